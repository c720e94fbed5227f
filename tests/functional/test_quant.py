"""int8 weights (:mod:`langtorch.functional.models.quant`): the quantizer, the int8 product and a
quantized decoder against torch.

The reference for a quantized model is transformers' own model with its weights replaced by
``q * scale`` computed here in torch (the same per-channel rule, written independently), run in
float32: ours must match it to the int8 product's activation precision (~15 bits per row), and
differ from the unquantized model by more than that (so the comparison is not vacuous).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional.models import decoder, llama, quant
from langtorch.functional.models.matmul import dense, dense_f32


def _rng(seed=0):
    return np.random.default_rng(seed)


# ------------------------------------------------------------------------- the quantizer
def test_quantize_rounds_each_column_within_half_a_step():
    w = _rng().standard_normal((40, 24)).astype(np.float32)
    w[:, 3] = 0.0  # an all-zero channel: scale 1, values 0
    m = quant.quantize(w)
    assert m.q.dtype == jnp.int8 and m.scale.shape == (1, 24) and m.shape == (40, 24)
    q, s = np.asarray(m.q, np.int32), np.asarray(m.scale)
    assert np.abs(q).max() == 127 and s[0, 3] == 1.0 and not q[:, 3].any()
    np.testing.assert_allclose(s[0, :3], np.abs(w[:, :3]).max(0) / 127, rtol=1e-6)
    assert (np.abs(q * s - w) <= s / 2 * (1 + 1e-5)).all()
    np.testing.assert_array_equal(np.asarray(m.dequantize()), (q * s).astype(np.float32))


def test_quantize_rows_of_an_embedding_table():
    t = _rng(1).standard_normal((30, 8)).astype(np.float32)
    m = quant.quantize(t, axis=-1)
    assert m.scale.shape == (30, 1)
    np.testing.assert_allclose(np.asarray(m.scale)[:, 0], np.abs(t).max(1) / 127, rtol=1e-6)
    ids = jnp.array([[4, 0, 29]])
    np.testing.assert_allclose(np.asarray(decoder.embedding_rows(m, ids)),
                               np.asarray(m.dequantize())[[4, 0, 29]][None], rtol=1e-6)


def test_stacked_layers_quantize_per_layer_and_index():
    w = _rng(2).standard_normal((3, 8, 5)).astype(np.float32)
    w[1] *= 100.0  # each layer has its own scales
    m = quant.quantize(w)
    assert m.scale.shape == (3, 1, 5)
    for i in range(3):
        one = quant.quantize(w[i])
        np.testing.assert_array_equal(np.asarray(m[i].q), np.asarray(one.q))
        np.testing.assert_array_equal(np.asarray(m[i].scale), np.asarray(one.scale))


@pytest.mark.parametrize("bad,match", [
    (np.ones((4, 4), np.int32), "float array"),
    (np.ones(4, np.float32), "2 or more axes"),
    (np.array([[1.0, np.nan]], np.float32), "non-finite"),
    (np.array([[1.0, np.inf]], np.float32), "non-finite"),
])
def test_quantize_refuses_bad_matrices(bad, match):
    with pytest.raises(ValueError, match=match):
        quant.quantize(bad)


def test_quantize_refuses_bad_options():
    with pytest.raises(ValueError, match="axis"):
        quant.quantize(np.ones((2, 2), np.float32), axis=0)
    m = quant.quantize(np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="already quantized"):
        quant.quantize(m)
    with pytest.raises(ValueError, match="compute dtype"):
        m.astype(jnp.int32)
    cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
                            num_kv_heads=1, head_dim=4, intermediate_size=8)
    p = llama.random_params(jax.random.key(0), cfg)
    with pytest.raises(ValueError, match="expected quantization 'int8'"):
        quant.quantize_params(p, "int4")
    with pytest.raises(ValueError, match="decoder params"):
        quant.quantize_params({"layers": {}})
    with pytest.raises(ValueError, match="2-D QuantizedMatrix"):
        quant.quantized_dot(jnp.ones((1, 8)), jnp.ones((8, 8)))
    with pytest.raises(ValueError, match=r"x \[\.\.\., 8\]"):
        quant.quantized_dot(jnp.ones((1, 5)), quant.quantize(jnp.ones((8, 8))))


def test_quantize_params_covers_every_matrix_and_keeps_the_rest():
    cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
                            num_kv_heads=1, head_dim=4, intermediate_size=8,
                            tie_embeddings=False)
    p = llama.random_params(jax.random.key(0), cfg)
    for layers in (p, decoder.unstack_layers(p)):
        qp = quant.quantize_params(layers)
        flat = [qp["layers"]] if isinstance(qp["layers"], dict) else list(qp["layers"])
        for lay in flat:
            assert {k for k, v in lay.items() if quant.is_quantized(v)} == {
                "wqkv", "wo", "w_gate_up", "w_down"}  # wq/wk/wv and w_gate/w_up joined
            assert lay["wqkv"].shape[-1] == 8 + 2 * 4 and lay["w_gate_up"].shape[-1] == 2 * 8
            assert not quant.is_quantized(lay["attn_norm"])
        assert quant.is_quantized(qp["embed"]) and qp["embed"].scale.shape == (16, 1)
        # an untied head and the layers' matrices are stored transposed ([N, K])
        assert quant.is_quantized(qp["lm_head"]) and qp["lm_head"].transposed
        assert qp["lm_head"].shape == (8, 16) and qp["lm_head"].scale.shape == (16, 1)
        assert all(lay[k].transposed for lay in flat for k in ("wqkv", "wo", "w_gate_up",
                                                                 "w_down"))
        assert not quant.is_quantized(qp["norm"])
        assert quant.quantize_params(qp)["embed"] is qp["embed"]  # idempotent
    # int8 storage: a quarter of the fp32 matrices' bytes (plus one scale per channel).
    p = llama.random_params(jax.random.key(0), llama.LlamaConfig(
        vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=128, tie_embeddings=False))
    qp = quant.quantize_params(p)
    big = sum(a.nbytes for a in quant.leaves(qp) if quant.is_quantized(a))
    f32 = sum(np.asarray(a).nbytes for k, a in p["layers"].items() if k in quant.LAYER_MATRICES)
    f32 += np.asarray(p["embed"]).nbytes + np.asarray(p["lm_head"]).nbytes
    assert big < 0.3 * f32


@pytest.mark.parametrize("bias", [False, True])
def test_joined_matrices_give_the_bits_of_separate_ones(bias):
    # quant.FUSED: per-column scales and exact int32 sums make a joined product's columns the
    # same bits as the separate products' (so joining is only a speed change).
    cfg = decoder.check_config(decoder.DecoderConfig(
        vocab_size=16, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
        intermediate_size=48, qkv_bias=bias, architecture="qwen2" if bias else "llama"))
    p = decoder.unstack_layers(llama.random_params(jax.random.key(7), cfg))["layers"][0]
    separate = {k: quant.quantize(v) if k in quant.LAYER_MATRICES else v for k, v in p.items()}
    joined = quant.quantize_params({"embed": jnp.ones((16, 32)), "layers": (p,)})["layers"][0]
    assert "wqkv" in joined and "wq" not in joined and "wq" in separate
    x = jax.random.normal(jax.random.key(8), (3, 5, 32))
    cos, sin = decoder.rope(jnp.arange(5)[None].repeat(3, 0), cfg)
    bias_ = decoder.attention_bias(jnp.tril(jnp.ones((5, 5), bool))[None].repeat(3, 0))

    def run(lay):
        return np.asarray(jax.jit(lambda x: decoder.block(
            lay, x, cos, sin, bias_, lambda k, v: (k, v, None), config=cfg)[0])(x))

    np.testing.assert_array_equal(run(joined), run(separate))


def test_cast_shares_int8_storage():
    qp = quant.quantize_params(llama.random_params(jax.random.key(0), llama.LlamaConfig(
        vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4,
        intermediate_size=8)))
    b = quant.cast(qp, jnp.bfloat16)
    assert b["embed"].dtype == jnp.bfloat16 and b["norm"].dtype == jnp.bfloat16
    assert b["embed"].q is qp["embed"].q and b["layers"]["wqkv"].q is qp["layers"]["wqkv"].q
    assert b["embed"].scale.dtype == jnp.float32  # scales stay float32
    # A stacked quantized tree survives stack/unstack.
    again = decoder.stack_layers(decoder.unstack_layers(qp))
    np.testing.assert_array_equal(np.asarray(again["layers"]["wqkv"].q),
                                  np.asarray(qp["layers"]["wqkv"].q))


# ------------------------------------------------------------------------- the product
def _reference_dot(x, q, scale):
    """The int8 product in numpy: per-row int8 part and remainder, int64 products."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(-1, keepdims=True)
    xs = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    v = x / xs
    hi = np.clip(np.rint(v), -127, 127)
    lo = np.rint((v - hi) * 254)
    q = np.asarray(q, np.int64)
    acc_hi = hi.astype(np.int64) @ q
    acc_lo = lo.astype(np.int64) @ q
    return (acc_hi + acc_lo / 254.0) * xs * np.asarray(scale).reshape(1, -1)


