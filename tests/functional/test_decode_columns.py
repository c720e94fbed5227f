"""Column-major decode steps (``decode_layout="columns"``): the hidden states as columns and the
layer weights transposed (:func:`langtorch.functional.models.decoder.block_columns`,
:func:`langtorch.functional.engine.columns_params`) compute what the rows layout computes, for
every architecture the loader supports; the copy is made once per set of weights; bad params
and options get clear errors."""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import engine as E
from langtorch.functional.models import decoder, quant

_BASE = dict(vocab_size=56, hidden_size=24, num_layers=2, num_heads=4, num_kv_heads=2,
             head_dim=6, intermediate_size=40, max_positions=512)
ARCHS = {
    "llama": dict(),
    "mistral": dict(architecture="mistral", sliding_window=16, sliding_layers=(True, True)),
    "qwen2": dict(architecture="qwen2", qkv_bias=True, o_bias=True),
    "qwen3": dict(architecture="qwen3", qk_norm=True),
    "gemma2": dict(architecture="gemma2", norm_offset=1.0, activation="gelu_tanh",
                   post_norms=True, embed_scale=24 ** 0.5, query_scale=0.25, attn_softcap=50.0,
                   final_softcap=30.0, sliding_window=16, sliding_layers=(True, False)),
    "gemma3": dict(architecture="gemma3", norm_offset=1.0, activation="gelu_tanh",
                   post_norms=True, qk_norm=True, embed_scale=24 ** 0.5, query_scale=0.25,
                   sliding_window=16, sliding_layers=(True, False), rope_local_theta=10000.0),
    "phi3": dict(architecture="phi3", tie_embeddings=False),
}
ROWS, CTX = 5, 40


def _params(cfg, dtype=jnp.float32, seed=0):
    p = decoder.random_params(jax.random.key(seed), cfg)
    # Non-trivial norms and biases (random_params makes ones and zeros).
    leaves, tree = jax.tree.flatten(p)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [a + 0.2 * jax.random.normal(k, a.shape) if a.ndim <= 2 and a.shape[-1] in (
        cfg.hidden_size, cfg.head_dim) and a.shape[0] != cfg.vocab_size else a
        for a, k in zip(leaves, keys)]
    return jax.tree.map(lambda a: a.astype(dtype), jax.tree.unflatten(tree, leaves))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_column_layer_computes_the_row_layer(arch, dtype):
    cfg = decoder.check_config(decoder.DecoderConfig(**{**_BASE, **ARCHS[arch]}))
    params = decoder.unstack_layers(_params(cfg, dtype))
    cols = decoder.arrange_columns(params)
    ctx_k = jax.random.normal(jax.random.key(2), (ROWS, cfg.num_kv_heads, cfg.head_dim, CTX))
    ctx_v = jax.random.normal(jax.random.key(3), (ROWS, cfg.num_kv_heads, CTX, cfg.head_dim))
    x = jax.random.normal(jax.random.key(4), (ROWS, 1, cfg.hidden_size)).astype(dtype)
    pos = jnp.array([[CTX - 1], [3], [20], [7], [33]])
    tables = decoder.rope_tables(pos, cfg)
    distance = pos[:, :, None] - jnp.arange(CTX)[None, None, :]
    biases = decoder.layer_biases(distance >= 0, distance, cfg)
    seen = {}

    def kv(tag):
        def f(k, v):
            seen[tag] = (k, v)
            at = pos[:, 0]
            keys = ctx_k.at[jnp.arange(ROWS), :, :, at].set(k[:, :, 0].astype(ctx_k.dtype))
            values = ctx_v.at[jnp.arange(ROWS), :, at].set(v[:, :, 0].astype(ctx_v.dtype))
            return decoder.blocked_keys(jnp.swapaxes(keys, 2, 3)), values, None  # as cached
        return f

    for li in range(cfg.num_layers):
        sliding = bool(cfg.sliding_layers[li]) if cfg.sliding_layers else False
        want, _ = decoder.layer(params["layers"][li], x, tables, biases, kv("rows"), config=cfg,
                                sliding=sliding, transposed_keys=True)
        got, _ = decoder.layer(cols["layers"][li], x[:, 0].T, tables, biases, kv("cols"),
                               config=cfg, sliding=sliding, transposed_keys=True, columns=True)
        # bf16: bit for bit (the products accumulate in fp32 and every rounding to bf16
        # happens at the same point in both layouts; a rounding moved shows here, where a
        # tolerance of a bf16 ulp would hide it). fp32: the products' sums differ in order.
        tol = 1e-5 if dtype == jnp.float32 else 0
        assert got.shape == (cfg.hidden_size, ROWS) and got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got.T, np.float32),
                                   np.asarray(want[:, 0], np.float32), rtol=tol, atol=tol)
        for a, b in zip(seen["cols"], seen["rows"]):  # the same keys/values to the cache
            assert a.shape == b.shape == (ROWS, cfg.num_kv_heads, 1, cfg.head_dim)
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                       rtol=tol, atol=tol)
        assert not np.allclose(np.asarray(want, np.float32), np.asarray(x, np.float32))


