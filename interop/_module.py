"""``JaxModule``: a stateless JAX ``(init, apply)`` pair as a ``torch.nn.Module``.

The torch ``nn.Parameter``s are the source of truth: optimizers, ``.to()``, ``state_dict``,
``load_state_dict``, ``requires_grad_`` and DDP-style hooks see ordinary parameters. The parameter
pytree of the JAX side is mirrored as nested submodules (dict keys and list indices become
attribute names), so ``state_dict`` keys read like the pytree paths (``layers.q_w``).

On every forward, the module hands JAX zero-copy views of its parameters. A view is cached per
parameter and re-made only when the parameter's storage changes (``data_ptr``, shape, strides,
dtype, device) or when torch modified it in place (``_version``, bumped by optimizer steps and
``load_state_dict``) — JAX assumes its arrays are immutable, so a changed tensor gets a new array.
Gradients reach the parameters through :func:`~langtorch.interop.jax_function`.

``apply`` receives the training flag explicitly (``training=self.training`` by default), like
``F.dropout(x, training=...)`` in torch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import torch
from torch import nn

from langtorch.interop._bridge import JaxFunction, _plain
from langtorch.interop._convert import _tensor_to_jax, to_torch
from langtorch.interop._errors import InteropError

__all__ = ["JaxModule"]


class _ParamNode(nn.Module):
    """A container for one level of the parameter pytree (no forward)."""

    def forward(self, *args, **kwargs):  # pragma: no cover - containers are not called
        raise InteropError("a parameter container of a JaxModule is not callable")


def _path_name(entry) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            name = str(getattr(entry, attr))
            break
    else:
        name = str(entry)
    if not name or "." in name:
        raise InteropError(
            f"JaxModule: parameter pytree key {name!r} cannot be a torch attribute name (empty or "
            "containing '.'); rename the key in the pytree returned by init."
        )
    return name


def _as_torch_leaf(leaf) -> torch.Tensor:
    if isinstance(leaf, torch.Tensor):
        # contiguous: a transposed/strided parameter could not be shared with JAX zero-copy
        return leaf.detach().clone(memory_format=torch.contiguous_format)
    if isinstance(leaf, np.ndarray):
        return torch.from_numpy(np.array(leaf, copy=True))
    if isinstance(leaf, jax.Array):
        # copy once at construction: from then on torch owns and mutates this memory
        return to_torch(leaf).clone()
    return torch.as_tensor(leaf)


class _ApplyFlat:
    """``apply`` taking the parameters as a flat list (picklable when ``apply`` is).

    The parameter tree is rebuilt on the JAX side: the torch side passes a flat list, which
    torch.compile can trace (JAX treedefs are opaque to Dynamo).
    """

    def __init__(self, apply, treedef):
        self.apply, self.treedef = apply, treedef
        self.__name__ = getattr(apply, "__name__", type(apply).__name__)

    def __call__(self, leaves, *inputs, **kwargs):
        return self.apply(jax.tree_util.tree_unflatten(self.treedef, leaves), *inputs, **kwargs)


def _cacheable(t: torch.Tensor) -> bool:
    """Whether ``t`` is one of the module's own tensors whose JAX view may be cached.

    Not cached: anything inside a torch.func transform (``torch.func.grad`` over
    ``functional_call``: wrapped tensors have no storage, and even ``detach()`` of a plain buffer
    is re-dispatched there; the bridge unwraps and converts them itself), tensor subclasses, and
    floating leaves that are not ``nn.Parameter``s (a tensor substituted by ``functional_call``:
    caching it would keep the caller's memory alive and evict the parameter's view).
    """
    fc = torch._C._functorch
    if fc.peek_interpreter_stack() is not None or fc.is_functorch_wrapped_tensor(t):
        return False
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return type(t) is nn.Parameter
    return type(t) is torch.Tensor


class JaxModule(nn.Module):
    """Wrap ``apply(params, *inputs, training=...)`` and its parameter pytree as an nn.Module.

    Floating leaves of ``params`` become ``nn.Parameter``s (trainable unless ``trainable`` says
    otherwise), other leaves become buffers. ``forward(*inputs, **static)`` calls ``apply``
    through the autograd bridge, so ``loss.backward()`` fills ``param.grad``; ``apply`` runs
    jitted, compiled once per input shape/dtype and train/eval mode.

    Args:
        apply: a pure JAX function ``apply(params, *inputs, **kwargs)``.
        params: the parameter pytree (JAX/numpy arrays or tensors; copied once).
        trainable: ``True`` / ``False`` for all floating leaves, or a predicate on the
            ``state_dict``-style name (``"layers.q_w"``) of each leaf.
        mode_arg: keyword through which ``apply`` receives ``self.training``; ``None`` to not
            pass it.
        name: display name of the bridged function.

    Example:
        >>> import jax, jax.numpy as jnp, torch
        >>> from langtorch.interop import JaxModule
        >>> def init(key, d_in, d_out):
        ...     return {"w": jax.random.normal(key, (d_in, d_out)) * 0.1, "b": jnp.zeros(d_out)}
        >>> def apply(params, x, *, training):
        ...     return x @ params["w"] + params["b"]
        >>> m = JaxModule.from_init(init, apply, jax.random.key(0), 3, 2)
        >>> sorted(k for k, _ in m.named_parameters())
        ['params.b', 'params.w']
        >>> y = m(torch.ones(4, 3)); y.sum().backward()
        >>> y.shape, m.params.w.grad.shape
        (torch.Size([4, 2]), torch.Size([3, 2]))
    """

    def __init__(
        self,
        apply: Callable,
        params: Any,
        *,
        trainable: bool | Callable[[str], bool] = True,
        mode_arg: str | None = "training",
        name: str | None = None,
    ):
        super().__init__()
        self.mode_arg = mode_arg
        leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
        self._treedef = treedef

        self._fn = JaxFunction(_ApplyFlat(apply, treedef),
                               name=name or getattr(apply, "__name__", None))
        self.params = _ParamNode()
        slots = []
        for path, leaf in leaves_with_path:
            names = [_path_name(e) for e in path] or ["value"]
            node = self.params
            for part in names[:-1]:
                child = node._modules.get(part)
                if child is None:
                    child = _ParamNode()
                    node.add_module(part, child)
                node = child
            t = _as_torch_leaf(leaf)
            full = ".".join(names)
            if t.dtype.is_floating_point or t.dtype.is_complex:
                grad = trainable(full) if callable(trainable) else bool(trainable)
                node.register_parameter(names[-1], nn.Parameter(t, requires_grad=grad))
            else:
                node.register_buffer(names[-1], t)
            slots.append((node, names[-1]))
        self._slots = slots
        self._views: dict[int, tuple] = {}

    @classmethod
    def from_init(cls, init: Callable, apply: Callable, *init_args, **kwargs) -> JaxModule:
        """Build from ``init(*init_args)`` (e.g. ``init(key, sizes...)``) and ``apply``.

        Keyword arguments go to the constructor (``trainable``, ``mode_arg``, ``name``).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> from langtorch.interop import JaxModule
            >>> m = JaxModule.from_init(lambda k: {"s": jnp.ones(())},
            ...                         lambda p, x, training: x * p["s"], jax.random.key(0))
            >>> m.params.s.item()
            1.0
        """
        return cls(apply, init(*init_args), **kwargs)

    # ------------------------------------------------------------------ parameter access
    def param_tree(self) -> Any:
        """The parameter pytree with the torch parameters/buffers as leaves (no copy).

        Example:
            >>> import jax.numpy as jnp
            >>> from langtorch.interop import JaxModule
            >>> m = JaxModule(lambda p, x, training: x, {"a": jnp.zeros(2)})
            >>> type(m.param_tree()["a"]).__name__
            'Parameter'
        """
        return jax.tree_util.tree_unflatten(self._treedef, self._leaves())

    def _leaves(self) -> list[torch.Tensor]:
        return [getattr(node, name) for node, name in self._slots]

    def jax_params(self) -> Any:
        """The parameter pytree as JAX arrays sharing memory with the torch parameters.

        Views are cached and re-made only when a parameter's storage or version changes.

        Example:
            >>> import jax.numpy as jnp
            >>> from langtorch.interop import JaxModule
            >>> m = JaxModule(lambda p, x, training: x, {"a": jnp.arange(3.0)})
            >>> v = m.jax_params()["a"]
            >>> v.unsafe_buffer_pointer() == m.params.a.data_ptr()
            True
        """
        leaves = self._leaves()
        return jax.tree_util.tree_unflatten(
            self._treedef, [self._view(i, t) for i, t in enumerate(leaves)]
        )

    def _view(self, i: int, t: torch.Tensor):
        if not _cacheable(t):
            return _tensor_to_jax(_plain(t), False)
        sig = (t.data_ptr(), t._version, tuple(t.shape), t.stride(), t.dtype, t.device)
        cached = self._views.get(i)
        if cached is not None and cached[0] == sig and cached[1]() is t:
            return cached[2]
        view = _tensor_to_jax(t, False)
        # Cache only a true view: a copy (non-contiguous or unaligned parameter) would go stale
        # on writes that do not bump _version (``p.data.mul_(0)``); re-made on each forward.
        if t.numel() and view.unsafe_buffer_pointer() == t.data_ptr():
            self._views[i] = (sig, weakref.ref(t), view)
        else:
            self._views.pop(i, None)
        return view

    def _apply(self, fn, recurse=True):
        # .to()/.cuda()/.double() replace storages: drop views of the old ones right away
        self._views = {}
        return super()._apply(fn, recurse)

    # The view cache holds JAX arrays and weak references (neither copyable nor picklable) of
    # this instance's parameters: copies start with an empty cache. The bridged function is
    # copied as a fresh JaxFunction (see JaxFunction.__deepcopy__).
    def __getstate__(self):
        state = super().__getstate__().copy()
        state["_views"] = {}
        return state

    # ------------------------------------------------------------------ forward
    def forward(self, *inputs, **kwargs):
        """Run ``apply(params, *inputs, **kwargs, training=self.training)`` through JAX."""
        if self.mode_arg is not None:
            kwargs[self.mode_arg] = self.training
        leaves = self._leaves()
        if torch.compiler.is_compiling():
            return self._fn(leaves, *inputs, **kwargs)
        views = {id(t): self._view(i, t) for i, t in enumerate(leaves) if _cacheable(t)}

        def convert(t):
            v = views.get(id(t))
            return v if v is not None else _tensor_to_jax(t, False)

        return self._fn._call((leaves, *inputs), kwargs, convert)

    def extra_repr(self) -> str:
        n = sum(p.numel() for p in self.parameters())
        return f"apply={self._fn.name}, parameters={n}"
