#!/usr/bin/env bash
# Noisy neighbours on this machine: tenant a posts documents of SIZE_MIB without pause while tenant b
# posts 1 KiB documents and asks questions, on the embedded default (local model, embedded index, no
# broker), once with tenants taking turns (ingest.fair = true) and once with one queue (false), in
# this order. Prints one JSON report per line.
#   ./deploy/scripts/bench-neighbours.sh [SIZE_MIB] [LOADED_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/scripts/bench-local-env.sh
# Each run leaves its job's working directory under TMPDIR: removed on exit.
export TMPDIR="$(mktemp -d)"
trap 'rm -rf "$TMPDIR"' EXIT
for fair in true false; do
  RUST_LOG=error "$bin" bench neighbours --fair "$fair" --size-mib "${1:-7}" \
    --loaded-seconds "${2:-90}" | tr -d '\n'
  echo
done
