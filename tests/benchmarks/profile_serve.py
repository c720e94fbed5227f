"""Profile of `langtorch serve`'s time to first token: where a streamed request's wait goes.

Runs the load of ``bench_serve.py`` (64 AsyncOpenAI clients, 128 chat requests, max_tokens
8-128, greedy, streamed; a warm-up pass, then the measured one) against a ``langtorch serve``
child process whose request path and engine are wrapped to record wall-clock stamps:

* per request (matched by an ``x-langtorch-probe`` header): ``send`` (the client, just before
  the request) -> ``arrive`` (the route handler starts) -> ``prepared`` (chat template and
  tokens, in a worker thread) -> ``submit`` (queued for the engine) -> ``admit`` (the engine
  thread takes it) -> ``first_delta`` (its first text leaves the engine) -> ``loop`` (the event
  loop has it) -> ``client`` (the client's first content chunk);
* per engine call: each prefill call (rows, wall), each join (writing prompts into the cache
  and picking first tokens; it also waits for the prefill computation, which runs
  asynchronously), each cache resize (rows, length, wall) and each decode chunk (rows, cache
  length, wall).

Prints a table of the stages (p50 / mean / p90; and p50 for the first 64 requests, which
arrive as one burst, and the last 64, which arrive one at a time as others finish), the
engine's time by kind over the measured pass, and one JSON line. Run on a quiet machine::

    python tests/benchmarks/profile_serve.py
    python tests/benchmarks/profile_serve.py --max-slots 16 --quantization int8

The stamps cost a few microseconds each (a lock and a list append); the resize stamp waits for
its device work (``block_until_ready``), which the real server does not do; a join waits for its
first tokens (and so for the prefill computation before them), not for its cache write. The
per-stage times are for reading where the time goes; ``bench_serve.py`` is the throughput
benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HEADER = "x-langtorch-probe"
STAGES = ("send", "arrive", "prepared", "submit", "admit", "first_delta", "loop", "client")


def server_child(out: str, argv: list[str]) -> None:
    """Wrap the serving path with stamps, then run ``langtorch serve argv``; the stamps are
    written to ``out`` (JSON) every second."""
    import contextvars
    import threading

    import jax

    from langtorch.functional import engine as E
    from langtorch.models import _engine
    from langtorch.serve import _app

    log: list = []
    lock = threading.Lock()
    rid_var: contextvars.ContextVar = contextvars.ContextVar("probe", default=None)

    def rec(*item) -> None:
        with lock:
            log.append((time.time(), *item))

    def dump() -> None:
        while True:
            time.sleep(1.0)
            with lock:
                data = list(log)
            with open(out + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace(out + ".tmp", out)

    threading.Thread(target=dump, daemon=True, name="probe-dump").start()

    chat = _app.ServeState.chat

    async def chat_(self, request):
        rid_var.set(request.headers.get(HEADER))
        rec("arrive", rid_var.get())
        return await chat(self, request)

    stream = _app.ServeState._stream

    async def stream_(self, request, call, prepared):
        rec("prepared", rid_var.get())
        return await stream(self, request, call, prepared)

    events = _app._events

    async def events_(backend, request):
        rid, first = rid_var.get(), True
        async for e in events(backend, request):
            if first and getattr(e, "text", ""):
                first = False
                rec("loop", rid)
            yield e

    submit = _engine.Engine.submit

    def submit_(self, seqs, **kw):
        rid = rid_var.get()
        rec("submit", rid)
        on_delta, seen = kw["on_delta"], []

        def delta(i, text):
            if not seen:
                seen.append(True)
                rec("first_delta", rid)
            on_delta(i, text)

        kw["on_delta"] = delta
        for s in seqs:
            s.probe = rid
        return submit(self, seqs, **kw)

    admit = _engine.Engine._admit

    def admit_(self, take):
        for s in take:
            rec("admit", getattr(s, "probe", None))
        return admit(self, take)

    def timed(kind, fn, sync, info=lambda *a, **k: ()):
        def wrapper(*a, **k):
            t = time.time()
            r = fn(*a, **k)
            if sync:
                jax.block_until_ready(r)
            rec(kind, time.time() - t, *info(*a, **k))
            return r
        return wrapper

    _app.ServeState.chat, _app.ServeState._stream, _app._events = chat_, stream_, events_
    _engine.Engine.submit, _engine.Engine._admit = submit_, admit_
    E.SlotBatch._prefill_call = timed("prefill_call", E.SlotBatch._prefill_call, False,
                                      lambda self, jobs: (len(jobs),))
    E.SlotBatch._join = timed("join", E.SlotBatch._join, False, lambda self, jobs: (len(jobs),))
    E._resize = timed("resize", E._resize, True, lambda *a, rows, length: (rows, length))
    decode_step = E.SlotBatch._decode_step

    def decode_step_(self):
        t = time.time()
        r = decode_step(self)
        rec("decode", time.time() - t, self._rows, self._len)
        return r

    E.SlotBatch._decode_step = decode_step_
    from langtorch.serve import main

    sys.argv = ["langtorch", "serve", *argv]
    sys.exit(main())


async def load_pass(url: str, load: list[dict], clients: int, tag: str) -> tuple[dict, float]:
    from openai import AsyncOpenAI

    queue: asyncio.Queue = asyncio.Queue()
    for i, body in enumerate(load):
        queue.put_nowait((f"{tag}{i}", body))
    pool = [AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
            for _ in range(clients)]
    got: dict = {}

    async def worker(client) -> None:
        async with client:
            while not queue.empty():
                rid, body = queue.get_nowait()
                t0, first, tokens = time.time(), None, 0
                stream = await client.chat.completions.create(
                    model="smollm2", stream=True, stream_options={"include_usage": True},
                    extra_headers={HEADER: rid}, **body)
                async for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.time()
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                got[rid] = (t0, first, tokens)

    t = time.time()
    await asyncio.gather(*[worker(c) for c in pool])
    return got, time.time() - t


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    import numpy as np

    a = np.asarray(xs)
    return (float(np.percentile(a, 50)), float(a.mean()), float(np.percentile(a, 90)))


def report(stamps: list, client: dict, wall: float, burst: int) -> dict:
    start = min(c[0] for c in client.values())
    per: dict = collections.defaultdict(dict)
    for t, kind, *rest in stamps:
        if kind in STAGES and rest and rest[0] in client:
            per[rest[0]].setdefault(kind, t)
    rows = []
    for rid, (t0, first, _) in client.items():
        at = {"send": t0, **per[rid], "client": first}
        if first is None or any(k not in at for k in STAGES):
            continue  # no text (an empty answer) or a stamp missing: not in the table
        rows.append((int(rid[1:]), [at[b] - at[a] for a, b in zip(STAGES, STAGES[1:])]
                     + [first - t0]))
    names = [f"{a} -> {b}" for a, b in zip(STAGES, STAGES[1:])] + ["TTFT (send -> client)"]
    table = {}
    print(f"{'stage':28s} {'p50':>7s} {'mean':>7s} {'p90':>7s} {'p50 burst':>10s} "
          f"{'p50 later':>10s}   (seconds)")
    for j, name in enumerate(names):
        all_ = quantiles([r[1][j] for r in rows])
        early = quantiles([r[1][j] for r in rows if r[0] < burst] or [float("nan")])[0]
        late = quantiles([r[1][j] for r in rows if r[0] >= burst] or [float("nan")])[0]
        table[name] = {"p50": round(all_[0], 4), "mean": round(all_[1], 4),
                       "p90": round(all_[2], 4), "p50_burst": round(early, 4),
                       "p50_later": round(late, 4)}
        print(f"{name:28s} {all_[0]:7.3f} {all_[1]:7.3f} {all_[2]:7.3f} {early:10.3f} "
              f"{late:10.3f}")
    engine = {}
    for kind in ("prefill_call", "join", "resize", "decode"):
        xs = [s for s in stamps if s[1] == kind and s[0] >= start]
        shapes = collections.Counter(tuple(s[3:]) for s in xs)
        engine[kind] = {"calls": len(xs), "seconds": round(sum(s[2] for s in xs), 3),
                        "shapes": {"x".join(map(str, k)): v for k, v in shapes.items()}}
        print(f"{kind:13s} {len(xs):4d} calls {engine[kind]['seconds']:7.2f} s of "
              f"{wall:.1f} s wall   {dict(shapes.most_common(6))}")
    return {"stages": table, "engine": engine}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--max-slots", type=int, default=None,
                    help="the server's decode slots (default: one per client)")
    ap.add_argument("--quantization", choices=("int8",), default=None)
    ap.add_argument("--server-child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.server_child is not None:
        out, *argv = args.server_child
        server_child(out, argv)
        return
    import bench_serve as B

    slots = args.max_slots or args.clients
    with tempfile.TemporaryDirectory(prefix="langtorch-profile-serve-") as tmp:
        out = os.path.join(tmp, "stamps.json")
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--server-child", out, "--port", "0",
             "--embedding-model", "none", "--max-concurrency", str(args.clients),
             "--max-slots", str(slots), "--log-level", "WARNING",
             *(["--quantization", args.quantization] if args.quantization else [])],
            stdout=subprocess.PIPE, text=True)
        try:
            line = ""
            while "listening on" not in line:
                line = proc.stdout.readline()
                if not line and proc.poll() is not None:
                    raise SystemExit("profile_serve: the server did not start")
            url = re.search(r"(http://\S+/v1)", line).group(1)
            load = B.make_load(args.requests, 8, 128)
            asyncio.run(load_pass(url, load, args.clients, "w"))  # warm-up: shapes compiled
            client, wall = asyncio.run(load_pass(url, load, args.clients, "m"))
            time.sleep(2.5)  # the child writes its stamps every second
            with open(out) as f:
                stamps = json.load(f)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    tokens = sum(c[2] for c in client.values())
    print(f"{tokens / wall:.1f} tokens/s, {len(client)} requests, {wall:.1f} s")
    out = report(stamps, client, wall, burst=args.clients)
    print(json.dumps({"profile": "serve", "clients": args.clients, "requests": args.requests,
                      "max_slots": slots, "quantization": args.quantization,
                      "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
                      "tokens_per_s": round(tokens / wall, 2), **out}))


if __name__ == "__main__":
    main()