def test_quantized_dot_equals_the_numpy_reference_and_the_dequantized_product():
    rng = _rng(3)
    w = rng.standard_normal((64, 48)).astype(np.float32)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[2] = 0.0  # an all-zero row
    m = quant.quantize(w)
    got = np.asarray(quant.quantized_dot(jnp.asarray(x), m))
    np.testing.assert_allclose(got, _reference_dot(x, m.q, m.scale), rtol=1e-5, atol=1e-5)
    deq = x @ np.asarray(m.dequantize())
    # Activations are kept to ~1/(127*254) of each row's largest entry.
    tol = np.abs(x).max(1, keepdims=True) * np.abs(deq).max() * 1e-4 + 1e-6
    assert (np.abs(got - deq) <= tol).all()
    assert not got[2].any()
    # Transposed (a [N, K] table, one scale per row): x @ table.T.
    t = quant.quantize(w.T.copy(), axis=-1)
    got_t = np.asarray(quant.quantized_dot(jnp.asarray(x), t, transpose=True))
    np.testing.assert_allclose(got_t, _reference_dot(x, np.asarray(t.q).T,
                                                     np.asarray(t.scale).T), rtol=1e-5, atol=1e-5)
    # dense / dense_f32 dispatch to it, keeping x's dtype / returning float32.
    np.testing.assert_array_equal(np.asarray(dense_f32(jnp.asarray(x), m)), got)
    xb = jnp.asarray(x, jnp.bfloat16)
    assert dense(xb, m).dtype == jnp.bfloat16 and dense_f32(xb, m).dtype == jnp.float32
    assert dense(jnp.asarray(x)[None], m).shape == (1, 5, 48)


