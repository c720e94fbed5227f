"""Benchmark: top-10 retrieval for 256 queries over a 1,000,000 x 384 corpus.

Ours: ``langtorch.functional.topk`` (jitted chunked matmul + ``lax.top_k``, running merge; never
holds the 256 x 1M score matrix). Peers: numpy (BLAS matmul + ``argpartition``) and torch
(``mm`` + ``topk``), both on the full score matrix. Unit-length float32 vectors, ``metric="dot"``
for all; results are checked to agree. Medians of ``--repeats`` runs after one warm-up each.

``--mesh`` adds ours with ``mesh="auto"`` (the corpus split row-wise over the local devices; run
with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` on a CPU to get N devices).

Prints one JSON line. Run: ``python tests/benchmarks/bench_retrieval.py`` (``--quick`` for a
smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mesh", action="store_true", help="also time mesh='auto'")
    ap.add_argument("--quick", action="store_true", help="smoke run: 20,000 rows, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.n, args.repeats = 20_000, 1

    import jax
    import torch

    import langtorch.functional as F

    rng = np.random.default_rng(0)
    corpus = rng.standard_normal((args.n, 384), dtype=np.float32)
    corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
    queries = corpus[rng.integers(0, args.n, args.queries)] + 0.1 * rng.standard_normal(
        (args.queries, 384), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    corpus_dev = jax.device_put(corpus)  # a JAX-resident corpus, as a retrieval index holds it
    torch.set_num_threads(os.cpu_count() or 1)
    tc, tq = torch.from_numpy(corpus), torch.from_numpy(queries)

    def ours():
        return F.topk(queries, corpus_dev, k=args.k, metric="dot")[1]

    def with_numpy():
        s = queries @ corpus.T
        part = np.argpartition(-s, args.k, axis=1)[:, :args.k]
        order = np.argsort(-np.take_along_axis(s, part, 1), axis=1)
        return np.take_along_axis(part, order, 1)

    def with_torch():
        return torch.topk(tq @ tc.T, args.k, dim=1).indices.numpy()

    fns = {"ours": ours, "numpy": with_numpy, "torch": with_torch}
    if args.mesh:
        from langtorch.functional import sharding as S

        mesh = S.resolve_mesh("auto")
        corpus_sharded, _ = S.shard_batch(corpus, mesh, name="corpus")

        def ours_mesh():
            return F.topk(queries, corpus_sharded, k=args.k, metric="dot", mesh=mesh)[1]

        fns["ours_mesh"] = ours_mesh
    results = {k: f() for k, f in fns.items()}  # warm-up (and compile)
    agree = {k: float(np.mean(results[k] == results["numpy"])) for k in fns if k != "numpy"}
    times = {k: [] for k in fns}
    for _ in range(args.repeats):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({
        "bench": "retrieval", "corpus": [args.n, 384], "queries": args.queries, "k": args.k,
        "ours_s": round(med["ours"], 3), "numpy_s": round(med["numpy"], 3),
        "torch_s": round(med["torch"], 3),
        "ratio_vs_numpy": round(med["numpy"] / med["ours"], 2),
        "ratio_vs_torch": round(med["torch"] / med["ours"], 2),
        "index_agreement": agree,
        "ours_mesh_s": round(med["ours_mesh"], 3) if args.mesh else None,
        "mesh_devices": jax.device_count() if args.mesh else None,
        "device_kind": jax.devices()[0].device_kind,
        "peer": f"numpy {np.__version__} / torch {torch.__version__} "
                f"(threads={torch.get_num_threads()})",
        "repeats": args.repeats, "statistic": "median",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
