"""bf16 products accumulate in float32, forward and backward, without weight converts."""

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import losses as L
from langtorch.functional.models import llama, matmul
from langtorch.functional.models.matmul import dense, dense_f32


def test_dense_matches_float32_reference_and_gradients():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 5, 64)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(64, 32)) * 0.1, jnp.bfloat16)
    ref = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
    np.testing.assert_allclose(np.asarray(dense(x, w), np.float32), ref, rtol=2e-2, atol=2e-2)
    g = jnp.asarray(rng.normal(size=(3, 5, 32)), jnp.float32)
    dx, dw = jax.grad(lambda x, w: jnp.sum(dense(x, w).astype(jnp.float32) * g),
                      argnums=(0, 1))(x, w)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.bfloat16
    gb = np.asarray(g.astype(jnp.bfloat16), np.float32)
    np.testing.assert_allclose(np.asarray(dx, np.float32), gb @ np.asarray(w, np.float32).T,
                               rtol=2e-2, atol=5e-2)
    np.testing.assert_allclose(np.asarray(dw, np.float32),
                               np.einsum("bti,btj->ij", np.asarray(x, np.float32), gb),
                               rtol=2e-2, atol=0.2)
    f32 = jnp.ones((2, 3))
    assert dense(f32, jnp.ones((3, 4))).dtype == jnp.float32  # fp32 stays a plain product


def _dots(fn, x):
    text = jax.jit(jax.grad(fn)).lower(x).as_text()
    return [line.split(":", 1)[-1].strip() for line in text.splitlines() if "dot_general" in line]


def test_backward_does_not_convert_the_weight_to_float32():
    # XLA:CPU is fast for bf16 x bf16 -> f32 products and slow for bf16 results; JAX's default
    # transpose of a preferred-f32 product multiplies an f32 cotangent by the weight upcast to
    # f32 on every step. Ours: every product (forward and backward) is bf16 x bf16 -> f32.
    x = jnp.ones((64, 96), jnp.bfloat16)
    w = jnp.ones((96, 160), jnp.bfloat16)
    ours = _dots(lambda x: dense(x, w).astype(jnp.float32).sum(), x)
    default = _dots(lambda x: jnp.matmul(x, w, preferred_element_type=jnp.float32)
                    .astype(jnp.bfloat16).astype(jnp.float32).sum(), x)
    fast = "bf16>, tensor<"
    assert ours  # (the forward product is dead code here: only its transpose remains)
    assert all(fast in d and d.endswith("xf32>") and "xbf16>, tensor<" in d for d in ours), ours
    assert any("xf32>, tensor<" in d and "96x160xf32" in d for d in default), default
    # The f32-output variant (the LM head): the f32 cotangent is cast down before the product.
    head = _dots(lambda x: dense_f32(x, w).sum(), x)
    assert head and all(d.endswith("xf32>") and "xbf16>, tensor<" in d for d in head), head
    assert dense_f32(x, w).dtype == jnp.float32


def test_bf16_decoder_loss_close_to_float32():
    cfg = llama.LlamaConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=8, intermediate_size=64)
    params = llama.random_params(jax.random.key(0), cfg)
    ids = jnp.asarray(np.random.default_rng(1).integers(1, 64, (2, 8)), jnp.int32)
    batch = {"ids": ids, "mask": jnp.ones_like(ids), "labels": ids}
    prompt = jax.random.normal(jax.random.key(2), (3, 32)) * 0.05
    loss = jax.jit(jax.value_and_grad(
        lambda p, f: L.decoder_lm_loss(p, f, batch, config=cfg)[0]))
    l32, g32 = loss(prompt, {"model": params})
    bf = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    l16, g16 = loss(prompt, {"model": bf})
    assert abs(float(l16) - float(l32)) < 2e-2 * abs(float(l32))
    cos = float(jnp.sum(g16 * g32) / (jnp.linalg.norm(g16) * jnp.linalg.norm(g32)))
    assert cos > 0.99


def test_docstring_examples_run():
    result = doctest.testmod(matmul, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 4




def test_dense_rejects_batched_or_mismatched_weights():
    # A [B, K, N] weight multiplies in the forward pass, but the custom backward transposes it
    # as one matrix: the bf16 gradient used to fail (fp32 worked), so both now refuse it.
    for dt in (jnp.float32, jnp.bfloat16):
        x = jnp.ones((2, 3, 4), dt)
        for w in (jnp.ones((2, 4, 5), dt), jnp.ones((4,), dt), jnp.ones((3, 5), dt)):
            for fn in (dense, dense_f32):
                with pytest.raises(ValueError, match=r"expected x \[\.\.\., K\] and w \[K, N\]"):
                    fn(x, w)
    # vmap over a stack of weights still works (each call sees one matrix), gradients too.
    xs, ws = jnp.ones((3, 4), jnp.bfloat16), jnp.ones((2, 4, 5), jnp.bfloat16)
    g = jax.vmap(jax.grad(lambda w: dense(xs, w).astype(jnp.float32).sum()))(ws)
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.full((2, 4, 5), 3.0))


