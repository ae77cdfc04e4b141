#!/usr/bin/env bash
# Embedding benchmark on this machine: ragstream's ONNX Runtime embedder (int8 and fp32 graphs) against
# sentence-transformers (PyTorch, CPU) on the same texts (the corpus's chunks as the pipeline cuts them)
# and the same questions, same threads, in interleaved rounds; prints every round and the medians and
# ratios as JSON.
#   ./deploy/scripts/bench/embed.sh [CORPUS] [QUESTIONS] [ROUNDS] [THREADS]
# Defaults: ../shared/data/squad-v1.1/{corpus,questions}.jsonl, 3 rounds, 2 threads.
# The PyTorch side lives in its own virtual environment, $RAGSTREAM_CACHE/st-venv, made on first use
# with `pip install sentence-transformers==6.2.0 torch==2.15.0` from PyPI (CPU; the torch wheel pulls
# its CUDA libraries too, about 6 GB). The tests never use it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
data="${RAGSTREAM_DATA:-../shared/data}"
corpus="${1:-$data/squad-v1.1/corpus.jsonl}"
questions="${2:-$data/squad-v1.1/questions.jsonl}"
rounds="${3:-3}"
threads="${4:-2}"
cache="${RAGSTREAM_CACHE:-$HOME/.cache/ragstream}"
export RAGSTREAM_MODEL_DIR="${RAGSTREAM_MODEL_DIR:-$cache/models/all-MiniLM-L6-v2}"
deploy/scripts/install/model.sh "$RAGSTREAM_MODEL_DIR" >/dev/null
venv="$cache/st-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sentence_transformers' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check sentence-transformers==6.2.0 torch==2.15.0 >&2
fi
engines=(int8 fp32)
cargo build -q --features bench
bin="${CARGO_TARGET_DIR:-target}/debug/ragstream"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$bin" bench embed --corpus "$corpus" --questions "$questions" --threads "$threads" --texts-out "$work/texts.json" --engine int8 > "$work/warm.json"
for round in $(seq "$rounds"); do
  for engine in "${engines[@]}"; do
    "$bin" bench embed --corpus "$corpus" --questions "$questions" --threads "$threads" --engine "$engine" | tee -a "$work/rounds.jsonl" >&2
  done
  "$venv/bin/python" deploy/scripts/bench/embed_torch.py "$work/texts.json" "$RAGSTREAM_MODEL_DIR" "$threads" 2>/dev/null | tee -a "$work/rounds.jsonl" >&2
done
python3 - "$work/rounds.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
engines = sorted({r["engine"] for r in rows})
by = {e: [r for r in rows if r["engine"] == e] for e in engines}
med = lambda e, k: statistics.median(r[k] for r in by[e])
report = {e: {k: med(e, k) for k in ("word_pieces_per_s", "query_p50_ms", "query_p90_ms")} for e in engines}
report["rounds"] = len(by["pytorch"])
report["texts"] = rows[0]["texts"]
report["word_pieces"] = {e: by[e][0]["word_pieces"] for e in engines}
for e in engines:
    if e != "pytorch":
        ratios = [a["word_pieces_per_s"] / b["word_pieces_per_s"] for a, b in zip(by[e], by["pytorch"])]
        report[f"{e}_vs_pytorch"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
print(json.dumps(report, indent=2))
PY
