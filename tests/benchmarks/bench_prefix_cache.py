"""Benchmark: a 64-request grid sharing a ~400-token prefix, with and without the prefix cache.

The workload of a [P] x [N] candidate grid or a few-shot classifier: every request is the same
long instruction block (a system prompt with few-shot examples, ~400 tokens) followed by its
own short question, answered greedily with a few tokens. Two engines of the same model (the
weights shared) run it in the same process, alternating (on, off, on, off, ...):
``prefix_cache_tokens=8192`` and ``prefix_cache_tokens=0``. The store is emptied before each
timed round, so a round pays for the prefix once (the first prompt computes it, the others
reuse it) — what a fresh grid costs, not a warm repeat.

Reports the median wall time of a round for each, their ratio (goal: >= 3x), the prefill
tokens each computed and the prefix-cache counters, and the machine's GEMM ceilings measured in
the same process. On a shared machine the absolute times are noise; the ratio of the alternated
runs is the number.

Prints one JSON line. Run: ``python tests/benchmarks/bench_prefix_cache.py`` (``--quick`` for a
smoke run with small sizes: its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _gemm import gemm_ceilings  # noqa: E402

EXAMPLES = [("The battery died after two days.", "negative"),
            ("Shipping was fast and the fit is perfect.", "positive"),
            ("It works, nothing special.", "neutral"),
            ("Customer support never answered my emails.", "negative"),
            ("Best purchase I made this year!", "positive"),
            ("The colour is slightly different from the photo.", "neutral")]


def instruction(target_tokens: int, encode) -> str:
    """A few-shot block of about ``target_tokens`` tokens."""
    head = ("You label product reviews as positive, negative or neutral. Read the review, "
            "think about the customer's overall feeling, and answer with one word.\n\n")
    text, i = head, 0
    while len(encode(text)) < target_tokens:
        review, label = EXAMPLES[i % len(EXAMPLES)]
        text += f"Example {i + 1}. Review: {review}\nLabel: {label}\n\n"
        i += 1
    return text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prefix-tokens", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smoke run with small sizes")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.prefix_tokens, args.max_tokens, args.rounds = 8, 100, 2, 1
        args.slots = 4

    from langtorch.models import Engine, default_llm

    ceilings = gemm_ceilings()
    model = default_llm()
    block = instruction(args.prefix_tokens, model.encode)
    prompts = [model.encode(model.apply_chat_template([
        {"role": "system", "content": block},
        {"role": "user", "content": f"Review {i}: the product number {i} arrived "
                                    f"{['late', 'early', 'on time', 'broken'][i % 4]}."}]))
        for i in range(args.requests)]
    engines = {"with_cache": Engine(model, max_slots=args.slots, prefix_cache_tokens=8192),
               "without_cache": Engine(model, max_slots=args.slots, prefix_cache_tokens=0)}
    t0 = time.perf_counter()
    outputs = {}
    for name, eng in engines.items():  # compile every shape the rounds use
        outputs[name] = [g.text for g in eng.generate(prompts, max_tokens=args.max_tokens)]
    warmup_s = time.perf_counter() - t0
    times: dict[str, list[float]] = {k: [] for k in engines}
    tokens: dict[str, list[int]] = {k: [] for k in engines}
    hits = []
    for _ in range(args.rounds):
        for name, eng in engines.items():  # alternated: on, off, on, off
            eng.batch.prefix_cache.clear()
            before = eng.stats()
            t = time.perf_counter()
            eng.generate(prompts, max_tokens=args.max_tokens)
            times[name].append(time.perf_counter() - t)
            after = eng.stats()
            tokens[name].append(after["prefill_tokens"] - before["prefill_tokens"])
            if name == "with_cache":
                hits.append(after["prefix_cache"]["hits"] - before["prefix_cache"]["hits"])
    on, off = (statistics.median(times[k]) for k in ("with_cache", "without_cache"))
    print(json.dumps({
        "bench": "prefix_cache", "model": getattr(model, "name", type(model).__name__),
        "quick": args.quick, "requests": args.requests, "slots": args.slots,
        "prefix_tokens": len(model.encode(block)),
        "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts), 1),
        "max_tokens": args.max_tokens,
        "with_cache_s": round(on, 3), "without_cache_s": round(off, 3),
        "ratio": round(off / on, 2), "goal_ratio": 3.0,
        "prefill_tokens_with_cache": int(statistics.median(tokens["with_cache"])),
        "prefill_tokens_without_cache": int(statistics.median(tokens["without_cache"])),
        "prefix_cache_hits_per_round": int(statistics.median(hits)),
        "same_text": outputs["with_cache"] == outputs["without_cache"],
        "warmup_s": round(warmup_s, 1), **ceilings,
        "rounds": args.rounds, "statistic": "median",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
