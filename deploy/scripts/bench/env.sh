# Sourced by the bench scripts that need a broker: bench/local-env.sh (the model, the job's binary `bin`),
# then a Tansu broker on a free loopback port (stopped and its storage removed on exit). Sets
# RAGSTREAM_MODEL_DIR, `bin` and `port`.
source deploy/scripts/bench/local-env.sh
tansu="$(deploy/scripts/install/tansu.sh)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
work="$(mktemp -d)"
trap 'kill "$broker" 2>/dev/null || true; rm -rf "$work"' EXIT
(cd "$work" && exec "$tansu" broker --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine sqlite://tansu.db >/dev/null 2>&1) &
broker=$!
sleep 2
