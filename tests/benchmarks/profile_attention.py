"""Decode-step attention formulations on XLA:CPU: alternated timings and optimized-HLO op counts.

The decode step attends one new token per row over the cached context (fp32 cache, heads-major
``[R, Nkv, C, D]``, SmolLM2's 9 query / 3 KV heads, head_dim 64). This script times, on the
decode shapes ``ROWSxCONTEXT`` (default 1x256, 16x256, 16x1024, 64x1024), jitted (``--heads``
picks another model's query heads / KV heads / head dim, e.g. ``gemma3``: 4 / 1 / 256):

* ``a_einsum``: the engine's formulation (:func:`langtorch.functional.models.decoder.block`):
  one ``bkqd,bksd->bkqs`` product per (row, KV head) with the ``g`` query heads as rows, fp32
  softmax, then ``bkqs,bksd->bkqd``;
* ``b_mulreduce``: multiply + reduce over ``D`` for the scores and over ``C`` for the output
  (an elementwise fusion instead of tiny batched dots);
* ``c_kT``: keys stored transposed ``[R, Nkv, D, C]``, scores ``[g, D] x [D, C]`` contiguous in
  ``C``; values as in (a);
* ``d_kT_mulreduce``: keys transposed with the scores as a multiply + reduce over ``D`` (the
  reduction over the major axis, vectorised over ``C``), the output as in (a);
* ``e_blocks``: the context split into blocks with an online (running max / sum) softmax,
  a ``lax.scan`` over blocks (flash-decoding's formulation).

Each call runs ``--layers`` layers' attention (unrolled; each layer reads its own cache arrays,
as the engine's decode step does; the layer count is chosen so that the caches read per call
exceed the last-level cache, capped at 30), so the timings see the memory traffic of a real
step. The variants are timed alternating ``a, b, c, d, e, a, ...`` in one process for
``--rounds`` rounds; a variant's time is its best round and the reported ratio is
``variant / a`` of the best rounds, with the median over rounds of the same round's
``variant / a`` beside it (the machine is shared: compare the ratios, not the milliseconds). Every
variant is checked against (a) (max abs difference of the outputs) before it is timed.

The optimized HLO of each variant (one layer) is summarised by opcode counts (dots, fusions,
reduces, transposes, copies) so the formulation's program can be compared without time.

Prints a table and one JSON line. Run::

    python tests/benchmarks/profile_attention.py
    python tests/benchmarks/profile_attention.py --shapes 16x256 --rounds 9
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

HEADS = {"smollm2": (9, 3, 64), "gemma3": (4, 1, 256), "qwen2": (14, 2, 64)}  # Nq, Nkv, D
BLOCK = 128
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*[^=]*?\s([\w\-]+)\(")


def _bias(valid):  # [R, C] bool -> additive bias [R, 1, 1, C]
    return jnp.where(valid, 0.0, jnp.finfo(jnp.float32).min)[:, None, None, :]


def attn_a(q, k, v, bias):
    """Today's: q [R, Nkv, g, D]; k, v [R, Nkv, C, D]."""
    s = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32) * q.shape[-1] ** -0.5
    p = jax.nn.softmax(s + bias, axis=-1)
    return jnp.einsum("bkqs,bksd->bkqd", p, v, preferred_element_type=jnp.float32)


def attn_b(q, k, v, bias):
    s = jnp.sum(q[:, :, :, None, :] * k[:, :, None, :, :], axis=-1) * q.shape[-1] ** -0.5
    p = jax.nn.softmax(s + bias, axis=-1)
    return jnp.sum(p[..., None] * v[:, :, None, :, :], axis=-2)


def attn_c(q, kt, v, bias):
    """kt [R, Nkv, D, C]."""
    s = jnp.einsum("bkqd,bkds->bkqs", q, kt, preferred_element_type=jnp.float32) * q.shape[-1] ** -0.5
    p = jax.nn.softmax(s + bias, axis=-1)
    return jnp.einsum("bkqs,bksd->bkqd", p, v, preferred_element_type=jnp.float32)


def attn_d(q, kt, v, bias):
    s = jnp.sum(q[..., None] * kt[:, :, None, :, :], axis=-2) * q.shape[-1] ** -0.5
    p = jax.nn.softmax(s + bias, axis=-1)
    return jnp.einsum("bkqs,bksd->bkqd", p, v, preferred_element_type=jnp.float32)