def test_dense_gradients_match_jax_and_torch_on_odd_shapes():
    import torch

    rng = np.random.default_rng(3)
    for dt, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)):
        for sx, sw in (((7,), (7, 5)), ((3, 7), (7, 1)), ((2, 3, 5, 7), (7, 11))):
            x = jnp.asarray(rng.normal(size=sx), dt)
            w = jnp.asarray(rng.normal(size=sw) * 0.1, dt)
            g = rng.normal(size=(*sx[:-1], sw[-1])).astype(np.float32)
            tx = torch.tensor(np.asarray(x, np.float32), requires_grad=True)
            tw = torch.tensor(np.asarray(w, np.float32), requires_grad=True)
            (torch.matmul(tx, tw) * torch.from_numpy(g)).sum().backward()
            for fn in (dense, dense_f32):
                dx, dw = jax.jit(jax.grad(
                    lambda x, w, fn=fn, g=g: jnp.sum(fn(x, w).astype(jnp.float32) * g),
                    argnums=(0, 1)))(x, w)
                assert dx.shape == x.shape and dw.shape == w.shape and dx.dtype == dt
                for ours, ref in ((dx, tx.grad), (dw, tw.grad)):
                    ref = ref.numpy()
                    err = np.abs(np.asarray(ours, np.float32) - ref).max()
                    assert err <= tol * max(np.abs(ref).max(), 1.0), (fn.__name__, dt, sx, err)


def test_a_few_row_bf16_product_runs_padded_to_the_least_alike_rows():
    # XLA:CPU's bf16 x bf16 -> f32 product of ONE row takes a slow generic path (~9x slower
    # than two rows on a Zen 4), and a row's last bits at a few rows differ from the same row
    # in a larger product (one row on a Zen 4; one and two rows on an AMX Xeon): dense,
    # dense_f32 and the LM head pad fewer rows than product_min_rows() with zero rows.
    least = matmul.product_min_rows()
    assert least >= 2
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.normal(size=(48, 40)) * 0.1, jnp.bfloat16)
    x = jnp.asarray(rng.normal(size=(1, 1, 48)), jnp.bfloat16)

    def dot_shapes(fn, *args):
        text = jax.jit(fn).lower(*args).as_text()
        return [line.split(":", 1)[-1].strip() for line in text.splitlines()
                if "dot_general" in line]

    padded = f"tensor<{least}x48xbf16>"
    for fn in (dense, dense_f32, matmul.padded_rows_product):
        assert all(padded in d for d in dot_shapes(fn, x, w)), fn
        assert fn(x, w).shape == (1, 1, 40)
        ref = np.asarray(x, np.float32).reshape(1, 48) @ np.asarray(w, np.float32)
        np.testing.assert_allclose(np.asarray(fn(x, w), np.float32).reshape(1, 40), ref,
                                   rtol=2e-2, atol=2e-2)
    # The tied head ([V, H] table) and enough rows: unchanged products.
    head = dot_shapes(lambda x, e: matmul.padded_rows_product(x, e, transposed=True), x, w.T)
    assert head and all(padded in d for d in head)
    assert all(f"tensor<{least}x48xbf16>" in d
               for d in dot_shapes(dense_f32, jnp.ones((least, 48), jnp.bfloat16), w))
    assert all("tensor<2x48xf16>" in d  # fp16: one row as two (speed; its bits differ anyway)
               for d in dot_shapes(dense_f32, x.astype(jnp.float16), w.astype(jnp.float16)))
    assert all("tensor<1x48xf32>" in d  # fp32: the one-row product is XLA's fast one
               for d in dot_shapes(dense_f32, jnp.ones((1, 48)), w.astype(jnp.float32)))
    # Gradients flow through the padded product.
    g = jax.grad(lambda x: dense_f32(x, w).sum())(x)
    np.testing.assert_allclose(np.asarray(g, np.float32).reshape(48),
                               np.asarray(w, np.float32).sum(1), rtol=2e-2, atol=2e-2)


def test_a_bf16_row_computes_alike_at_every_row_count():
    # What the padding is for: a row's product at 1 .. 64 rows (a decode step's rows, a
    # prefill call's logits), every bit alike, jitted and eager, rows and tied-head forms, at
    # a decoder's shapes (the probe's own and a SmolLM2 head's width).
    rng = np.random.default_rng(5)
    for k, n in ((576, 1536), (576, 4096)):
        w = jnp.asarray(rng.normal(size=(k, n)) * 0.05, jnp.bfloat16)
        x = jnp.asarray(rng.normal(size=(64, k)), jnp.bfloat16)
        for transposed, wm in ((False, w), (True, w.T)):
            f = jax.jit(lambda x, w, t=transposed: matmul.padded_rows_product(x, w,
                                                                             transposed=t))
            want = np.asarray(f(x, wm))[0]
            for m in (1, 2, 3, 4, 5, 8, 16, 33):
                got = np.asarray(f(x[:m], wm))[0]
                assert np.array_equal(got, want), (k, n, transposed, m)
            assert np.array_equal(np.asarray(matmul.padded_rows_product(x[:1], wm,
                                                                        transposed=transposed))[0],
                                  want)


@pytest.mark.parametrize("dt", [jnp.bfloat16, jnp.float16])
def test_16bit_embedding_rows_differentiate_like_a_gather(dt):
    # The 16-bit table is gathered as uint16 bits (no whole-table convert); a bitcast has no
    # derivative, so the gather's own must be supplied: repeated ids add up, others get 0.
    from langtorch.functional.models import decoder

    table = jnp.asarray(np.random.default_rng(0).normal(size=(10, 6)), dt)
    ids = jnp.array([[3, 1], [3, 7]])

    def loss(rows_fn):
        return lambda t: (rows_fn(t).astype(jnp.float32) ** 2).sum()

    got = jax.grad(loss(lambda t: decoder.embedding_rows(t, ids)))(table)
    want = jax.grad(loss(lambda t: jnp.take(t, ids, axis=0)))(table)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert np.asarray(got, np.float32)[3].any() and not np.asarray(got, np.float32)[0].any()
    np.testing.assert_array_equal(np.asarray(decoder.embedding_rows(table, ids), np.float32),
                                  np.asarray(table, np.float32)[np.asarray(ids)])
