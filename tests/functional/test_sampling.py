"""langtorch.functional.sampling against trusted references.

Hugging Face's logits processors (repetition penalty, temperature, top-k, top-p, min-p) and
numpy transcriptions of OpenAI's documented formulas (frequency/presence penalty, logit_bias,
log_softmax) are the references; the sampler's empirical frequencies are compared with the exact
distribution of the filtered softmax.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import sampling
from langtorch.functional.constrain import unpack_bitmask
from langtorch.functional.errors import BadRequestError

V = 64


def _logits(rows, v=V, seed=0, scale=3.0):
    return np.random.default_rng(seed).normal(size=(rows, v)).astype(np.float32) * scale


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_penalties_match_openai_formula():
    x = _logits(5)
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 4, size=x.shape) * (rng.random(x.shape) < 0.3)
    freq = np.array([0.0, 0.5, -1.0, 2.0, 1.3], np.float32)
    pres = np.array([0.0, 1.0, 0.5, -2.0, 0.0], np.float32)
    want = x - freq[:, None] * counts - pres[:, None] * (counts > 0)
    got = sampling.apply_penalties(jnp.asarray(x), jnp.asarray(counts), jnp.asarray(freq),
                                   jnp.asarray(pres))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-5)


def test_count_tokens_matches_bincount():
    ids = np.array([[3, 3, 5, -1, 0], [-1, -1, -1, -1, -1]], np.int32)
    got = np.asarray(sampling.count_tokens(jnp.asarray(ids), 8))
    want = np.stack([np.bincount(r[r >= 0], minlength=8) for r in ids])
    np.testing.assert_array_equal(got, want)


def test_repetition_penalty_matches_transformers():
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    x = _logits(3)
    ids = np.random.default_rng(2).integers(0, V, size=(3, 12))
    penalty = np.array([1.0, 1.3, 0.7], np.float32)
    seen = np.zeros_like(x, bool)
    np.put_along_axis(seen, ids, True, axis=1)
    got = np.asarray(sampling.apply_repetition_penalty(jnp.asarray(x), jnp.asarray(seen),
                                                       jnp.asarray(penalty)))
    for r in range(3):
        ref = RepetitionPenaltyLogitsProcessor(float(penalty[r]))(
            torch.tensor(ids[r:r + 1]), torch.tensor(x[r:r + 1])).numpy()[0]
        np.testing.assert_allclose(got[r], ref, rtol=1e-6, atol=1e-6)


def test_logit_bias_adds_at_ids_and_pads():
    x = _logits(2)
    ids, vals = sampling.logit_bias_arrays([{"3": 5.0, 7: -100}, None], width=4)
    got = np.asarray(sampling.apply_logit_bias(jnp.asarray(x), jnp.asarray(ids),
                                               jnp.asarray(vals)))
    want = x.copy()
    want[0, 3] += 5.0
    want[0, 7] -= 100
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_token_bitmask_matches_unpacked_mask():
    rng = np.random.default_rng(3)
    v = 70  # not a multiple of 32: the last word is partly padding
    bits = rng.integers(-(2**31), 2**31 - 1, size=(3, 3), dtype=np.int64).astype(np.int32)
    bits[2] = -1
    x = _logits(3, v)
    got = np.asarray(sampling.apply_token_bitmask(jnp.asarray(x), jnp.asarray(bits)))
    allowed = unpack_bitmask(bits, v)
    np.testing.assert_array_equal(got, np.where(allowed, x, -np.inf))
    assert np.isfinite(got[2]).all()


def _hf_keep(x, temperature, top_k, top_p, min_p):
    """The kept set of HF's warpers applied in generate()'s order to one row."""
    import torch
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    s = torch.tensor(x[None].astype(np.float32))
    ids = torch.zeros((1, 1), dtype=torch.long)
    s = TemperatureLogitsWarper(float(temperature))(ids, s)
    if 0 < top_k < x.shape[-1]:
        s = TopKLogitsWarper(int(top_k))(ids, s)
    if top_p < 1:
        s = TopPLogitsWarper(float(top_p))(ids, s)
    if min_p > 0:
        s = MinPLogitsWarper(float(min_p))(ids, s)
    return np.isfinite(s.numpy()[0]), s.numpy()[0]


def test_keep_threshold_matches_transformers_warpers_per_row():
    pytest.importorskip("torch")
    rows = 24
    x = _logits(rows, seed=4)
    rng = np.random.default_rng(5)
    temperature = rng.choice([0.5, 1.0, 1.7], rows).astype(np.float32)
    top_k = rng.choice([0, 1, 3, 10, 40, V], rows).astype(np.int32)
    top_p = rng.choice([1.0, 0.9, 0.5, 0.2, 0.05], rows).astype(np.float32)
    min_p = rng.choice([0.0, 0.05, 0.3], rows).astype(np.float32)
    x[3, :5] = x[3, 0]  # ties at the top-k boundary are kept, as HF keeps them
    top_k[3] = 2
    scaled = jnp.asarray(x) / jnp.asarray(temperature)[:, None]
    keep_threshold = jax.jit(sampling.keep_threshold)
    got = np.asarray(keep_threshold(scaled, jnp.asarray(top_k), jnp.asarray(top_p),
                                             jnp.asarray(min_p)))
    for r in range(rows):
        want, _ = _hf_keep(x[r], temperature[r], top_k[r], top_p[r], min_p[r])
        np.testing.assert_array_equal(got[r], want, err_msg=f"row {r}")
        # batch invariance: the row alone gives the same set
        alone = keep_threshold(scaled[r:r + 1], jnp.asarray(top_k[r:r + 1]),
                                        jnp.asarray(top_p[r:r + 1]), jnp.asarray(min_p[r:r + 1]))
        np.testing.assert_array_equal(np.asarray(alone)[0], got[r])


def test_keep_threshold_ignores_masked_tokens():
    x = np.array([[3.0, -np.inf, 2.0, -np.inf, 1.0]], np.float32)
    keep = sampling.keep_threshold(jnp.asarray(x), jnp.array([2]), jnp.array([1.0]),
                                   jnp.array([0.0]))
    assert np.asarray(keep).tolist() == [[True, False, True, False, False]]


def test_keep_threshold_treats_signed_zeros_as_one_value():
    # Review of issue 20: -0.0 and +0.0 are equal logits (a float comparison, transformers'
    # top-k warper); the sort-free threshold kept only the +0.0 ones at a top-k boundary.
    x = np.array([[1.0, 0.0, -0.0, 0.0, -0.0, -1.0]], np.float32)
    keep = sampling.keep_threshold(jnp.asarray(x), top_k=jnp.array([2]))
    assert np.asarray(keep).tolist() == [[True, True, True, True, True, False]]
    keep = sampling.keep_threshold(jnp.asarray(x), top_p=jnp.array([0.5]))
    assert np.asarray(keep).tolist() == [[True, True, True, True, True, False]]


@pytest.mark.parametrize("candidates", [64, 3])  # 64 >= V: candidates only; 3: both ways
@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 4, 1.0, 0.0), (1.0, 0, 0.8, 0.0), (1.3, 6, 0.9, 0.1),
    (1.0, 2, 1.0, 0.0), (0.5, 0, 0.5, 0.0),
])
def test_sampler_frequencies_match_exact_distribution(temperature, top_k, top_p, min_p,
                                                      candidates):
    pytest.importorskip("torch")
    x = _logits(1, v=12, seed=6, scale=1.5)[0]
    keep, scaled = _hf_keep(x, temperature, top_k, top_p, min_p)
    exact = np.where(keep, np.exp(scaled - scaled[keep].max()), 0.0)
    exact /= exact.sum()
    n = 20000
    keys = jax.random.split(jax.random.key(7), n)
    draws = np.asarray(jax.jit(functools.partial(sampling.sample, candidates=candidates))(
        jnp.broadcast_to(jnp.asarray(x), (n, x.size)), keys, jnp.full((n,), temperature),
        top_k=jnp.full((n,), top_k, jnp.int32), top_p=jnp.full((n,), top_p),
        min_p=jnp.full((n,), min_p)))
    freq = np.bincount(draws, minlength=x.size) / n
    assert (freq[~keep] == 0).all(), "sampled a filtered token"
    sigma = np.sqrt(exact * (1 - exact) / n)
    assert np.all(np.abs(freq - exact) <= 5 * sigma + 1e-9), (freq, exact)


def test_sampler_greedy_rows_and_row_independence():
    x = _logits(4, seed=8)
    keys = jax.random.split(jax.random.key(9), 4)
    temp = jnp.array([0.0, 1.0, 0.0, 0.8])
    out = np.asarray(sampling.sample(jnp.asarray(x), keys, temp, top_p=jnp.full((4,), 0.9)))
    assert out[0] == x[0].argmax() and out[2] == x[2].argmax()
    for r in range(4):
        alone = sampling.sample(jnp.asarray(x[r:r + 1]), keys[r:r + 1], temp[r:r + 1],
                                top_p=jnp.full((1,), 0.9))
        assert int(alone[0]) == out[r]


def _exact(x, temperature, top_k=0, top_p=1.0, min_p=0.0):
    keep, scaled = _hf_keep(x, temperature, top_k, top_p, min_p)
    p = np.where(keep, np.exp(scaled - scaled[keep].max()), 0.0)
    return p / p.sum()


def _assert_frequencies(draws, exact):
    """Each token expected >= 30 times within 5 sigma of its probability; the others pooled
    into one bin (the normal approximation needs the counts); filtered tokens never."""
    n = draws.size
    freq = np.bincount(draws, minlength=exact.size) / n
    assert (freq[exact == 0] == 0).all(), "sampled a filtered token"
    big = exact * n >= 30
    f = np.append(freq[big], freq[~big].sum())
    e = np.append(exact[big], exact[~big].sum())
    sigma = np.sqrt(e * (1 - e) / n)
    assert np.all(np.abs(f - e) <= 5 * sigma + 1e-9), (np.flatnonzero(big), f, e)


@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.999])
def test_sampler_over_several_blocks_matches_exact_distribution(top_p):
    # V = 1300: three blocks of the full-vocabulary draw (the last one padded); the likely tokens
    # sit in different blocks. top_p 0.9: resolved among the 8 candidates; 0.999 and 1.0: the
    # nucleus reaches past them, the whole vocabulary is searched.
    pytest.importorskip("torch")
    x = _logits(1, v=1300, seed=11, scale=1.0)[0]
    x[[3, 511, 512, 700, 1299]] += np.array([6.0, 5.5, 5.0, 4.5, 6.2], np.float32)
    exact = _exact(x, 1.0, top_p=top_p)
    n = 6000
    keys = jax.random.split(jax.random.key(12), n)
    draws = np.asarray(jax.jit(functools.partial(sampling.sample, candidates=8))(
        jnp.broadcast_to(jnp.asarray(x), (n, x.size)), keys, jnp.ones((n,)),
        top_p=jnp.full((n,), top_p)))
    _assert_frequencies(draws, exact)


def test_a_rows_draw_does_not_depend_on_which_way_its_batch_mates_go():
    # A peaked row is resolved among its candidates; a flat row needs the whole vocabulary, which
    # then runs for the batch. Each row draws the same token alone and together, for many keys.
    v = 1300
    peaked = _logits(1, v=v, seed=13, scale=1.0)[0]
    peaked[[5, 900, 1200]] = [9.0, 9.5, 8.5]  # value order differs from vocabulary order
    flat = _logits(1, v=v, seed=14, scale=0.1)[0]
    x = jnp.asarray(np.stack([peaked, flat]))
    f = jax.jit(functools.partial(sampling.sample, candidates=16))
    temp, top_p = jnp.array([0.8, 0.8]), jnp.array([0.9, 0.9])
    for i in range(40):
        keys = jax.random.split(jax.random.key(i), 2)
        both = np.asarray(f(x, keys, temp, top_p=top_p))
        for r in range(2):
            alone = f(x[r:r + 1], keys[r:r + 1], temp[r:r + 1], top_p=top_p[r:r + 1])
            assert int(alone[0]) == both[r], (i, r)


@pytest.mark.parametrize("top_p", [1.0, 0.6])
def test_sampler_keeps_ties_at_the_last_candidate(top_p):
    # top_k = 2 with a three-way tie for second place: Hugging Face keeps all three. With two
    # candidates the tie reaches past them, so the row is resolved on the whole vocabulary.
    # top_p 0.6 is reached by token 0 alone if the top-k mass were the two candidates' (0.73 of
    # it), but not of the four tokens' top-k set (0.48): all four stay.
    x = np.full((1, 700), -5.0, np.float32)
    x[0, [0, 300, 650, 699]] = [4.0, 3.0, 3.0, 3.0]
    n = 3000
    keys = jax.random.split(jax.random.key(15), n)
    draws = np.asarray(jax.jit(functools.partial(sampling.sample, candidates=2))(
        jnp.broadcast_to(jnp.asarray(x), (n, 700)), keys, jnp.ones((n,)),
        top_k=jnp.full((n,), 2, jnp.int32), top_p=jnp.full((n,), top_p)))
    assert set(np.unique(draws)) == {0, 300, 650, 699}


def test_top_p_mass_is_the_top_k_sets_when_top_k_exceeds_the_candidates():
    # top_k 6 > 3 candidates, min_p's cut lies inside the candidates. top_p 0.15 of the top-6
    # mass is token 0 alone (0.20 of it); of the whole vocabulary's mass it would be two tokens.
    pytest.importorskip("torch")
    x = np.array([2.0, 1.9, 1.8, 1.7, 1.7, 1.7] + [1.6] * 6, np.float32)
    keep, _ = _hf_keep(x, 1.0, 6, 0.15, 0.85)
    assert keep.tolist() == [True] + [False] * 11
    n = 200
    keys = jax.random.split(jax.random.key(16), n)
    draws = np.asarray(jax.jit(functools.partial(sampling.sample, candidates=3))(
        jnp.broadcast_to(jnp.asarray(x), (n, 12)), keys, jnp.ones((n,)),
        top_k=jnp.full((n,), 6, jnp.int32), top_p=jnp.full((n,), 0.15),
        min_p=jnp.full((n,), 0.85)))
    assert (draws == 0).all()


def test_sampler_uses_the_topk_kernel_not_a_sort_of_the_vocabulary():
    # A static slice of lax.top_k's result (vals[:, :1]) merges with top_k's own slice: XLA:CPU
    # loses the TopK pattern and sorts every row of the vocabulary (~100x slower).
    x = jnp.zeros((2, 5000))
    keys = jax.random.split(jax.random.key(0), 2)
    hlo = jax.jit(sampling.sample).lower(x, keys, jnp.ones(2), top_p=jnp.full((2,), 0.9),
                                         top_k=jnp.full((2,), 5, jnp.int32),
                                         min_p=jnp.full((2,), 0.1)).compile().as_text()
    assert 'custom_call_target="TopK"' in hlo
    sorts = [ln for ln in hlo.splitlines() if " sort(" in ln and "5000]" in ln.split("=")[1]]
    assert not sorts, sorts


def test_a_nan_logit_is_never_drawn_and_takes_no_top_k_slot():
    # Review: lax.top_k sorts NaN first; the row max became NaN, min_p's threshold NaN, and the
    # NaN token itself was drawn. NaN is no token (keep_threshold: not > -inf).
    x = jnp.array([[0.0, 1.0, jnp.nan, 0.5, 2.0]])
    n = 64
    keys = jax.random.split(jax.random.key(0), n)
    xs = jnp.broadcast_to(x, (n, 5))
    for cands in (64, 2):  # all candidates / the whole-vocabulary path too
        f = jax.jit(functools.partial(sampling.sample, candidates=cands))
        d = np.asarray(f(xs, keys, jnp.ones(n), min_p=jnp.full((n,), 0.1)))
        assert not (d == 2).any(), np.unique(d)
        d = np.asarray(f(xs, keys, jnp.ones(n), top_k=jnp.full((n,), 2, jnp.int32)))
        assert set(np.unique(d)) == {1, 4}, np.unique(d)
        d = np.asarray(f(xs, keys, jnp.ones(n)))
        assert not (d == 2).any() and len(set(np.unique(d))) == 4


def test_plus_inf_logits_are_the_only_tokens_drawn():
    # Review: with a +inf maximum the full-vocabulary draw used exp(s), which overflowed for a
    # large finite logit too, and drew the first of them in vocabulary order.
    x = np.zeros((1, 302), np.float32)
    x[0, 0], x[0, 150], x[0, 301] = 100.0, np.inf, np.inf
    n = 400
    keys = jax.random.split(jax.random.key(0), n)
    xs = jnp.broadcast_to(jnp.asarray(x), (n, 302))
    for kw in ({}, {"top_p": jnp.ones(n)}, {"top_p": jnp.full((n,), 0.9)},
               {"top_k": jnp.full((n,), 5, jnp.int32)}):
        d = np.asarray(jax.jit(functools.partial(sampling.sample, **kw))(xs, keys, jnp.ones(n)))
        assert set(np.unique(d)) == {150, 301}, (kw, np.unique(d))


def test_a_tiny_temperature_is_greedy_not_an_overflow():
    # Review: logits / 1e-37 overflowed to +inf above ~34, and the first of those was drawn;
    # logits are shifted by the row max first, so only -inf overflow remains.
    x = jnp.asarray(np.linspace(30, 40, 600, dtype=np.float32)[None])
    keys = jax.random.split(jax.random.key(0), 1)
    for kw in ({"top_k": jnp.array([1])}, {}, {"top_p": jnp.array([0.9])}):
        assert int(sampling.sample(x, keys, jnp.array([1e-37]), **kw)[0]) == 599, kw


@pytest.mark.parametrize("v", [1, 7, 512, 513, 1300, 2048, 4096, 4097, 6001, 49152])
def test_argmax_equals_jnp_argmax(v):
    # Sizes below, at and past argmax's 2,048-logit blocks, with and without a shorter tail.
    rng = np.random.default_rng(v)
    x = rng.normal(size=(10, v)).astype(np.float32)
    x[1] = -np.inf  # every token masked: position 0, as jnp.argmax
    x[2, v // 2:] = x[2].max() + 1  # ties: the first one
    x[3, -1] = np.inf
    x[4] = np.round(x[4])  # many ties
    x[6, [v // 3, v - 1]] = x[6].max() + 1  # a tie between an early block and the tail
    x[7, [v - 1, max(v - 2, 0)]] = x[7].max() + 1  # the maximum in the last block only
    x[8, 0] = x[8].max() + 1  # the first position
    x[9, -1] = -np.inf  # a masked last token beside finite ones
    np.testing.assert_array_equal(np.asarray(jax.jit(sampling.argmax)(jnp.asarray(x))),
                                  np.argmax(x, axis=-1))
    x[5, v // 3] = np.nan  # a NaN counts as +inf (jnp.argmax: the first NaN)
    x[5, -1] = np.nan
    assert int(sampling.argmax(jnp.asarray(x))[5]) == v // 3
    if v > 1:  # ... so an earlier +inf wins over a NaN (jnp.argmax would take the NaN)
        x[5, 0] = np.inf
        assert int(sampling.argmax(jnp.asarray(x))[5]) == 0
    # Each lane of a block: a row whose maximum sits at position p for every p of one block
    # (a wrong halving would miss some lane).
    n = min(v, 2048)
    y = np.zeros((n, v), np.float32)
    y[np.arange(n), v - n + np.arange(n)] = 1.0
    np.testing.assert_array_equal(np.asarray(jax.jit(sampling.argmax)(jnp.asarray(y))),
                                  v - n + np.arange(n))


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_sampler_refuses_bad_candidates(bad):
    with pytest.raises(ValueError, match="candidates"):
        sampling.sample(jnp.zeros((1, 4)), jax.random.split(jax.random.key(0), 1), jnp.ones(1),
                        top_p=jnp.ones(1), candidates=bad)


def test_argmax_and_draw_refuse_bad_shapes():
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sampling.argmax(jnp.zeros((3,)))
    with pytest.raises(ValueError, match=r"\[B, V\]"):
        sampling.draw(jnp.zeros((2, 0)), jax.random.split(jax.random.key(0), 2), jnp.ones(2))


def test_top_logprobs_equal_log_softmax():
    x = _logits(3, v=300, seed=10, scale=4.0)
    tokens = np.array([5, 17, 299], np.int32)
    chosen, ids, top = sampling.top_logprobs(jnp.asarray(x), jnp.asarray(tokens), k=20)
    ref = _log_softmax(x)
    np.testing.assert_allclose(np.asarray(chosen), ref[np.arange(3), tokens], atol=1e-4)
    want_ids = np.argsort(-ref, axis=-1)[:, :20]
    np.testing.assert_array_equal(np.asarray(ids), want_ids)
    np.testing.assert_allclose(np.asarray(top), np.take_along_axis(ref, want_ids, -1), atol=1e-4)
    with pytest.raises(ValueError, match="top_logprobs"):
        sampling.top_logprobs(jnp.asarray(x), jnp.asarray(tokens), k=21)


@pytest.mark.parametrize("kwargs,param", [
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": float("nan")}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"top_k": -2}, "top_k"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logit_bias": {"99": 1.0}}, "logit_bias"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"),
    ({"logit_bias": {"3": 101}}, "logit_bias"),
])
def test_check_sampling_rejects_bad_values(kwargs, param):
    with pytest.raises(BadRequestError) as e:
        sampling.check_sampling(vocab_size=10, **kwargs)
    assert e.value.param == param and e.value.status == 400


def test_check_sampling_accepts_defaults_and_limits():
    sampling.check_sampling(vocab_size=10, frequency_penalty=-2, presence_penalty=2,
                            repetition_penalty=1.2, top_k=-1, min_p=1.0,
                            logit_bias={"3": -100, 4: 100}, logprobs=True, top_logprobs=20)


@pytest.mark.parametrize("v", [1, 15, 2048, 2049, 4096 + 700, 49152])
def test_row_max_equals_numpy(v):
    # The full-vocabulary draw's row maximum reads a row in 2,048-entry blocks narrowed to
    # lanes, and a tail; every position must count (a spike at each boundary).
    rng = np.random.default_rng(v)
    x = rng.normal(size=(5, v)).astype(np.float32)
    for r, p in enumerate(sorted({0, v - 1, min(2048, v - 1), (v - v % 2048) % v, v // 2})):
        x[r, p] = 50.0
    got = np.asarray(jax.jit(sampling._row_max)(jnp.asarray(x)))
    np.testing.assert_array_equal(got, np.max(x, axis=-1))
