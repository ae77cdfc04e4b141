# Sourced by the bench scripts: fetches the model and builds the job. Sets RAGSTREAM_MODEL_DIR and `bin`
# (the job's binary; RAGSTREAM_BIN names another one, e.g. a build of an earlier commit for a
# before/after run).
export RAGSTREAM_MODEL_DIR="${RAGSTREAM_MODEL_DIR:-${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}/models/all-MiniLM-L6-v2}"
deploy/scripts/install/model.sh "$RAGSTREAM_MODEL_DIR" >/dev/null
if [ -n "${RAGSTREAM_BIN:-}" ]; then
  bin="$RAGSTREAM_BIN"
else
  cargo build -q --features bench
  bin="${CARGO_TARGET_DIR:-target}/debug/ragstream"
fi
