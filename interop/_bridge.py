"""The autograd bridge: call a JAX function from torch, backpropagate through JAX's VJP.

How one call works (eager mode):

1. The arguments (any pytree) are flattened with ``jax.tree_util``. Torch tensors become dynamic
   inputs, JAX/numpy arrays become constant dynamic inputs, everything else is static (hashed into
   the cache key, like ``static_argnums``).
2. A *plan* is looked up per (tree structure, static values, shapes, dtypes, devices, which tensors
   need a gradient, x64 flag). A plan holds two compiled XLA programs: the forward, which runs
   ``jax.vjp`` and returns the outputs plus the VJP residuals, and the backward, which rebuilds the
   VJP from the residuals and applies it to the output cotangents. Gradients are computed only for
   the tensors that ``requires_grad`` (frozen weights cost nothing).
3. Residuals that are simply one of the inputs or one of the outputs are detected while tracing
   (object identity of the tracers) and are *not* returned by the forward program — torch keeps
   the input/output tensor itself through ``ctx.save_for_backward``, so nothing is stored twice and
   an in-place change of such a tensor before ``backward`` raises torch's usual version-counter
   error instead of producing a silently wrong gradient.
4. The remaining residuals cross to torch zero-copy and travel as extra, non-differentiable outputs
   of a ``torch.autograd.Function`` (so torch owns their lifetime and ``torch.func`` sees tensors
   only); the caller never sees them.
5. Every result is converted with ``torch.from_dlpack``, which waits for JAX: when control returns
   to torch, JAX has finished reading the inputs, so torch may write into them again.

Double backward raises :class:`DoubleBackwardError` (the backward runs in XLA, outside torch's
graph). Under ``torch.compile`` the call goes through a ``torch.library.custom_op`` instead (see
``_compiled.py``).
"""

from __future__ import annotations

import functools
import itertools
import warnings
import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.autograd.forward_ad as _fwad

from langtorch.interop._convert import _tensor_to_jax, narrowing_error, x64_enabled
from langtorch.interop._errors import DoubleBackwardError, InteropError

__all__ = ["JaxFunction", "jax_function"]

_TORCH, _ARRAY, _STATIC = 0, 1, 2

# uid -> JaxFunction, so the torch.compile custom ops (which take an int) can find the function.
_REGISTRY: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_UIDS = itertools.count(1)


