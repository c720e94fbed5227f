"""The autograd bridge: gradcheck through JAX, torch references, pytrees, residuals, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from langtorch.interop import DoubleBackwardError, DtypeNarrowingError, InteropError, jax_function


def _mlp_jax(x, p):
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jax.nn.log_softmax(h @ p["w2"], axis=-1)


def _mlp_torch(x, p):
    h = torch.tanh(x @ p["w1"] + p["b1"])
    return torch.log_softmax(h @ p["w2"], dim=-1)


def _scan_jax(x, a):
    def step(c, xi):
        c = jnp.sin(c * a + xi)
        return c, c**2

    c, ys = jax.lax.scan(step, jnp.zeros_like(x[0]), x)
    return c.sum() + jax.scipy.special.logsumexp(ys)


def _gather_jax(table, ids):
    return (jnp.take(table, ids, axis=0) ** 2).sum(-1)


GRADCHECK_CASES = {
    "tanh_mul": (jax_function(lambda x, y: jnp.tanh(x) * y), lambda: (
        torch.randn(3, 4, dtype=torch.float64, requires_grad=True),
        torch.randn(3, 4, dtype=torch.float64, requires_grad=True))),
    "mlp_pytree": (jax_function(_mlp_jax), lambda: (
        torch.randn(2, 3, dtype=torch.float64, requires_grad=True),
        {"w1": torch.randn(3, 5, dtype=torch.float64, requires_grad=True),
         "b1": torch.randn(5, dtype=torch.float64, requires_grad=True),
         "w2": torch.randn(5, 4, dtype=torch.float64, requires_grad=True)})),
    "scan_logsumexp": (jax_function(_scan_jax), lambda: (
        torch.randn(6, 3, dtype=torch.float64, requires_grad=True),
        torch.randn(3, dtype=torch.float64, requires_grad=True))),
    "complex_to_real": (jax_function(lambda z, w: jnp.abs(jnp.sin(z) * w) ** 2), lambda: (
        torch.randn(4, dtype=torch.complex128, requires_grad=True),
        torch.randn(4, dtype=torch.complex128, requires_grad=True))),
    "real_to_complex": (jax_function(lambda x: jnp.exp(1j * x) * x), lambda: (
        torch.randn(3, dtype=torch.float64, requires_grad=True),)),
    "gather_int_ids": (jax_function(_gather_jax), lambda: (
        torch.randn(7, 3, dtype=torch.float64, requires_grad=True),
        torch.tensor([[0, 3], [6, 3]], dtype=torch.int32))),
}


def _leaves(args):
    return [t for t in jax.tree_util.tree_leaves(args) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("case", sorted(GRADCHECK_CASES))
def test_gradcheck_float64(case):
    fn, make = GRADCHECK_CASES[case]
    torch.manual_seed(0)
    args = make()
    treedef = jax.tree_util.tree_structure(args)
    with jax.enable_x64(True):  # thread-local: does not leak into other tests
        def flat_fn(*leaves):
            return fn(*jax.tree_util.tree_unflatten(treedef, list(leaves)))

        assert torch.autograd.gradcheck(flat_fn, tuple(jax.tree_util.tree_leaves(args)))


def test_gradients_match_pure_torch():
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    p = {"w1": torch.randn(3, 5, requires_grad=True), "b1": torch.randn(5, requires_grad=True),
         "w2": torch.randn(5, 2, requires_grad=True)}
    target = torch.tensor([0, 1, 1, 0])
    f = jax_function(_mlp_jax)

    loss = torch.nn.functional.nll_loss(f(x, p), target)
    grads = torch.autograd.grad(loss, [x, *p.values()])
    ref_loss = torch.nn.functional.nll_loss(_mlp_torch(x, p), target)
    ref = torch.autograd.grad(ref_loss, [x, *p.values()])
    torch.testing.assert_close(loss, ref_loss)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_pytree_inputs_and_outputs():
    @jax_function
    def f(inputs, *, scale):
        a, (b, c) = inputs["a"], inputs["bc"]
        return {"sum": (a * b).sum() * scale, "pair": (a + c, jnp.argmax(c))}

    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    c = torch.randn(3)  # no grad wanted
    out = f({"a": a, "bc": (b, c)}, scale=2.0)
    assert set(out) == {"sum", "pair"} and out["pair"][1].dtype == torch.int32
    assert not out["pair"][1].requires_grad
    (out["sum"] + out["pair"][0].sum()).backward()
    torch.testing.assert_close(a.grad, 2 * b + 1)
    torch.testing.assert_close(b.grad, 2 * a)
    assert c.grad is None


def test_only_required_grads_are_computed_and_plans_cached():
    f = jax_function(lambda x, w: (x @ w).sum())
    x = torch.randn(2, 3, requires_grad=True)
    w = torch.randn(3, 4)  # frozen
    f(x, w).backward()
    plan = next(iter(f._plans.values()))
    assert plan.diff == (0,)  # VJP taken w.r.t. x only
    torch.testing.assert_close(x.grad, w.sum(1).expand(2, 3))
    for _ in range(3):
        f(x, w).backward()
    assert f.cache_size() == 1
    f(torch.randn(5, 3, requires_grad=True), w)
    with torch.no_grad():
        f(x, w)
    assert f.cache_size() == 3  # new shape; no-grad signature


def test_residuals_do_not_duplicate_inputs():
    # d(x*y)/dx needs y: y is saved as the torch input itself, not as a JAX copy.
    f = jax_function(lambda x, y: x * y)
    x = torch.randn(5, requires_grad=True)
    y = torch.randn(5)
    out = f(x, y)
    plan = next(iter(f._plans.values()))
    assert ("in", 1) in plan.res_src and plan.n_res == 0
    y.add_(1.0)  # torch's version counter catches the in-place change
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_double_backward_raises_clearly():
    f = jax_function(lambda x: jnp.sin(x) ** 2)
    x = torch.randn(3, requires_grad=True)
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.sin(2 * x))  # first order still right
    with pytest.raises(DoubleBackwardError, match="first-order"):
        g.sum().backward()


def test_torch_func_grad():
    f = jax_function(lambda x, y: jnp.tanh(x) * y)
    x, y = torch.randn(4), torch.randn(4)
    g = torch.func.grad(lambda x: f(x, y).sum())(x)
    torch.testing.assert_close(g, (1 - torch.tanh(x) ** 2) * y)
    with pytest.raises(DoubleBackwardError):
        torch.func.grad(torch.func.grad(lambda x: f(x, y).sum()))(x)


def test_torch_func_vmap_raises_clearly():
    f = jax_function(jnp.sin)
    with pytest.raises(InteropError, match="jax.vmap"):
        torch.func.vmap(f)(torch.randn(2, 3))


def test_outputs_never_alias_inputs():
    f = jax_function(lambda x: x)  # XLA may hand back the input buffer; we must not
    x = torch.randn(4)
    out = f(x)
    assert out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(out, x)


def test_unhashable_static_argument_errors():
    f = jax_function(lambda x, cfg: x)
    with pytest.raises(InteropError, match="hashable"):
        f(torch.ones(1), [1, {2}][1])


def test_retain_graph_second_backward():
    f = jax_function(lambda x, y: jnp.tanh(x) * y)
    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    out = f(x, y).sum()
    out.backward(retain_graph=True)  # first: reuses the forward's JAX arrays
    g1 = x.grad.clone()
    out.backward()  # second: rebuilt from the tensors torch saved
    torch.testing.assert_close(x.grad, 2 * g1)


def test_int64_ids_through_the_bridge():
    lookup = jax_function(lambda table, ids: jnp.take(table, ids, axis=0).sum())
    table = torch.randn(10, 3, requires_grad=True)
    ids = torch.tensor([1, 1, 9])  # int64, as tokenizers give
    with pytest.raises(DtypeNarrowingError, match="int32"):
        lookup(table, ids)
    with pytest.raises(DtypeNarrowingError, match="float32"):
        lookup(table, np.ones(2))  # numpy float64 constant: same rule
    lookup(table, ids.to(torch.int32)).backward()  # explicit cast: fine
    expected = torch.zeros(10, 3)
    expected[1], expected[9] = 2.0, 1.0
    torch.testing.assert_close(table.grad, expected)
    with jax.enable_x64(True):  # or keep int64 with x64 on
        table.grad = None
        lookup(table, ids).backward()
    torch.testing.assert_close(table.grad, expected)


# -- regression tests from the interop review --------------------------------------------------
def test_numpy_constants_refused_only_when_jax_would_narrow_them():
    f = jax_function(lambda x, c: x * jnp.real(c).sum())
    x = torch.ones(2, requires_grad=True)
    f(x, np.ones(2, np.complex64)).sum().backward()  # 32-bit complex: accepted
    torch.testing.assert_close(x.grad, torch.full((2,), 2.0))
    for dt in (np.complex128, np.uint64, np.float64, np.int64):
        with pytest.raises(DtypeNarrowingError):
            f(x, np.ones(2, dt))
    with jax.enable_x64(True):
        out = jax_function(lambda c: c)(np.array([1 + 1e-12j], np.complex128))
    assert out.dtype == torch.complex128 and out.imag.item() == 1e-12


def test_backward_keeps_only_what_it_needs_alive():
    import gc

    # d/dw needs x only: the first output is not a residual and must be freed when dropped
    g = jax_function(lambda x, w: (x @ w, x * w.sum()))
    x, w = torch.randn(16, 16), torch.randn(16, 16, requires_grad=True)
    big, small = g(x, w)
    ptr = big.data_ptr()
    loss = small[:1].sum()
    del big
    gc.collect()
    assert not any(a.unsafe_buffer_pointer() == ptr for a in jax.live_arrays())
    loss.backward()
    torch.testing.assert_close(w.grad, x[:1].sum().expand(16, 16))


def test_static_arguments_are_keyed_by_type_and_value():
    h = jax_function(lambda x, v: jnp.full(x.shape, v))
    z = torch.zeros(2)
    assert h(z, 1).dtype == torch.int32
    assert h(z, 1.0).dtype == torch.float32  # 1.0 == 1 as a dict key, not as a JAX value
    assert h(z, True).dtype == torch.bool
    assert torch.signbit(h(z, -0.0)).all() and not torch.signbit(h(z, 0.0)).any()
    assert h.cache_size() == 5


def test_plan_cache_warns_and_is_bounded():
    h = jax_function(lambda x, v: x * v)
    h.warn_plans, h.max_plans = 2, 3
    z = torch.zeros(1)
    h(z, 1.0)
    with pytest.warns(RuntimeWarning, match="call signatures"):
        h(z, 2.0)
    for v in (3.0, 4.0, 5.0):
        h(z, v)
    assert h.cache_size() == 3
    assert h(z, 1.0).item() == 0.0  # evicted signatures recompile


def test_forward_mode_ad_raises_interop_error():
    f = jax_function(lambda x, w: jnp.sin(x) * w)
    w = torch.randn(3, requires_grad=True)  # takes the autograd.Function path
    with pytest.raises(InteropError, match="forward-mode"):
        torch.func.jvp(lambda x: f(x, w), (torch.randn(3),), (torch.ones(3),))
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level(), pytest.raises(InteropError, match="forward-mode"):
        f(fwAD.make_dual(torch.randn(3), torch.ones(3)), w)
    with fwAD.dual_level(), pytest.raises(InteropError, match="forward-mode"):
        f(fwAD.make_dual(torch.randn(3), torch.ones(3)), w.detach())  # no grad: no Function
    with pytest.raises(InteropError, match="jax.jvp"):
        torch.func.jvp(lambda x: f(x, w.detach()), (torch.randn(3),), (torch.ones(3),))


def test_copies_are_fresh_wrappers():
    import copy
    import pickle

    from langtorch.interop._bridge import _REGISTRY

    f = jax_function(_scan_jax)
    f(torch.zeros(2, 3, requires_grad=True), torch.ones(3)).backward()  # compiled: not copyable
    for g in (copy.deepcopy(f), pickle.loads(pickle.dumps(f))):
        assert g.fn is f.fn and g.cache_size() == 0
        assert g._uid != f._uid and _REGISTRY[g._uid] is g
        torch.testing.assert_close(g(torch.zeros(2, 3), torch.ones(3)),
                                   f(torch.zeros(2, 3), torch.ones(3)))
