"""The GPU check (skipped without CUDA in both torch and JAX): device zero-copy, stream sync.

This is the prepared script of the issue's GPU item; run it on a CUDA machine with
``pytest tests/interop/test_cuda.py -q``. The CPU suite does not depend on it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from langtorch.interop import SoftPrompt, jax_function, to_jax, to_torch


def _cuda_in_both() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


pytestmark = pytest.mark.skipif(not _cuda_in_both(), reason="needs CUDA torch and CUDA JAX")


def test_zero_copy_on_device():
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    a = to_jax(t)
    assert a.unsafe_buffer_pointer() == t.data_ptr()
    assert next(iter(a.devices())).platform == "gpu"
    b = jnp.ones(1 << 20, dtype=jnp.float32, device=a.devices().pop()) * 3
    tb = to_torch(b)
    assert tb.is_cuda and tb.data_ptr() == b.unsafe_buffer_pointer()


def test_torch_work_is_finished_before_jax_reads():
    torch.manual_seed(0)
    x = torch.randn(4096, 4096, device="cuda")
    y = x @ x  # queued on torch's current stream, not finished yet
    total = float(jnp.sum(to_jax(y)))  # JAX's stream must wait for torch's
    np.testing.assert_allclose(total, y.sum().item(), rtol=1e-3)


def test_jax_work_is_finished_before_torch_reads():
    k = jax.random.key(0)
    a = jax.random.normal(k, (4096, 4096), device=jax.devices("gpu")[0])
    r = a @ a  # dispatched asynchronously
    t = to_torch(r)
    np.testing.assert_allclose(t.sum().item(), float(jnp.sum(r)), rtol=1e-3)


def test_bridge_on_device_matches_torch():
    f = jax_function(lambda x, w: jnp.tanh(x @ w))
    x = torch.randn(64, 32, device="cuda", requires_grad=True)
    w = torch.randn(32, 16, device="cuda", requires_grad=True)
    f(x, w).pow(2).sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    torch.tanh(x @ w).pow(2).sum().backward()
    torch.testing.assert_close(gx, x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gw, w.grad, rtol=1e-4, atol=1e-4)


def test_module_moves_to_device():
    sp = SoftPrompt(4, 8).cuda()
    e, m = sp(torch.zeros(2, 3, 8, device="cuda"), torch.ones(2, 3, device="cuda",
                                                                dtype=torch.int64))
    assert e.is_cuda and e.shape == (2, 7, 8) and m.is_cuda
    assert sp.jax_params()["prompt"].unsafe_buffer_pointer() == sp.prompt.data_ptr()
