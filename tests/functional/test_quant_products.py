"""Float products of int8 matrices (``QuantizedMatrix.products == "float"``, ``quant.PRODUCTS``).

A float product multiplies ``x`` (rounded only to the compute dtype) by the int8 values converted
to that dtype (exact) and scales the columns: the result is ``x @ (q * scale)`` up to float32
summation. The references are numpy in float64 and, for a whole decoder, transformers with its
weights replaced by ``q * scale`` (``tests/functional/test_quant.py``'s ``_torch_quantized``).
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


def _ref(x, m):
    """``x @ m.dequantize()`` in float64 (the matrix the quantized weight stands for)."""
    w = np.asarray(m.q, np.float64)
    w = w.T if m.transposed else w
    s = np.asarray(m.scale, np.float64)
    s = s.T if m.transposed else s
    return np.asarray(x, np.float64) @ (w * s)


@pytest.mark.parametrize("transposed", [False, True])
def test_float_products_equal_x_times_the_dequantized_matrix(transposed):
    rng = _rng(1)
    w = rng.standard_normal((64, 40)).astype(np.float32)
    x = rng.standard_normal((3, 7, 64)).astype(np.float32)
    m = quant.quantize(w, transposed=transposed).with_products("float")
    got = np.asarray(quant.quantized_dot(jnp.asarray(x), m))
    want = _ref(x, m)
    assert got.dtype == np.float32 and got.shape == (3, 7, 40)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Tighter than the int8 product, whose input is quantized to ~15 bits per row: the float
    # product does not quantize x (the bug this guards against: a float product that still
    # quantizes its input).
    int8 = np.asarray(quant.quantized_dot(jnp.asarray(x), m.with_products("int8")))
    assert np.abs(got - want).max() < np.abs(int8 - want).max() / 10
    # bf16 compute: x rounded to bf16, the int8 values exact, float32 sums.
    mb = m.astype(jnp.bfloat16)
    assert mb.products == "float"
    xb = np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(quant.quantized_dot(jnp.asarray(x), mb)),
                               _ref(xb, m), rtol=1e-5, atol=1e-5)
    # dense / dense_f32 dispatch to it.
    np.testing.assert_array_equal(np.asarray(dense_f32(jnp.asarray(x), m)), got)
    assert dense(jnp.asarray(x, jnp.bfloat16), mb).dtype == jnp.bfloat16


def test_float_products_of_a_table_used_transposed_and_gradient():
    rng = _rng(2)
    t = quant.quantize(rng.standard_normal((30, 16)).astype(np.float32), axis=-1)
    tf = t.with_products("float")
    x = jnp.asarray(rng.standard_normal((4, 16)).astype(np.float32))
    got = np.asarray(quant.quantized_dot(x, tf, transpose=True))
    want = np.asarray(x, np.float64) @ np.asarray(t.dequantize(), np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Reverse mode: the gradient of x @ w.dequantize(), in float32 whatever the compute
    # dtype, and the weight (its scales too) a constant: the int8 product's gradient.
    m = quant.quantize(rng.standard_normal((16, 5)).astype(np.float32)).with_products("float")
    want_g = np.tile(np.asarray(m.dequantize()).sum(1), (4, 1))
    for mm in (m, m.astype(jnp.bfloat16)):
        g = jax.grad(lambda a, mm=mm: quant.quantized_dot(a, mm).sum())(x)
        np.testing.assert_allclose(g, want_g, rtol=1e-5)
    gs = jax.grad(lambda s: quant.quantized_dot(
        x, quant.QuantizedMatrix(m.q, s, jnp.float32, False, "float")).sum())(m.scale)
    assert not np.asarray(gs).any()
    # float16 compute is refused for float products (x would overflow), not silently inf.
    with pytest.raises(ValueError, match="float16"):
        quant.quantized_dot(x * 1e5, m.astype(jnp.float16))


def test_float_products_run_a_float_dot_not_an_int8_one():
    m = quant.quantize(jnp.ones((96, 200)), transposed=True)
    x = jnp.ones((4, 96), jnp.bfloat16)

    def hlo(mm):  # the matrix passed in (a constant would be folded)
        return jax.jit(quant.quantized_dot).lower(x, mm).compile().as_text()

    assert "s32[8,200]" in hlo(m.astype(jnp.bfloat16))  # int8 x int8 -> int32, both halves
    text = hlo(m.astype(jnp.bfloat16).with_products("float"))
    # No int32 product: the int8 storage is converted (exactly) to bf16 and multiplied.
    assert "s32[" not in text and "s8[200,96]" in text and "bf16[200,96]" in text


def test_products_is_static_and_survives_every_view():
    m = quant.quantize(jnp.ones((3, 8, 4)), transposed=True).with_products("float")
    assert m[1].products == "float" and m.astype(jnp.bfloat16).products == "float"
    leaves, tree = jax.tree.flatten(m)
    assert len(leaves) == 2 and jax.tree.unflatten(tree, leaves).products == "float"
    assert "float products" in repr(m) and "float products" not in repr(m.with_products("int8"))
    # The static field is part of the jit cache key: switching products recompiles.
    f = jax.jit(lambda a, mm: quant.quantized_dot(a, mm))
    x = jnp.ones((2, 8))
    np.testing.assert_allclose(np.asarray(f(x, m[0])), np.asarray(f(x, m[0].with_products(
        "int8"))), rtol=1e-4)
    # quantize_params keeps a caller's float products when it moves storage or joins parts.
    p = llama.random_params(jax.random.key(0), llama.LlamaConfig(
        vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4,
        intermediate_size=8))
    lay = decoder.unstack_layers(p)["layers"][0]
    mine = {k: quant.quantize(v).with_products("float") if k in ("wq", "wk", "wv", "wo")
            else v for k, v in lay.items()}
    qp = quant.quantize_params({**p, "layers": (mine,)})
    assert qp["layers"][0]["wqkv"].products == "float" and qp["layers"][0]["wo"].transposed
    assert qp["layers"][0]["wo"].products == "float"
    assert qp["layers"][0]["w_gate_up"].products == "int8"
    # Parts with different products are not joined silently.
    mixed = {**mine, "wk": quant.quantize(lay["wk"])}
    with pytest.raises(ValueError, match="different products"):
        quant.quantize_params({**p, "layers": (mixed,)})


def test_with_products_changes_the_layers_only_and_shares_storage():
    cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
                            num_kv_heads=1, head_dim=4, intermediate_size=8,
                            tie_embeddings=False)
    qp = quant.quantize_params(llama.random_params(jax.random.key(1), cfg))
    for layers in (qp, decoder.unstack_layers(qp)):
        fp = quant.with_products(layers, "float")
        mats = [a for a in quant.leaves(fp["layers"]) if quant.is_quantized(a)]
        assert mats and all(a.products == "float" for a in mats)
        # The head's products stay int8: a float product would convert the whole [V, H] table.
        assert fp["embed"].products == "int8" and fp["lm_head"].products == "int8"
        assert fp["embed"] is layers["embed"]
        old = [a for a in quant.leaves(layers["layers"]) if quant.is_quantized(a)]
        assert all(a.q is b.q and a.scale is b.scale for a, b in zip(mats, old))
        assert quant.with_products(fp, "int8")["layers"] is not None
        assert all(a.products == "int8" for a in quant.leaves(
            quant.with_products(fp, "int8")["layers"]) if quant.is_quantized(a))
        # Unquantized entries (norms) pass through.
        assert not quant.is_quantized(fp["norm"])


@pytest.mark.parametrize("call,match", [
    (lambda m: m.with_products("fp8"), "products"),
    (lambda m: m.with_products(None), "products"),
    (lambda m: quant.QuantizedMatrix(m.q, m.scale, jnp.float32, False, "bf16"), "products"),
    (lambda m: quant.with_products({"layers": {}}, "int4"), "products"),
    (lambda m: quant.with_products({"embed": m}, "float"), "layers"),
    (lambda m: quant.with_products([m], "float"), "layers"),
])
def test_bad_products_are_refused(call, match):
    m = quant.quantize(jnp.ones((4, 3)))
    with pytest.raises(ValueError, match=match):
        call(m)


# ------------------------------------------------------------------------- against torch
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_decoder_with_float_products_equals_transformers_with_quantized_weights(
        arch, tmp_path):
    import langtorch.models as M
    from tests.functional.test_decoder_archs import make_checkpoint
    from tests.functional.test_quant import _torch_quantized

    ref = make_checkpoint(tmp_path, arch)
    lm = M.load(tmp_path)
    ids = [int(i) for i in _rng(5).integers(7, 290, size=20)]
    with torch.no_grad():
        want = _torch_quantized(ref)(torch.tensor([ids])).logits[0].float().numpy()
    qp = quant.with_products(quant.quantize_params(lm.params), "float")
    a = jnp.asarray([ids], jnp.int32)
    hidden, _ = decoder.hidden_states(qp, a, jnp.arange(len(ids))[None], jnp.ones_like(a),
                                      config=lm.config)
    got = np.asarray(decoder.lm_head(qp, hidden, lm.config)[0])
    # float32 throughout except the head's int8 product (~15 bits per row): much closer to
    # the reference than the int8 layers' 5e-4 (tests/functional/test_quant.py).
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= 1e-4, (arch, err)
