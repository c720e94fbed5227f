"""Where one prompt-tuning train step's time goes (SmolLM2, B=8, T=64, P=20 by default).

Prints, for each weight dtype, a per-component table of one train step measured with isolated
jitted sub-functions in one process (median of ``--repeats`` calls each, after a warm-up call):

* ``forward layers``: the 30 decoder layers + final norm, prompt in front (``decoder_hidden``);
* ``attention`` (inside the layers): the attention core of every layer (scores, mask, softmax,
  weighted values), forward + backward, ``num_layers`` x one layer's time;
* ``LM head + loss``: the output head over the labelled states and the cross-entropy, forward
  and backward with respect to the hidden states;
* ``backward``: ``value_and_grad`` of the loss minus its forward;
* ``optimizer update``: clipping + AdamW on the ``[P, H]`` prompt;
* ``host overhead``: :class:`TrainStep`'s call (placement, the NaN check's host copies) minus
  the jitted program alone.

then the optimized HLO's op counts of the whole jitted step (converts, transposes, copies,
dots, fusions; at the top level, i.e. outside fusions, and in total) and the machine's load.
On a shared machine wall times are noisy: read the shares and the HLO counts, and compare
alternatives inside one run.

    python tests/benchmarks/profile_prompt_tuning.py [--dtypes float32,bfloat16] [--repeats 3]
    python tests/benchmarks/profile_prompt_tuning.py --layers 2    # quick: 2 layers
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import statistics
import time


def _median_time(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


_OP = re.compile(r"=\s.*?\s([a-z][a-z0-9-]*)\(")


def hlo_op_counts(text: str) -> dict:
    """Counts of selected opcodes in optimized HLO text: ``{op: {"top": n, "all": n}}``
    (``top``: in non-fusion computations, i.e. each one a separate kernel or buffer pass)."""
    wanted = ("convert", "transpose", "copy", "dot", "fusion", "dynamic-update-slice",
              "dynamic-slice", "while", "custom-call")
    top, every = collections.Counter(), collections.Counter()
    fused = False
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            name = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            fused = "fused" in name or "fusion" in name
            continue
        m = _OP.search(line)
        if not m:
            continue
        op = m.group(1)
        if op in wanted:
            every[op] += 1
            if not fused:
                top[op] += 1
    return {op: {"top": top[op], "all": every[op]} for op in wanted}


def _instructions(text: str) -> dict:
    """``{instruction name: (fusion kind or opcode, output shape, op_name, called text)}`` of
    the top-level instructions of optimized HLO text."""
    comps, name, body = {}, None, []
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            name = (line.split()[1] if line.startswith("ENTRY") else line.split()[0]).lstrip("%")
            body = []
            comps[name] = body
        elif name is not None:
            body.append(line)
    out = {}
    for lines in comps.values():
        for line in lines:
            m = re.match(r"\s+(?:ROOT )?%([\w.-]+) = (\S+) ([a-z][\w-]*)\(", line)
            if not m:
                continue
            calls = re.search(r"calls=%([\w.-]+)", line)
            op_name = re.search(r'op_name="([^"]*)"', line)
            out[m.group(1)] = (m.group(3), m.group(2),
                               op_name.group(1) if op_name else "",
                               "\n".join(comps.get(calls.group(1), [])) if calls else "")
    return out


def classify(op, shape, op_name, called, vocab):
    """One thunk's category for the per-op table."""
    backward = "transpose(" in op_name
    side = "backward" if backward else "forward"
    dims = [int(d) for d in re.findall(r"\d+", shape.split("{")[0])]
    if " dot(" in called or op == "dot":
        if vocab in dims or f",{vocab}]" in called or f"[{vocab}," in called:
            return f"LM head matmul, {side}"
        return f"{'attention' if len(dims) >= 4 else 'layer'} matmuls, {side}"
    if vocab in dims:
        return "LM head + loss elementwise (softmax, lse)"
    if "transpose" in called or " copy(" in called or op in ("copy", "transpose"):
        return "transposes / copies"
    if "convert" in called or op == "convert":
        return "elementwise with converts"
    return "other elementwise / reductions"


