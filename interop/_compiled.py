"""The ``torch.compile`` path of :func:`langtorch.interop.jax_function`.

Dynamo cannot trace into JAX, so under ``torch.compile`` a bridged call becomes two opaque
``torch.library`` custom ops that Inductor/AOTAutograd treat like any ATen op:

* ``langtorch_interop::jax_fwd(Tensor[] xs, str spec, int uid) -> Tensor[]`` returns the outputs
  followed by the VJP residuals (the same compiled XLA forward as eager mode);
* ``langtorch_interop::jax_bwd(Tensor[] saved, Tensor[] cots, str spec, int uid) -> Tensor[]``
  applies JAX's VJP.

Both have fake (meta) implementations computed with ``jax.eval_shape``, and ``jax_fwd`` has an
autograd registration whose backward calls ``jax_bwd``. Everything static about the call — the
argument tree, constants, shapes, dtypes, which inputs need a gradient — is encoded by
:func:`_encode` into the ``spec`` string; ``_encode`` is plain Python over tuples, lists, dicts and
tensors so Dynamo traces it to a constant. The output tree is obtained at trace time through
``torch.compiler.assume_constant_result`` and rebuilt with the equally traceable :func:`_decode`.
``uid`` identifies the :class:`~langtorch.interop.JaxFunction` (kept in a weak registry).

Limits: static shapes only (``dynamic=False``); argument containers are tuples, lists, dicts and
constants; output containers are tuples, lists, dicts and None.
"""

from __future__ import annotations

import ast
import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from langtorch.interop._bridge import (
    _REGISTRY,
    _TORCH,
    _double_backward_error,
    _flatten_call,
    _fresh,
    _ptrs,
)
from langtorch.interop._convert import _WIDE_TORCH, _tensor_to_jax, narrowing_error, x64_enabled
from langtorch.interop._errors import InteropError

__all__ = ["compiled_call"]


def _lookup(uid: int):
    jf = _REGISTRY.get(uid)
    if jf is None:
        raise InteropError(f"jax_function with uid {uid} no longer exists (it was garbage collected)")
    return jf


# -- spec encoding (traced by Dynamo: keep it to str/isinstance/recursion) -------------------------
def _encode(obj, tensors: list) -> str:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        # under torch.no_grad() no gradient is wanted: plan a forward without residuals
        wants_grad = obj.requires_grad and torch.is_grad_enabled()
        return (
            "('T'," + str(len(tensors) - 1) + "," + ("1" if wants_grad else "0") + ","
            + str(tuple(obj.shape)) + ",'" + str(obj.dtype)[6:] + "')"
        )
    if isinstance(obj, tuple):
        return "('tuple',[" + ",".join([_encode(o, tensors) for o in obj]) + "])"
    if isinstance(obj, list):
        return "('list',[" + ",".join([_encode(o, tensors) for o in obj]) + "])"
    if isinstance(obj, dict):
        return "('dict',[" + ",".join(
            ["(" + repr(k) + "," + _encode(obj[k], tensors) + ")" for k in sorted(obj)]
        ) + "])"
    return "('c'," + repr(obj) + ")"


def _decode(node, flat):
    """Rebuild a (traceable) output structure from its literal layout."""
    kind = node[0]
    if kind == "T":
        return flat[node[1]]
    if kind == "tuple":
        return tuple([_decode(c, flat) for c in node[1]])
    if kind == "list":
        return [_decode(c, flat) for c in node[1]]
    if kind == "dict":
        return {k: _decode(c, flat) for k, c in node[1]}
    return node[1]


@functools.lru_cache(maxsize=256)
def _parse(spec: str):
    try:
        tree = ast.literal_eval(spec)
    except (ValueError, SyntaxError):
        raise InteropError(
            "jax_function under torch.compile needs static shapes and constant non-tensor "
            f"arguments; got the call spec {spec!r}. Compile with dynamic=False."
        ) from None
    metas = []

    def build(node):
        kind = node[0]
        if kind == "T":
            _, i, rg, shape, dtype = node
            metas.append((i, bool(rg), shape, dtype))
            return _Placeholder(i)
        if kind in ("tuple", "list"):
            items = [build(c) for c in node[1]]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            return {k: build(c) for k, c in node[1]}
        return node[1]

    return build(tree), sorted(metas)


class _Placeholder:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


