"""Benchmark: `langtorch serve` under 64 concurrent AsyncOpenAI clients, mixed max_tokens 8-128.

The same load (same prompts, same max_tokens draw, greedy, streamed with usage) goes to:

* served: ``python -m langtorch serve`` (subprocess, warmed up) through 64 ``AsyncOpenAI``
  clients, one per concurrent worker;
* in-process: the same ``LocalBackend`` API called directly (``stream_events`` when the engine
  has it, else ``complete``) from 64 concurrent tasks: the ceiling the HTTP layer is measured
  against (goal: served >= 0.9x its tokens/s);
* llama-cpp-python's server (``python -m llama_cpp.server``) on the same GGUF file with all
  cores, ``--interrupt_requests False`` (its default lets each new request cut off the stream in
  progress) (goal: served ahead in tokens/s); ``skipped`` with the reason when it is not
  installed. It sends no usage chunk, so its streamed text is re-tokenised with the GGUF's own
  tokenizer. It is started through ``_llama_cpp.py``, which turns off llama.cpp's AMX weight
  repacking: on this VM (a Xeon reporting AMX) that path segfaults in any multi-token
  ``llama_decode`` (0.3.36). Should it still crash, it is rerun with ``n_ubatch=1``
  and says so.

Each target first gets a warm-up pass of the same load (compiles, caches), then the measured
pass. Reported per target: completion tokens/s (sum of usage over wall time), p50/p99 request
latency, p50/p99 time to first token, requests, tokens; for the served process also its resident
memory in MiB (``rss_mb``: when ready, steady after the passes, peak). Prints one JSON line.

Run on a quiet machine: ``python tests/benchmarks/bench_serve.py``; ``--quick`` for a smoke run;
``--max-slots N --served-only`` measures the server alone with ``N`` decode slots (how the
default of ``langtorch serve --max-slots`` was chosen: docs/benchmarks.md); ``--quantization
int8`` serves (and runs in process) with int8 weights.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.",
    "Explain photosynthesis to a child.", "List three uses of copper.",
    "Why is the sky blue?", "Give me a recipe for pancakes.",
    "Summarise the plot of Hamlet.", "What does a compiler do?",
    "Tell me a short story about a robot.", "How do vaccines work?",
    "Name five European rivers.", "What is 17 times 23?",
    "Describe a sunset in two sentences.", "What is machine learning?",
    "Translate 'good morning' into Spanish.", "Why do cats purr?",
]


def make_load(n: int, lo: int, hi: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
             "max_tokens": rng.randint(lo, hi), "temperature": 0} for i in range(n)]


def summary(records: list[tuple[float, float, int]], wall: float) -> dict:
    lat = np.array([r[0] for r in records])
    ttft = np.array([r[1] for r in records])
    tokens = int(sum(r[2] for r in records))
    return {"tokens_per_s": round(tokens / wall, 2), "wall_s": round(wall, 3),
            "requests": len(records), "completion_tokens": tokens,
            "latency_p50_s": round(float(np.percentile(lat, 50)), 4),
            "latency_p99_s": round(float(np.percentile(lat, 99)), 4),
            "ttft_p50_s": round(float(np.percentile(ttft, 50)), 4),
            "ttft_p99_s": round(float(np.percentile(ttft, 99)), 4)}


async def http_load(base_url: str, model: str, load: list[dict], clients: int,
                    count_tokens=None) -> dict:
    """Stream every request of ``load`` through ``clients`` AsyncOpenAI clients. Completion tokens
    come from the usage chunk; a server that sends none (llama-cpp-python) has its streamed text
    re-tokenised with ``count_tokens`` (the same GGUF's tokenizer)."""
    from openai import AsyncOpenAI

    queue: asyncio.Queue = asyncio.Queue()
    for body in load:
        queue.put_nowait(body)
    records: list[tuple[float, float, int]] = []
    counted: dict[str, bool] = {}

    # Every client is made before the clock starts: making one costs ~20 ms of this process's
    # event loop (an httpx client and its TLS context), and 64 made inside the workers delayed
    # the first requests' sends by up to ~1.5 s, time that was counted as the server's TTFT.
    pool = [AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
                for _ in range(clients)]

    async def worker(client) -> None:
        async with client:
            while not queue.empty():
                body = queue.get_nowait()
                t0 = time.perf_counter()
                first = None
                tokens, text = None, []
                stream = await client.chat.completions.create(
                    model=model, stream=True, stream_options={"include_usage": True}, **body)
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        text.append(chunk.choices[0].delta.content)
                        if first is None:
                            first = time.perf_counter() - t0
                    if chunk.usage is not None:
                        tokens = chunk.usage.completion_tokens
                total = time.perf_counter() - t0
                if tokens is None:
                    if count_tokens is None:
                        raise RuntimeError(f"{base_url} sent no usage chunk")
                    tokens = count_tokens("".join(text))
                    counted["retokenised"] = True
                records.append((total, total if first is None else first, tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*[worker(c) for c in pool])
    out = summary(records, time.perf_counter() - t0)
    out["tokens_from"] = "re-tokenised text" if counted else "usage"
    return out


async def in_process_load(backend, load: list[dict], clients: int) -> dict:
    from langtorch.backends import Usage

    sem = asyncio.Semaphore(clients)
    records: list[tuple[float, float, int]] = []

    async def one(body: dict) -> None:
        async with sem:
            t0 = time.perf_counter()
            first, tokens = None, 0
            if hasattr(backend, "stream_events"):
                async for event in backend.stream_events(dict(body)):
                    if isinstance(event, Usage):
                        tokens = event.completion_tokens
                    elif first is None and event.text:
                        first = time.perf_counter() - t0
            else:
                tokens = (await backend.complete(dict(body))).usage.completion_tokens
            total = time.perf_counter() - t0
            records.append((total, total if first is None else first, tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*[one(b) for b in load])
    return summary(records, time.perf_counter() - t0)


def rss_mb(pid: int) -> dict:
    """The resident memory of process ``pid`` in MiB: ``rss`` now (VmRSS) and ``peak`` (VmHWM)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["rss" if key == "VmRSS" else "peak"] = int(value.split()[0]) // 1024
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {url}")


def start_langtorch(clients: int, slots: int, quantization: str | None = None,
                    decode_dtype: str | None = None
                    ) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "langtorch", "serve", "--port", "0", "--embedding-model", "none",
         "--max-concurrency", str(clients), "--max-slots", str(slots),
         "--log-level", "WARNING",
         *(["--quantization", quantization] if quantization else []),
         *(["--decode-dtype", decode_dtype] if decode_dtype else [])],
        stdout=subprocess.PIPE, text=True)
    line = ""
    while "listening on" not in line:
        ready, _, _ = select.select([proc.stdout], [], [], 900)
        line = proc.stdout.readline() if ready else ""
        if not line:
            proc.kill()
            raise RuntimeError("langtorch serve did not start")
    return proc, re.search(r"(http://\S+/v1)", line).group(1)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_llama_cpp(gguf: str, load: list[dict], clients: int, count_tokens,
                  ubatch: int | None = None) -> dict:
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as e:
        return {"skipped": f"llama-cpp-python[server] is not installed ({e})"}
    port = free_port()
    threads = os.cpu_count() or 1
    proc = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_llama_cpp.py"),
         "--model", gguf, "--model_alias", "smollm2",
         "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
         "--n_threads_batch", str(threads), "--n_ctx", "2048",
         # By default a new request interrupts the one streaming: queue them instead.
         "--interrupt_requests", "False",
         *(["--n_batch", str(ubatch), "--n_ubatch", str(ubatch)] if ubatch else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", proc)
        url = f"http://127.0.0.1:{port}/v1"
        asyncio.run(http_load(url, "smollm2", load, clients, count_tokens))  # warm-up
        result = asyncio.run(http_load(url, "smollm2", load, clients, count_tokens))
        result["threads"] = threads
        result["n_ubatch"] = ubatch or "default"
        return result
    except Exception as e:  # noqa: BLE001 - the peer failing is reported, not fatal
        time.sleep(1)
        code = proc.poll()
        return {"skipped": f"llama_cpp.server failed: {type(e).__name__}: {e}"
                           + (f" (server exited with code {code})" if code is not None else "")}
    finally:
        if proc.poll() is None:
            stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (4 clients, 4-8 tokens)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--max-slots", type=int, default=None,
                    help="the server's and the in-process engine's decode slots (default: one "
                         "per client)")
    ap.add_argument("--decode-dtype", choices=("bfloat16", "float32"), default=None,
                    help="the server's and the in-process engine's decode weights' dtype "
                         "(default: the model's, fp32; bf16 is faster and not batch-invariant)")
    ap.add_argument("--quantization", choices=("int8",), default=None,
                    help="serve (and run in process) with int8 weights")
    ap.add_argument("--served-only", action="store_true",
                    help="measure the server only (slot-count sweeps)")
    args = ap.parse_args()
    clients, n, lo, hi = args.clients, args.requests, 8, 128
    if args.quick:
        clients, n, lo, hi = 4, 4, 4, 8
    load = make_load(n, lo, hi)
    slots = args.max_slots or clients

    proc, url = start_langtorch(clients, slots, args.quantization, args.decode_dtype)
    try:
        ready_rss = rss_mb(proc.pid)
        asyncio.run(http_load(url, "smollm2", load, clients))  # warm-up: every shape compiled
        served = asyncio.run(http_load(url, "smollm2", load, clients))
        # The server's resident memory: when it started listening, after both passes (steady
        # state) and its peak (docs/serving.md, "Memory").
        served["rss_mb"] = {"ready": ready_rss["rss"], **rss_mb(proc.pid)}
    finally:
        stop(proc)
    if args.served_only:
        print(json.dumps({"bench": "serve", "quick": args.quick, "clients": clients,
                          "requests": n, "max_tokens": [lo, hi], "max_slots": slots,
                          "quantization": args.quantization, "decode_dtype": args.decode_dtype,
                          "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
                          "served": served}))
        return

    from langtorch.backends import LocalBackend

    backend = LocalBackend(max_slots=slots, quantization=args.quantization,
                           decode_dtype=args.decode_dtype)
    asyncio.run(in_process_load(backend, load, clients))  # warm-up
    local = asyncio.run(in_process_load(backend, load, clients))
    gguf = str(backend.llm.path)
    encode = backend.llm.encode

    def count_tokens(text: str) -> int:
        return len(encode(text))

    peer = ({"skipped": "--no-llama-cpp"} if args.no_llama_cpp
            else run_llama_cpp(gguf, load, clients, count_tokens))
    if "code -11" in peer.get("skipped", ""):
        # Seen with llama-cpp-python 0.3.36 built from source here: every multi-token batch
        # (prompt prefill) segfaults in llama_decode; one-token micro-batches run. Rerun so
        # that a number exists, and say so: its prefill is token by token.
        crashed = peer["skipped"]
        peer = run_llama_cpp(gguf, load, clients, count_tokens, ubatch=1)
        peer["note"] = f"default n_ubatch crashed ({crashed}); measured with n_ubatch=1"
    out = {
        "bench": "serve", "quick": args.quick, "clients": clients, "requests": n,
        "max_tokens": [lo, hi], "max_slots": slots, "quantization": args.quantization,
        "decode_dtype": args.decode_dtype,
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(), "gguf": os.path.basename(gguf),
        "served": served, "in_process": local, "llama_cpp_server": peer,
        "served_vs_in_process": round(served["tokens_per_s"] / local["tokens_per_s"], 3),
        "served_vs_llama_cpp": (round(served["tokens_per_s"] / peer["tokens_per_s"], 3)
                                if peer.get("tokens_per_s") else None),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
