"""Benchmark: the cost of tracing. The 2,000-call batch of ``bench_llm.py`` (concurrency 100,
100 ms server latency, server in a subprocess) through a ``TChain(TLayer, LLM)``, with and
without ``lt.trace()``, interleaved in the same run; ``BENCH_REPEATS`` (default 5) runs each,
medians compared. Goal: <= 5% overhead.

Also measured: the trace's memory per recorded request (tracemalloc, around a traced run), and
the CPU time of the client per request with and without tracing (the wall time is dominated by
the server's latency; CPU time shows the recorder's own cost).

Prints one JSON line. Run: ``python tests/benchmarks/bench_trace.py``.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(__file__))

from bench_llm import CONCURRENCY, IDEAL, LATENCY, N, Server, questions  # noqa: E402

import langtorch as lt  # noqa: E402
from langtorch.backends import OpenAIBackend  # noqa: E402


def run(url: str, qs: list[str], traced: bool) -> tuple[float, float, object]:
    backend = OpenAIBackend("bench", base_url=url, api_key="sk-bench-000000", max_concurrency=CONCURRENCY)
    chain = lt.TChain(lt.TLayer("{}"), lt.nn.LLM(backend, temperature=0))
    x = lt.TextTensor(qs)
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    if traced:
        with lt.trace() as tr:
            out = chain(x)
    else:
        tr = None
        out = chain(x)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert out.tolist() == [f"Echo: {q}" for q in qs]
    return wall, cpu, tr


def main() -> None:
    repeats = int(os.environ.get("BENCH_REPEATS", "5"))
    server = Server(faults=False)
    try:
        run(server.url, questions("warm"), False)
        plain, traced, cpu_plain, cpu_traced = [], [], [], []
        for r in range(repeats):
            for flag in (False, True):
                w, c, _ = run(server.url, questions(f"r{r}{flag}"), flag)
                (traced if flag else plain).append(w)
                (cpu_traced if flag else cpu_plain).append(c)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        _, _, tr = run(server.url, questions("memory"), True)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        spans = len(tr.spans)
        requests = len(tr.find(kind="request"))
    finally:
        server.close()
    mp, mt = statistics.median(plain), statistics.median(traced)
    print(json.dumps({
        "bench": "trace", "requests": N, "concurrency": CONCURRENCY, "latency_s": LATENCY,
        "ideal_s": IDEAL, "plain_s": round(mp, 3), "traced_s": round(mt, 3),
        "overhead": round(mt / mp - 1.0, 4), "goal_overhead": 0.05,
        "cpu_per_request_plain_us": round(statistics.median(cpu_plain) / N * 1e6, 1),
        "cpu_per_request_traced_us": round(statistics.median(cpu_traced) / N * 1e6, 1),
        "trace_bytes_per_request": round((after - before) / requests),
        "spans": spans, "repeats": repeats,
        "runs_plain_s": [round(t, 3) for t in plain], "runs_traced_s": [round(t, 3) for t in traced],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
