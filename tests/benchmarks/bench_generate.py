"""Benchmark: greedy generation of a GGUF model, ours (JAX) vs transformers and llama.cpp.

``--model smollm2`` (the default: SmolLM2-135M-Instruct, ours = :class:`langtorch.models.SmolLM2`),
``--model gemma3`` (Gemma 3 270M, base, Q4_K_M) or ``--model PATH.gguf``: any other model is
loaded with :func:`langtorch.models.load` and driven through the engine the loaded model gets
(:func:`langtorch.models.engine_for`, as ``LocalBackend`` and ``serve`` use it), by
``Engine.generate`` on token ids — the call ``SmolLM2.generate`` makes. transformers loads the
same file (``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``) and llama.cpp runs it.

The prompts: 16 chat prompts rendered with the model's chat template when its GGUF has one
(``"prompt_form": "chat_template"``), else the same 16 requests as plain text for all three
(``"plain"``: Gemma 3 270M's GGUF has no template). Ours and transformers must tokenise every
prompt identically (checked before timing; the run stops if they differ). Up to 64 new tokens,
greedy, stopping at the model's EOS ids. Measured in one run, each with its peers at their
best thread setting:

* **batched**: all prompts in one call (ours: the continuous-batching engine; transformers:
  ``generate`` on a left-padded batch) at steady state (warmed up, median of ``--repeats``).
  transformers is timed in its default dtype (fp32) and in bf16; both are reported, and the
  ratio against its best. The default engine decodes with ``decode_dtype="auto"`` (bf16
  weights where the CPU has bf16 dot units, batch-invariant). More rows of ours: the opt-in
  dtype-per-shape engine (``decode_dtype="by_shape"``: bf16 decode chunks where a probe finds
  them faster; not batch-invariant), the other decode dtype, batched and single stream: fp32
  (``decode_dtype="float32"``, the default before 2026-12-06) when the default decodes in bf16,
  else bf16 (``decode_dtype="bfloat16"``: a model loaded from a checkpoint decodes in its
  params' dtype by default, so that its greedy answers equal transformers'), and sampled
  decoding (temperature 0.7, top_p 0.9, seeded) on the default engine, reported as its time
  per token over greedy's. And the int8 engine
  (``quantization="int8"``: int8 weights and products, ``functional/models/quant.py``),
  batched and single stream, with how far its answers are from the fp32 model's: teacher-forced
  on the fp32 engine's greedy continuations of the prompts, the share of generated positions
  where its top-1 token equals fp32's and the mean KL(fp32 || int8), next to the same numbers
  for bf16 weights as a yardstick. And the default engine with its decode steps in the rows
  layout (``decode_layout="rows"``; the default ``"auto"`` decodes with the hidden states as
  columns on a CPU, :func:`langtorch.functional.models.decoder.block_columns`), batched and
  single stream, as the before/after of the layout.
* **first call in a fresh process** with a warm compilation cache: a child process (same
  interpreter) loads the model and runs the batched call once; its wall time includes loading
  and loading the compiled programs from the persistent cache. Reported as seconds and as a
  throughput ratio against transformers' default steady state.
* **single stream**: the first ``--single`` prompts one at a time (ours, transformers best of
  fp32/bf16 and threads, llama-cpp-python on the same GGUF when importable; ``null`` with the
  reason otherwise).

Throughput = generated tokens (to EOS, EOS counted) / wall time. Each line also reports the
machine's fp32/bf16 GEMM and GEMV ceilings measured in the same process.

Prints one JSON line (``"model"`` names the model). Run::

    python tests/benchmarks/bench_generate.py                  # SmolLM2-135M-Instruct
    python tests/benchmarks/bench_generate.py --model gemma3   # Gemma 3 270M (its issue-20 row)
    python tests/benchmarks/bench_generate.py --model path/to/model.gguf

(``--quick`` for a smoke run with tiny sizes: its numbers mean nothing.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _gemm import gemm_ceilings  # noqa: E402
from _models import NAMES, gguf_path  # noqa: E402

TOPICS = ("a cat", "the ocean", "a robot", "a wizard", "a pirate", "a dragon", "a city", "a river",
          "the moon", "a tree", "a car", "a star", "a bird", "a fish", "a king", "a library")


def prompts(n: int = len(TOPICS)) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a short story about {t}."}] for t in TOPICS[:n]]


def plain(chat: list[dict]) -> str:
    """The request as plain text (the prompt of a model with no chat template)."""
    return chat[-1]["content"]


class Ours:
    """Our side of the benchmark: ``SmolLM2`` through its ``generate`` (``spec="smollm2"``), or
    any GGUF through :func:`langtorch.models.load` and the engine the loaded model gets
    (``Engine.generate`` on token ids, which is what ``SmolLM2.generate`` calls)."""

    def __init__(self, spec: str):
        import langtorch.models as M

        self.smollm2 = spec == "smollm2"
        if self.smollm2:
            self.model = M.SmolLM2()
            self.name, self.path, self.form = self.model.name, self.model.path, "chat_template"
        else:
            import jax

            self.path = gguf_path(spec)
            if not jax.config.jax_compilation_cache_dir:
                M.enable_compilation_cache()  # as SmolLM2 does: the fresh-process row needs it
            self.model = M.load(self.path)
            self.name = self.model.name
            self.form = "chat_template" if self.model.tokenizer.chat_template else "plain"
        self.engine = M.engine_for(self.model)  # = model.engine; LocalBackend's with no options

    def ids(self, chat: list[dict]) -> list[int]:
        """The prompt's token ids as our engine sees them."""
        m = self.model
        if self.form == "chat_template":  # the template writes its own BOS
            return m.encode(m.apply_chat_template(chat))
        return m.tokenizer.encode(plain(chat))  # the model's BOS rule

    def items(self, chats: list[list[dict]]) -> list:
        """What :meth:`generate` takes: chats (SmolLM2 renders them) or token ids."""
        return chats if self.smollm2 else [self.ids(c) for c in chats]

    def generate(self, batch: list, max_tokens: int) -> int:
        """Greedy-generate a batch; the number of generated tokens (to EOS, EOS counted)."""
        if self.smollm2:
            gens = self.model.generate(batch, max_tokens=max_tokens, temperature=0)
        else:
            gens = self.engine.generate(batch, max_tokens=max_tokens, temperature=0)
        return sum(g.completion_tokens for g in gens)

    def generate_ids(self, engine, ids: list, max_tokens: int, **sampling) -> int:
        """Generate from token ids on ``engine`` (another engine of this model, e.g. with
        ``decode_dtype="by_shape"``); the number of generated tokens."""
        gens = engine.generate(ids, max_tokens=max_tokens, **sampling)
        return sum(g.completion_tokens for g in gens)

    @property
    def eos_ids(self) -> list[int]:
        return list(getattr(self.model, "eos_ids", (self.model.eos_id,)))

    def describe(self) -> str:
        import jax

        o, b = self.engine.options, self.engine.batch

        def dtype(tree):
            return (tree["embed"] if "embed" in tree else jax.tree.leaves(tree)[0]).dtype

        return (f"engine (decode {dtype(b.params)}, prefill {dtype(b.prefill_params)}, "
                f"kv {o.kv_dtype}, "
                f"{o.max_slots} slots, chunk {o.chunk})")