@pytest.mark.parametrize("transpose", [False, True])
def test_quantized_dot_rows_do_not_depend_on_the_rows_beside_them(transpose):
    # Integer sums are exact: row i's bits are the same computed alone, among a few rows or
    # among many (a float product changes a row's summation order with the row count: one
    # row vs two differs on XLA:CPU). Row counts across XLA's one-row, small and blocked paths.
    rng = _rng(4)
    w = rng.standard_normal((96, 200)).astype(np.float32)
    m = quant.quantize(w.T.copy(), axis=-1) if transpose else quant.quantize(w)
    x = jnp.asarray(rng.standard_normal((64, 96)).astype(np.float32))
    f = jax.jit(lambda a: quant.quantized_dot(a, m, transpose=transpose))
    full = np.asarray(f(x))
    for n in (1, 2, 3, 5, 16, 17, 33, 48):
        for start in (0, 64 - n):
            part = np.asarray(f(x[start:start + n]))
            np.testing.assert_array_equal(part, full[start:start + n], err_msg=f"{n} rows")


def test_transposed_storage_is_the_same_matrix_with_the_same_bits():
    # quantize(..., transposed=True) (what quantize_params stores layer matrices as) holds
    # q [N, K]: the same matrix, the same product bits (exact int32 sums), the same gradient;
    # its product contracts both operands' last axis (the layout the int8 kernel runs fastest).
    rng = _rng(9)
    w = rng.standard_normal((96, 200)).astype(np.float32)
    m, t = quant.quantize(w), quant.quantize(w, transposed=True)
    assert t.transposed and not m.transposed and t.shape == m.shape == (96, 200)
    assert t.q.shape == (200, 96) and t.scale.shape == (200, 1)
    np.testing.assert_array_equal(np.asarray(t.q), np.asarray(m.q).T)
    np.testing.assert_array_equal(np.asarray(t.dequantize()), np.asarray(m.dequantize()))
    for rows in (1, 2, 16):
        x = jnp.asarray(rng.standard_normal((rows, 96)).astype(np.float32))
        np.testing.assert_array_equal(np.asarray(quant.quantized_dot(x, t)),
                                      np.asarray(quant.quantized_dot(x, m)))
    gm = jax.grad(lambda a: quant.quantized_dot(a, m).sum())(x)
    gt = jax.grad(lambda a: quant.quantized_dot(a, t).sum())(x)
    np.testing.assert_allclose(np.asarray(gt), np.asarray(gm), rtol=1e-6)
    text = jax.jit(lambda a: quant.quantized_dot(a, t)).lower(jnp.ones((4, 96))).compile().as_text()
    dots = [ln for ln in text.splitlines() if "s32[8,200]" in ln and "dot(" in ln]
    assert dots and all("rhs_contracting_dims={1}" in ln for ln in dots), dots
    stack = rng.standard_normal((3, 96, 200)).astype(np.float32)
    st = quant.quantize(stack, transposed=True)
    assert st.shape == (3, 96, 200) and st[1].transposed
    np.testing.assert_array_equal(np.asarray(st[1].q), np.asarray(quant.quantize(
        stack[1], transposed=True).q))
    assert quant.cast({"w": t}, jnp.bfloat16)["w"].transposed
    with pytest.raises(ValueError, match="transposed"):
        quant.quantize(w, axis=-1, transposed=True)
    with pytest.raises(ValueError, match="transposed"):
        quant.quantize(w, transposed=1)
    with pytest.raises(ValueError, match="transposed"):
        quant.QuantizedMatrix(t.q, t.scale, jnp.float32, "yes")
    with pytest.raises(ValueError, match="one scale per row"):
        decoder.embedding_rows(t, jnp.array([0]))


