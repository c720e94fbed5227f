"""DLPack exchange: zero-copy both ways, view resolution, the 64-bit rule, readiness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from langtorch.interop import DtypeNarrowingError, InteropError, jax_function, to_jax, to_torch


def test_torch_to_jax_shares_memory():
    t = torch.arange(1024, dtype=torch.float32)
    a = to_jax(t)
    assert a.unsafe_buffer_pointer() == t.data_ptr()
    t[0] = 42.0  # visible on the JAX side: same bytes
    assert float(a[0]) == 42.0


def test_jax_to_torch_shares_memory():
    a = jnp.arange(1024, dtype=jnp.float32) * 2
    t = to_torch(a)
    assert t.data_ptr() == a.unsafe_buffer_pointer()
    np.testing.assert_array_equal(t.numpy(), np.asarray(a))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32,
                                   torch.int8, torch.uint8, torch.bool, torch.complex64])
def test_round_trip_dtypes_zero_copy(dtype):
    t = (torch.arange(64) % 3).to(dtype)
    a = to_jax(t)
    back = to_torch(a)
    assert a.unsafe_buffer_pointer() == t.data_ptr() == back.data_ptr()
    assert back.dtype == t.dtype and torch.equal(back, t)


def test_pytree_round_trip():
    tree = {"w": torch.ones(3, 4), "b": [torch.zeros(4), 7], "name": "x"}
    jt = to_jax(tree)
    assert isinstance(jt["w"], jax.Array) and jt["b"][1] == 7 and jt["name"] == "x"
    assert jt["w"].unsafe_buffer_pointer() == tree["w"].data_ptr()
    back = to_torch(jt)
    assert back["b"][0].data_ptr() == tree["b"][0].data_ptr()
    assert torch.equal(back["w"], tree["w"])


def test_views_are_resolved():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(to_jax(t.T)), t.T.numpy())  # non-contiguous
    np.testing.assert_array_equal(np.asarray(to_jax(-t)), -t.numpy())
    neg = torch._neg_view(t)  # lazy negation flag, same memory
    assert neg.is_neg()
    np.testing.assert_array_equal(np.asarray(to_jax(neg)), -t.numpy())
    c = torch.complex(t, t + 1).conj()  # lazy conjugation flag
    assert c.is_conj()
    np.testing.assert_array_equal(np.asarray(to_jax(c)), c.resolve_conj().numpy())


def test_unaligned_slice_is_copied_correctly():
    t = torch.arange(100, dtype=torch.float32)[1:]  # 4-byte offset: JAX copies, values right
    np.testing.assert_array_equal(np.asarray(to_jax(t)), t.numpy())


def test_requires_grad_tensor_is_detached():
    t = torch.ones(3, requires_grad=True)
    assert to_jax(t).unsafe_buffer_pointer() == t.data_ptr()


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.complex128])
def test_64_bit_refused_without_x64(dtype):
    with pytest.raises(DtypeNarrowingError, match="JAX_ENABLE_X64"):
        to_jax(torch.zeros(3, dtype=dtype))


def test_int64_kept_with_x64():
    ids = torch.tensor([2**40, -5, 3], dtype=torch.int64)
    with jax.enable_x64(True):
        a = to_jax(ids)
        assert a.dtype == jnp.int64 and a.unsafe_buffer_pointer() == ids.data_ptr()
        assert int(a[0]) == 2**40
        back = to_torch(a + 1)
    assert back.dtype == torch.int64 and back.tolist() == [2**40 + 1, -4, 4]


def test_sparse_refused():
    with pytest.raises(InteropError, match="to_dense"):
        to_jax(torch.eye(3).to_sparse())


def test_to_torch_waits_for_result():
    # JAX dispatches asynchronously; from_dlpack must hand torch the finished values.
    x = jnp.full((400, 400), 1.0 / 400, jnp.float32)
    f = jax.jit(lambda x: jax.lax.fori_loop(0, 50, lambda i, y: y @ x + 1.0, x))
    expected = np.asarray(f(x))
    t = to_torch(f(x))
    np.testing.assert_allclose(t.numpy(), expected)


def test_tracer_gives_clear_error():
    with pytest.raises(InteropError, match="tracer"):
        jax.jit(lambda a: to_torch(a))(jnp.ones(2))


def test_writing_into_shared_input_after_call_does_not_corrupt():
    # A bridged call returns only once XLA is done reading its (zero-copy) inputs, so torch may
    # overwrite them right away. Large enough that the computation takes a while.
    f = jax_function(lambda x, w: jax.lax.fori_loop(0, 20, lambda i, y: jnp.tanh(y @ w), x))
    x = torch.randn(256, 256) * 0.1
    w = torch.randn(256, 256) * 0.1
    x0, w0 = x.clone(), w.clone()
    expected = f(x0, w0)
    for _ in range(3):
        out = f(x, w)
        x.add_(1.0)
        w.mul_(-1.0)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        x.copy_(x0)
        w.copy_(w0)
