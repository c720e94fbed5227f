"""The machine's measured matmul ceilings, reported next to every generation benchmark number.

The CPU kind changes from run to run, so each benchmark line carries the fp32 and bf16 GEMM
throughput measured in the same process (XLA, square 1024 matrices, best of 5), and the
single-row (M=1) GEMV rates that bound single-stream decoding. ``bf16`` is a bf16 product with a
bf16 result (XLA:CPU's slow path), ``bf16_acc32`` the same operands accumulated and returned in
float32 (what the models run: ``functional/models/matmul.py``), ``int8`` int8 operands
accumulated in int32 (what ``quantization="int8"`` runs: ``functional/models/quant.py``; XLA
runs a one-row int8 product as a slow reduction: the engine's products have two rows or more).
"""

from __future__ import annotations

import time


def gemm_ceilings(n: int = 1024, repeats: int = 5) -> dict:
    """``{"gemm_fp32_gflops", "gemm_bf16_gflops", "gemm_bf16_acc32_gflops", "gemm_int8_gflops",
    "gemv_fp32_gflops", "gemv_bf16_gflops", "gemv_bf16_acc32_gflops", "gemv_int8_gflops"}``
    (int8: giga integer operations per second)."""
    import jax
    import jax.numpy as jnp

    out = {}
    for name, m in (("gemm", n), ("gemv", 1)):
        for dt, label, acc in ((jnp.float32, "fp32", None), (jnp.bfloat16, "bf16", None),
                               (jnp.bfloat16, "bf16_acc32", jnp.float32),
                               (jnp.int8, "int8", jnp.int32)):
            a = jnp.ones((m, n), dt)
            b = jnp.ones((n, n), dt)
            f = jax.jit(lambda x, y, acc=acc: jnp.matmul(x, y, preferred_element_type=acc))
            f(a, b).block_until_ready()
            inner = max(1, 64 // max(1, m // 16)) if m == 1 else 4
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                for _ in range(inner):
                    r = f(a, b)
                r.block_until_ready()
                best = min(best, (time.perf_counter() - t) / inner)
            out[f"{name}_{label}_gflops"] = round(2 * m * n * n / best / 1e9, 1)
    return out