def test_quantize_params_joins_parts_the_caller_quantized_in_either_storage():
    cfg = decoder.check_config(decoder.DecoderConfig(
        vocab_size=16, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
        intermediate_size=48))
    p = decoder.unstack_layers(llama.random_params(jax.random.key(3), cfg))["layers"][0]
    mixed = {**p, "wq": quant.quantize(p["wq"]), "w_up": quant.quantize(p["w_up"],
                                                                        transposed=True)}
    a = quant.quantize_params({"embed": jnp.ones((16, 32)), "layers": (mixed,)})["layers"][0]
    b = quant.quantize_params({"embed": jnp.ones((16, 32)), "layers": (p,)})["layers"][0]
    for k in ("wqkv", "w_gate_up"):
        assert a[k].transposed and a[k].shape == b[k].shape
        np.testing.assert_array_equal(np.asarray(a[k].q), np.asarray(b[k].q))
        np.testing.assert_array_equal(np.asarray(a[k].scale), np.asarray(b[k].scale))


def test_quantize_params_moves_caller_quantized_matrices_to_one_storage():
    # Review: a caller-quantized [K, N] wo stayed beside transposed matrices, and stacking the
    # layers failed on mismatched pytree metadata.
    cfg = decoder.check_config(decoder.DecoderConfig(
        vocab_size=16, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
        intermediate_size=48))
    p = decoder.unstack_layers(llama.random_params(jax.random.key(1), cfg))
    layers = list(p["layers"])
    layers[0] = {**layers[0], "wo": quant.quantize(layers[0]["wo"])}
    q = quant.quantize_params({**p, "layers": tuple(layers)})
    assert q["layers"][0]["wo"].transposed
    np.testing.assert_array_equal(np.asarray(q["layers"][0]["wo"].dequantize()),
                                  np.asarray(layers[0]["wo"].dequantize()))
    stacked = decoder.stack_layers(q)
    assert stacked["layers"]["wo"].shape == (2, 32, 32)
    table_like = quant.quantize(layers[1]["w_down"], axis=-1)  # one scale per row: refused
    with pytest.raises(ValueError, match="one scale per output column"):
        quant.quantize_params({**p, "layers": ({**layers[1], "w_down": table_like},)})


@pytest.mark.parametrize("index", [(0, 1), (0, slice(None), 1)])
def test_indexing_a_stack_past_the_layer_axis_is_refused(index):
    t = quant.quantize(jnp.ones((3, 4, 6)), transposed=True)
    with pytest.raises(IndexError, match="stack axis only"):
        t[index]
    assert t[1:3].shape == (2, 4, 6) and t[-1].shape == (4, 6)


