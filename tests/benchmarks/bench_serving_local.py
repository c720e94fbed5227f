"""Benchmark: 64 concurrent chat requests with mixed lengths through ``nn.LLM(LocalBackend())``.

Each request asks for a story (greedy) with its own ``max_tokens`` drawn from 8..128 (fixed
seed), all sent at once, the way a server sees traffic. Uses only the public API (``nn.LLM``,
``LocalBackend``, ``TextTensor``, ``backend.usage``), so the same script measures older
implementations too (the static micro-batching before the decode engine, commit c6511f4).

Reports throughput (completion tokens / wall time of the whole round) and the p50 / p90
latency of the short requests (the quarter with the smallest ``max_tokens``) and of all
requests. A first round (same workload) warms up/compiles; the timed rounds follow. Each line
also carries the machine's GEMM ceilings measured in the same process.

Prints one JSON line. Run: ``python tests/benchmarks/bench_serving_local.py`` (``--quick`` for a
smoke run with tiny sizes: its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _gemm import gemm_ceilings  # noqa: E402

TOPICS = ("a cat", "the ocean", "a robot", "a wizard", "a pirate", "a dragon", "a city", "a river",
          "the moon", "a tree", "a car", "a star", "a bird", "a fish", "a king", "a library")


def workload(n: int, low: int, high: int, seed: int = 0) -> list[tuple[str, int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    budgets = rng.integers(low, high + 1, size=n).tolist()
    return [(f"Write a long story about {TOPICS[i % len(TOPICS)]} (number {i}).", int(m))
            for i, m in enumerate(budgets)]


async def one_round(llm, work) -> tuple[float, list[float]]:
    import langtorch as lt

    start = time.perf_counter()
    latencies = [0.0] * len(work)

    async def one(i, prompt, budget):
        await llm.acall(lt.TextTensor([prompt]), max_tokens=budget)
        latencies[i] = time.perf_counter() - start

    await asyncio.gather(*[one(i, p, m) for i, (p, m) in enumerate(work)])
    return time.perf_counter() - start, latencies


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--min-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup-rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smoke run with tiny sizes")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.min_tokens, args.max_tokens, args.rounds = 6, 2, 8, 1

    import langtorch as lt
    from langtorch.backends import LocalBackend

    ceilings = gemm_ceilings()
    backend = LocalBackend()
    llm = lt.nn.LLM(backend, temperature=0, use_cache=False)
    work = workload(args.requests, args.min_tokens, args.max_tokens)
    budgets = [m for _, m in work]
    cut = sorted(budgets)[max(0, len(budgets) // 4 - 1)]
    short = [i for i, m in enumerate(budgets) if m <= cut]

    t0 = time.perf_counter()
    backend.warmup()  # public API on every version: compile what it says it compiles
    for _ in range(args.warmup_rounds):  # then the workload itself: the shapes it really uses
        asyncio.run(one_round(llm, work))
    warmup_s = time.perf_counter() - t0
    rounds = []
    for _ in range(args.rounds):
        before = backend.usage.completion_tokens
        wall, lat = asyncio.run(one_round(llm, work))
        tokens = backend.usage.completion_tokens - before
        rounds.append({"tok_s": tokens / wall, "wall_s": wall, "tokens": tokens,
                       "short_p50_s": pct([lat[i] for i in short], 0.5),
                       "short_p90_s": pct([lat[i] for i in short], 0.9),
                       "all_p50_s": pct(lat, 0.5), "all_p90_s": pct(lat, 0.9)})
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    try:
        import subprocess

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
                                check=False).stdout.strip() or None
    except OSError:
        commit = None
    print(json.dumps({
        "bench": "serving_local", "model": backend.model, "commit": commit,
        "quick": args.quick, "requests": args.requests,
        "max_tokens_range": [args.min_tokens, args.max_tokens], "seed": 0,
        "short_requests": len(short), "short_max_tokens_cut": cut,
        "throughput_tok_s": round(med["tok_s"], 1),
        "short_p50_latency_s": round(med["short_p50_s"], 3),
        "short_p90_latency_s": round(med["short_p90_s"], 3),
        "all_p50_latency_s": round(med["all_p50_s"], 3),
        "all_p90_latency_s": round(med["all_p90_s"], 3),
        "round_wall_s": round(med["wall_s"], 2), "completion_tokens": int(med["tokens"]),
        "warmup_round_s": round(warmup_s, 1),
        **ceilings,
        "rounds": args.rounds, "statistic": "median",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
