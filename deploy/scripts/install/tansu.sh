#!/usr/bin/env bash
# Installs the Tansu broker (a Kafka-protocol broker used by the tests) into a cache directory, once.
# Prints the binary's path. Reuses a cached binary when present; otherwise unpacks the prebuilt binary
# that ../shared/bin/ ships beside this checkout (checksums verified by its own script), and only where
# there is none builds it from crates.io.
#   RAGSTREAM_CACHE  cache root (default ~/.cache/ragstream)
#   TANSU_VERSION    crate version (default 0.6.0)
set -euo pipefail
cache="${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}"
version="${TANSU_VERSION:-0.6.0}"
root="$cache/tansu-$version"
bin="$root/bin/tansu"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
shipped="$(cd "$(dirname "$0")/../../../.." && pwd)/shared/bin/install-tansu.sh"
if [ "$version" = "0.6.0" ] && [ -x "$shipped" ]; then
  exec "$shipped"
fi
echo "installing tansu $version into $root (a one-time build of ~10 minutes)" >&2
mkdir -p "$root"
# Its own target dir, so a failed build never leaves a half-installed binary behind.
CARGO_TARGET_DIR="$cache/tansu-build" cargo install tansu --version "$version" --locked \
  --features libsql,dynostore --root "$root" >&2
rm -rf "$cache/tansu-build"
echo "$bin"