def trace_shares(fn, text, vocab, tmp):
    """Per-thunk times of one call of ``fn`` (jax.profiler), summed by category."""
    import glob
    import gzip

    import jax

    with jax.profiler.trace(tmp, create_perfetto_trace=True):
        jax.block_until_ready(fn())
    path = sorted(glob.glob(os.path.join(tmp, "plugins/profile/*/perfetto_trace.json.gz")))[-1]
    events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    ins = _instructions(text)
    shares, per_op = collections.Counter(), collections.Counter()
    for e in events:
        op = (e.get("args") or {}).get("hlo_op")
        if e.get("ph") != "X" or not op:
            continue
        kind, shape, op_name, called = ins.get(op, ("?", "", "", ""))
        shares[classify(kind, shape, op_name, called, vocab)] += float(e["dur"]) / 1e3
        per_op[(op, shape, op_name[-60:])] += float(e["dur"]) / 1e3
    if os.environ.get("PROFILE_TOP_OPS"):
        for (op, shape, name), ms in per_op.most_common(int(os.environ["PROFILE_TOP_OPS"])):
            print(f"    {ms:8.1f} ms  {op:32s} {shape:28s} {name}")
    return shares


def profile(smol, dtype, args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from langtorch.functional import losses as L
    from langtorch.functional import prompt_tuning as PT

    b, t, p = args.batch, args.tokens, args.virtual_tokens
    cfg = smol.config
    rng = np.random.default_rng(0)
    ids = rng.integers(100, 40000, (b, t)).astype(np.int32)
    mask = np.ones_like(ids)
    one = {"ids": ids, "mask": mask, "labels": ids}
    batches = PT.stack_batches([one])
    jd = getattr(jnp, dtype)
    params = jax.tree.map(lambda a: jnp.asarray(a, jd), smol.params)
    frozen = {"model": params}
    prompt = jnp.asarray(np.asarray(smol.params["embed"][:p], np.float32))
    loss_fn = functools.partial(L.decoder_lm_loss, config=cfg)
    opt = PT.make_optimizer(1e-2, total_steps=100)
    state = opt.init(prompt)
    step = PT.make_train_step(loss_fn, opt)
    dev = {k: jnp.asarray(v) for k, v in one.items()}
    block = jax.block_until_ready
    rows = collections.OrderedDict()

    s = {"p": prompt, "s": state}

    def call_step():
        s["p"], s["s"], _ = step(s["p"], s["s"], batches, frozen)
        block(s["p"])

    jb = jax.tree.map(jnp.asarray, batches)

    def call_jitted_out():
        return step.jitted(prompt, state, jb, frozen)

    def call_jitted():
        block(call_jitted_out())

    rows["train step (TrainStep call)"] = _median_time(call_step, args.repeats)
    rows["  jitted step alone"] = _median_time(call_jitted, args.repeats)

    hidden = jax.jit(functools.partial(L.decoder_hidden, config=cfg))
    rows["  forward layers"] = _median_time(
        lambda: block(hidden(prompt, params, dev["ids"], dev["mask"])), args.repeats)
    value = jax.jit(lambda q, f, bt: loss_fn(q, f, bt)[0])
    rows["  forward (layers + head + loss)"] = _median_time(
        lambda: block(value(prompt, frozen, dev)), args.repeats)
    vg = jax.jit(jax.value_and_grad(lambda q, f, bt: loss_fn(q, f, bt)[0]))
    rows["  forward + backward"] = _median_time(lambda: block(vg(prompt, frozen, dev)),
                                                args.repeats)

    h = hidden(prompt, params, dev["ids"], dev["mask"])[:, p - 1:p + t - 1]
    head_f = jax.jit(lambda hh: L.token_cross_entropy(params, hh, dev["labels"], config=cfg)[0])
    head_fb = jax.jit(jax.value_and_grad(
        lambda hh: L.token_cross_entropy(params, hh, dev["labels"], config=cfg)[0]))
    rows["  LM head + loss, forward"] = _median_time(lambda: block(head_f(h)), args.repeats)
    rows["  LM head + loss, forward + backward"] = _median_time(lambda: block(head_fb(h)),
                                                                args.repeats)

    # The attention core of one layer, forward + backward, times the number of layers.
    n = p + t
    g = cfg.num_heads // cfg.num_kv_heads
    key = jax.random.split(jax.random.key(1), 3)
    adt = jd
    q = jax.random.normal(key[0], (b, n, cfg.num_kv_heads, g, cfg.head_dim), adt)
    k = jax.random.normal(key[1], (b, n, cfg.num_kv_heads, cfg.head_dim), adt)
    v = jax.random.normal(key[2], (b, n, cfg.num_kv_heads, cfg.head_dim), adt)
    allowed = jnp.tril(jnp.ones((n, n), bool))[None]
    bias = jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)[:, None, None]

    def attn(q, k, v):
        sc = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
        pr = jax.nn.softmax(sc * cfg.head_dim ** -0.5 + bias, axis=-1).astype(adt)
        o = jnp.einsum("bkgts,bskd->btkgd", pr, v, preferred_element_type=jnp.float32)
        return o.astype(adt)

    attn_f = jax.jit(attn)
    attn_fb = jax.jit(lambda q, k, v: jax.vjp(attn, q, k, v)[1](attn(q, k, v)))
    layers = cfg.num_layers
    rows["  attention core x layers, forward"] = layers * _median_time(
        lambda: block(attn_f(q, k, v)), args.repeats)
    rows["  attention core x layers, forward + backward"] = layers * _median_time(
        lambda: block(attn_fb(q, k, v)), args.repeats)

    grads = jnp.ones_like(prompt)
    upd = jax.jit(lambda gr, st, pr: opt.update(gr, st, pr))
    rows["  optimizer update"] = _median_time(lambda: block(upd(grads, state, prompt)),
                                              args.repeats)

    total = rows["train step (TrainStep call)"]
    fwd = rows["  forward (layers + head + loss)"]
    derived = collections.OrderedDict()
    derived["forward layers (excl. attention core)"] = (
        rows["  forward layers"] - rows["  attention core x layers, forward"])
    derived["attention core, forward"] = rows["  attention core x layers, forward"]
    derived["LM head + loss, forward"] = fwd - rows["  forward layers"]
    derived["backward (all)"] = rows["  forward + backward"] - fwd
    derived["  of which LM head + loss"] = (rows["  LM head + loss, forward + backward"]
                                            - rows["  LM head + loss, forward"])
    derived["  of which attention core"] = (rows["  attention core x layers, forward + backward"]
                                            - rows["  attention core x layers, forward"])
    derived["optimizer update + scan/guard (jitted step - fwd/bwd)"] = (
        rows["  jitted step alone"] - rows["  forward + backward"])
    derived["host overhead (call - jitted)"] = total - rows["  jitted step alone"]

    print(f"\n== {dtype}: B={b} T={t} P={p} layers={layers}  (load: {os.getloadavg()})")
    print(f"{'measured sub-function':52s} {'ms':>9s}")
    for name, sec in rows.items():
        print(f"{name:52s} {1e3 * sec:9.1f}")
    print(f"\n{'component of one train step':52s} {'ms':>9s} {'share':>7s}")
    for name, sec in derived.items():
        print(f"{name:52s} {1e3 * sec:9.1f} {100 * sec / total:6.1f}%")
    text = step.jitted.lower(prompt, state, jb, frozen).compile().as_text()
    counts = hlo_op_counts(text)
    if os.environ.get("PROFILE_HLO_DIR"):
        with open(os.path.join(os.environ["PROFILE_HLO_DIR"], f"step_{dtype}.hlo.txt"), "w") as f:
            f.write(text)
    print("\noptimized HLO of the jitted step (top level = outside fusions):")
    print("  " + ", ".join(f"{op} {c['top']}/{c['all']}" for op, c in counts.items()))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shares = trace_shares(call_jitted_out, text, cfg.vocab_size, tmp)
    busy = sum(shares.values())
    print(f"\nper-thunk time of one jitted step (jax.profiler; {busy:.0f} ms of thunks):")
    for name, ms in shares.most_common():
        print(f"  {name:48s} {ms:9.1f} ms {100 * ms / busy:6.1f}%")
    return {"dtype": dtype, "ms": {k.strip(): round(1e3 * v, 1) for k, v in rows.items()},
            "thunk_ms": {k: round(v, 1) for k, v in shares.items()},
            "hlo": counts, "load": os.getloadavg()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--virtual-tokens", type=int, default=20)
    ap.add_argument("--layers", type=int, default=None, help="keep the first N layers")
    args = ap.parse_args()
    import jax

    from langtorch.models import default_llm

    smol = default_llm()
    if args.layers is not None:
        import types

        params = dict(smol.params)
        params["layers"] = jax.tree.map(lambda a: a[:args.layers], params["layers"])
        smol = types.SimpleNamespace(params=params,
                                     config=smol.config._replace(num_layers=args.layers))
    out = [profile(smol, d, args) for d in args.dtypes.split(",")]
    print(json.dumps({"bench": "profile_prompt_tuning", "results": out}))


if __name__ == "__main__":
    main()
