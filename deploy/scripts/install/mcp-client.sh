#!/usr/bin/env bash
# Installs a real MCP client for the MCP test, once: the PyPI package `mcp` (the protocol's Python
# SDK) in a virtual environment under the cache. Prints the environment's python.
#   RAGSTREAM_CACHE    cache root (default ~/.cache/ragstream)
#   RAGSTREAM_PYTHON   python to build the environment with (default python3; needs 3.10+)
set -euo pipefail
version="2.3.0"
cache="${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}"
root="$cache/mcp-client-$version"
if [ -x "$root/bin/python" ] && "$root/bin/python" -c "import mcp" 2>/dev/null; then
  echo "$root/bin/python"
  exit 0
fi
python="${RAGSTREAM_PYTHON:-python3}"
command -v "$python" >/dev/null || { echo "'$python' not found; install Python 3.10+" >&2; exit 1; }
echo "installing the MCP client (PyPI mcp==$version) into $root" >&2
# A virtual environment is not relocatable: it is built in place, and removed if the install fails
# (the check above also refuses a half-built one).
rm -rf "$root"
"$python" -m venv "$root" >&2
"$root/bin/python" -m pip install --quiet --disable-pip-version-check "mcp==$version" >&2 \
  || { rm -rf "$root"; echo "pip install of mcp==$version failed (is PyPI reachable?)" >&2; exit 1; }
echo "$root/bin/python"
