"""Benchmark: 2,000 chat requests at concurrency 100 against the loopback server (100 ms latency).

Peers, measured in the same run against the same server:

* ours: ``langtorch.nn.LLM(OpenAIBackend(..., max_concurrency=100))`` on a [2000] TextTensor;
* LangChain: ``ChatOpenAI(...).batch(..., config={"max_concurrency": 100})`` (the ``test`` extra;
  reported as null when ``langchain_openai`` is not installed);
* a hand-written ``AsyncOpenAI`` + ``asyncio.Semaphore(100)`` loop;
* the ideal: 2000 / 100 * 0.1 s = 2.0 s.

Then the same 2,000 requests with 10% 429s (Retry-After 0.1 s) and 5% 500s injected: ours must
return every answer, correct and in order.

The server runs in a subprocess so that its CPU time does not compete with the client for the
GIL. Each peer runs ``BENCH_REPEATS`` times (default 3), interleaved; the median counts (all
runs are listed). Prints two JSON lines (plain, then with faults).
Run: ``python tests/benchmarks/bench_llm.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

N = 2000
CONCURRENCY = 100
LATENCY = 0.1
IDEAL = N / CONCURRENCY * LATENCY

_SERVER = """
import sys
from langtorch.testing import OpenAIServer
faults = {"rate_limit": 0.10, "server_error": 0.05} if sys.argv[2] == "faults" else None
server = OpenAIServer(latency=float(sys.argv[1]), faults=faults, retry_after=0.1, seed=1).start()
print(server.url, flush=True)
sys.stdin.read()
"""


class Server:
    def __init__(self, faults: bool):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(LATENCY), "faults" if faults else "none"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def questions(prefix: str) -> list[str]:
    return [f"{prefix} question {i}" for i in range(N)]


def bench_ours(url: str, qs: list[str], **options) -> tuple[float, list[str]]:
    import langtorch as lt
    from langtorch.backends import OpenAIBackend

    backend = OpenAIBackend("m", base_url=url, api_key="sk-bench-000000",
                            max_concurrency=CONCURRENCY, **options)
    llm = lt.nn.LLM(backend, temperature=0)
    llm(lt.TextTensor([f"warm-up {i}" for i in range(CONCURRENCY)]), progress=False)
    start = time.perf_counter()
    out = llm(lt.TextTensor(qs), progress=False)
    return time.perf_counter() - start, out.tolist()


def bench_langchain(url: str, qs: list[str]) -> float | None:
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        return None
    model = ChatOpenAI(model="m", base_url=url, api_key="sk-bench-000000", temperature=0)
    config = {"max_concurrency": CONCURRENCY}
    model.batch([f"warm-up {i}" for i in range(CONCURRENCY)], config=config)
    start = time.perf_counter()
    answers = model.batch(qs, config=config)
    elapsed = time.perf_counter() - start
    assert [a.content for a in answers] == [f"Echo: {q}" for q in qs]
    return elapsed


def bench_hand_loop(url: str, qs: list[str]) -> float:
    import openai

    async def main() -> float:
        client = openai.AsyncOpenAI(base_url=url, api_key="sk-bench-000000", max_retries=0)
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(q: str) -> str:
            async with sem:
                r = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": q}], temperature=0)
                return r.choices[0].message.content

        await asyncio.gather(*(one(f"warm-up {i}") for i in range(CONCURRENCY)))
        start = time.perf_counter()
        answers = await asyncio.gather(*(one(q) for q in qs))
        elapsed = time.perf_counter() - start
        assert answers == [f"Echo: {q}" for q in qs]
        await client.close()
        return elapsed

    return asyncio.run(main())


def median(times: list[float | None]) -> float | None:
    """Median of the repeats (the machines here are shared and noisy; all runs are printed too)."""
    real = [t for t in times if t is not None]
    return statistics.median(real) if real else None


def main() -> None:
    repeats = int(os.environ.get("BENCH_REPEATS", "3"))
    ours, langchain, hand = [], [], []
    server = Server(faults=False)
    try:
        for r in range(repeats):  # interleaved, so a burst of outside load hits every peer alike
            qs = questions(f"plain {r}")
            elapsed, answers = bench_ours(server.url, qs)
            assert answers == [f"Echo: {q}" for q in qs]
            ours.append(elapsed)
            langchain.append(bench_langchain(server.url, questions(f"langchain {r}")))
            hand.append(bench_hand_loop(server.url, questions(f"hand {r}")))
    finally:
        server.close()

    faulty = Server(faults=True)
    try:
        qs = questions("faulty")
        ours_faults, answers = bench_ours(faulty.url, qs, max_retries=8)
        correct = answers == [f"Echo: {q}" for q in qs]
    finally:
        faulty.close()

    o, lc, h = median(ours), median(langchain), median(hand)
    print(json.dumps({
        "bench": "llm_batch_2000_c100_100ms",
        "repeats": repeats,
        "ours_s": round(o, 3),
        "langchain_s": None if lc is None else round(lc, 3),
        "hand_asyncopenai_semaphore_s": round(h, 3),
        "ideal_s": IDEAL,
        "ratio_ours_vs_ideal": round(o / IDEAL, 3),
        "speedup_vs_langchain": None if lc is None else round(lc / o, 3),
        "speedup_vs_hand_loop": round(h / o, 3),
        "all_runs_s": {"ours": [round(t, 3) for t in ours],
                       "langchain": [None if t is None else round(t, 3) for t in langchain],
                       "hand": [round(t, 3) for t in hand]},
    }))
    print(json.dumps({
        "bench": "llm_batch_2000_c100_100ms_faults",
        "rate_limit_429": 0.10,
        "server_error_500": 0.05,
        "ours_s": round(ours_faults, 3),
        "ideal_s": IDEAL,
        "all_correct_in_order": correct,
    }))


if __name__ == "__main__":
    main()
