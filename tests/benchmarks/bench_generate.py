"""Benchmark: SmolLM2-135M-Instruct greedy chat generation, ours (JAX) vs transformers.

16 chat prompts, up to 64 new tokens, greedy, fp32. Batched: all 16 prompts in one call (ours:
one jitted KV-cache loop; transformers: ``generate`` on a left-padded batch). Single stream: the
first ``--single`` prompts one at a time. Throughput = generated tokens (to EOS) / wall time;
both sides warmed up first, medians of ``--repeats`` alternating runs. transformers is timed
with 1 and all torch threads and its better setting is reported (under load on a shared machine
torch's thread team often does better with 1). llama-cpp-python on the same GGUF is timed too
when it is installed.

Prints one JSON line. Run: ``python tests/benchmarks/bench_generate.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

TOPICS = ("a cat", "the ocean", "a robot", "a wizard", "a pirate", "a dragon", "a city", "a river",
          "the moon", "a tree", "a car", "a star", "a bird", "a fish", "a king", "a library")


def prompts() -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a short story about {t}."}] for t in TOPICS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--single", type=int, default=4)
    args = ap.parse_args()

    import torch
    import transformers

    from langtorch.models import SmolLM2

    chats = prompts()
    ours = SmolLM2()
    t0 = time.perf_counter()
    ours.generate(chats, max_tokens=args.max_tokens, temperature=0)
    first_batched_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours.generate(chats[:1], max_tokens=args.max_tokens, temperature=0)
    first_single_s = time.perf_counter() - t0

    torch.set_num_threads(os.cpu_count() or 1)
    d, f = str(ours.path.parent), ours.path.name
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.padding_side = "left"
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f,
                                                              dtype=torch.float32).eval()
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    eos = tok.eos_token_id

    def hf_generate(batch: list[str]) -> int:
        enc = tok(batch, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.max_tokens, do_sample=False,
                                 pad_token_id=eos)
        gen = out[:, enc["input_ids"].shape[1]:].tolist()
        return sum(len(r[:r.index(eos) + 1]) if eos in r else len(r) for r in gen)

    def ours_generate(batch: list) -> int:
        return sum(g.completion_tokens for g in ours.generate(batch, max_tokens=args.max_tokens,
                                                              temperature=0))

    hf_generate(texts[:2])  # warm-up
    threads = sorted({1, os.cpu_count() or 1})
    res: dict = {"ours_b": [], "ours_s": []}
    for th in threads:
        res[("hf_b", th)], res[("hf_s", th)] = [], []

    def single(fn, items) -> float:
        n, t = 0, time.perf_counter()
        for item in items[:args.single]:
            n += fn([item])
        return n / (time.perf_counter() - t)

    for _ in range(args.repeats):
        t = time.perf_counter(); n = ours_generate(chats); res["ours_b"].append(n / (time.perf_counter() - t))  # noqa: E702
        res["ours_s"].append(single(ours_generate, chats))
        for th in threads:
            torch.set_num_threads(th)
            t = time.perf_counter(); n = hf_generate(texts); res[("hf_b", th)].append(n / (time.perf_counter() - t))  # noqa: E702
            res[("hf_s", th)].append(single(hf_generate, texts))
    med = {k: statistics.median(v) for k, v in res.items()}
    best_b = max(threads, key=lambda th: med[("hf_b", th)])
    best_s = max(threads, key=lambda th: med[("hf_s", th)])
    med["hf_b"], med["hf_s"] = med[("hf_b", best_b)], med[("hf_s", best_s)]

    llama_cpp = None
    try:
        import llama_cpp as lc

        llm = lc.Llama(model_path=str(ours.path), n_ctx=1024, n_threads=os.cpu_count(),
                       verbose=False)
        n, t = 0, time.perf_counter()
        for c in chats[:args.single]:
            r = llm.create_chat_completion(c, max_tokens=args.max_tokens, temperature=0)
            n += r["usage"]["completion_tokens"]
        llama_cpp = round(n / (time.perf_counter() - t), 1)
    except ImportError:
        pass

    print(json.dumps({
        "bench": "generate", "model": "SmolLM2-135M-Instruct", "prompts": len(chats),
        "max_tokens": args.max_tokens, "dtype": "float32",
        "ours_batched_tok_s": round(med["ours_b"], 1),
        "peer": f"transformers {transformers.__version__} generate (best torch threads: "
                f"batched {best_b}, single {best_s})",
        "peer_batched_tok_s": round(med["hf_b"], 1),
        "ratio_batched": round(med["ours_b"] / med["hf_b"], 2),
        "ours_single_tok_s": round(med["ours_s"], 1),
        "peer_single_tok_s": round(med["hf_s"], 1),
        "ratio_single": round(med["ours_s"] / med["hf_s"], 2),
        "llama_cpp_single_tok_s": llama_cpp,
        "ours_first_call_s": {"batched": round(first_batched_s, 1),
                              "single": round(first_single_s, 1)},
        "repeats": args.repeats, "statistic": "median",
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
