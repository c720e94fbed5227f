"""Profile: where one packed encoder batch spends its time (MiniLM or any loadable BERT encoder).

Times each component of the encoder as an isolated jitted sub-function on one representative
packed batch (the first batch ``embed_texts`` builds for the benchmark's 2,000 texts: rows of
``--row-len`` tokens, several texts per row), in float32 and bfloat16, in one process:

* ``embed+ln``: word/position/type lookups and the embedding layer norm;
* ``mask``: the segment attention bias;
* per layer (times ``num_layers``): ``qkv`` (three projections), ``attention`` (scores, softmax,
  value product), ``attn_out`` (output projection, residual, layer norm), ``ffn`` (two
  projections, GELU, residual, layer norm), and ``ffn_matmuls`` (the two FFN products alone,
  for the elementwise share of ``ffn``);
* ``pool``: segment mean pooling and L2 normalisation;
* ``full``: the whole jitted batch (``embed_packed``), and the host side (tokenising the texts,
  packing the rows) for the whole run.

Each row is the best of ``--repeats`` rounds (round-robin over components, so a burst of load on
this shared machine hits all alike), as wall time and as this process's CPU time (all threads;
steadier than wall time on a loaded machine); shares are of the components' sum. Also prints, for the
whole-batch program, the optimized HLO's op counts (converts, transposes, copies, dots) and the
machine's GEMM ceiling on the FFN shape, and the load average with every table.

Run: ``python tests/benchmarks/profile_embed.py [--model DIR] [--row-len 128] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))


def hlo_counts(fn, *args) -> dict:
    """Op counts of the optimized HLO of ``jax.jit(fn)(*args)`` (nested computations included)."""
    import jax

    txt = jax.jit(fn).lower(*args).compile().as_text()
    ops = collections.Counter(re.findall(r"= \S+ ([a-z][\w-]*)\(", txt))
    return {k: ops[k] for k in ("convert", "transpose", "copy", "dot", "fusion")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a sentence-transformers dir (default MiniLM)")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--row-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    from bench_embed import gemm_ceiling, sentences

    from langtorch.functional import embedding as E
    from langtorch.functional.models import bert
    from langtorch.models import MiniLM, load

    texts = sentences(args.n)
    if args.model:
        model = load(args.model)
        host_params = model.params
    else:
        model = MiniLM()
        host_params = model._host_params
    cfg, tok = model.config, model.tokenizer

    # Host side: tokenising, and packing (embed_texts with an encoder that only records).
    t = time.perf_counter()
    tok.encode_batch(texts)
    tokenize_s = time.perf_counter() - t
    batches = []

    def record(params, ids, seg, pos, *, config, max_segments):
        batches.append((ids, seg, pos))
        return np.zeros((ids.shape[0], max_segments, config.hidden_size), np.float32)

    t = time.perf_counter()
    E.embed_texts(host_params, tok, texts, config=cfg, encode_fn=record,
                  row_lengths=(args.row_len, max(args.row_len, model.max_length)),
                  max_length=model.max_length)
    host_s = time.perf_counter() - t
    ids, seg, pos = (jnp.asarray(a) for a in batches[0])
    real = int(sum(int((b[1] > 0).sum()) for b in batches))
    slots = int(sum(b[1].size for b in batches))
    print(f"# {len(texts)} texts, {real} tokens in {len(batches)} batches of "
          f"{tuple(batches[0][0].shape)} (padding {1 - real / slots:.1%}, "
          f"{float((batches[0][1].max(1)).mean()):.1f} texts/row); host: tokenise "
          f"{tokenize_s * 1e3:.0f} ms, tokenise+pack {host_s * 1e3:.0f} ms for all")

    def prelude(p, ids, pos):
        emb = p["embeddings"]
        x = jnp.take(emb["word"], ids, axis=0).astype(jnp.float32) + emb["token_type"][0]
        x = x + jnp.take(emb["position"], pos, axis=0)
        return bert._layer_norm(x, emb["ln_scale"], emb["ln_bias"], cfg.layer_norm_eps)

    def bias(seg):
        allowed = (seg > 0)[:, None, None, :] & (seg[:, :, None] == seg[:, None, :])[:, None]
        return jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)

    def pool(h, seg):
        onehot = (seg[:, :, None] == jnp.arange(1, 33)).astype(jnp.float32)
        sums = jnp.einsum("bts,bth->bsh", onehot, h)
        return E.normalize(sums / jnp.maximum(jnp.sum(onehot, axis=1)[..., None], 1.0))

    def ffn_matmuls(x, p):
        return bert._mm(bert._mm(x, p["ffn_in_w"]), p["ffn_out_w"])

    def profile(dt):
        params = E.cast_params(host_params, dt)
        lp = jax.tree.map(lambda a: a[0], params["layers"])
        x = jax.jit(prelude)(params, ids, pos)
        bm = jax.jit(bias)(seg)
        q, k, v = jax.jit(bert._qkv, static_argnums=0)(cfg, x, lp)
        ctx = jax.jit(bert._attention, static_argnums=4)(q, k, v, bm, lp["q_w"].dtype)
        L = cfg.num_layers
        comps = {  # name: (thunk, times per batch)
            "embed+ln": (lambda: jax.jit(prelude)(params, ids, pos), 1),
            "mask": (lambda: jax.jit(bias)(seg), 1),
            "qkv": (lambda: jax.jit(bert._qkv, static_argnums=0)(cfg, x, lp), L),
            "attention": (lambda: jax.jit(bert._attention, static_argnums=4)(
                q, k, v, bm, lp["q_w"].dtype), L),
            "attn_out": (lambda: jax.jit(bert._attn_out, static_argnums=0)(cfg, x, ctx, lp), L),
            "ffn": (lambda: jax.jit(bert._ffn, static_argnums=0)(cfg, x, lp), L),
            "pool": (lambda: jax.jit(pool)(x, seg), 1),
        }
        extra = {
            "ffn_matmuls": (lambda: jax.jit(ffn_matmuls)(x, lp), L),
            "full": (lambda: E.embed_packed(params, ids, seg, pos, config=cfg,
                                            max_segments=32), 1),
        }
        every = {**comps, **extra}
        best = {name: float("inf") for name in every}
        cpu = {name: float("inf") for name in every}
        for f, _ in every.values():
            jax.block_until_ready(f())
        for _ in range(args.repeats):
            for name, (f, _) in every.items():
                t, c = time.perf_counter(), time.process_time()
                jax.block_until_ready(f())
                best[name] = min(best[name], time.perf_counter() - t)
                cpu[name] = min(cpu[name], time.process_time() - c)
        ceiling = gemm_ceiling(dt)
        total = sum(best[n] * times for n, (_, times) in comps.items())
        total_cpu = sum(cpu[n] * times for n, (_, times) in comps.items())
        h, f_ = cfg.hidden_size, cfg.intermediate_size
        dense_flops = 2 * (4 * h * h + 2 * h * f_) * L * ids.size
        print(f"\n## {dt}  (load {os.getloadavg()[0]:.2f}; GEMM ceiling {ceiling:.0f} "
              f"GFLOP/s; best of {args.repeats})")
        print(f"{'component':<14}{'ms/call':>9}{'x':>4}{'ms/batch':>10}{'share':>8}"
                  f"{'cpu ms/batch':>14}{'cpu share':>10}")
        for name, (_, times) in comps.items():
            ms = best[name] * 1e3
            print(f"{name:<14}{ms:9.2f}{times:4d}{ms * times:10.1f}"
                  f"{best[name] * times / total:8.1%}{cpu[name] * times * 1e3:14.1f}{cpu[name] * times / total_cpu:10.1%}")
        print(f"{'sum':<14}{'':13}{total * 1e3:10.1f}{'':8}{total_cpu * 1e3:14.1f}")
        ffn_share = best["ffn_matmuls"] / best["ffn"]
        print(f"{'full batch':<14}{'':13}{best['full'] * 1e3:10.1f}{'':8}"
              f"{cpu['full'] * 1e3:14.1f}   "
              f"({ids.size / best['full']:.0f} tokens/s, dense layers at "
              f"{dense_flops / best['full'] / 1e9:.0f} GFLOP/s)")
        print(f"ffn: its two matmuls alone are {ffn_share:.0%} of the block "
              f"({best['ffn_matmuls'] * 1e3:.2f} ms of {best['ffn'] * 1e3:.2f})")
        print("optimized HLO of the full batch:", hlo_counts(
            lambda p, i, s, po: E.embed_packed(p, i, s, po, config=cfg, max_segments=32),
            params, ids, seg, pos))

    for dt in args.dtypes.split(","):
        profile(dt)


if __name__ == "__main__":
    main()
