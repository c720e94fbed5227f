"""``langtorch.func``: run a module with substituted text parameters (like ``torch.func``).

``functional_call(module, {"name": value}, x)`` runs ``module(x)`` as if its TextParameters had
the given values, without mutating the module: the substitution lives in a context variable, so
it is invisible to other threads and concurrent tasks, and ends with the call.

**Candidates.** A value with one more (leading) dimension than the parameter is a batch of
``P`` candidates. For a 0-d parameter (one prompt, one system prompt) the candidates are
broadcast against the input: they are substituted with shape ``[P, 1, ..., 1]``, so an ``[N]``
input gives ``[P, N]`` outputs in **one** batched call (one request per entry, all concurrent).
For an n-d parameter the module runs once per candidate, concurrently, and the outputs are
stacked along a new leading axis.

Example:
    >>> import langtorch as lt
    >>> layer = lt.TLayer("Q: {}")
    >>> cands = lt.TextTensor(["Question: {}", "Ask: {}"])
    >>> lt.func.functional_call(layer, {"prompt": cands}, lt.TextTensor(["a", "b", "c"])).shape
    (2, 3)
    >>> str(layer.prompt)                       # unchanged
    'Q: {}'
"""

from __future__ import annotations

import concurrent.futures
import contextvars
from collections.abc import Mapping
from typing import Any

from langtorch.tensor import TextParameter, TextTensor

__all__ = ["functional_call"]


def functional_call(module: Any, parameters: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``module(*args, **kwargs)`` with its text parameters replaced by ``parameters``.

    Args:
        module: a :class:`~langtorch.TModule`.
        parameters: dotted parameter name (as in ``named_text_parameters()``) -> value (a str,
            list, or TextTensor). A value of the parameter's shape substitutes it; a value with
            an extra leading axis is a batch of candidates (see the module docstring).
        *args, **kwargs: the call's inputs.

    Returns:
        The module's output (with a leading candidates axis for candidate batches).

    Raises:
        KeyError: an unknown parameter name (the message lists the known ones).
        ShapeError: a value whose shape is neither the parameter's nor ``[P] + shape``; or
            candidate batches of different sizes in one call.

    Example:
        >>> import langtorch as lt
        >>> m = lt.TLayer("Summarize: {}")
        >>> lt.func.functional_call(m, {"prompt": "TL;DR: {}"}, lt.TextTensor("text")).item()
        'TL;DR: text'
    """
    from langtorch.errors import ShapeError
    from langtorch.nn.modules import TModule, _overrides

    if not isinstance(module, TModule):
        raise TypeError(f"functional_call expected a langtorch TModule, got {type(module).__name__}")
    if not isinstance(parameters, Mapping):
        raise TypeError(f"functional_call expected a mapping name -> value, got {type(parameters).__name__}")
    named = dict(module.named_text_parameters())
    subs: dict[int, TextTensor] = {}
    batched: dict[int, TextTensor] = {}
    for name, value in parameters.items():
        if name not in named:
            raise KeyError(f"{type(module).__name__} has no text parameter {name!r}; it has {sorted(named)}")
        p = named[name]
        v = value.data if isinstance(value, TextParameter) else value
        v = v if isinstance(v, TextTensor) else TextTensor(v, template=True)
        v = TextTensor._wrap(v.texts, v._fields, v.metadata.copy(), None, True)
        if v.shape == p.shape:
            subs[id(p)] = v
        elif v.ndim == p.ndim + 1 and v.shape[1:] == p.shape:
            batched[id(p)] = v
        else:
            raise ShapeError(f"the value for {name!r} has shape {v.shape}; expected the parameter's "
                             f"shape {p.shape} or a batch of candidates [P] + {p.shape}")
    sizes = {v.shape[0] for v in batched.values()}
    if len(sizes) > 1:
        raise ShapeError(f"candidate batches must have one size, got {sorted(sizes)}")
    base = _overrides.get() or {}
    if not batched:
        token = _overrides.set({**base, **subs})
        try:
            return module(*args, **kwargs)
        finally:
            _overrides.reset(token)

    size = sizes.pop()
    first = next((a for a in args if isinstance(a, TextTensor)), None)
    params_by_id = {id(p): p for p in named.values()}
    if all(params_by_id[i].ndim == 0 for i in batched) and first is not None:
        # One batched call: the candidates broadcast against the input.
        lead = (size,) + (1,) * first.ndim
        cands = {i: v.reshape(lead) for i, v in batched.items()}
        token = _overrides.set({**base, **subs, **cands})
        try:
            return module(*args, **kwargs)
        finally:
            _overrides.reset(token)

    # n-d parameters: one run per candidate, concurrently (each in its own context).
    def run(k: int) -> Any:
        token = _overrides.set({**base, **subs, **{i: v[k] for i, v in batched.items()}})
        try:
            return module(*args, **kwargs)
        finally:
            _overrides.reset(token)

    with concurrent.futures.ThreadPoolExecutor(min(size, 16)) as pool:
        futures = [pool.submit(contextvars.copy_context().run, run, k) for k in range(size)]
        outs = [f.result() for f in futures]
    from langtorch.functional.textops import stack

    return stack(outs)
