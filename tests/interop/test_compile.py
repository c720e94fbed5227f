"""The torch.compile path: one small model, fullgraph=True, forward and backward vs eager.

The model mixes torch layers, a JaxModule (SoftPrompt) and a bare jax_function with pytree
arguments and outputs, so one compilation covers every bridged entry point.
"""

import jax.numpy as jnp
import pytest
import torch

from langtorch.interop import SoftPrompt, jax_function


@jax_function
def _block(x, p):
    h = jnp.tanh(x @ p["w"])
    return {"h": h, "norm": (h**2).sum()}


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.prompt = SoftPrompt(2, 4, scale=0.5)
        self.w = torch.nn.Parameter(torch.randn(4, 5) * 0.5)

    def forward(self, x, mask):
        e, m = self.prompt(torch.relu(self.lin(x)), mask)  # JaxModule
        out = _block(e, {"w": self.w})  # torch -> JAX -> torch, pytrees both ways
        per_token = out["h"].sum(-1).pow(2) * m
        return per_token.mean() + 0.1 * out["norm"]


def test_compiled_fullgraph_matches_eager():
    torch.manual_seed(0)
    model = _Model()
    x = torch.randn(2, 6, 3)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    loss = model(x, mask)
    loss.backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    loss_c = compiled(x, mask)
    loss_c.backward()
    torch.testing.assert_close(loss_c, loss)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, eager[n], rtol=1e-5, atol=1e-6)


# -- regression tests from the interop review --------------------------------------------------
@jax_function  # module level: Dynamo cannot trace the construction of a JaxFunction
def _mul_sum(a, b):
    return (a * b).sum()


def test_compiled_same_tensor_twice_and_no_grad():
    import torch._inductor.config as inductor_config

    # no on-disk graph caches: they key on the graph, not on this package's Python code
    with inductor_config.patch(force_disable_caches=True):
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        c = torch.compile(lambda x: _mul_sum(x, x), fullgraph=True, dynamic=False)
        c(x).backward()
        torch.testing.assert_close(x.grad, 2 * x.detach())  # one gradient per position
        with torch.no_grad():  # plans a forward without residuals
            assert c(x).item() == 14.0
    assert {p.diff for p in _mul_sum._plans.values()} == {(), (0, 1)}


def test_compiled_refuses_every_64_bit_dtype():
    from langtorch.interop import DtypeNarrowingError
    from langtorch.interop._compiled import _structs

    for dt in (torch.int64, torch.uint64, torch.float64, torch.complex128):
        with pytest.raises(DtypeNarrowingError):
            _structs([torch.zeros(2, dtype=dt)])


def test_jax_function_created_inside_compile_says_so():
    def fwd(x):
        return jax_function(jnp.sin)(x).sum()

    with pytest.raises(Exception, match="create it once outside"):
        torch.compile(fwd, fullgraph=True, dynamic=False)(torch.ones(3))
