#!/usr/bin/env bash
# Installs, once, the Python packages the tests of the HTTP API and of the Python client use, pinned,
# in a virtual environment under the cache: openapi-spec-validator and jsonschema (the OpenAPI
# document and the topic schemas are checked with them), langchain-core and llama-index-core (the
# client's retrievers are tested against them), mypy and ruff (the client's type check and lint).
# Prints the environment's python.
#   RAGSTREAM_CACHE    cache root (default ~/.cache/ragstream)
#   RAGSTREAM_PYTHON   python to build the environment with (default python3; needs 3.10+)
set -euo pipefail
packages=(
  "openapi-spec-validator==0.9.0"
  "jsonschema==4.26.0"
  "langchain-core==1.8.3"
  "llama-index-core==0.14.25"
  "mypy==2.4.1"
  "ruff==0.17.5"
)
key=$(printf '%s\n' "${packages[@]}" | sha256sum | cut -c1-12)
cache="${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}"
root="$cache/python-tools-$key"
check='import openapi_spec_validator, jsonschema, langchain_core, llama_index.core, mypy'
if [ -x "$root/bin/python" ] && "$root/bin/python" -c "$check" 2>/dev/null; then
  echo "$root/bin/python"
  exit 0
fi
python="${RAGSTREAM_PYTHON:-python3}"
command -v "$python" >/dev/null || { echo "'$python' not found; install Python 3.10+" >&2; exit 1; }
echo "installing the Python test tools (${packages[*]}) into $root" >&2
# A virtual environment is not relocatable: it is built in place, and removed if the install fails
# (the check above also refuses a half-built one).
rm -rf "$root"
"$python" -m venv "$root" >&2
"$root/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2 \
  || { rm -rf "$root"; echo "pip install of ${packages[*]} failed (is PyPI reachable?)" >&2; exit 1; }
echo "$root/bin/python"