def _fill(tree, xs):
    return jax.tree_util.tree_map(lambda p: xs[p.i] if isinstance(p, _Placeholder) else p, tree,
                                  is_leaf=lambda p: isinstance(p, _Placeholder))


def _jax_dtype(name: str):
    return jnp.dtype(name)


def _torch_dtype(dt) -> torch.dtype:
    return getattr(torch, np.dtype(dt).name)


def _plan(uid: int, spec: str, xs):
    """The JaxFunction's plan for this spec, and its dynamic inputs in plan order.

    The i-th dynamic input of the plan is ``xs[pos[i]]``, by position: the same tensor may be
    passed twice (``f(x, x)``) and then gets one gradient per position, which autograd sums.
    """
    jf, plan, dyn, _ = _plan_pos(uid, spec, xs)
    return jf, plan, dyn


def _plan_pos(uid: int, spec: str, xs):
    jf = _lookup(uid)
    tree, metas = _parse(spec)
    pos = _positions(spec)
    leaves, treedef, kinds = _flatten_call(*_fill(tree, xs))
    dyn_kinds = [k for k in kinds if k != 2]
    if any(k != _TORCH for k in dyn_kinds):
        raise InteropError("jax_function under torch.compile takes torch tensors, not JAX arrays")
    dyn_leaves = [leaf for leaf, k in zip(leaves, kinds) if k != 2]
    diff = tuple(
        j for j, leaf in enumerate(dyn_leaves)
        if metas[pos[j]][1] and (leaf.dtype.is_floating_point or leaf.dtype.is_complex)
    )
    plan = jf._plan_for(leaves, treedef, kinds, diff)
    if plan.out_treedef is None:
        # a new plan object (first use, or the old one was evicted from the cache): derive the
        # output and residual layout now, the fake, real and backward ops all read it
        plan.abstract(_structs(dyn_leaves))
    return jf, plan, dyn_leaves, pos


@functools.lru_cache(maxsize=256)
def _positions(spec: str) -> tuple:
    """Index into ``xs`` of each dynamic leaf, in the order ``jax.tree_util`` flattens them."""
    tree, _ = _parse(spec)
    flat = jax.tree_util.tree_leaves(tree, is_leaf=lambda p: isinstance(p, _Placeholder))
    return tuple(p.i for p in flat if isinstance(p, _Placeholder))


def _structs(dyn_leaves):
    out = []
    for t in dyn_leaves:
        if t.dtype in _WIDE_TORCH and not x64_enabled():
            raise narrowing_error(f"a {t.dtype} tensor", tuple(t.shape), str(t.dtype)[6:])
        out.append(jax.ShapeDtypeStruct(tuple(t.shape), _jax_dtype(str(t.dtype)[6:])))
    return out


# -- the custom ops -----------------------------------------------------------------------------
@torch.library.custom_op("langtorch_interop::jax_fwd", mutates_args=())
def jax_fwd(xs: list[torch.Tensor], spec: str, uid: int) -> list[torch.Tensor]:
    _, plan, dyn = _plan(uid, spec, xs)
    outs, res = plan.forward([_tensor_to_jax(t, False) for t in dyn])
    ptrs = _ptrs(xs)
    return _fresh([torch.from_dlpack(o) for o in [*outs, *res]], ptrs)


@jax_fwd.register_fake
def _jax_fwd_fake(xs, spec, uid):
    _, plan, dyn = _plan(uid, spec, xs)
    outs, res = plan.abstract(_structs(dyn))
    dev = xs[0].device if xs else torch.device("cpu")
    return [torch.empty(s.shape, dtype=_torch_dtype(s.dtype), device=dev) for s in [*outs, *res]]


def _bwd_inputs(plan, saved):
    n_in = len({i for kind, i in plan.res_src if kind == "in"})
    n_out = len({k for kind, k in plan.res_src if kind == "out"})
    ins = dict(zip(sorted({i for kind, i in plan.res_src if kind == "in"}), saved[:n_in]))
    outs = dict(zip(sorted({k for kind, k in plan.res_src if kind == "out"}),
                    saved[n_in:n_in + n_out]))
    res = saved[n_in + n_out:]
    return ins, outs, res


