#!/usr/bin/env bash
# Query latency benchmark on this machine: starts a Tansu broker on a free loopback port, runs
# `ragstream bench query` on the eval index (build it first with `ragstream eval`), prints the JSON report.
#   ./deploy/scripts/bench-query.sh [RATE] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
rate="${1:-200}"
seconds="${2:-20}"
export RAGSTREAM_MODEL_DIR="${RAGSTREAM_MODEL_DIR:-${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}/models/all-MiniLM-L6-v2}"
deploy/scripts/fetch-model.sh "$RAGSTREAM_MODEL_DIR" >/dev/null
tansu="$(deploy/scripts/install-tansu.sh)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
work="$(mktemp -d)"
trap 'kill "$broker" 2>/dev/null || true; rm -rf "$work"' EXIT
(cd "$work" && exec "$tansu" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine sqlite://tansu.db >/dev/null 2>&1) &
broker=$!
sleep 2
cargo build -q
RUST_LOG=warn target/debug/ragstream bench query --brokers "127.0.0.1:$port" --rate "$rate" --seconds "$seconds"
