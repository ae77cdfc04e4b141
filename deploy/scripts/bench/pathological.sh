#!/usr/bin/env bash
# Pathological documents on this machine: chunking time of one 8 MiB line of minified script, an 8 MiB
# markdown table and one 8 MiB function against 1 MiB ones, HTML, PDF and DOCX files of both sizes read
# through the file sandbox and chunked (`ragstream bench pathological --offline` stops there), then
# `POST /v1/query` round trips from one client with ingest idle and while the script and the table
# are dropped into the job's watched directory (the embedded default: local model, embedded index, no broker). Prints the JSON report.
#   ./deploy/scripts/bench/pathological.sh [SIZE_MIB] [QUERIES] [INTERVAL_MS] [LOADED_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
source deploy/scripts/bench/local-env.sh
# The bench leaves its job's working directory (index, watched files) under TMPDIR: removed on exit.
export TMPDIR="$(mktemp -d)"
trap 'rm -rf "$TMPDIR"' EXIT
RUST_LOG=error "$bin" bench pathological --size-mib "${1:-8}" --queries "${2:-200}" \
  --interval-ms "${3:-50}" --loaded-seconds "${4:-120}"
