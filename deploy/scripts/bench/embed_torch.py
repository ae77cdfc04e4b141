#!/usr/bin/env python3
"""The PyTorch peer of `ragstream bench embed`: sentence-transformers on CPU over the same texts.

Reads the JSON written by `ragstream bench embed --texts-out` ({"texts": [...], "queries": [...]}), loads
the model folder written by deploy/scripts/install/model.sh (offline), and prints one JSON line with the
same fields as the Rust side: word pieces per second over all texts in one `encode` call (batch 32,
max_seq_length 256, after a warm-up), and the latency of each query embedded alone.

Usage: bench/embed_torch.py TEXTS_JSON MODEL_DIR THREADS
Needs sentence-transformers and torch (see deploy/scripts/bench/embed.sh for how they are installed).
"""

import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402


def main() -> int:
    texts_path, model_dir, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(threads)
    data = json.load(open(texts_path))
    texts, queries = data["texts"], data["queries"]
    model = SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = 256
    encoded = model.tokenizer(texts, truncation=True, max_length=256)
    word_pieces = sum(len(ids) for ids in encoded["input_ids"])
    with torch.inference_mode():
        model.encode(texts[:64], batch_size=32, normalize_embeddings=True)
        started = time.perf_counter()
        model.encode(texts, batch_size=32, normalize_embeddings=True)
        seconds = time.perf_counter() - started
        latencies = []
        for query in queries:
            started = time.perf_counter()
            model.encode([query], batch_size=1, normalize_embeddings=True)
            latencies.append((time.perf_counter() - started) * 1000.0)
    latencies.sort()
    pick = lambda p: latencies[round((len(latencies) - 1) * p)]  # noqa: E731
    print(json.dumps({
        "engine": "pytorch",
        "threads": threads,
        "torch": torch.__version__,
        "texts": len(texts),
        "word_pieces": word_pieces,
        "seconds": seconds,
        "word_pieces_per_s": word_pieces / seconds,
        "query_p50_ms": pick(0.5),
        "query_p90_ms": pick(0.9),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
