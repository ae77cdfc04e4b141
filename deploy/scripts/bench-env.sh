# Sourced by the bench scripts: fetches the model, starts a Tansu broker on a free loopback port (stopped and
# its storage removed on exit) and builds the job. Sets RAGSTREAM_MODEL_DIR, `port` and `bin` (the job's
# binary; RAGSTREAM_BIN names another one, e.g. a build of an earlier commit for a before/after run).
export RAGSTREAM_MODEL_DIR="${RAGSTREAM_MODEL_DIR:-${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}/models/all-MiniLM-L6-v2}"
deploy/scripts/fetch-model.sh "$RAGSTREAM_MODEL_DIR" >/dev/null
tansu="$(deploy/scripts/install-tansu.sh)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
work="$(mktemp -d)"
trap 'kill "$broker" 2>/dev/null || true; rm -rf "$work"' EXIT
(cd "$work" && exec "$tansu" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine sqlite://tansu.db >/dev/null 2>&1) &
broker=$!
sleep 2
if [ -n "${RAGSTREAM_BIN:-}" ]; then
  bin="$RAGSTREAM_BIN"
else
  cargo build -q
  bin="${CARGO_TARGET_DIR:-target}/debug/ragstream"
fi
