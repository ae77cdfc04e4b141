#!/usr/bin/env bash
# The two index backends side by side, in one session: `bench/load.sh` (query round trips idle and under
# ingest, the ingest rate) once into a fresh embedded index and once into a throw-away Qdrant server on
# loopback (deploy/scripts/install/qdrant.sh + qdrant-local.sh), in alternating rounds; prints both
# JSON reports of each round.
#   ./deploy/scripts/bench/backends.sh [SEED] [QUERIES] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
seed="${1:-200}"
queries="${2:-100}"
rounds="${3:-2}"
qdrant="$(deploy/scripts/install/qdrant.sh)"
for round in $(seq 1 "$rounds"); do
  echo "== round $round: embedded index"
  deploy/scripts/bench/load.sh "" "" "$seed" "$queries"
  echo "== round $round: Qdrant server"
  deploy/scripts/qdrant-local.sh "$qdrant" bash -c \
    'deploy/scripts/bench/load.sh "" "" "$0" "$1" "" "$QDRANT_URL"' "$seed" "$queries"
done