def _conj(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def _inexact(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def _flatten_call(args, kwargs):
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    kinds = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            kinds.append(_TORCH)
        elif isinstance(leaf, (jax.Array, np.ndarray)):
            kinds.append(_ARRAY)
            if isinstance(leaf, np.ndarray):
                if jax.dtypes.canonicalize_dtype(leaf.dtype) != leaf.dtype:
                    # jnp.asarray would narrow it silently (int64/uint64/float64/complex128 with
                    # x64 off), like 64-bit tensors (see to_jax); complex64 etc. pass
                    raise narrowing_error(f"a numpy {leaf.dtype} array", leaf.shape,
                                          str(leaf.dtype))
                leaves[i] = jnp.asarray(leaf)
        else:
            try:
                hash(leaf)
            except TypeError:
                raise InteropError(
                    f"jax_function: argument leaf {i} of type {type(leaf).__name__} is neither a "
                    "tensor/array nor hashable; non-array arguments are treated as static (part "
                    "of the compilation key) and must be hashable. Pass arrays as torch tensors."
                ) from None
            kinds.append(_STATIC)
    return leaves, treedef, tuple(kinds)


class _Plan:
    """Compiled forward/backward for one call signature."""

    def __init__(self, fn, treedef, kinds, static_leaves, diff):
        self.fn = fn
        self.treedef = treedef
        self.kinds = kinds
        self.dyn_pos = [i for i, k in enumerate(kinds) if k != _STATIC]
        self.static_leaves = static_leaves  # full-length list, dynamic slots are None
        self.diff = diff  # indices into the dynamic inputs that get a gradient
        self.out_treedef = None
        self.out_inexact: list[bool] = []
        self.res_treedef = None
        self.res_src: list[tuple[str, int]] = []
        self.n_res = 0
        self._fwd = None
        self._bwd = None

    # -- tracing helpers -------------------------------------------------------------------
    def _assemble(self, dyn):
        leaves = list(self.static_leaves)
        for p, v in zip(self.dyn_pos, dyn):
            leaves[p] = v
        args, kwargs = jax.tree_util.tree_unflatten(self.treedef, leaves)
        return self.fn(*args, **kwargs)

    def _record_out(self, out):
        outs, self.out_treedef = jax.tree_util.tree_flatten(out)
        for o in outs:
            if not hasattr(o, "dtype"):
                raise InteropError(
                    f"jax_function: the JAX function returned a non-array leaf {o!r}; outputs must "
                    "be arrays (or pytrees of arrays)."
                )
        self.out_inexact = [_inexact(o.dtype) for o in outs]
        return outs

    def _fwd_nograd(self, *dyn):
        return self._record_out(self._assemble(dyn))

    def _fwd_vjp(self, *dyn):
        def partial_fn(*d):
            vals = list(dyn)
            for j, v in zip(self.diff, d):
                vals[j] = v
            return self._assemble(vals)

        out, vjp = jax.vjp(partial_fn, *[dyn[j] for j in self.diff])
        outs = self._record_out(out)
        res, self.res_treedef = jax.tree_util.tree_flatten(vjp)
        src, kept = [], []
        for r in res:
            hit = next((("in", i) for i, d in enumerate(dyn) if r is d), None)
            hit = hit or next((("out", k) for k, o in enumerate(outs) if r is o), None)
            hit = hit or next((("res", k) for k, q in enumerate(kept) if r is q), None)
            if hit is None:
                hit = ("res", len(kept))
                kept.append(r)
            src.append(hit)
        self.res_src, self.n_res = src, len(kept)
        return outs, kept

    def _bwd_impl(self, res_full, cots):
        vjp = jax.tree_util.tree_unflatten(self.res_treedef, res_full)
        # torch's complex gradients are the conjugates of JAX's cotangents (torch: J^H g,
        # JAX: g^T J), so complex values are conjugated on the way in and out; no-op for reals.
        it = iter(cots)
        ct = [_conj(next(it)) if ok else np.zeros(s, jax.dtypes.float0)
              for ok, s in zip(self.out_inexact, self.out_shapes)]
        return [_conj(g) for g in vjp(jax.tree_util.tree_unflatten(self.out_treedef, ct))]

    # -- compiled entry points -------------------------------------------------------------
    def forward(self, dyn):
        if self._fwd is None:
            target = self._fwd_vjp if self.diff else self._fwd_nograd
            # AOT trace: guarantees the residual bookkeeping above ran for this signature.
            self._fwd = jax.jit(target).trace(*dyn).lower().compile()
            out_info = self._fwd.out_info
            outs_info = out_info[0] if self.diff else out_info
            self.out_shapes = [o.shape for o in outs_info]
            self.out_dtypes = [o.dtype for o in outs_info]
        out = self._fwd(*dyn)
        return out if self.diff else (out, [])

    def backward(self, res_full, cots):
        if self._bwd is None:  # planned abstractly (torch.compile), first real backward
            self._bwd = jax.jit(self._bwd_impl)
        return self._bwd(res_full, cots)

    def abstract(self, dyn):
        """Shapes/dtypes of (outputs, kept residuals) for ``jax.ShapeDtypeStruct`` inputs."""
        if not hasattr(self, "_abstract"):
            target = self._fwd_vjp if self.diff else self._fwd_nograd
            res = jax.eval_shape(target, *dyn)
            outs, kept = res if self.diff else (res, [])
            self.out_shapes = [o.shape for o in outs]
            self.out_dtypes = [o.dtype for o in outs]
            self._abstract = (list(outs), list(kept))
        return self._abstract


def _spec(leaf, kind):
    if kind == _TORCH:
        return (tuple(leaf.shape), leaf.dtype, leaf.device)
    if kind == _ARRAY:
        return (leaf.shape, leaf.dtype, getattr(leaf, "weak_type", False))
    # 1 == 1.0 == True and 0.0 == -0.0 as dict keys, but JAX traces them to different dtypes or
    # values: key on the type, and on the bit pattern of floats (also makes nan hit the cache)
    return (type(leaf), leaf.hex() if type(leaf) is float else leaf)


def _plain(t):
    """Strip torch.func (functorch) grad wrappers: the backward math runs in JAX on the values."""
    fc = torch._C._functorch
    while fc.is_functorch_wrapped_tensor(t):
        t = fc.get_unwrapped(t)
    return t


def _wrap_depth(t):
    fc, n = torch._C._functorch, 0
    while fc.is_functorch_wrapped_tensor(t):
        t, n = fc.get_unwrapped(t), n + 1
    return n


def _fresh(tensors, ptrs):
    """Clone any result that shares memory with an input (torch must not see hidden aliases)."""
    return [t.clone() if t.numel() and t.data_ptr() in ptrs else t for t in tensors]


def _ptrs(tensors):
    return {t.data_ptr() for t in tensors if isinstance(t, torch.Tensor) and t.numel()}


class _Call:
    """Per-call state handed to the autograd Function (plan + non-tensor dynamic inputs)."""

    __slots__ = ("plan", "dyn_kinds", "arrays", "convert", "torch_idx", "name", "live")

    def __init__(self, plan, dyn_kinds, arrays, convert, name):
        self.plan = plan
        self.dyn_kinds = dyn_kinds
        self.arrays = arrays  # jax arrays for _ARRAY slots (None for torch slots)
        self.convert = convert
        self.name = name
        # dynamic index -> position among the torch tensors
        it = itertools.count()
        self.torch_idx = [next(it) if k == _TORCH else None for k in dyn_kinds]
        # ({input index: jax array}, {output index: jax array}, jax residuals): only the values
        # the first backward reads (inputs/outputs that are residuals, the kept residuals), so
        # nothing is converted twice and inputs/outputs the backward does not need are not held
        # alive; dropped after the first backward (torch frees its saved tensors then)
        self.live = None

    def jax_inputs(self, tensors):
        out = []
        for k, a, ti in zip(self.dyn_kinds, self.arrays, self.torch_idx):
            out.append(self.convert(tensors[ti]) if k == _TORCH else a)
        return out


class _Bridge(torch.autograd.Function):
    @staticmethod
    def vmap(info, in_dims, call, *tensors):
        raise InteropError(
            f"jax_function({call.name}) cannot run under torch.func.vmap: the batching would have "
            "to happen inside XLA. Use jax.vmap inside the wrapped function instead."
        )

    @staticmethod
    def jvp(ctx, *tangents):
        # forward-mode AD (torch.func.jvp/jacfwd, torch.autograd.forward_ad) would need JAX's JVP
        # of the whole call inside XLA; without this, torch raises a bare NotImplementedError
        raise InteropError(
            f"jax_function({ctx.call.name}) supports reverse mode only (backward, torch.func.grad);"
            " forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) is not bridged."
            " Use jax.jvp inside the wrapped function instead."
        )

    @staticmethod
    def forward(call: _Call, *tensors):
        jin = call.jax_inputs(tensors)
        plan = call.plan
        outs, res = plan.forward(jin)
        call.live = (
            {i: jin[i] for kind, i in plan.res_src if kind == "in"},
            {k: outs[k] for kind, k in plan.res_src if kind == "out"},
            res,
        )
        ptrs = _ptrs(tensors)
        touts = _fresh([torch.from_dlpack(o) for o in outs], ptrs)
        tres = [torch.from_dlpack(r) for r in res]
        return (*touts, *tres)

    @staticmethod
    def setup_context(ctx, inputs, output):
        call = inputs[0]
        tensors = inputs[1:]
        plan = call.plan
        n_out = len(plan.out_inexact)
        outs, res = output[:n_out], output[n_out:]
        ctx.mark_non_differentiable(
            *res, *[o for o, ok in zip(outs, plan.out_inexact) if not ok]
        )
        ctx.set_materialize_grads(False)
        ctx.call = call
        # residuals that are inputs/outputs are saved as those tensors (version-checked by torch)
        saved_in = sorted({i for kind, i in plan.res_src if kind == "in"})
        saved_out = sorted({k for kind, k in plan.res_src if kind == "out"})
        ctx.saved_in = {i: n for n, i in enumerate(saved_in)}
        ctx.saved_out = {k: len(saved_in) + n for n, k in enumerate(saved_out)}
        diff_tensors = [tensors[call.torch_idx[j]] for j in plan.diff]
        in_vals = [
            tensors[call.torch_idx[i]] if call.torch_idx[i] is not None else None
            for i in saved_in
        ]
        # JAX-array inputs forwarded as residuals stay on the call object, not in torch
        ctx.save_for_backward(
            *[t for t in in_vals if t is not None],
            *[outs[k] for k in saved_out],
            *res,
            *diff_tensors,
        )
        ctx.in_is_torch = [t is not None for t in in_vals]

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        depth = max([_wrap_depth(t) for t in saved] + [_wrap_depth(g) for g in grads
                                                       if g is not None])
        if depth == 0:
            return _Bridge._backward(ctx, saved, grads, guard=torch.is_grad_enabled())
        if depth > 1:
            raise _double_backward_error(ctx.call.name)
        # Under torch.func.grad the tensors are functorch wrappers; the math runs in JAX on the
        # plain values, with functorch's dispatch off so torch ops do not re-wrap them.
        ctx.call.live = None  # use the unwrapped saved tensors
        with torch._C._DisableFuncTorch():
            saved = [_plain(t) for t in saved]
            grads = [None if g is None else _plain(g) for g in grads]
            return _Bridge._backward(ctx, saved, grads, guard=False)

    @staticmethod
    def _backward(ctx, saved, grads, guard):
        call, plan = ctx.call, ctx.call.plan
        n_out = len(plan.out_inexact)
        it = iter(saved)
        saved_in_vals = {}
        if call.live is not None:
            # first backward: the forward's JAX arrays are still at hand (torch has checked the
            # saved tensors' versions when we read ctx.saved_tensors)
            jin, jouts, jres = call.live
            call.live = None
            for _ in range(sum(ctx.in_is_torch) + len(ctx.saved_out) + plan.n_res):
                next(it)
            saved_in_vals, saved_out_vals, res_vals = dict(jin), dict(jouts), list(jres)
        else:
            # retain_graph / torch.func: rebuild from the tensors torch saved
            for i, is_torch in zip(sorted(ctx.saved_in), ctx.in_is_torch):
                saved_in_vals[i] = call.convert(next(it)) if is_torch else call.arrays[i]
            saved_out_vals = {k: _tensor_to_jax(next(it), False) for k in sorted(ctx.saved_out)}
            res_vals = [_tensor_to_jax(next(it), False) for _ in range(plan.n_res)]
        anchors = list(it)  # the differentiable inputs, for the double-backward guard
        res_full = []
        for kind, i in plan.res_src:
            res_full.append(
                saved_in_vals[i] if kind == "in" else saved_out_vals[i] if kind == "out"
                else res_vals[i]
            )
        cots = []
        for k in range(n_out):
            if not plan.out_inexact[k]:
                continue
            g = grads[k]
            if g is None:
                cots.append(jnp.zeros(plan.out_shapes[k], plan.out_dtypes[k]))
            else:
                cots.append(_tensor_to_jax(g, False))
        gj = plan.backward(res_full, cots)
        ptrs = _ptrs(grads) | _ptrs(saved)
        gt = _fresh([torch.from_dlpack(g) for g in gj], ptrs)
        if guard:
            anchors += [g for g in grads[:n_out] if g is not None]
            gt = list(_NoDoubleBackward.apply(call.name, len(anchors), *anchors, *gt))
        result = [None] * (1 + len(call.torch_idx) - call.torch_idx.count(None))
        for j, g in zip(plan.diff, gt):
            result[1 + call.torch_idx[j]] = g
        # grads for residual outputs are ignored; for JAX-array inputs there is no slot
        return tuple(result)


class _NoDoubleBackward(torch.autograd.Function):
    """Identity on gradients whose own backward raises: makes double backward fail clearly."""

    @staticmethod
    def forward(ctx, name, n_anchor, *tensors):
        # anchors (inputs needing grad, incoming grads) only connect this node to the graph
        ctx.name = name
        return tuple(t.view_as(t) for t in tensors[n_anchor:])

    @staticmethod
    def backward(ctx, *grads):
        raise _double_backward_error(ctx.name)


def _double_backward_error(name):
    return DoubleBackwardError(
        f"jax_function({name}) supports first-order gradients only: its backward runs JAX's VJP "
        "outside torch's autograd graph, so torch cannot differentiate it again (create_graph=True "
        "then another backward/grad, or nested torch.func.grad). Compute higher-order derivatives "
        "in JAX instead, e.g. wrap `jax.grad(f)` itself with jax_function."
    )


class JaxFunction:
    """A torch-callable wrapper of a JAX function; see :func:`jax_function`.

    Holds one compiled forward/backward plan per call signature. A signature that keeps changing
    (a new static value or shape on every call) recompiles every time: the first time the cache
    reaches ``warn_plans`` signatures a warning says so, and beyond ``max_plans`` the oldest plan
    is dropped (both are class attributes; set them on an instance to change them).

    Copies (``copy.deepcopy``, pickling) are fresh wrappers of the same ``fn`` with an empty
    cache and their own compile identity.

    Attributes:
        fn: the wrapped JAX function.
        name: display name used in error messages.

    Example:
        >>> import torch, jax.numpy as jnp
        >>> from langtorch.interop import JaxFunction
        >>> f = JaxFunction(jnp.exp, name="exp")
        >>> x = torch.zeros(2, requires_grad=True)
        >>> f(x).sum().backward(); x.grad.tolist()
        [1.0, 1.0]
    """

    warn_plans: int = 32
    max_plans: int = 256

    def __init__(self, fn: Callable, *, name: str | None = None):
        if torch.compiler.is_compiling():
            # Dynamo would otherwise fail on the weak registry with an unrelated message
            raise InteropError(
                f"jax_function({getattr(fn, '__name__', fn)!r}) was created inside a function "
                "being compiled by torch.compile; create it once outside (at module level or in "
                "__init__) and call it inside the compiled function."
            )
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self._plans: dict = {}
        self._warned = False
        self._uid = next(_UIDS)
        _REGISTRY[self._uid] = self
        functools.update_wrapper(self, fn, updated=())

    # Compiled plans hold XLA executables (not copyable or picklable) and the uid names this
    # instance in the compile registry, so a copy is a fresh instance: same fn, new uid, no plans.
    def __deepcopy__(self, memo):
        new = JaxFunction(self.fn, name=self.name)
        memo[id(self)] = new
        return new

    def __getstate__(self):
        return {"fn": self.fn, "name": self.name}

    def __setstate__(self, state):
        self.__init__(state["fn"], name=state["name"])

    def __repr__(self) -> str:
        return f"jax_function({self.name})"

    def cache_size(self) -> int:
        """Number of compiled call signatures held.

        Example:
            >>> import torch, jax.numpy as jnp
            >>> from langtorch.interop import jax_function
            >>> f = jax_function(jnp.sin)
            >>> _ = f(torch.zeros(2)); _ = f(torch.zeros(2)); _ = f(torch.zeros(3))
            >>> f.cache_size()
            2
        """
        return len(self._plans)

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            # imported here: the custom ops pull in torch._dynamo (~1 s), needed only when compiling
            from langtorch.interop._compiled import compiled_call

            return compiled_call(self, args, kwargs)
        return self._call(args, kwargs)

    def _plan_for(self, leaves, treedef, kinds, diff) -> _Plan:
        key = (
            treedef,
            kinds,
            tuple(_spec(leaf, k) for leaf, k in zip(leaves, kinds)),
            diff,
            x64_enabled(),
        )
        plan = self._plans.get(key)
        if plan is None:
            static = [leaf if k == _STATIC else None for leaf, k in zip(leaves, kinds)]
            plan = _Plan(self.fn, treedef, kinds, static, diff)
            self._admit(key, plan)
        return plan

    def _admit(self, key, plan):
        plans = self._plans
        while len(plans) >= max(1, self.max_plans):
            # oldest first (dicts keep insertion order); a live autograd node keeps its own plan
            plans.pop(next(iter(plans), None), None)
        plans[key] = plan
        if len(plans) >= self.warn_plans and not self._warned:
            self._warned = True
            warnings.warn(
                f"{self!r} has compiled {len(plans)} call signatures (one per distinct shape, "
                "dtype, requires_grad pattern and static argument value); each new one recompiles."
                " Pass values that change between calls as arrays/tensors, not Python scalars, "
                f"or pad shapes to a few sizes. Beyond {self.max_plans} signatures the oldest "
                "plans are dropped.",
                RuntimeWarning,
                stacklevel=4,
            )

    def _call(self, args, kwargs, convert: Callable | None = None):
        convert = convert or _tensor_to_jax_nocopy
        leaves, treedef, kinds = _flatten_call(args, kwargs)
        grad_on = torch.is_grad_enabled()
        dyn = [(i, leaf, k) for i, (leaf, k) in enumerate(zip(leaves, kinds)) if k != _STATIC]
        diff = tuple(
            j for j, (_, leaf, k) in enumerate(dyn)
            if k == _TORCH and grad_on and leaf.requires_grad
            and (leaf.dtype.is_floating_point or leaf.dtype.is_complex)
        )
        plan = self._plan_for(leaves, treedef, kinds, diff)
        tensors = [leaf for _, leaf, k in dyn if k == _TORCH]
        call = _Call(
            plan, [k for _, _, k in dyn], [leaf if k == _ARRAY else None for _, leaf, k in dyn],
            convert, self.name,
        )
        if diff:
            flat = _Bridge.apply(call, *tensors)[: len(plan.out_inexact)]
        else:
            if _fwad._current_level >= 0 and any(
                    _fwad.unpack_dual(t).tangent is not None for t in tensors):
                # without an input requiring grad the Function (and its jvp) is bypassed: the
                # tangent would be dropped silently
                raise InteropError(
                    f"{self!r} got a forward-mode dual tensor (torch.autograd.forward_ad); "
                    "forward-mode AD is not bridged. Use jax.jvp inside the wrapped function."
                )
            if any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors):
                raise InteropError(
                    f"{self!r} got a torch.func-transformed tensor (vmap/jvp/jacfwd) with no "
                    "input requiring grad; only torch.func.grad-style reverse mode is bridged. "
                    "Use the JAX transform (jax.vmap, jax.jvp) inside the wrapped function."
                )
            outs, _ = plan.forward(call.jax_inputs(tensors))
            flat = _fresh([torch.from_dlpack(o) for o in outs], _ptrs(tensors))
        return jax.tree_util.tree_unflatten(plan.out_treedef, list(flat))


def _tensor_to_jax_nocopy(t):
    return _tensor_to_jax(t, False)


def jax_function(fn: Callable | None = None, *, name: str | None = None):
    """Make a JAX function callable on torch tensors, differentiable by torch autograd.

    The forward and backward run as jitted XLA programs (compiled once per shape/dtype
    signature); torch autograd calls JAX's VJP for the backward. Arguments and results may be
    pytrees; torch tensors become JAX arrays zero-copy, non-array arguments are static (hashable,
    part of the compilation key). Gradients are returned for every floating tensor input that
    requires grad; integer inputs and outputs are not differentiable. Second-order gradients
    raise :class:`DoubleBackwardError`. Inside ``torch.compile`` the call is a
    ``torch.library.custom_op`` (works with ``fullgraph=True``; shapes must be static).

    Args:
        fn: a function of JAX arrays (and static values) returning an array or pytree of arrays.
            Usable as a decorator, with or without arguments.
        name: a display name (defaults to ``fn.__name__``).

    Returns:
        A :class:`JaxFunction`.

    Example:
        >>> import torch, jax.numpy as jnp
        >>> from langtorch.interop import jax_function
        >>> @jax_function
        ... def f(x, params):
        ...     return {"y": jnp.tanh(x @ params["w"]).sum()}
        >>> x = torch.ones(2, 3, requires_grad=True)
        >>> w = torch.zeros(3, 4, requires_grad=True)
        >>> out = f(x, {"w": w})
        >>> out["y"].backward()
        >>> x.grad.shape, w.grad.shape
        (torch.Size([2, 3]), torch.Size([3, 4]))
    """
    if fn is None:
        return lambda f: JaxFunction(f, name=name)
    return JaxFunction(fn, name=name)