def attn_e(q, k, v, bias):
    r, nkv, c, d = k.shape
    nb = max(c // BLOCK, 1)
    kb = k.reshape(r, nkv, nb, c // nb, d)
    vb = v.reshape(r, nkv, nb, c // nb, d)
    bb = bias.reshape(r, 1, 1, nb, c // nb)

    def step(carry, j):
        m, den, acc = carry
        kj = jax.lax.dynamic_index_in_dim(kb, j, axis=2, keepdims=False)
        vj = jax.lax.dynamic_index_in_dim(vb, j, axis=2, keepdims=False)
        bj = jax.lax.dynamic_index_in_dim(bb, j, axis=3, keepdims=False)
        s = jnp.einsum("bkqd,bksd->bkqs", q, kj, preferred_element_type=jnp.float32) * q.shape[-1] ** -0.5
        s = s + bj
        m2 = jnp.maximum(m, s.max(-1))
        a = jnp.exp(m - m2)
        e = jnp.exp(s - m2[..., None])
        den2 = den * a + e.sum(-1)
        acc2 = acc * a[..., None] + jnp.einsum("bkqs,bksd->bkqd", e, vj,
                                               preferred_element_type=jnp.float32)
        return (m2, den2, acc2), None

    init = (jnp.full(q.shape[:-1], -jnp.inf, jnp.float32), jnp.zeros(q.shape[:-1], jnp.float32),
            jnp.zeros(q.shape, jnp.float32))
    (_, den, acc), _ = jax.lax.scan(step, init, jnp.arange(nb))
    return acc / den[..., None]


VARIANTS = {"a_einsum": (attn_a, False), "b_mulreduce": (attn_b, False),
            "c_kT": (attn_c, True), "d_kT_mulreduce": (attn_d, True),
            "e_blocks": (attn_e, False)}


def stepper(fn):
    """``layers`` layers' attention, each on its own cache arrays, chained through q."""
    def run(q, ks, vs, bias):
        out = jnp.zeros_like(q)
        for k, v in zip(ks, vs):
            o = fn(q + 1e-3 * out, k, v, bias)
            out = out + o
        return out
    return jax.jit(run)


def op_counts(fn, args) -> dict:
    text = jax.jit(fn).lower(*args).compile().as_text()
    ops = collections.Counter()
    for line in text.splitlines():
        m = _OP.match(line)
        if m:
            ops[m.group(1)] += 1
    keep = ("dot", "fusion", "reduce", "transpose", "copy", "while", "custom-call")
    return {k: ops.get(k, 0) for k in keep}


def profile_shape(rows: int, ctx: int, rounds: int, max_layers: int, heads: tuple,
                  seed: int = 0) -> dict:
    nq, nkv, d = heads
    rng = np.random.default_rng(seed)
    per_layer = 2 * rows * nkv * ctx * d * 4
    layers = int(min(max_layers, max(2, -(-256 * 2 ** 20 // per_layer))))
    q = jnp.asarray(rng.standard_normal((rows, nkv, nq // nkv, d)), jnp.float32)
    ks = [jnp.asarray(rng.standard_normal((rows, nkv, ctx, d)), jnp.float32)
          for _ in range(layers)]
    vs = [jnp.asarray(rng.standard_normal((rows, nkv, ctx, d)), jnp.float32)
          for _ in range(layers)]
    kts = [jnp.swapaxes(k, -1, -2) for k in ks]
    lens = rng.integers(ctx // 2, ctx + 1, rows)
    bias = _bias(jnp.asarray(np.arange(ctx)[None, :] < lens[:, None]))
    fns, args = {}, {}
    ref = None
    errors, hlo = {}, {}
    for name, (fn, transposed) in VARIANTS.items():
        fns[name] = stepper(fn)
        args[name] = (q, kts if transposed else ks, vs, bias)
        out = np.asarray(jax.block_until_ready(fns[name](*args[name])))
        if ref is None:
            ref = out
        errors[name] = float(np.max(np.abs(out - ref)))
        hlo[name] = op_counts(fn, (q, args[name][1][0], vs[0], bias))
    times = {n: [] for n in VARIANTS}
    for _ in range(rounds):
        for name in VARIANTS:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name](*args[name]))
            times[name].append(time.perf_counter() - t0)
    best = {n: min(t) for n, t in times.items()}
    base = times["a_einsum"]
    read_mb = layers * per_layer / 2 ** 20
    return {
        "shape": f"{rows}x{ctx}", "heads": list(heads), "layers": layers, "cache_read_MiB": round(read_mb, 1),
        "ms_per_layer": {n: round(1e3 * t / layers, 4) for n, t in best.items()},
        "ratio_vs_a": {n: round(t / best["a_einsum"], 3) for n, t in best.items()},
        # per round, variant / (a) of the same round: robust to load that changes between rounds
        "median_round_ratio_vs_a": {n: round(float(np.median(np.divide(t, base))), 3)
                                    for n, t in times.items()},
        "GBps": {n: round(read_mb * 2 ** 20 / t / 1e9, 2) for n, t in best.items()},
        "max_abs_err_vs_a": errors, "hlo": hlo,
    }


def read_ceiling_gbps(mib: int = 256, rounds: int = 5) -> float:
    """This machine's memory read rate: a jitted sum over a ``mib`` MiB fp32 array."""
    x = jnp.ones((mib * 2 ** 18,), jnp.float32)
    f = jax.jit(jnp.sum)
    jax.block_until_ready(f(x))
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        best = min(best, time.perf_counter() - t0)
    return round(mib * 2 ** 20 / best / 1e9, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["1x256", "16x256", "16x1024", "64x1024"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--max-layers", type=int, default=30)
    ap.add_argument("--heads", default="smollm2",
                    help=f"query heads, KV heads, head dim: one of {sorted(HEADS)} or 'NQ,NKV,D'")
    a = ap.parse_args()
    heads = HEADS[a.heads] if a.heads in HEADS else tuple(int(x) for x in a.heads.split(","))
    ceiling = read_ceiling_gbps()
    results = []
    for s in a.shapes:
        rows, ctx = (int(x) for x in s.lower().split("x"))
        r = profile_shape(rows, ctx, a.rounds, a.max_layers, heads)
        results.append(r)
        print(f"{r['shape']:>8} heads {heads} ({r['layers']} layers, {r['cache_read_MiB']} MiB read/call)")
        for n in VARIANTS:
            print(f"  {n:<16} {r['ms_per_layer'][n]:8.3f} ms/layer  x{r['ratio_vs_a'][n]:<6} "
                  f"(median/round x{r['median_round_ratio_vs_a'][n]:<6}) "
                  f"{r['GBps'][n]:6.2f} GB/s  err {r['max_abs_err_vs_a'][n]:.1e}  {r['hlo'][n]}")
    print(json.dumps({"benchmark": "profile_attention", "read_ceiling_GBps": ceiling,
                      "baseline": "a_einsum", "results": results}))


if __name__ == "__main__":
    main()