def int8_agreement(ours: Ours, ids: list, max_tokens: int) -> dict:
    """Teacher-forced on the fp32 engine's greedy continuations of ``ids``: at the generated
    positions, the share where int8 weights' (and bf16 weights') top-1 token equals fp32's,
    and the mean KL(fp32 || other)."""
    import threading

    import jax
    import jax.numpy as jnp
    import numpy as np

    from langtorch.functional.engine import Sequence
    from langtorch.functional.models import decoder, quant

    runs = [Sequence(list(i), max_tokens=max_tokens) for i in ids]
    done = [threading.Event() for _ in runs]
    for r, d in zip(runs, done):
        ours.engine.submit([r], on_done=lambda *_, d=d: d.set(), on_error=lambda e, d=d: d.set())
    for d in done:
        d.wait()
    seqs = [list(i) + [int(x) for x in r.tokens] for i, r in zip(ids, runs)]
    t = max(map(len, seqs))
    arr = np.zeros((len(seqs), t), np.int32)
    mask = np.zeros((len(seqs), t), np.int32)
    gen = np.zeros((len(seqs), t), bool)
    for r, (s, i) in enumerate(zip(seqs, ids)):
        arr[r, :len(s)], mask[r, :len(s)] = s, 1
        gen[r, len(i) - 1:len(s) - 1] = True
    cfg = ours.model.config
    base = getattr(ours.model, "decode_params", None) or ours.model.params
    base = decoder.stack_layers(base)

    @jax.jit
    def logits(p, a, m):
        pos = jnp.maximum(jnp.cumsum(m, 1) - 1, 0)
        h, _ = decoder.hidden_states(p, a, pos, m, config=cfg)
        return jax.nn.log_softmax(decoder.lm_head(p, h, cfg), -1)

    ref = logits(base, arr, mask)
    out = {}
    for name, p in (("int8", quant.quantize_params(base)),
                    ("bf16_weights", quant.cast(base, jnp.bfloat16))):
        lp = logits(p, arr, mask)
        kl = (jnp.exp(ref) * (ref - lp)).sum(-1)
        same = ref.argmax(-1) == lp.argmax(-1)
        out[name] = {"top1_agreement": round(float(same[gen].mean()), 4),
                     "mean_kl": round(float(kl[gen].mean()), 5)}
    out["positions"] = int(gen.sum())
    return out


