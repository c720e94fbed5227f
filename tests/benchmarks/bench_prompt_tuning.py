"""Prompt-tuning benchmark: ours (JAX, jitted train step) vs PEFT + transformers (eager), same run.

Line 0 — the machine's GEMM ceilings measured in this run (GFLOP/s, XLA and torch, fp32 and
bf16, at the train step's shape [B*(P+T), 576] x [576, 1536] and at 1024^3); also copied into
line 1, since the CPU kind changes from day to day.

Line 1 — train-step time on SmolLM2-135M: batch 8, 64 tokens, 20 virtual tokens, full causal-LM
loss, AdamW + global-norm clipping; each side in fp32 and in bf16 weights. Median of ``--steps``
timed steps after one warm-up step (our warm-up includes the compile; its time is reported
separately). ``ratio`` compares each side's best dtype (the goal: >= 1.3, issue 20); ``ratio_fp32`` and
``ratio_bf16`` compare like with like.

Line 2 — wall time to reach 90% validation accuracy on ``load_sentiment`` (label-word
classification, P=20, prompt initialised from the same text, lr 1e-2, batch 8, validation every 8
steps), compile and evaluation time included, capped at ``--max-seconds`` per side.

Each line is one JSON object; ``ratio`` is peer time / our time (> 1: we are faster). Where the
step's time goes: ``tests/benchmarks/profile_prompt_tuning.py``.

    python tests/benchmarks/bench_prompt_tuning.py [--threads 2] [--steps 5] [--max-seconds 900]
    python tests/benchmarks/bench_prompt_tuning.py --quick    # smoke: 2 layers, tiny batch
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time


def _time_steps(fn, steps):
    fn()  # warm-up (compile for ours)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def gemm_ceilings(rows, reps=5):
    """GFLOP/s of XLA and torch GEMMs, fp32 and bf16 (XLA's bf16 accumulates in f32, as the
    model does), at the train step's shape and at 1024^3."""
    import jax
    import jax.numpy as jnp
    import torch

    out = {}
    for tag, (m, k, n) in (("step", (rows, 576, 1536)), ("1024", (1024, 1024, 1024))):
        flops = 2 * m * k * n / 1e9
        for dtype in ("float32", "bfloat16"):
            jd, td = getattr(jnp, dtype), getattr(torch, dtype)
            a, b = jnp.ones((m, k), jd), jnp.ones((k, n), jd)
            f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
            out[f"xla_{dtype}_{tag}_gflops"] = round(
                flops / _best(lambda f=f, a=a, b=b: jax.block_until_ready(f(a, b)), reps), 1)
            ta, tb = torch.ones((m, k), dtype=td), torch.ones((k, n), dtype=td)
            out[f"torch_{dtype}_{tag}_gflops"] = round(
                flops / _best(lambda ta=ta, tb=tb: ta @ tb, reps), 1)
    return out


