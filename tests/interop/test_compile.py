"""The torch.compile path: one small model, fullgraph=True, forward and backward vs eager.

The model mixes torch layers, a JaxModule (SoftPrompt) and a bare jax_function with pytree
arguments and outputs, so one compilation covers every bridged entry point.
"""

import jax.numpy as jnp
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
