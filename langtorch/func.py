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
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from langtorch.tensor import TextParameter, TextTensor

__all__ = ["functional_call"]


def functional_call(module: Any, parameters: Mapping[str, Any], *args: Any,
                    batching: str = "auto", **kwargs: Any) -> Any:
    """Call ``module(*args, **kwargs)`` with its text parameters replaced by ``parameters``.

    Args:
        module: a :class:`~langtorch.TModule`.
        parameters: dotted parameter name (as in ``named_text_parameters()``) -> value (a str,
            list, or TextTensor). A value of the parameter's shape substitutes it; a value with
            an extra leading axis is a batch of candidates (see the module docstring).
        *args, **kwargs: the call's inputs.
        batching: for candidate batches of 0-d parameters: ``"auto"`` (default) runs one batched
            call and checks, through the recorded lineage, that output entry ``(p, ...)`` came
            from candidate ``p`` only — a module that reshapes, retrieves or mixes entries
            fails the check and is rerun once per candidate (with a warning); ``"broadcast"``
            raises instead of rerunning; ``"per_candidate"`` always runs once per candidate
            (concurrently).

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
    from langtorch.nn.modules import override_parameters

    subs, batched = _substitutions(module, parameters)
    sizes = {v.shape[0] for _, v in batched}
    if len(sizes) > 1:
        raise ShapeError(f"candidate batches must have one size, got {sorted(sizes)}")
    if not batched:
        with override_parameters(subs):
            return module(*args, **kwargs)

    size = sizes.pop()
    first = next((a for a in args if isinstance(a, TextTensor)), None)
    if batching not in ("auto", "broadcast", "per_candidate"):
        raise ValueError(f"batching must be 'auto', 'broadcast' or 'per_candidate', got {batching!r}")
    if (batching != "per_candidate" and all(p.ndim == 0 for p, _ in batched)
            and first is not None):
        out = _broadcast_call(module, subs, batched, size, first, args, kwargs, check=True)
        if out is not None:
            return out
        if batching == "broadcast":
            raise ShapeError("functional_call(batching='broadcast'): the module's output entries do not "
                             "each come from one candidate; use batching='per_candidate'")
        warnings.warn(
            f"{type(module).__name__} does not broadcast a [P] batch of candidates against its "
            "input (its output entries do not each come from one candidate), so functional_call "
            "ran it once per candidate after the batched attempt. Pass batching='per_candidate' "
            "to skip the batched attempt.", RuntimeWarning, stacklevel=2)

    # n-d parameters: one run per candidate, concurrently (each in its own context).
    def run(k: int) -> Any:
        with override_parameters([*subs, *((p, v[k]) for p, v in batched)]):
            return module(*args, **kwargs)

    with concurrent.futures.ThreadPoolExecutor(min(size, 16)) as pool:
        futures = [pool.submit(contextvars.copy_context().run, run, k) for k in range(size)]
        outs = [f.result() for f in futures]
    from langtorch.functional.textops import stack

    return stack(outs)


def _substitutions(module: Any, parameters: Mapping[str, Any]) -> tuple[list[tuple[TextParameter, TextTensor]],
                                                                         list[tuple[TextParameter, TextTensor]]]:
    """``(substitutions, candidate batches)``: ``(parameter, value)`` pairs from the dotted names
    of ``parameters``, checked against the module's parameters and their shapes."""
    from langtorch.errors import ShapeError
    from langtorch.nn.modules import TModule

    if not isinstance(module, TModule):
        raise TypeError(f"functional_call expected a langtorch TModule, got {type(module).__name__}")
    if not isinstance(parameters, Mapping):
        raise TypeError(f"functional_call expected a mapping name -> value, got {type(parameters).__name__}")
    named = dict(module.named_text_parameters())
    subs: list[tuple[TextParameter, TextTensor]] = []
    batched: list[tuple[TextParameter, TextTensor]] = []
    for name, value in parameters.items():
        if name not in named:
            raise KeyError(f"{type(module).__name__} has no text parameter {name!r}; it has {sorted(named)}")
        p = named[name]
        v = value.data if isinstance(value, TextParameter) else value
        v = v if isinstance(v, TextTensor) else TextTensor(v, template=True)
        v = TextTensor.from_arrays(v.texts, fields=v.fields or None, metadata=v.metadata.copy(), template=True)
        if v.shape == p.shape:
            subs.append((p, v))
        elif v.ndim == p.ndim + 1 and v.shape[1:] == p.shape:
            batched.append((p, v))
        else:
            raise ShapeError(f"the value for {name!r} has shape {v.shape}; expected the parameter's "
                             f"shape {p.shape} or a batch of candidates [P] + {p.shape}")
    return subs, batched


def _broadcast_call(module: Any, subs: list, batched: list, size: int, first: Any,
                    args: Any, kwargs: Any, *, check: bool) -> Any:
    """One call with ``[P, 1, ..., 1]`` candidates; ``None`` when the lineage check fails."""
    from langtorch.autograd import enable_grad, is_grad_enabled, parameter_sources, tracked_leaf
    from langtorch.nn.modules import override_parameters

    lead = (size,) + (1,) * first.ndim
    # The candidates are temporary parameters and the inputs tracked copies, so the run records
    # the lineage the check below reads.
    cands = [(p, TextParameter(v.reshape(lead))) for p, v in batched]
    inputs: list[Any] = []  # what each input's lineage is followed to (a parameter, a node)
    if check:
        def track(a: Any) -> Any:
            if not isinstance(a, TextTensor):
                return a
            if isinstance(a, TextParameter):
                inputs.append(a)
            elif a._grad_fn is not None:
                inputs.append(a._grad_fn)
            else:
                copy, node = tracked_leaf(a)
                inputs.append(node)
                return copy
            return a

        args = tuple(track(a) for a in args)
        kwargs = {k: track(v) for k, v in kwargs.items()}
    caller_grad = is_grad_enabled()  # noqa: F841 - documented: the output never has a graph
    from langtorch.errors import ShapeError

    try:
        with override_parameters([*subs, *cands]), enable_grad():
            out = module(*args, **kwargs)
    except ShapeError:
        return None  # the candidates do not broadcast inside this module: run per candidate
    if not isinstance(out, TextTensor) or out.ndim == 0 or out.shape[0] != size:
        return None
    if check and out.size:
        inner = int(np.prod(lead[1:])) if len(lead) > 1 else 1
        want = np.arange(size).reshape((size,) + (1,) * (out.ndim - 1))
        # 1. Output entry (p, ...) comes from candidate p, and from it only.
        for _, c in cands:
            src = parameter_sources(out, c)
            if src is None or not np.array_equal(np.where(src >= 0, src // inner, src),
                                                 np.broadcast_to(want, out.shape)):
                return None
        # 2. Every candidate saw the same input entries, in the same places (no diagonal).
        for target in inputs:
            src = parameter_sources(out, target)
            if src is not None:
                rows = src.reshape(size, -1)
                if not (rows == rows[:1]).all():
                    return None
    # The run's graph leads to the temporary candidates and tracked copies: not the caller's.
    del caller_grad
    return TextTensor.from_arrays(out.texts, fields=out.fields or None, metadata=out.metadata.copy(), embedding=out.embedding, template=out.is_template)
