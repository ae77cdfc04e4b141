#!/usr/bin/env bash
# Query round trips under ingest on this machine: starts a Tansu broker on a free loopback port and runs
# `ragstream bench load` (POST /v1/query round trips with ingest idle, then while the rest of the corpus
# streams in at full embedding speed); prints the JSON report.
#   ./deploy/scripts/bench/load.sh [CORPUS] [QUESTIONS] [SEED] [QUERIES] [CONFIG_EXTRA] [INDEX_URL] [FLAGS...]
# Defaults: ../shared/data/squad-v1.1/{corpus,questions}.jsonl, 200 seed documents, 100 round trips of
# each kind per phase, the default embedder, a fresh embedded index (INDEX_URL: a Qdrant server's gRPC
# URL to index into instead, in a fresh collection). An empty argument keeps its default; FLAGS go to
# `bench load` as they are, e.g. `--budgets 8000,8001 --fill` (default: 600 and 700 tokens, not filled).
set -euo pipefail
cd "$(dirname "$0")/../../.."
data="${RAGSTREAM_DATA:-../shared/data}"
corpus="${1:-$data/squad-v1.1/corpus.jsonl}"
questions="${2:-$data/squad-v1.1/questions.jsonl}"
seed="${3:-200}"
queries="${4:-100}"
extra="${5:-}"
index_url="${6:-}"
source deploy/scripts/bench/env.sh
RUST_LOG=warn "$bin" bench load --corpus "$corpus" --questions "$questions" \
  --brokers "127.0.0.1:$port" --seed "$seed" --queries "$queries" --config-extra "$extra" --index-url "$index_url" \
  "${@:7}"