def _best(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bench_step(args, smol, hf_model, ceilings):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from peft import PromptTuningConfig, get_peft_model

    from langtorch.functional import losses as L
    from langtorch.functional import prompt_tuning as PT

    b, t, p = args.batch, args.tokens, args.virtual_tokens
    rng = np.random.default_rng(0)
    ids = rng.integers(100, 40000, (b, t)).astype(np.int32)
    mask = np.ones_like(ids)
    batch = PT.stack_batches([{"ids": ids, "mask": mask, "labels": ids}])
    prompt0 = np.asarray(smol.params["embed"][:p], np.float32)
    out = {"bench": "prompt_tuning_train_step", "batch": b, "tokens": t, "virtual_tokens": p,
           "layers": int(smol.config.num_layers), "threads": args.threads, **ceilings}
    for dtype in ("float32", "bfloat16"):
        jd = jnp.float32 if dtype == "float32" else jnp.bfloat16
        params = jax.tree.map(lambda a, jd=jd: jnp.asarray(a, jd), smol.params)
        opt = PT.make_optimizer(1e-2, total_steps=100)
        step = PT.make_train_step(functools.partial(L.decoder_lm_loss, config=smol.config), opt)
        state = {"p": jnp.asarray(prompt0), "s": opt.init(jnp.asarray(prompt0))}

        def run(step=step, params=params, state=state):
            p, s, m = step(state["p"], state["s"], batch, {"model": params})
            jax.block_until_ready(p)
            state["p"], state["s"] = p, s

        t0 = time.perf_counter()
        run()
        out[f"ours_{dtype}_first_call_s"] = round(time.perf_counter() - t0, 2)
        out[f"ours_{dtype}_s"] = round(_time_steps(run, args.steps), 3)

    tids = torch.from_numpy(ids.astype(np.int64))
    tmask = torch.from_numpy(mask.astype(np.int64))
    for dtype in ("float32", "bfloat16"):
        hf = hf_model().to(getattr(torch, dtype))
        model = get_peft_model(hf, PromptTuningConfig(task_type="CAUSAL_LM",
                                                      num_virtual_tokens=p))
        with torch.no_grad():
            model.prompt_encoder["default"].embedding.weight.copy_(
                torch.from_numpy(prompt0.copy()))
        model.train()
        trainable = [q for q in model.parameters() if q.requires_grad]
        topt = torch.optim.AdamW(trainable, lr=1e-2, weight_decay=0.0)

        def peft_step(model=model, trainable=trainable, topt=topt):
            loss = model(input_ids=tids, attention_mask=tmask, labels=tids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            topt.step()
            topt.zero_grad(set_to_none=True)

        out[f"peft_{dtype}_s"] = round(_time_steps(peft_step, args.steps), 3)
        del model, hf
    ours = {d: out[f"ours_{d}_s"] for d in ("float32", "bfloat16")}
    peft = {d: out[f"peft_{d}_s"] for d in ("float32", "bfloat16")}
    out["ours_best"] = min(ours, key=ours.get)
    out["peft_best"] = min(peft, key=peft.get)
    out["ratio"] = round(min(peft.values()) / min(ours.values()), 2)
    out["ratio_fp32"] = round(peft["float32"] / ours["float32"], 2)
    out["ratio_bf16"] = round(peft["bfloat16"] / ours["bfloat16"], 2)
    return out


def bench_time_to_90(args, smol, hf):
    import numpy as np
    import torch
    from peft import PromptTuningConfig, get_peft_model

    from langtorch.datasets import load_sentiment
    from langtorch.tuning import PromptTuner

    template = "Review: {}\nSentiment:"
    init_text = "Classify the sentiment of the review as positive or negative."
    train, val = load_sentiment("train"), load_sentiment("val")
    out = {"bench": "prompt_tuning_time_to_90pct_val", "target": 0.9, "threads": args.threads}

    # Ours: the tuner with validation every 8 steps; stop at the first evaluation >= 0.9.
    tuner = PromptTuner(smol, n_tokens=20, labels=["negative", "positive"], template=template,
                        init="text", init_text=init_text, learning_rate=1e-2, progress=False)
    prompt0 = np.asarray(tuner.prompt).copy()
    t0 = time.perf_counter()
    tuner.fit(*train, val=val, epochs=3, batch_size=8, eval_every=8, restore_best=False,
              callback=lambda h: h["val_accuracy"] >= 0.9
              or time.perf_counter() - t0 > args.max_seconds)
    hits = [h for h in tuner.history if (h["val_accuracy"] or 0) >= 0.9]
    reached = (time.perf_counter() - t0, hits[0]["step"], hits[0]["val_accuracy"]) if hits \
        else None
    out["ours_s"] = round(reached[0], 1) if reached else None
    out["ours_steps"] = reached[1] if reached else None
    out["ours_val_accuracy"] = reached[2] if reached else None

    # PEFT + transformers: same init, data, batch, lr, clipping, eval schedule.
    model = get_peft_model(hf, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=20))
    with torch.no_grad():
        model.prompt_encoder["default"].embedding.weight.copy_(torch.from_numpy(prompt0))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-2, weight_decay=0.0)
    label_ids = torch.tensor([smol.encode(" negative")[0], smol.encode(" positive")[0]])

    def encode(texts):
        rows = [smol.encode(template.replace("{}", t)) for t in texts]
        n = max(map(len, rows))
        ids = torch.full((len(rows), n), smol.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
        return ids, mask, torch.tensor([len(r) - 1 + 20 for r in rows])

    def label_logits(texts):
        ids, mask, idx = encode(texts)
        logits = model(input_ids=ids, attention_mask=mask).logits
        return logits[torch.arange(len(texts)), idx][:, label_ids]

    vx, vy = val[0].tolist(), torch.tensor([lab == "positive" for lab in val[1].tolist()]).long()
    tx, ty = train[0].tolist(), [lab == "positive" for lab in train[1].tolist()]
    t0 = time.perf_counter()
    reached, step = None, 0
    rng = np.random.default_rng(0)
    while reached is None and time.perf_counter() - t0 < args.max_seconds and step < 32 * 3:
        order = rng.permutation(len(tx))
        for i in range(0, len(order), 8):
            j = order[i:i + 8]
            model.train()
            loss = torch.nn.functional.cross_entropy(
                label_logits([tx[k] for k in j]), torch.tensor([ty[k] for k in j]).long())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 8 == 0:
                model.eval()
                with torch.no_grad():
                    pred = torch.cat([label_logits(vx[k:k + 32]).argmax(-1)
                                      for k in range(0, len(vx), 32)])
                acc = float((pred == vy).float().mean())
                if acc >= 0.9:
                    reached = (time.perf_counter() - t0, step, acc)
                    break
            if time.perf_counter() - t0 > args.max_seconds:
                break
    out["peft_s"] = round(reached[0], 1) if reached else None
    out["peft_steps"] = reached[1] if reached else None
    out["peft_val_accuracy"] = reached[2] if reached else None
    if out["ours_s"] and out["peft_s"]:
        out["ratio"] = round(out["peft_s"] / out["ours_s"], 2)
    else:
        out["ratio"] = None
        out["note"] = f"a side did not reach 0.9 within {args.max_seconds} s"
    return out


def _truncate(smol, hf_factory, layers):
    """``--quick``: the first ``layers`` decoder layers on both sides (same weights)."""
    import dataclasses

    import jax

    params = dict(smol.params)
    params["layers"] = jax.tree.map(lambda a: a[:layers], params["layers"])
    small = dataclasses.replace(smol, params=params,
                                config=smol.config._replace(num_layers=layers)) \
        if dataclasses.is_dataclass(smol) else _Small(smol, params,
                                                      smol.config._replace(num_layers=layers))

    def hf():
        model = hf_factory()
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        return model

    return small, hf


class _Small:
    def __init__(self, base, params, config):
        self._base, self.params, self.config = base, params, config

    def __getattr__(self, name):
        return getattr(self._base, name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--virtual-tokens", type=int, default=20)
    ap.add_argument("--layers", type=int, default=None,
                    help="keep only the first N decoder layers on both sides (step line only)")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--skip-step", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 layers, batch 2, 16 tokens, 1 step, no accuracy line")
    args = ap.parse_args()
    import torch
    import transformers

    from langtorch.models import default_llm

    torch.set_num_threads(args.threads)
    smol = default_llm()

    def hf_model():
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(smol.path.parent), gguf_file=os.path.basename(smol.path),
            dtype=torch.float32)

    if args.quick:
        args.batch, args.tokens, args.virtual_tokens, args.steps = 2, 16, 4, 1
        args.layers = 2
    if args.layers is not None:
        args.skip_accuracy = True
        smol, hf_model = _truncate(smol, hf_model, args.layers)
    ceilings = gemm_ceilings(args.batch * (args.tokens + args.virtual_tokens),
                             reps=1 if args.quick else 5)
    print(json.dumps({"bench": "gemm_ceilings", "threads": args.threads, **ceilings}),
          flush=True)
    if not args.skip_step:
        print(json.dumps(bench_step(args, smol, hf_model, ceilings)), flush=True)
    if not args.skip_accuracy:
        print(json.dumps(bench_time_to_90(args, smol, hf_model())), flush=True)


if __name__ == "__main__":
    main()