def test_quantized_dot_reads_int8_weights_in_an_int8_product():
    # The weight must reach the product as int8: XLA:CPU materialises a converted (float)
    # copy of a weight that is converted before a float product, which reads more bytes
    # than the fp32 weight itself (measured: slower than fp32).
    m = quant.quantize(jnp.ones((96, 200)))
    text = jax.jit(lambda a: quant.quantized_dot(a, m)).lower(
        jnp.ones((4, 96))).compile().as_text()
    assert "s32[8,200]" in text  # one int8 x int8 -> int32 product for both halves
    assert "f32[96,200]" not in text and "bf16[96,200]" not in text


# ------------------------------------------------------------------------- against torch
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _torch_quantized(model):
    """``model`` with every Linear weight and the embedding table replaced by ``q * scale``
    (per output channel / per token row, ``scale = max|w| / 127``): written here in torch."""
    import copy

    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():  # (a tied head is the embedding: quantized once)
            if p.ndim != 2:
                continue
            amax = p.abs().amax(dim=1, keepdim=True)  # Linear [out, in]; Embedding [V, H]
            scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
            p.copy_(torch.clamp(torch.round(p / scale), -127, 127) * scale)
    return ref


@pytest.mark.parametrize("arch", ["llama", "llama_tied", "gemma3"])
def test_quantized_logits_equal_transformers_with_quantized_weights(arch, tmp_path):
    import langtorch.models as M
    from tests.functional.test_decoder_archs import make_checkpoint

    ref = make_checkpoint(tmp_path, arch)
    lm = M.load(tmp_path)
    ids = [int(i) for i in _rng(5).integers(7, 290, size=20)]
    with torch.no_grad():
        want = _torch_quantized(ref)(torch.tensor([ids])).logits[0].float().numpy()
        unquantized = ref(torch.tensor([ids])).logits[0].float().numpy()
    qp = quant.quantize_params(lm.params)
    a = jnp.asarray([ids], jnp.int32)
    hidden, _ = decoder.hidden_states(qp, a, jnp.arange(len(ids))[None], jnp.ones_like(a),
                                      config=lm.config)
    got = np.asarray(decoder.lm_head(qp, hidden, lm.config)[0])
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    assert err <= 5e-4, (arch, err)
    # Not vacuous: quantizing the weights moved the logits by more than that.
    assert np.abs(unquantized - want).max() / scale > 5 * err, arch


def test_quantized_dot_edge_rows_and_gradient():
    rng = _rng(6)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    m = quant.quantize(w)
    x = jnp.asarray(rng.standard_normal((3, 4)).astype(np.float32)).at[0, 0].set(jnp.nan)
    out = np.asarray(quant.quantized_dot(x, m))
    assert np.isnan(out[0]).all() and np.isfinite(out[1:]).all()  # NaN stays in its row
    assert quant.quantized_dot(jnp.zeros((0, 4)), m).shape == (0, 3)
    small = quant.quantize(w * 0.01)
    xb = np.array([[3e38, -3e38, 1.0, 0.0]], np.float32)
    big = np.asarray(quant.quantized_dot(jnp.asarray(xb), small))
    want = xb.astype(np.float64) @ np.asarray(small.dequantize(), np.float64)
    np.testing.assert_allclose(big, want, rtol=1e-3)  # (x scale * w scale) first: no overflow
    # Reverse mode: the gradient of x @ w.dequantize() (straight through x's rounding).
    xs = jnp.asarray(rng.standard_normal((2, 4)).astype(np.float32))
    g = jax.grad(lambda a: quant.quantized_dot(a, m).sum())(xs)
    np.testing.assert_allclose(g, np.tile(np.asarray(m.dequantize()).sum(1), (2, 1)),
                               rtol=1e-5)
    t = quant.quantize(w.T.copy(), axis=-1)
    gt = jax.grad(lambda a: quant.quantized_dot(a, t, transpose=True).sum())(xs)
    np.testing.assert_allclose(gt, np.tile(np.asarray(t.dequantize()).sum(0), (2, 1)),
                               rtol=1e-5)
    assert jax.grad(lambda a: quant.quantized_dot(a, m).sum())(
        xs.astype(jnp.bfloat16)).dtype == jnp.bfloat16
    # A table quantized along the other axis is refused, not silently mis-scaled.
    sq = quant.quantize(np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"scales of shape \(4, 1\)"):
        quant.quantized_dot(xs, sq, transpose=True)
    with pytest.raises(ValueError, match="compute dtype"):
        quant.quantize(w, dtype=jnp.int32)
    with pytest.raises(IndexError, match="stack"):
        m[0]
