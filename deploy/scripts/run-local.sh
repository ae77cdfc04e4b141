#!/usr/bin/env bash
# Runs the main job on its embedded default: fetches the model if missing, then indexes a directory
# (default: this repository) into the embedded qdrant-edge index and keeps following changes.
#   ./deploy/scripts/run-local.sh [DIRECTORY]
# The job is the default build (no cargo features: see docs/configuration.md, "Components"). The
# model's download overlaps the first build.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RAGSTREAM_MODEL_DIR="${RAGSTREAM_MODEL_DIR:-${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}/models/all-MiniLM-L6-v2}"
cargo build --bin ragstream &
build=$!
if ! deploy/scripts/install/model.sh "$RAGSTREAM_MODEL_DIR" >/dev/null; then
  kill "$build" 2>/dev/null || true
  exit 1
fi
wait "$build"
if [ $# -gt 0 ]; then
  export RAGSTREAM_SOURCE__PATH="$1"
fi
exec cargo run -q -- run --config topologies/presets/local.toml
