"""Benchmark: data-parallel scaling of embeddings and a prompt-tuning step over a device mesh.

Each configuration runs in its own subprocess (XLA's device count and threading are fixed when
JAX starts):

- ``1x1``: one CPU device, single-threaded (XLA intra-op parallelism 1, no multi-threaded Eigen);
- ``2x1``: two CPU devices, each single-threaded, ``mesh="auto"`` — on a 2-core machine this is
  the honest "1 vs 2 devices" comparison: ``efficiency = t(1x1) / (2 * t(2x1))``;
- ``1``: one CPU device with the default threading, and ``8v``: 8 virtual devices on the same
  cores (``--xla_force_host_platform_device_count=8``), ``mesh="auto"`` — ``overhead =
  t(8v) / t(1) - 1`` on the same total work: what sharding costs where it cannot help.

Work per configuration (same total work everywhere): MiniLM embeddings of ``--n`` random
sentences (median of ``--repeats`` after a warm-up) and a PromptTuner train call on the tiny
random-weight Llama (batch ``--batch`` sharded along ``data``; median step time after the
compile).

Prints one JSON line with the device kind, the per-configuration times and the efficiencies.
Run: ``python tests/benchmarks/bench_scaling.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "1x1": ("--xla_force_host_platform_device_count=1 --xla_cpu_multi_thread_eigen=false "
            "intra_op_parallelism_threads=1", False),
    "2x1": ("--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false "
            "intra_op_parallelism_threads=1", True),
    "1": ("--xla_force_host_platform_device_count=1", False),
    "8v": ("--xla_force_host_platform_device_count=8", True),
}


def _median_time(fn, repeats):
    fn()  # warm-up / compile
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def worker(args) -> dict:
    import jax

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_embed import sentences

    from langtorch.models import MiniLM

    mesh = "auto" if args.mesh else None
    texts = sentences(args.n)
    model = MiniLM(mesh=mesh)
    out = {"devices": jax.device_count(), "device_kind": jax.devices()[0].device_kind,
           "embed_s": _median_time(lambda: model.embed_texts(texts), args.repeats)}
    out["tune_step_s"] = tune_step_time(args, mesh)
    return out


def tune_step_time(args, mesh):
    """Median seconds of one optimizer step of a tiny soft-prompt tuning run (None if the tuner
    has no mesh support in this build)."""
    import inspect

    from langtorch.tuning import PromptTuner

    if "mesh" not in inspect.signature(PromptTuner).parameters:
        return None
    import jax

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "langtorch"))
    from conftest import TinyLM  # the test suite's tiny random-weight local model

    from langtorch.functional.models import llama
    from langtorch.models import default_llm

    cfg = llama.LlamaConfig(vocab_size=49152, hidden_size=64, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=16, intermediate_size=128,
                            max_positions=128)
    tiny = TinyLM(llama.random_params(jax.random.key(0), cfg), cfg, default_llm())
    labels = ["negative", "positive"]
    texts = [f"example number {i} " * 4 for i in range(args.batch)]
    targets = [labels[i % 2] for i in range(args.batch)]
    tuner = PromptTuner(tiny, n_tokens=4, labels=labels, mesh=mesh, seed=0, progress=False)
    tuner.fit(texts, targets, epochs=1, batch_size=args.batch)  # compile
    steps = max(2, args.repeats)
    t = time.perf_counter()
    tuner.fit(texts * steps, targets * steps, epochs=1, batch_size=args.batch)
    return (time.perf_counter() - t) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: 48 texts, 1 repeat")
    ap.add_argument("--worker", choices=sorted(CONFIGS))
    ap.add_argument("--mesh", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.n, args.repeats, args.batch = 48, 1, 8
    if args.worker:
        print("RESULT" + json.dumps(worker(args)))
        return

    results = {}
    for name, (flags, mesh) in CONFIGS.items():
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
        cmd = [sys.executable, __file__, "--worker", name, "--n", str(args.n),
               "--batch", str(args.batch), "--repeats", str(args.repeats)]
        proc = subprocess.run(cmd + (["--mesh"] if mesh else []), env=env, capture_output=True,
                              text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
        if proc.returncode or not lines:
            raise SystemExit(f"worker {name} failed:\n{proc.stderr[-3000:]}")
        results[name] = json.loads(lines[-1][len("RESULT"):])

    def ratio(a, b, scale=1.0):
        return None if a is None or b is None else round(a / (scale * b), 3)

    r = results
    print(json.dumps({
        "bench": "scaling", "device_kind": r["1"]["device_kind"], "cpu_count": os.cpu_count(),
        "n_texts": args.n, "tune_batch": args.batch,
        "embed_s": {k: round(v["embed_s"], 3) for k, v in r.items()},
        "tune_step_s": {k: None if v["tune_step_s"] is None else round(v["tune_step_s"], 4)
                        for k, v in r.items()},
        "embed_efficiency_2dev": ratio(r["1x1"]["embed_s"], r["2x1"]["embed_s"], 2),
        "tune_efficiency_2dev": ratio(r["1x1"]["tune_step_s"], r["2x1"]["tune_step_s"], 2),
        "embed_overhead_8v_vs_1": None if r["1"]["embed_s"] is None else
        round(r["8v"]["embed_s"] / r["1"]["embed_s"] - 1, 3),
        "tune_overhead_8v_vs_1": None if r["1"]["tune_step_s"] is None else
        round(r["8v"]["tune_step_s"] / r["1"]["tune_step_s"] - 1, 3),
        "note": "CPU devices only; GPU/TPU not run. 2x1 = two single-threaded CPU devices.",
        "repeats": args.repeats, "statistic": "median",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
