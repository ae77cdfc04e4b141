#!/usr/bin/env bash
# Makes Prometheus and promtool (Debian package `prometheus`) available to the tests, once, without
# starting a system service: uses them from PATH when installed, otherwise downloads the Debian package
# with `apt-get download` and unpacks its binaries into a cache directory. Prints the directory that
# holds `prometheus` and `promtool`.
#   RAGSTREAM_CACHE  cache root (default ~/.cache/ragstream)
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  dirname "$(command -v prometheus)"
  exit 0
fi
cache="${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}"
root="$cache/prometheus-deb"
if [ -x "$root/usr/bin/prometheus" ] && [ -x "$root/usr/bin/promtool" ]; then
  echo "$root/usr/bin"
  exit 0
fi
echo "fetching the Debian package prometheus into $root" >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chmod 777 "$work"
(cd "$work" && apt-get download prometheus >&2) || {
  # The package index may be missing on a fresh machine.
  if [ "$(id -u)" = 0 ]; then apt-get update >&2; else sudo apt-get update >&2; fi
  (cd "$work" && apt-get download prometheus >&2)
}
rm -rf "$root.tmp"
mkdir -p "$root.tmp"
dpkg-deb -x "$work"/prometheus_*.deb "$root.tmp"
rm -rf "$root"
mv "$root.tmp" "$root"
"$root/usr/bin/prometheus" --version >&2
echo "$root/usr/bin"
