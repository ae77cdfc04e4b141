#!/usr/bin/env bash
# The job at volume on this machine: starts a Tansu broker on a free loopback port and runs
# `ragstream bench volume` (a corpus repeated with varied ids and words up to CHUNKS chunks, the model
# taken out by an instant in-process embedder; queries while growing, at full size idle and under ingest;
# RSS, disk, optimization stalls); prints the JSON report.
#   ./deploy/scripts/bench/volume.sh [CHUNKS] [WORKERS] [CORPUS] [QUESTIONS]
# RAGSTREAM_MEMORY_LIMIT (e.g. 4G) runs the job inside a memory cgroup of that size
# (deploy/scripts/bench/memory-limit.sh), page cache included.
# Defaults: 1000000 chunks, 1 worker, ../shared/data/squad-v1.1/{corpus,questions}.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../../.."
data="${RAGSTREAM_DATA:-../shared/data}"
chunks="${1:-1000000}"
workers="${2:-1}"
corpus="${3:-$data/squad-v1.1/corpus.jsonl}"
questions="${4:-$data/squad-v1.1/questions.jsonl}"
source deploy/scripts/bench/env.sh
limit=()
if [ -n "${RAGSTREAM_MEMORY_LIMIT:-}" ]; then
  limit=(deploy/scripts/bench/memory-limit.sh "$RAGSTREAM_MEMORY_LIMIT")
fi
RUST_LOG=warn "${limit[@]}" "$bin" bench volume --corpus "$corpus" \
  --questions "$questions" --brokers "127.0.0.1:$port" --chunks "$chunks" --workers "$workers"