def _decode(batch_params, cfg, steps=6):
    empty = decoder.init_kv_cache(cfg, ROWS, CTX, jnp.float32, per_layer=True,
                                  transposed_keys=True)
    rng = np.random.default_rng(0)
    cache = {n: tuple(jnp.asarray(rng.standard_normal(a.shape), jnp.float32) for a in empty[n])
             for n in "kv"}
    i32 = lambda a: jnp.asarray(a, jnp.int32)  # noqa: E731
    out = E.decode_chunk(batch_params, cache, i32([3, 9, 20, 41, 7]), i32([0, 5, 11, 2, 30]),
                         jnp.ones((ROWS,), bool), i32([steps] * ROWS), i32([0] * ROWS),
                         jnp.zeros((ROWS,)), jnp.ones((ROWS,)), jnp.zeros((ROWS, 3), jnp.uint32),
                         i32([]), None, config=cfg, steps=steps, features=("logprobs",))
    return np.asarray(out[1]), np.asarray(out[8][0])


@pytest.mark.parametrize("arch", ["gemma2", "phi3", "qwen2"])  # softcaps; untied head; biases
def test_a_column_decode_chunk_decodes_the_row_tokens(arch):
    cfg = decoder.check_config(decoder.DecoderConfig(**{**_BASE, **ARCHS[arch]}))
    params = decoder.unstack_layers(_params(cfg))
    want_tokens, want_lp = _decode(params, cfg)
    got_tokens, got_lp = _decode(E.columns_params(params), cfg)
    assert (got_tokens == want_tokens).all()
    np.testing.assert_allclose(got_lp, want_lp, rtol=1e-4, atol=1e-4)


def test_the_column_copy_is_made_once_per_set_of_weights_and_goes_with_them():
    cfg = decoder.DecoderConfig(**_BASE)
    params = decoder.unstack_layers(_params(cfg))
    cols = E.columns_params(params)

    def shared(a, b):  # the same transposed matrices
        return all(x[k] is y[k] for x, y in zip(a["layers"], b["layers"]) for k in x
                   if k.endswith("_t"))

    assert shared(E.columns_params(dict(params)), cols)  # another tree of the same weights
    # Another tree sharing the layer matrices but not the rest: the copy is shared, the rest
    # is that tree's own (never the first caller's embedding or norms).
    embed2 = params["embed"] + 1
    lay2 = {**params["layers"][0], "attn_norm": params["layers"][0]["attn_norm"] * 2}
    cols2 = E.columns_params({**params, "embed": embed2,
                              "layers": (lay2,) + tuple(params["layers"][1:])})
    assert shared(cols2, cols)
    assert cols2["embed"] is embed2 and cols2["layers"][0]["attn_norm"] is lay2["attn_norm"]
    assert cols["embed"] is params["embed"]
    layer = cols["layers"][1]
    assert layer["w_down_t"].shape == (cfg.hidden_size, cfg.intermediate_size)
    assert (layer["w_down_t"] == params["layers"][1]["w_down"].T).all()
    assert layer["attn_norm"] is params["layers"][1]["attn_norm"]  # shared, not copied
    assert not any(k in layer for k in decoder.COLUMN_MATRICES)  # rows params fail loudly
    # Other weights in one layer: another copy.
    other = {**params, "layers": (params["layers"][0],
                                  {**params["layers"][1], "w_up": params["layers"][1]["w_up"] + 1})}
    assert not shared(E.columns_params(other), cols)
    # A batch of these weights decodes with the kept copy.
    batch = E.SlotBatch(params, config=cfg, max_slots=4, decode_layout="columns")
    assert batch.decode_layout == "columns" and shared(batch.decode_params(4), cols)
    assert batch.decode_params(4) is batch.decode_params(1)  # (one tree per batch)
    key = tuple(id(lay[k]) for lay in params["layers"] for k in decoder.COLUMN_MATRICES)
    # A variant's copy goes with the variant, while the weights it shares stay.
    variant_copy = weakref.ref(E.columns_params(other)["layers"][1]["w_up_t"])
    del other
    gc.collect()
    assert variant_copy() is None
    # Stacked weights are unstacked first (their slices are new arrays each call).
    stacked = decoder.stack_layers(params)
    assert E.columns_params(stacked)["layers"][0]["wq_t"].shape == (cfg.hidden_size,) * 2
    # Called while tracing (weights closed over in a jitted function): nothing is kept, so
    # a later eager call gets arrays, not a leaked tracer.
    fresh = {**params, "layers": tuple({**lay, "wq": lay["wq"] * 1.0}
                                       for lay in params["layers"])}  # (not cached yet)
    before = len(E._COLUMNS)
    jax.jit(lambda x, f=fresh: E.columns_params(f)["layers"][0]["wq_t"].sum() + x)(1.0)
    assert len(E._COLUMNS) == before
    assert (E.columns_params(fresh)["layers"][0]["wq_t"] + 1).shape == (cfg.hidden_size,) * 2
    del fresh
    kept = weakref.ref(cols["layers"][0]["wq_t"])
    del params, cols, cols2, layer, batch, stacked
    gc.collect()
    assert key not in E._COLUMNS and kept() is None