@torch.library.custom_op("langtorch_interop::jax_bwd", mutates_args=())
def jax_bwd(saved: list[torch.Tensor], cots: list[torch.Tensor], spec: str, uid: int,
            xs_meta: list[torch.Tensor]) -> list[torch.Tensor]:
    _, plan, _ = _plan(uid, spec, xs_meta)
    ins, outs, res = _bwd_inputs(plan, [_tensor_to_jax(t, False) for t in saved])
    res_full = [ins[i] if kind == "in" else outs[i] if kind == "out" else res[i]
                for kind, i in plan.res_src]
    cj = [_tensor_to_jax(c, False) for c, ok in zip(cots, plan.out_inexact) if ok]
    grads = plan.backward(res_full, cj)
    return _fresh([torch.from_dlpack(g) for g in grads], _ptrs(saved) | _ptrs(cots))


@jax_bwd.register_fake
def _jax_bwd_fake(saved, cots, spec, uid, xs_meta):
    _, plan, dyn = _plan(uid, spec, xs_meta)
    return [torch.empty_like(dyn[j]) for j in plan.diff]


def _setup_context(ctx, inputs, output):
    xs, spec, uid = inputs
    _, plan, dyn, pos = _plan_pos(uid, spec, xs)
    n_out = len(plan.out_inexact)
    ctx.spec, ctx.uid, ctx.n_out, ctx.n_xs = spec, uid, n_out, len(xs)
    ctx.diff_pos = [pos[j] for j in plan.diff]
    saved_in = [dyn[i] for i in sorted({i for kind, i in plan.res_src if kind == "in"})]
    saved_out = [output[k] for k in sorted({k for kind, k in plan.res_src if kind == "out"})]
    ctx.n_saved = len(saved_in) + len(saved_out) + (len(output) - n_out)
    # xs are saved too (cheap references) so the backward op can rebuild the plan's spec
    ctx.save_for_backward(*saved_in, *saved_out, *output[n_out:], *xs)


def _backward(ctx, grads):
    saved = ctx.saved_tensors
    fixed, xs = list(saved[: ctx.n_saved]), list(saved[ctx.n_saved:])
    _, plan, _ = _plan(ctx.uid, ctx.spec, xs)
    cots = [
        g if g is not None else torch.zeros(s, dtype=_torch_dtype(d), device=xs[0].device)
        for g, s, d in zip(grads[: ctx.n_out], plan.out_shapes, plan.out_dtypes)
    ]
    gs = jax_bwd(fixed, cots, ctx.spec, ctx.uid, xs)
    result = [None] * ctx.n_xs
    for p, g in zip(ctx.diff_pos, gs):
        result[p] = g
    return result, None, None


def _no_double(ctx, grads):
    raise _double_backward_error(f"uid={ctx.uid}")


def _bwd_setup(ctx, inputs, output):
    ctx.uid = inputs[3]


jax_fwd.register_autograd(_backward, setup_context=_setup_context)
jax_bwd.register_autograd(_no_double, setup_context=_bwd_setup)


@torch.compiler.assume_constant_result
def _layout(uid: int, spec: str) -> tuple:
    """(output layout literal, number of outputs); evaluated once at trace time by Dynamo."""
    tree, metas = _parse(spec)
    xs = [torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
          for _, _, shape, dtype in metas]
    for x, (_, rg, _, _) in zip(xs, metas):
        x.requires_grad_(rg and (x.dtype.is_floating_point or x.dtype.is_complex))
    _, plan, dyn = _plan(uid, spec, xs)
    plan.abstract(_structs(dyn))
    n = len(plan.out_inexact)
    dummy = jax.tree_util.tree_unflatten(plan.out_treedef, list(range(n)))
    return _literal(dummy), n


def _literal(node):
    if isinstance(node, int):
        return ("T", node)
    if node is None:
        return ("c", None)
    if type(node) is tuple:
        return ("tuple", tuple(_literal(c) for c in node))
    if type(node) is list:
        return ("list", tuple(_literal(c) for c in node))
    if type(node) is dict:
        return ("dict", tuple((k, _literal(c)) for k, c in node.items()))
    raise InteropError(
        f"jax_function under torch.compile returns tuples, lists, dicts or arrays; got a "
        f"{type(node).__name__} node in the output. Return plain containers from the JAX function."
    )


def compiled_call(jf, args, kwargs):
    """Entry point used by ``JaxFunction.__call__`` while Dynamo traces."""
    tensors: list = []
    spec = _encode((args, kwargs), tensors)
    flat = jax_fwd(tensors, spec, jf._uid)
    layout, n = _layout(jf._uid, spec)
    return _decode(layout, flat[:n])
