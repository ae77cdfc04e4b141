#!/usr/bin/env bash
# Runs a command beside a throw-away Qdrant server on loopback: free ports, storage in a temp directory,
# stopped (and its storage removed) when the command ends. The command sees QDRANT_URL (gRPC, what
# qdrant-client speaks) and QDRANT_HTTP_URL.
#   usage: deploy/scripts/qdrant-local.sh <qdrant binary> <command> [args...]
set -euo pipefail
bin="$1"
shift
dir="$(mktemp -d)"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
http_port="$(free_port)"
grpc_port="$(free_port)"
while [ "$grpc_port" = "$http_port" ]; do grpc_port="$(free_port)"; done
(
  cd "$dir"
  QDRANT__SERVICE__HOST=127.0.0.1 QDRANT__SERVICE__HTTP_PORT="$http_port" \
    QDRANT__SERVICE__GRPC_PORT="$grpc_port" QDRANT__STORAGE__STORAGE_PATH="$dir/storage" \
    QDRANT__STORAGE__SNAPSHOTS_PATH="$dir/snapshots" QDRANT__TELEMETRY_DISABLED=true \
    exec "$bin" --disable-telemetry > "$dir/qdrant.log" 2>&1
) &
server=$!
stop() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT
for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$http_port/readyz" > /dev/null 2>&1; then
    break
  fi
  if ! kill -0 "$server" 2>/dev/null; then
    echo "qdrant-local: the server exited; its log:" >&2
    cat "$dir/qdrant.log" >&2
    exit 1
  fi
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$http_port/readyz" > /dev/null || {
  echo "qdrant-local: the server did not become ready in 10 s; its log:" >&2
  cat "$dir/qdrant.log" >&2
  exit 1
}
export QDRANT_URL="http://127.0.0.1:$grpc_port"
export QDRANT_HTTP_URL="http://127.0.0.1:$http_port"
"$@"