def test_decode_layouts_are_checked_and_quantized_weights_decode_as_rows():
    cfg = decoder.DecoderConfig(**_BASE)
    params = _params(cfg)
    with pytest.raises(ValueError, match="decode_layout 'auto', 'rows' or 'columns'"):
        E.SlotBatch(params, config=cfg, decode_layout="column")
    q = quant.quantize_params(params, "int8")
    assert E.SlotBatch(q, config=cfg).decode_layout == "rows"  # auto
    with pytest.raises(ValueError, match="needs float layer matrices"):
        E.SlotBatch(q, config=cfg, decode_layout="columns")
    with pytest.raises(ValueError, match="float weights"):
        decoder.arrange_columns(q)
    with pytest.raises(ValueError, match="joined"):
        E.columns_params(decoder.unstack_layers(q))
    # A float batch with a quantized wide copy: each tree in its own layout under "auto".
    mixed = E.SlotBatch(params, config=cfg, wide_params=q, wide_rows=2,
                        decode_layout="auto")
    assert mixed._layout_of(mixed.wide_params) == "rows"
    assert mixed.decode_params(4) is mixed.wide_params
    with pytest.raises(ValueError, match="columns"):
        E.SlotBatch(params, config=cfg, wide_params=q, wide_rows=2, decode_layout="columns")
    # "auto" is columns for fp32 weights only (16-bit ones decode as rows).
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    assert E.resolve_decode_layout("auto", bf16) == "rows"
    assert E.resolve_decode_layout("columns", bf16) == "columns"
    missing = decoder.unstack_layers(params)
    missing = {**missing, "layers": ({k: v for k, v in missing["layers"][0].items()
                                      if k != "w_gate"},) + missing["layers"][1:]}
    with pytest.raises(ValueError, match=r"layers\[0\]\.w_gate is missing"):
        E.resolve_decode_layout("columns", missing)
    # The column block reads the keys as the decode cache stores them, and says so.
    lay = decoder.arrange_columns(decoder.unstack_layers(params))["layers"][0]
    with pytest.raises(ValueError, match="transposed_keys=True"):
        decoder.layer(lay, jnp.ones((cfg.hidden_size, 2)), None, None, None, config=cfg,
                      columns=True)
    rows = E.SlotBatch(params, config=cfg, decode_layout="rows")
    assert rows.decode_layout == "rows" and rows.decode_params(1) is rows.params
    if jax.default_backend() == "cpu":
        assert E.SlotBatch(params, config=cfg).decode_layout == "columns"
        assert E.SlotBatch(bf16, config=cfg).decode_layout == "rows"
    from langtorch.models import EngineOptions

    with pytest.raises(ValueError, match="decode_layout"):
        EngineOptions(decode_layout="cols")
    assert EngineOptions(decode_layout="rows").decode_layout == "rows"
