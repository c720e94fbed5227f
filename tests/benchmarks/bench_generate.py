"""Benchmark: SmolLM2-135M-Instruct greedy chat generation, ours (JAX) vs transformers and llama.cpp.

16 chat prompts, up to 64 new tokens, greedy. Measured in one run, each with its peers at their
best thread setting:

* **batched**: all prompts in one call (ours: the continuous-batching engine; transformers:
  ``generate`` on a left-padded batch) at steady state (warmed up, median of ``--repeats``).
  transformers is timed in its default dtype (fp32) and in bf16; both are reported, and the
  ratio against its best.
* **first call in a fresh process** with a warm compilation cache: a child process (same
  interpreter) loads the model and runs the batched call once; its wall time includes loading
  and loading the compiled programs from the persistent cache. Reported as seconds and as a
  throughput ratio against transformers' default steady state.
* **single stream**: the first ``--single`` prompts one at a time (ours, transformers best of
  fp32/bf16 and threads, llama-cpp-python on the same GGUF when importable; ``null`` with the
  reason otherwise).

Throughput = generated tokens (to EOS, EOS counted) / wall time. Each line also reports the
machine's fp32/bf16 GEMM and GEMV ceilings measured in the same process.

Prints one JSON line. Run: ``python tests/benchmarks/bench_generate.py`` (``--quick`` for a
smoke run with tiny sizes: its numbers mean nothing).
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

TOPICS = ("a cat", "the ocean", "a robot", "a wizard", "a pirate", "a dragon", "a city", "a river",
          "the moon", "a tree", "a car", "a star", "a bird", "a fish", "a king", "a library")


def prompts(n: int = len(TOPICS)) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a short story about {t}."}] for t in TOPICS[:n]]


def child_first_call(n: int, max_tokens: int) -> None:
    # Runs in a fresh process: load + first batched call, with the parent's compilation cache.
    t0 = time.perf_counter()
    from langtorch.models import SmolLM2

    ours = SmolLM2()
    load = time.perf_counter() - t0
    t = time.perf_counter()
    gens = ours.generate(prompts(n), max_tokens=max_tokens, temperature=0)
    call = time.perf_counter() - t
    print(json.dumps({"load_s": load, "call_s": call,
                      "tokens": sum(g.completion_tokens for g in gens)}))


def child_llama_cpp(n: int, max_tokens: int, single: int, gguf: str) -> None:
    try:
        import llama_cpp as lc
    except ImportError as exc:
        print(json.dumps({"tok_s": None, "reason": f"ImportError: {exc}"}))
        return
    chats = prompts(n)
    rates = {}
    for th in sorted({1, os.cpu_count() or 1}):
        llm = lc.Llama(model_path=gguf, n_ctx=1024, n_threads=th, verbose=False)
        llm.create_chat_completion(chats[0], max_tokens=4, temperature=0)  # warm-up
        count, t = 0, time.perf_counter()
        for c in chats[:single]:
            out = llm.create_chat_completion(c, max_tokens=max_tokens, temperature=0)
            count += out["usage"]["completion_tokens"]
        rates[th] = count / (time.perf_counter() - t)
    print(json.dumps({"tok_s": round(max(rates.values()), 1), "reason": None,
                      "version": lc.__version__}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--single", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="smoke run with tiny sizes")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--llama-cpp-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_cpp_child:
        child_llama_cpp(args.prompts, args.max_tokens, args.single, args.gguf)
        return
    if args.quick:
        args.max_tokens, args.prompts, args.repeats, args.single = 8, 2, 1, 1
    if args.child:
        child_first_call(args.prompts, args.max_tokens)
        return

    import torch
    import transformers

    from langtorch.models import SmolLM2

    ceilings = gemm_ceilings()
    chats = prompts(args.prompts)
    ours = SmolLM2()
    t0 = time.perf_counter()
    ours.generate(chats, max_tokens=args.max_tokens, temperature=0)
    first_batched_same_process_s = time.perf_counter() - t0
    ours.generate(chats[:1], max_tokens=args.max_tokens, temperature=0)

    # A fresh process with the compilation cache this one just filled.
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--prompts",
                        str(args.prompts), "--max-tokens", str(args.max_tokens)],
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
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    eos = tok.eos_token_id

    def hf_generate(model, batch: list[str]) -> int:
        enc = tok(batch, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.max_tokens, do_sample=False,
                                 pad_token_id=eos)
        gen = out[:, enc["input_ids"].shape[1]:].tolist()
        return sum(len(r[:r.index(eos) + 1]) if eos in r else len(r) for r in gen)

    def ours_generate(batch: list) -> int:
        return sum(g.completion_tokens for g in ours.generate(batch, max_tokens=args.max_tokens,
                                                              temperature=0))

    for m in models.values():
        hf_generate(m, texts[:2])  # warm-up
    threads = sorted({1, os.cpu_count() or 1})
    res: dict = {"ours_b": [], "ours_s": []}
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
        res["ours_b"].append(timed(ours_generate, chats))
        res["ours_s"].append(single(ours_generate, chats))
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
                        "--single", str(args.single), "--gguf", str(ours.path)],
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
        "bench": "generate", "model": "SmolLM2-135M-Instruct", "prompts": len(chats),
        "max_tokens": args.max_tokens, "quick": args.quick,
        "ours": f"engine (decode {ours.dtype}, prefill "
                f"{ours.engine.batch.prefill_params['embed'].dtype}, kv {ours.kv_dtype}, "
                f"{ours.max_batch} slots, chunk {ours.chunk})",
        "ours_batched_tok_s": round(med["ours_b"], 1),
        "peer": f"transformers {transformers.__version__} generate",
        "peer_batched_default_fp32_tok_s": round(hf_b_default, 1),
        "peer_batched_best_tok_s": round(hf_b_best, 1),
        "peer_batched_best_setting": {"dtype": b_best[0], "threads": b_best[1]},
        "ratio_batched_vs_default": round(med["ours_b"] / hf_b_default, 2),
        "ratio_batched_vs_best": round(med["ours_b"] / hf_b_best, 2),
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
