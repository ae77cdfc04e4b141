#!/usr/bin/env bash
# Standing queries on this machine, on the embedded default (local model, embedded index, no
# broker): the SQuAD corpus posted at full speed with nothing subscribed, then with SUBSCRIPTIONS
# standing SQuAD questions held (and IDLE more made afterwards and held idle), then with nothing
# again. Prints one JSON report per run and a last line with the ingest throughput ratio
# (with subscriptions over the mean of the two baselines) and the memory the subscriptions took.
#   ./deploy/scripts/bench/standing.sh [SUBSCRIPTIONS] [IDLE]
set -euo pipefail
cd "$(dirname "$0")/../../.."
source deploy/scripts/bench/local-env.sh
# Each run leaves its job's working directory under TMPDIR: removed on exit.
export TMPDIR="$(mktemp -d)"
trap 'rm -rf "$TMPDIR"' EXIT
run() { RUST_LOG=error "$bin" bench standing "$@" | tr -d '\n'; echo; }
base1=$(run --subscriptions 0)
echo "$base1"
held=$(run --subscriptions "${1:-1000}" --idle "${2:-10000}")
echo "$held"
base2=$(run --subscriptions 0)
echo "$base2"
python3 - "$base1" "$held" "$base2" <<'PY'
import json, sys
a, h, b = (json.loads(x) for x in sys.argv[1:])
rate = lambda r: r["ingest"]["documents_per_second"]
rss = lambda r: r["rss_mib_after_ingest"]
print(json.dumps({
    "ingest_with_subscriptions_over_without": rate(h) / ((rate(a) + rate(b)) / 2),
    "rss_mib_per_1000_held_after_ingest": (rss(h) - (rss(a) + rss(b)) / 2) * 1000 / h["subscriptions"],
}))
PY