def child_first_call(spec: str, n: int, max_tokens: int) -> None:
    # Runs in a fresh process: load + first batched call, with the parent's compilation cache.
    t0 = time.perf_counter()
    ours = Ours(spec)
    load = time.perf_counter() - t0
    items = ours.items(prompts(n))
    t = time.perf_counter()
    tokens = ours.generate(items, max_tokens)
    call = time.perf_counter() - t
    print(json.dumps({"load_s": load, "call_s": call, "tokens": tokens}))


def child_llama_cpp(n: int, max_tokens: int, single: int, gguf: str, form: str) -> None:
    try:
        import llama_cpp as lc
    except ImportError as exc:
        print(json.dumps({"tok_s": None, "reason": f"ImportError: {exc}"}))
        return
    from _llama_cpp import no_extra_buffers

    no_extra_buffers()  # the AMX repack buffer segfaults on this CPU (see _llama_cpp.py)
    chats = prompts(n)

    def run(llm, chat, k):
        if form == "chat_template":  # the GGUF's template, rendered by llama-cpp-python
            return llm.create_chat_completion(chat, max_tokens=k, temperature=0)
        return llm.create_completion(plain(chat), max_tokens=k, temperature=0)  # BOS: its rule

    rates = {}
    for th in sorted({1, os.cpu_count() or 1}):
        llm = lc.Llama(model_path=gguf, n_ctx=1024, n_threads=th, verbose=False)
        run(llm, chats[0], 4)  # warm-up
        count, t = 0, time.perf_counter()
        for c in chats[:single]:
            count += run(llm, c, max_tokens)["usage"]["completion_tokens"]
        rates[th] = count / (time.perf_counter() - t)
    print(json.dumps({"tok_s": round(max(rates.values()), 1), "reason": None,
                      "version": lc.__version__}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2",
                    help=f"{' | '.join(NAMES)} | PATH.gguf (default smollm2)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--single", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="smoke run with tiny sizes")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--llama-cpp-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-form", default="chat_template", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_cpp_child:
        child_llama_cpp(args.prompts, args.max_tokens, args.single, args.gguf, args.prompt_form)
        return
    if args.quick:
        args.max_tokens, args.prompts, args.repeats, args.single = 8, 2, 1, 1
    if args.child:
        child_first_call(args.model, args.prompts, args.max_tokens)
        return
    if args.model not in NAMES:
        gguf_path(args.model)  # a clear error before anything is loaded

    import torch
    import transformers

    ceilings = gemm_ceilings()
    chats = prompts(args.prompts)
    ours = Ours(args.model)
    items = ours.items(chats)
    t0 = time.perf_counter()
    ours.generate(items, args.max_tokens)
    first_batched_same_process_s = time.perf_counter() - t0
    ours.generate(items[:1], args.max_tokens)

    # A fresh process with the compilation cache this one just filled.
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--model",
                        args.model, "--prompts", str(args.prompts), "--max-tokens",
                        str(args.max_tokens)],
                       capture_output=True, text=True, check=False)
    try:
        fresh = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        fresh = {"error": (r.stderr or "no output")[-300:]}

    d, f = str(ours.path.parent), ours.path.name
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.padding_side = "left"
    models = {"float32": transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=f, dtype=torch.float32).eval()}
    models["bfloat16"] = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=f, dtype=torch.bfloat16).eval()
    if ours.form == "chat_template":  # the rendered template holds its own BOS
        texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                 for c in chats]
    else:  # plain text: the tokenizer's BOS rule, as ours
        texts = [plain(c) for c in chats]
    specials = ours.form == "plain"
    # Both stacks must see the same prompt tokens, or the comparison means nothing.
    ours_ids = [ours.ids(c) for c in chats]
    peer_ids = [tok(text, add_special_tokens=specials)["input_ids"] for text in texts]
    identical = ours_ids == peer_ids
    if not identical:
        i = next(i for i, (a, b) in enumerate(zip(ours_ids, peer_ids)) if a != b)
        raise SystemExit(f"bench_generate: ours and transformers tokenise the {ours.form} "
                         f"prompt {texts[i]!r} differently: {ours_ids[i]} vs {peer_ids[i]}; "
                         "the speeds would not be comparable (fix the tokenizer first).")
    eos = ours.eos_ids
    if tok.eos_token_id not in eos:
        eos = [*eos, tok.eos_token_id]

    def hf_generate(model, batch: list[str]) -> int:
        enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=specials)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.max_tokens, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos[0])
        gen = out[:, enc["input_ids"].shape[1]:].tolist()
        return sum(next((i + 1 for i, t in enumerate(r) if t in eos), len(r)) for r in gen)

    def ours_generate(batch: list) -> int:
        return ours.generate(batch, args.max_tokens)

    # More rows of ours on the same prompts: the opt-in dtype-per-shape engine
    # (decode_dtype="by_shape": bf16 decode chunks where faster, not batch-invariant), the
    # other decode dtype (fp32 where the default decodes in bf16, else bf16), and sampled
    # decoding (temperature 0.7, top_p 0.9, a seed per prompt) on the default engine.
    import langtorch.models as M

    ids_all = [ours.ids(c) for c in chats]
    auto = M.engine_for(ours.model, decode_dtype="by_shape")
    default_16 = str(ours.engine.batch.params["embed"].dtype) in ("bfloat16", "float16")
    other_dt, other_tag = ("float32", "fp32") if default_16 else ("bfloat16", "bf16")
    other = M.engine_for(ours.model, decode_dtype=other_dt)

    def ours_other(batch: list) -> int:
        return ours.generate_ids(other, batch, args.max_tokens, temperature=0)

    def ours_auto(batch: list) -> int:
        return ours.generate_ids(auto, batch, args.max_tokens, temperature=0)

    def ours_sampled(batch: list) -> int:
        return ours.generate_ids(ours.engine, batch, args.max_tokens, temperature=0.7,
                                 top_p=0.9, seed=list(range(len(batch))))

    int8 = M.engine_for(ours.model, quantization="int8")
    # The default engine with its decode steps in the rows layout (decode_layout="rows"; the
    # default is "auto": columns on a CPU), on the same prompts: before/after of the layout.
    rows_layout = M.engine_for(ours.model, decode_layout="rows")

    def ours_rows(batch: list) -> int:
        return ours.generate_ids(rows_layout, batch, args.max_tokens, temperature=0)

    def ours_int8(batch: list) -> int:
        return ours.generate_ids(int8, batch, args.max_tokens, temperature=0)

    ours_auto(ids_all)  # warm-up (compiles its bf16 decode chunks)
    ours_other(ids_all)
    ours_other(ids_all[:1])
    ours_sampled(ids_all)
    for _ in range(2):  # the second call compiles the prefill programs of prefix-cache hits
        ours_int8(ids_all)
        ours_int8(ids_all[:1])
    ours_rows(ids_all)
    ours_rows(ids_all[:1])
    agreement = int8_agreement(ours, ids_all, args.max_tokens)

    for m in models.values():
        hf_generate(m, texts[:2])  # warm-up
    threads = sorted({1, os.cpu_count() or 1})
    res: dict = {"ours_b": [], "ours_s": [], "ours_b_auto": [], "ours_b_sampled": [],
                 "ours_b_other": [], "ours_s_other": [],
                 "ours_b_int8": [], "ours_s_int8": [], "ours_b_rows": [], "ours_s_rows": []}
    for dt in models:
        for th in threads:
            res[("hf_b", dt, th)], res[("hf_s", dt, th)] = [], []

    def single(fn, items) -> float:
        n, t = 0, time.perf_counter()
        for item in items[:args.single]:
            n += fn([item])
        return n / (time.perf_counter() - t)

    def timed(fn, batch) -> float:
        t = time.perf_counter()
        n = fn(batch)
        return n / (time.perf_counter() - t)

    for _ in range(args.repeats):
        res["ours_b"].append(timed(ours_generate, items))
        res["ours_s"].append(single(ours_generate, items))
        res["ours_b_auto"].append(timed(ours_auto, ids_all))
        res["ours_b_other"].append(timed(ours_other, ids_all))
        res["ours_s_other"].append(single(ours_other, ids_all))
        res["ours_b_sampled"].append(timed(ours_sampled, ids_all))
        res["ours_b_int8"].append(timed(ours_int8, ids_all))
        res["ours_s_int8"].append(single(ours_int8, ids_all))
        res["ours_b_rows"].append(timed(ours_rows, ids_all))
        res["ours_s_rows"].append(single(ours_rows, ids_all))
        for dt, m in models.items():
            for th in threads:
                torch.set_num_threads(th)
                res[("hf_b", dt, th)].append(timed(lambda b, m=m: hf_generate(m, b), texts))
                res[("hf_s", dt, th)].append(single(lambda b, m=m: hf_generate(m, b), texts))
    med = {k: statistics.median(v) for k, v in res.items()}

    def best(kind, dts):
        return max(((dt, th) for dt in dts for th in threads), key=lambda k: med[(kind, *k)])

    b_def, b_best, s_best = best("hf_b", ["float32"]), best("hf_b", models), best("hf_s", models)
    hf_b_default, hf_b_best = med[("hf_b", *b_def)], med[("hf_b", *b_best)]
    hf_s_best = med[("hf_s", *s_best)]

    # llama.cpp runs in its own process: it shares no thread pools with torch/XLA, and a crash
    # of the native library becomes a reported reason instead of killing the benchmark.
    llama_cpp, llama_cpp_reason = None, None
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--llama-cpp-child",
                        "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens),
                        "--single", str(args.single), "--gguf", str(ours.path),
                        "--prompt-form", ours.form],
                       capture_output=True, text=True, check=False)
    try:
        got = json.loads(r.stdout.strip().splitlines()[-1])
        llama_cpp, llama_cpp_reason = got.get("tok_s"), got.get("reason")
    except (IndexError, json.JSONDecodeError):
        llama_cpp_reason = (f"llama-cpp-python child exited with {r.returncode}: "
                            f"{(r.stderr or '').strip()[-200:]}")

    fresh_ratio = None
    if "call_s" in fresh:
        fresh_ratio = round(fresh["tokens"] / fresh["call_s"] / hf_b_default, 2)
    print(json.dumps({
        "bench": "generate", "model": ours.name, "prompts": len(chats),
        "max_tokens": args.max_tokens, "quick": args.quick,
        "gguf": ours.path.name, "prompt_form": ours.form,
        "prompt_tokens": sum(len(i) for i in ours_ids), "prompt_tokens_identical": identical,
        "ours": ours.describe(),
        "ours_batched_tok_s": round(med["ours_b"], 1),
        "peer": f"transformers {transformers.__version__} generate",
        "peer_batched_default_fp32_tok_s": round(hf_b_default, 1),
        "peer_batched_best_tok_s": round(hf_b_best, 1),
        "peer_batched_best_setting": {"dtype": b_best[0], "threads": b_best[1]},
        "ratio_batched_vs_default": round(med["ours_b"] / hf_b_default, 2),
        "ratio_batched_vs_best": round(med["ours_b"] / hf_b_best, 2),
        "ours_batched_decode_by_shape_tok_s": round(med["ours_b_auto"], 1),
        "ours_decode_by_shape_wide_rows": auto.batch.wide_rows,
        "ratio_batched_decode_by_shape_vs_best": round(med["ours_b_auto"] / hf_b_best, 2),
        f"ours_batched_decode_{other_tag}_tok_s": round(med["ours_b_other"], 1),
        f"ratio_batched_decode_{other_tag}_vs_best": round(med["ours_b_other"] / hf_b_best, 2),
        f"ours_single_decode_{other_tag}_tok_s": round(med["ours_s_other"], 1),
        f"ratio_single_decode_{other_tag}": round(med["ours_s_other"] / hf_s_best, 2),
        f"ratio_single_decode_{other_tag}_vs_llama_cpp": (
            round(med["ours_s_other"] / llama_cpp, 2) if llama_cpp else None),
        "ours_decode_layout": ours.engine.batch.decode_layout,
        "ours_batched_rows_layout_tok_s": round(med["ours_b_rows"], 1),
        "ours_single_rows_layout_tok_s": round(med["ours_s_rows"], 1),
        "ratio_batched_vs_rows_layout": round(med["ours_b"] / med["ours_b_rows"], 2),
        "ratio_single_vs_rows_layout": round(med["ours_s"] / med["ours_s_rows"], 2),
        "ours_batched_sampled_tok_s": round(med["ours_b_sampled"], 1),
        "sampled_time_per_token_vs_greedy": round(med["ours_b"] / med["ours_b_sampled"], 2),
        "ours_batched_int8_tok_s": round(med["ours_b_int8"], 1),
        "ratio_batched_int8_vs_best": round(med["ours_b_int8"] / hf_b_best, 2),
        "ours_single_int8_tok_s": round(med["ours_s_int8"], 1),
        "ratio_single_int8": round(med["ours_s_int8"] / hf_s_best, 2),
        "ratio_single_int8_vs_llama_cpp": (round(med["ours_s_int8"] / llama_cpp, 2)
                                           if llama_cpp else None),
        "int8_vs_fp32_answers": agreement,
        "ours_first_call_fresh_process": {k: round(v, 2) if isinstance(v, float) else v
                                          for k, v in fresh.items()},
        "ratio_first_call_fresh_vs_default": fresh_ratio,
        "ours_first_call_same_process_s": round(first_batched_same_process_s, 2),
        "ours_single_tok_s": round(med["ours_s"], 1),
        "peer_single_best_tok_s": round(hf_s_best, 1),
        "peer_single_best_setting": {"dtype": s_best[0], "threads": s_best[1]},
        "ratio_single": round(med["ours_s"] / hf_s_best, 2),
        "llama_cpp_single_tok_s": llama_cpp,
        "llama_cpp_unavailable_reason": llama_cpp_reason,
        "ratio_single_vs_llama_cpp": (round(med["ours_s"] / llama_cpp, 2) if llama_cpp
                                      else None),
        **ceilings,
        "repeats": args.repeats, "statistic": "median",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
