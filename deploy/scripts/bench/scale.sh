#!/usr/bin/env bash
# Scaling benchmark on this machine: starts a Tansu broker on a free loopback port, runs
# `ragstream bench scale` (ingest and query throughput at 1, 2 and 4 workers, model time excluded by an
# instant in-process embedder) over a BEIR corpus, prints the JSON report.
#   ./deploy/scripts/bench/scale.sh CORPUS.jsonl [LIMIT] [WORKERS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
corpus="$1"
limit="${2:-}"
workers="${3:-1,2,4}"
source deploy/scripts/bench/env.sh
args=(bench scale --corpus "$corpus" --brokers "127.0.0.1:$port" --workers "$workers")
if [ -n "$limit" ]; then args+=(--limit "$limit"); fi
RUST_LOG=warn "$bin" "${args[@]}"
