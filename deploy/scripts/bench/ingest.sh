#!/usr/bin/env bash
# Ingest benchmark on this machine: starts a Tansu broker on a free loopback port, runs
# `ragstream bench ingest` over a BEIR corpus, prints the JSON report.
#   ./deploy/scripts/bench/ingest.sh CORPUS.jsonl [LIMIT]
set -euo pipefail
cd "$(dirname "$0")/../../.."
corpus="$1"
limit="${2:-}"
source deploy/scripts/bench/env.sh
args=(bench ingest --corpus "$corpus" --brokers "127.0.0.1:$port")
if [ -n "$limit" ]; then args+=(--limit "$limit"); fi
RUST_LOG=warn "$bin" "${args[@]}"
