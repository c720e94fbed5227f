"""Attention over the engine's decode cache gives a row the same bits at every cache length.

The decode cache's length is a bucket of the longest live sequence, so a request's cache grows
when a longer batch-mate joins. Its keys are stored in blocks of ``decoder.KEY_BLOCK`` slots and
attention runs block by block, the blocks' sums combined by halving (``decoder.block``'s
``transposed_keys``): the slots past a row's keys add exact zeros, so its attention must not
change by a bit. With one ``[g, D] x [D, S]`` score product over the whole cache, XLA:CPU rounded
SmolLM2's scores differently from 1,024 slots on (an AMX Xeon, 2026-12-07), which changed a
greedy answer when a 600-token prompt joined.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional.models import decoder

# The engine's cache buckets (functional.engine.CACHE_BUCKETS: 256 on, two blocks and more).
# A cache of one block (128 slots) is not among them: its single block's products did not
# always round as the first of two blocks do (SmolLM2's shapes at 16 rows, 2026-12-07).
LENGTHS = (256, 512, 1024, 2048)

SHAPES = {  # the attention shapes of real models: query heads, KV heads, head dim
    "smollm2": dict(num_heads=9, num_kv_heads=3, head_dim=64),
    "gemma3": dict(num_heads=4, num_kv_heads=1, head_dim=256, qk_norm=True, norm_offset=1.0,
                   query_scale=256 ** -0.5),
}


def _attention_at(cfg, rows, real, length, seed=0):
    """One decode step's attention output (``decoder.block``'s first half, as the engine runs
    it) for ``rows`` rows of ``real[r]`` cached positions in a cache of ``length`` slots."""
    rng = np.random.default_rng(seed)
    p = decoder.unstack_layers(decoder.random_params(jax.random.key(seed), cfg))["layers"][0]
    top = max(real)
    nkv, d = cfg.num_kv_heads, cfg.head_dim
    k = np.zeros((rows, nkv, length, d), np.float32)
    v = np.zeros_like(k)
    k[:, :, :top] = rng.standard_normal((rows, nkv, top, d))
    v[:, :, :top] = rng.standard_normal((rows, nkv, top, d))
    x = jnp.asarray(rng.standard_normal((rows, 1, cfg.hidden_size)), jnp.float32)
    pos = jnp.asarray(real)[:, None] - 1
    allowed = jnp.arange(length)[None, None, :] <= pos[:, :, None]
    bias = decoder.attention_bias(allowed)
    cos, sin = decoder.rope(pos, cfg)
    keys = decoder.blocked_keys(jnp.asarray(k))

    def run(p, x, cos, sin, bias, keys, values):  # (all arguments: as the engine's step)
        return decoder.block(p, x, cos, sin, bias, lambda k_, v_: (keys, values, None),
                             config=cfg, transposed_keys=True)[0]

    return np.asarray(jax.jit(run)(p, x, cos, sin, bias, keys, jnp.asarray(v)))


@pytest.mark.parametrize("shape,rows", [("smollm2", 16), ("smollm2", 2), ("gemma3", 2)])
def test_a_rows_attention_is_alike_at_every_cache_length(shape, rows):
    cfg = decoder.DecoderConfig(vocab_size=16, hidden_size=32, num_layers=1,
                                intermediate_size=16, **SHAPES[shape])
    real = [60 + 4 * r for r in range(rows)]  # under every length, ragged
    want = _attention_at(cfg, rows, real, LENGTHS[0])
    for length in LENGTHS[1:]:
        got = _attention_at(cfg, rows, real, length)
        assert np.array_equal(got, want), (shape, rows, length,
                                           float(np.abs(got - want).max()))


def test_blocked_keys_rejects_a_partial_block():
    with pytest.raises(ValueError, match="whole number"):
        decoder.blocked_keys(jnp.zeros((2, 200, 4)), 256)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_prefill_row_is_alike_whatever_past_its_batch_mates_bring(dtype):
    # Chunked prefill (engine.prefill_blocks) runs a call's rows over the longest past among
    # them: a prompt's first chunk prefilled beside a long prompt's late chunk sees 16 masked
    # past blocks instead of none. Its keys/values and logits must not move by a bit.
    from langtorch.functional import engine as E

    cfg = decoder.DecoderConfig(vocab_size=40, hidden_size=32, num_layers=2,
                                intermediate_size=48, **SHAPES["smollm2"])
    params = jax.tree.map(lambda a: a.astype(dtype),
                          decoder.random_params(jax.random.key(3), cfg))
    bw, nb = 64, 16
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, bw)), jnp.int32)
    i32 = lambda *x: jnp.array(x, jnp.int32)  # noqa: E731
    past = tuple(jnp.asarray(rng.standard_normal((2, cfg.num_layers, cfg.num_kv_heads, bw,
                                                  cfg.head_dim)), jnp.bfloat16)
                 for _ in range(2 * nb))
    # Row 0: a prompt's first chunk (40 tokens). Row 1: another's first chunk, then (second
    # call) a late chunk of a long prompt whose past is 16 blocks; row 0's past blocks are
    # padding there.
    alone, a_logits = E.prefill_blocks(params, ids, i32(0, 0), i32(40, 64), (), config=cfg,
                                       block=bw)
    mixed, m_logits = E.prefill_blocks(params, ids, i32(0, nb * bw), i32(40, 64), past,
                                       config=cfg, block=bw)
    assert np.array_equal(np.asarray(a_logits[0]), np.asarray(m_logits[0]))
    assert np.array_equal(np.asarray(alone[0], np.float32), np.asarray(mixed[0], np.float32))
    assert not np.array_equal(np.asarray(a_logits[1]), np.asarray(m_logits[1]))  # it attended
    # A row with a real past of its own (3 blocks) beside a row whose past is 3 blocks, then
    # 16: its own keys must stay first (behind a longer past they would meet the halving's
    # pairs in another order) and its padding blocks add zeros.
    own3 = past[:3]
    short = own3 + tuple(past[nb:nb + 3])
    long_ = own3 + past[3:nb] + tuple(past[nb:2 * nb])
    three, t_logits = E.prefill_blocks(params, ids, i32(3 * bw, 3 * bw), i32(40, 64), short,
                                       config=cfg, block=bw)
    beside, b_logits = E.prefill_blocks(params, ids, i32(3 * bw, nb * bw), i32(40, 64), long_,
                                        config=cfg, block=bw)
    assert np.array_equal(np.asarray(t_logits[0]), np.asarray(b_logits[0]))
    assert np.array_equal(np.asarray(three[0], np.float32), np.asarray(beside[0], np.float32))


def test_the_halving_sum_ignores_zeros_appended_at_the_end():
    # Blocks past a row's keys are exact zeros appended at the end: the sum must keep its
    # bits whatever their number (a plain reduction may pair terms by the length), and it
    # must pair halves as documented: (x0 + x4) + (x2 + x6) + ... for 8 terms.
    from langtorch.functional.models.decoder import _halving_sum

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((5, 7)) * 10.0 ** rng.integers(-6, 7, (5, 7))).astype(np.float32)
    want = np.asarray(_halving_sum(jnp.asarray(x), 0))
    for extra in (0, 3, 11, 27):
        padded = np.concatenate([x, np.zeros((extra, 7), np.float32)])
        assert np.array_equal(np.asarray(jax.jit(_halving_sum, static_argnums=1)(
            jnp.asarray(padded), 0)), want), extra
    # the documented order, in numpy float32: pad to 8, then halves
    p = np.concatenate([x, np.zeros((3, 7), np.float32)])
    p = p[:4] + p[4:]
    p = p[:2] + p[2:]
    assert np.array_equal(p[0] + p[1], want)


def test_decode_chunk_rejects_keys_in_another_layout():
    # A cache in the old [R, Nkv, D, C] key layout (or keys that do not fit the values) gets a
    # clear error, not a reshape failure inside the jitted program.
    from langtorch.functional import engine as E

    cfg = decoder.DecoderConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=4, intermediate_size=8)
    p = decoder.random_params(jax.random.key(0), cfg)
    i32 = lambda *x: jnp.array(x, jnp.int32)  # noqa: E731

    def call(cache):
        return E.decode_chunk(p, cache, i32(3), i32(0), jnp.array([True]), i32(2), i32(0),
                              jnp.zeros(1), jnp.ones(1), jnp.zeros((1, 3), jnp.uint32), i32(),
                              config=cfg, steps=4)

    values = jnp.zeros((1, 1, 256, 4))
    with pytest.raises(ValueError, match="keys in blocks"):
        call({"k": (jnp.zeros((1, 1, 4, 256)),), "v": (values,)})
    with pytest.raises(ValueError, match="one array of each per layer"):
        call({"k": (), "v": (values,)})
    good = decoder.init_kv_cache(cfg, 1, 256, per_layer=True, transposed_keys=True)
    assert call({"k": good["k"], "v": good["v"]})[1].shape == (1, 4)
