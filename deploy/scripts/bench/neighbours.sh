#!/usr/bin/env bash
# Noisy neighbours on this machine: tenant a posts documents of SIZE_MIB without pause while tenant b
# posts 1 KiB documents and asks questions, on the embedded default (local model, embedded index, no
# broker): with the defaults (tenants taking turns, one ingest executor sitting out while queries
# come), with every ingest executor running (embedder.query_headroom_secs = 0), and with one queue
# (ingest.fair = false), in this order. Prints one JSON report per line.
#   ./deploy/scripts/bench/neighbours.sh [SIZE_MIB] [LOADED_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
source deploy/scripts/bench/local-env.sh
# Each run leaves its job's working directory under TMPDIR: removed on exit.
export TMPDIR="$(mktemp -d)"
trap 'rm -rf "$TMPDIR"' EXIT
for mode in "--fair true" "--fair true --query-headroom-secs 0" "--fair false"; do
  # shellcheck disable=SC2086 # the mode is two or four words
  RUST_LOG=error "$bin" bench neighbours $mode --size-mib "${1:-7}" \
    --loaded-seconds "${2:-90}" | tr -d '\n'
  echo
done
