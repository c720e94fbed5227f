"""A row's cache slots are its sequence positions, whatever ran in the batch before it.

The decode cache puts a row's token at position ``p`` in cache slot ``p``, so its attention
reduces over the same slots in the same order whether it was admitted into a fresh batch or
beside a row that has been decoding for a while, and whether its prompt was computed or came
from the prefix cache. (A ring with one write pointer shared by all rows put a late row's
tokens at an offset set by the batch's history; its softmax sums then rounded differently and
its logprobs moved in the last bits.) The check is bit-for-bit on logprobs, not on greedy
tokens, which hide small differences: the same two-row shapes in every run, fp32 throughout.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional.engine import Sequence, SlotBatch
from langtorch.functional.models import decoder, llama

CFG = llama.LlamaConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, intermediate_size=64, max_positions=256)
N = 24  # tokens the target decodes


def _batch(params, **kw):
    kw = {"config": CFG, "max_slots": 2, "chunk": 4, "kv_dtype": jnp.float32,
          "eos_ids": (), "prefill_chunk": 16, "prefix_cache_tokens": 0, **kw}
    return SlotBatch(params, **kw)


def _target():
    rng = np.random.default_rng(7)
    return Sequence(rng.integers(1, 96, 37).tolist(), max_tokens=N, top_logprobs=3)


def _lps(seq):
    return np.array([lp for _, lp, _, _ in seq.logprobs]), [ids for *_, ids, _ in seq.logprobs]


def _companion(n, length, seed):
    return Sequence(np.random.default_rng(seed).integers(1, 96, length).tolist(), max_tokens=n)


def _decode_beside(b, target, companion, *, steps_before):
    """Run ``companion`` alone for ``steps_before`` chunks, then admit ``target`` beside it and
    decode both until the target is done."""
    b.admit([companion])
    for _ in range(steps_before):
        b.step()
    b.admit([target])
    while not target.finished:
        b.step()
    assert len(target.tokens) == N and not companion.finished
    return _lps(target)


def test_a_rows_logprobs_do_not_depend_on_what_ran_before_it():
    params = llama.random_params(jax.random.key(11), CFG)
    # Reference: the target admitted together with a companion into a fresh batch.
    ref = _decode_beside(_batch(params), _target(), _companion(200, 5, 1), steps_before=0)
    # The same two rows' shapes, but the companion has decoded 9 chunks (36 tokens) first, and
    # an earlier request ran and left: in a shared ring the target's slots would start at 41.
    b = _batch(params)
    b.run([_companion(13, 9, 2)])
    late = _decode_beside(b, _target(), _companion(200, 21, 3), steps_before=9)
    np.testing.assert_array_equal(late[0], ref[0])
    assert late[1] == ref[1]


def test_a_prefix_cache_hit_gives_the_logprobs_of_a_miss_bit_for_bit():
    params = llama.random_params(jax.random.key(12), CFG)
    b = _batch(params, prefix_cache_tokens=4096, prefill_chunk=16)
    miss = _decode_beside(b, _target(), _companion(200, 5, 1), steps_before=0)
    b2 = _batch(params, prefix_cache_tokens=4096, prefill_chunk=16)
    b2.run([_target()])  # fills the prefix cache with the target's prompt blocks
    hits = b2.stats()["prefix_cache"]["hits"]
    hit = _decode_beside(b2, _target(), _companion(200, 11, 4), steps_before=5)
    assert b2.stats()["prefix_cache"]["hits"] > hits
    np.testing.assert_array_equal(hit[0], miss[0])
    assert hit[1] == miss[1]


# ---- cache growth, shrinking and row reuse, against a full forward pass --------------------
def _configs():
    small = dict(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                 head_dim=8, max_positions=128)
    return {"llama": llama.LlamaConfig(num_kv_heads=2, **small),
            "sliding": decoder.DecoderConfig(num_kv_heads=1, sliding_window=4,
                                             sliding_layers=(True, False), **small)}


def _forward_logprobs(params, cfg, seq):
    # One jitted forward per config: every sequence padded at the end to the context length
    # (causal attention: the padding does not change the real positions' logits).
    ids = list(seq.prompt) + list(seq.tokens)
    t, full = len(ids), cfg.max_positions
    padded = jnp.array([ids + [0] * (full - t)])
    mask = jnp.array([[1] * t + [0] * (full - t)])
    lp = np.asarray(_forward_logsoftmax(params, padded, jnp.arange(full)[None], mask, cfg))
    n = len(seq.prompt)
    return np.array([float(lp[n - 1 + i, tok]) for i, tok in enumerate(seq.tokens)])


@functools.partial(jax.jit, static_argnums=(4,))
def _forward_logsoftmax(params, ids, positions, mask, cfg):
    logits = decoder.forward(params, ids, positions, mask, config=cfg)[0]
    return jax.nn.log_softmax(logits[0].astype(jnp.float32), axis=-1)


def _check(params, cfg, *seqs):
    for s in seqs:
        got = np.array([lp for _, lp, _, _ in s.logprobs])
        assert len(got) == len(s.tokens) > 0
        np.testing.assert_allclose(got, _forward_logprobs(params, cfg, s), atol=2e-5)


def _seq(seed, n, max_tokens):
    return Sequence(np.random.default_rng(seed).integers(1, 96, n).tolist(),
                    max_tokens=max_tokens, top_logprobs=0)


@pytest.mark.parametrize("arch", ["llama", "sliding"])
def test_rows_stay_right_when_the_cache_grows_shrinks_and_reuses_rows(arch):
    cfg = _configs()[arch]
    params = (llama if arch == "llama" else decoder).random_params(jax.random.key(5), cfg)
    kw = dict(config=cfg, max_slots=2, chunk=4, kv_dtype=jnp.float32, eos_ids=(),
              prefill_chunk=8, prefix_cache_tokens=0, cache_buckets=(16, 32, 64, 128))
    # A row reused after a longer occupant, and the cache growing while rows decode.
    b = SlotBatch(params, **kw)
    a, short = _seq(1, 10, 60), _seq(2, 30, 25)
    b.admit([a, short])
    while not short.finished:
        b.step()
    c = _seq(3, 4, 20)
    b.admit([c])
    while b.live:
        b.step()
    _check(params, cfg, a, short, c)
    # The cache shrinks (a long row ends) while another row goes on decoding.
    b = SlotBatch(params, **kw)
    long_, t = _seq(4, 40, 6), _seq(5, 3, 40)
    b.admit([long_, t])
    while b.live:
        b.step()
    assert b.counters["cache_resizes"] >= 1
    _check(params, cfg, long_, t)
