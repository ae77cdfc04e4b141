#!/usr/bin/env bash
# Installs what the local embedder runs on, next to the model fetched by install/model.sh:
#   1. the ONNX Runtime library, taken out of the PyPI wheel `onnxruntime` (pinned version and sha256)
#      into $RAGSTREAM_CACHE/onnxruntime/libonnxruntime.so;
#   2. the graphs model_fp32.onnx and model_int8.onnx in MODEL_DIR, written from the model's safetensors
#      by deploy/scripts/install/export_onnx.py with pinned Python tools (deploy/scripts/install/onnx-tools.txt) in a
#      cached virtual environment, and checked against their pinned sha256.
# Nothing comes from a model hub; nothing happens at build time. Each step is skipped when its output is
# already there.
#
# Usage: deploy/scripts/install/onnx.sh MODEL_DIR
# Environment:
#   RAGSTREAM_CACHE          cache root (default ~/.cache/ragstream)
#   RAGSTREAM_GRAPH_SHA256   "skip" to accept graphs whose bytes differ from the pinned ones
#   PYTHON                   python interpreter (default python3)
set -euo pipefail

readonly ORT_VERSION="1.32.0"
# The cp311 manylinux_2_28 x86_64 wheel; the library inside it does not depend on Python.
readonly ORT_WHEEL_SHA256="5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d"
readonly FP32_SHA256="4f5f76923386637f848a64bd58e724229c4f30269156ba77f8157d5385921391"
readonly INT8_SHA256="e466329974ab07a218ebf6090dab0189a91e30c5bc8638f08f86516eb4fffb2c"

log() { printf 'install/onnx: %s\n' "$*" >&2; }
die() { printf 'install/onnx: error: %s\n' "$*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: $0 MODEL_DIR"
model_dir="$(cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
cache="${RAGSTREAM_CACHE:-${HOME:?HOME is not set}/.cache/ragstream}"
python="${PYTHON:-python3}"
lib_dir="$cache/onnxruntime"
library="$lib_dir/libonnxruntime.so"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ragstream-fetch-onnx.XXXXXX")"
trap 'rm -rf -- "$tmp"' EXIT

# 1. The runtime library.
if [[ ! -s "$library" || "$(cat "$lib_dir/VERSION" 2>/dev/null)" != "$ORT_VERSION" ]]; then
    log "downloading onnxruntime==$ORT_VERSION (wheel only) for its runtime library"
    "$python" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64 \
        "onnxruntime==$ORT_VERSION" -d "$tmp/wheel" >&2 \
        || die "pip download of onnxruntime==$ORT_VERSION failed (is PyPI reachable?)"
    wheel="$(ls "$tmp"/wheel/*.whl)"
    actual="$(sha256sum "$wheel" | cut -d' ' -f1)"
    [[ "$actual" == "$ORT_WHEEL_SHA256" ]] || die "onnxruntime wheel sha256 $actual, expected $ORT_WHEEL_SHA256"
    mkdir -p "$lib_dir"
    "$python" -m zipfile -e "$wheel" "$tmp/x" >/dev/null
    cp "$tmp/x/onnxruntime/capi/libonnxruntime.so.$ORT_VERSION" "$lib_dir/.libonnxruntime.so.part"
    mv -f "$lib_dir/.libonnxruntime.so.part" "$library"
    echo "$ORT_VERSION" > "$lib_dir/VERSION"
    log "installed $library"
fi

# 2. The graphs.
if [[ -s "$model_dir/model_fp32.onnx" && -s "$model_dir/model_int8.onnx" ]]; then
    exit 0
fi
venv="$cache/onnx-tools"
if ! cmp -s "$here/onnx-tools.txt" "$venv/requirements.txt"; then
    log "installing the graph tools into $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv" || die "cannot create a virtual environment (apt-get install python3-venv)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$here/onnx-tools.txt" >&2 \
        || die "installing the graph tools failed"
    cp "$here/onnx-tools.txt" "$venv/requirements.txt"
fi
log "writing the ONNX graphs into $model_dir"
stage="$(mktemp -d "$model_dir/.graphs.XXXXXX")"
trap 'rm -rf -- "$tmp" "$stage"' EXIT
cp "$model_dir/model.safetensors" "$model_dir/config.json" "$stage/"
"$venv/bin/python" "$here/export_onnx.py" "$stage" 2> >(grep -v -i warning >&2) \
    || die "writing the graphs failed"
if [[ "${RAGSTREAM_GRAPH_SHA256:-}" != "skip" ]]; then
    for pair in "model_fp32.onnx:$FP32_SHA256" "model_int8.onnx:$INT8_SHA256"; do
        actual="$(sha256sum "$stage/${pair%%:*}" | cut -d' ' -f1)"
        [[ "$actual" == "${pair#*:}" ]] \
            || die "${pair%%:*} sha256 $actual differs from the pinned ${pair#*:} (set RAGSTREAM_GRAPH_SHA256=skip to accept)"
    done
fi
mv -f "$stage/model_fp32.onnx" "$model_dir/model_fp32.onnx"
mv -f "$stage/model_int8.onnx" "$model_dir/model_int8.onnx"
log "graphs written"
