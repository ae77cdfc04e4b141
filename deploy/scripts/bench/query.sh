#!/usr/bin/env bash
# Query latency benchmark on this machine: starts a Tansu broker on a free loopback port, runs
# `ragstream bench query` on the eval index (build it first with `ragstream eval`), prints the JSON report.
#   ./deploy/scripts/bench/query.sh [RATE] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
rate="${1:-200}"
seconds="${2:-20}"
source deploy/scripts/bench/env.sh
RUST_LOG=warn "$bin" bench query --brokers "127.0.0.1:$port" --rate "$rate" --seconds "$seconds"
