"""Benchmark: fill one template over 1,000,000 values and join 1,000,000 entries.

Peers (same process, same data): the hand-written Python a user would write,
``[t.format(x=v) for v in values]`` and ``" ".join(values)``. Prints one JSON line with medians
and ratios (peer time / our time: > 1 means we are faster).

Run: python tests/benchmarks/bench_text.py [--n 1000000] [--repeats 7]
"""

import argparse
import json
import statistics
import time

import langtorch as lt


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    values = [f"item {i} of the list" for i in range(args.n)]
    template_text = "Summarize the following text in one sentence: {x}\nSummary:"
    template = lt.TextTensor(template_text)
    tensor = lt.TextTensor(values)

    # Correctness first: the same strings as the hand-written comprehension.
    ours = (template + tensor).tolist()
    assert ours == [template_text.format(x=v) for v in values]
    assert tensor.join(" ").item() == " ".join(values)

    fill_ours = median_time(lambda: template + tensor, args.repeats)
    fill_peer = median_time(lambda: [template_text.format(x=v) for v in values], args.repeats)
    join_ours = median_time(lambda: tensor.join(" "), args.repeats)
    join_peer = median_time(lambda: " ".join(values), args.repeats)
    # A tensor computed by an op has no memoised Python strings: its first join pays the
    # StringDType -> str conversion. Reported separately so the cached number is not mistaken.
    filled = template + tensor

    def join_cold():
        fresh = lt.TextTensor._wrap(filled.texts)  # same texts, nothing memoised
        fresh.join(" ")

    join_cold_ours = median_time(join_cold, args.repeats)
    print(json.dumps({
        "bench": "text",
        "n": args.n,
        "fill_ours_s": round(fill_ours, 4),
        "fill_listcomp_format_s": round(fill_peer, 4),
        "fill_speedup": round(fill_peer / fill_ours, 2),
        "join_ours_s": round(join_ours, 4),
        "join_str_join_s": round(join_peer, 4),
        "join_ratio_ours_over_str_join": round(join_ours / join_peer, 2),
        "join_cold_ours_s": round(join_cold_ours, 4),
        "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
