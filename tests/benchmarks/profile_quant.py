"""Profile: the int8 products of ``quantization="int8"`` against fp32 and bf16 ones, in isolation
and inside a decode loop, on this machine.

Two tables, one process (quiet machine; ``uptime`` load under 1):

* **one product** ``[M, 576] x [576, N]`` at SmolLM2-135M's MLP (``N = 1536``) and LM-head
  (``N = 49152``) shapes, ``M`` from 1 to 1024 rows: fp32, bf16 operands with fp32 accumulation
  (what bf16 params run), int8 weights converted to fp32 before an fp32 product (int8 *weights*
  only: XLA:CPU materialises the converted weight), and ours
  (:func:`langtorch.functional.models.quant.quantized_dot`: each row's int8 part and remainder
  in one int8 x int8 -> int32 product, twice the rows). Best of 5, milliseconds.
* **a 30-layer MLP stack inside a ``while_loop``** of 8 steps (the decode chunk's structure:
  weights read once per step, 318 MB in fp32): ms per step, fp32 vs bf16 vs ours.

Prints both tables, then one JSON line with the ratios (fp32 time / ours) and the machine's
GEMM ceilings. Run::

    python tests/benchmarks/profile_quant.py
"""

from __future__ import annotations

import json
import os
import statistics
import time


def _best(f, *args, inner=10):
    f(*args).block_until_ready()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(inner):
            r = f(*args)
        r.block_until_ready()
        times.append((time.perf_counter() - t) / inner)
    return min(times) * 1e3


def main() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from _gemm import gemm_ceilings

    from langtorch.functional.models import quant

    rng = np.random.default_rng(0)
    f32 = jax.jit(lambda x, w: x @ w)
    bf16 = jax.jit(lambda x, w: jnp.matmul(x.astype(jnp.bfloat16), w,
                                           preferred_element_type=jnp.float32))
    wonly = jax.jit(lambda x, m: (x @ m.q.astype(jnp.float32)) * m.scale)
    ours = jax.jit(lambda x, m: quant.quantized_dot(x, m))
    rows = []
    print(f"{'product':>22} {'M':>5} {'fp32':>8} {'bf16':>8} {'w-only':>8} {'ours':>8}  ms")
    for n in (1536, 49152):
        w = rng.standard_normal((576, n)).astype(np.float32)
        wf, wb, m = jnp.asarray(w), jnp.asarray(w, jnp.bfloat16), quant.quantize(w)
        for mm in (1, 2, 4, 16, 64, 256, 1024):
            if n == 49152 and mm > 64:
                continue  # the engine computes logits at a prompt's last position only
            x = jnp.asarray(rng.standard_normal((mm, 576)).astype(np.float32))
            inner = 20 if n == 1536 else 3
            t = [_best(f, x, a, inner=inner) for f, a in ((f32, wf), (bf16, wb), (wonly, m),
                                                          (ours, m))]
            rows.append({"n": n, "m": mm, "fp32_ms": round(t[0], 4), "bf16_ms": round(t[1], 4),
                         "int8_weight_only_ms": round(t[2], 4), "ours_ms": round(t[3], 4)})
            print(f"{f'[M,576]x[576,{n}]':>22} {mm:>5} " + " ".join(f"{v:8.3f}" for v in t))

    # The decode loop: 30 layers of gate/up/down inside an 8-step while_loop.
    layers, h, f = 30, 576, 1536
    shapes = ((h, f), (h, f), (f, h))
    wf = [[jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.02) for s in shapes]
          for _ in range(layers)]
    wb = [[a.astype(jnp.bfloat16) for a in lay] for lay in wf]
    wq = [[quant.quantize(a) for a in lay] for lay in wf]
    prods = {"fp32": (lambda x, w: x @ w, wf),
             "bf16": (lambda x, w: jnp.matmul(x.astype(jnp.bfloat16), w,
                                              preferred_element_type=jnp.float32), wb),
             "ours": (quant.quantized_dot, wq)}

    def loop(mm, ws, x, steps=8):
        def body(c):
            i, x = c
            for g, u, d in ws:
                x = x + mm(jax.nn.silu(mm(x, g)) * mm(x, u), d) * 1e-2
            return i + 1, x
        return jax.lax.while_loop(lambda c: c[0] < steps, body, (0, x))[1]

    stack = []
    print(f"\n{'30-layer MLP stack':>22} {'M':>5} {'fp32':>8} {'bf16':>8} {'ours':>8}  ms/step")
    for mm in (1, 2, 16, 64):
        x = jnp.asarray(rng.standard_normal((mm, h)).astype(np.float32)) * 0.1
        t = {}
        for name, (prod, ws) in prods.items():
            fn = jax.jit(lambda x, ws, prod=prod: loop(prod, ws, x))
            t[name] = _best(fn, x, ws, inner=1) / 8
        stack.append({"m": mm, **{f"{k}_ms_per_step": round(v, 3) for k, v in t.items()},
                      "fp32_over_ours": round(t["fp32"] / t["ours"], 2)})
        print(f"{'':>22} {mm:>5} {t['fp32']:8.2f} {t['bf16']:8.2f} {t['ours']:8.2f}")
    ratios = [r["fp32_ms"] / r["ours_ms"] for r in rows]
    print(json.dumps({"bench": "profile_quant", "products": rows, "mlp_stack": stack,
                      "fp32_over_ours_median_product": round(statistics.median(ratios), 2),
                      **gemm_ceilings(), "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
