"""The provenance graph: which op made a TextTensor, from which inputs, entry by entry.

Like torch autograd's graph. While recording (an input requires grad, or a trace is active,
and grad mode is on), every TextTensor an op or module produces carries a :class:`Node` in
``t.grad_fn``: the op's name, the module call path it ran in, and one :class:`Edge` per
TextTensor input. An edge holds

* ``node``: the producer of that input (``None`` for a leaf),
* ``param``: the :class:`~langtorch.TextParameter` when the input was one (a leaf that
  requires grad),
* ``texts``: the input's entries as they were when used (a parameter may change later),
* ``index``: an int array of shape ``output.shape + (m,)`` giving, for every output entry, the
  flat indices of the input entries it came from (``-1``: none). ``m`` is 1 for element-wise,
  broadcast and structural ops; for ``join`` it is the length of the joined axis. This is the
  per-entry lineage that survives broadcasting: in a ``[P, 1] + [N]`` grid, output entry
  ``(p, n)`` has index ``p`` into the templates and ``n`` into the inputs.

Structural lineage is computed exactly, for every op, by letting the op itself carry a hidden
metadata column of entry numbers (every op already moves metadata the way it moves entries).

Example:
    >>> import langtorch as lt
    >>> templates = lt.TextParameter([["Define {}."], ["Explain {}."]])
    >>> grid = templates + lt.TextTensor(["entropy", "irony", "gravity"])
    >>> grid.grad_fn.op, grid.shape
    ('add', (2, 3))
    >>> grid.grad_fn.edges[0].index[1, 2, 0], grid.grad_fn.edges[1].index[1, 2, 0]
    (np.int64(1), np.int64(2))
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.autograd._grad_mode import is_grad_enabled
from langtorch.core import context as _context
from langtorch.functional.text import STRING_DTYPE as _STRING
from langtorch.functional.text import Metadata
from langtorch.functional.text import TextTensor as _BaseTensor

__all__ = ["Edge", "Node", "record_node", "requires_grad", "topological_order"]

_ids = itertools.count(1)
_SRC = "\x00lt_src"  # hidden metadata column carrying entry numbers through an op

# Ops whose operands must share the hidden column's key (they keep only shared metadata keys).
_SHARED_KEY_OPS = ("stack", "cat")
# Ops that drop metadata: their lineage is computed from their arguments.
_EXPLICIT_OPS = ("join", "split")


class Edge:
    """One input of a :class:`Node` (see the module docstring).

    Attributes:
        node: the producing :class:`Node`, or ``None`` for a leaf input.
        param: the :class:`~langtorch.TextParameter` this input was, or ``None``.
        texts: the input's entries (numpy StringDType array) at the time of the op.
        index: ``output.shape + (m,)`` int64 array of flat input-entry indices (``-1`` = none).
        role: what the input was to the op (``"template"``, ``"values"``, ``"input"``,
            ``"system"``, ``"prediction"``, ``"target"``, ...).

    Example:
        >>> import langtorch as lt
        >>> e = (lt.TextParameter("Q: {}") + lt.TextTensor(["a", "b"])).grad_fn.edges[1]
        >>> e.role, e.index[:, 0].tolist()
        ('values', [0, 1])
    """

    __slots__ = ("node", "param", "texts", "index", "role")

    def __init__(self, node: Node | None, param: Any, texts: np.ndarray, index: np.ndarray, role: str):
        self.node = node
        self.param = param
        self.texts = texts
        self.index = index
        self.role = role

    @property
    def requires_grad(self) -> bool:
        """Whether feedback flows into this input (a producer that requires grad, or a trainable
        parameter)."""
        if self.param is not None:
            return bool(self.param.requires_grad)
        return self.node is not None and self.node.requires_grad

    def sources(self, flat_out: int) -> np.ndarray:
        """The flat input indices output entry ``flat_out`` came from."""
        row = self.index.reshape(-1, self.index.shape[-1])[flat_out]
        return row[row >= 0]

    def __repr__(self) -> str:
        src = self.node.name if self.node is not None else (
            f"TextParameter{tuple(self.texts.shape)}" if self.param is not None else "leaf")
        return f"Edge({self.role}: {src})"


class Node:
    """The op that produced a TextTensor (its ``grad_fn``).

    Attributes:
        op: the op name (``"add"``, ``"fill"``, ``"getitem"``, ``"join"``, ``"llm"``, ...).
        path: the module call path the op ran in (``"Pipeline.qa.llm"``; ``""`` outside modules).
        edges: one :class:`Edge` per TextTensor input, in argument order.
        out_texts: the output's entries (numpy array of the output's shape).
        attrs: op-specific details (an LLM node: the requests sent, the model, the backend).
        id: a process-unique number.

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Q: {}")
        >>> out = (p + lt.TextTensor(["a", "b"])).reshape(2, 1)
        >>> out.grad_fn.name, [e.node.name for e in out.grad_fn.edges]
        ('ReshapeBackward', ['AddBackward'])
    """

    __slots__ = ("op", "path", "edges", "out_texts", "attrs", "id", "requires_grad", "__weakref__")

    def __init__(self, op: str, edges: Sequence[Edge], out_texts: np.ndarray, *, path: str = "",
                 attrs: Mapping[str, Any] | None = None):
        self.op = op
        self.path = path
        self.edges = tuple(edges)
        self.attrs = dict(attrs or {})
        self.id = next(_ids)
        # True when some input leads to a TextParameter that requires grad. Nodes recorded only
        # because a trace wants the whole graph do not: they keep shapes, not texts or lineage,
        # and do not make later ops record.
        self.requires_grad = any(e.requires_grad for e in self.edges)
        if not self.requires_grad:
            out_texts = _shape_only(out_texts.shape)
            for e in self.edges:
                e.texts, e.index = _shape_only(e.texts.shape), None
        self.out_texts = out_texts

    @property
    def name(self) -> str:
        """torch-style display name, e.g. ``"FillBackward"``."""
        return "".join(p.capitalize() for p in self.op.split("_")) + "Backward"

    @property
    def shape(self) -> tuple[int, ...]:
        """The output's shape."""
        return self.out_texts.shape

    @property
    def next_functions(self) -> tuple[tuple[Any, int], ...]:
        """``(producer node or parameter or None, 0)`` per edge, as in torch."""
        return tuple((e.node if e.node is not None else e.param, 0) for e in self.edges)

    def parameters(self) -> list[Any]:
        """The TextParameters used directly by this op."""
        return [e.param for e in self.edges if e.param is not None]

    def __repr__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return f"<{self.name} {self.op}{where} shape={self.shape}>"


def _shape_only(shape: tuple[int, ...]) -> np.ndarray:
    """A zero-strided placeholder of ``shape`` (the texts of trace-only nodes are not kept)."""
    return np.broadcast_to(np.array("", dtype=_STRING), shape)


def requires_grad(t: Any) -> bool:
    """Whether ``t`` is a TextTensor that feedback can flow into (made by ops from a
    TextParameter with ``requires_grad=True``, or such a parameter itself).

    Example:
        >>> import langtorch as lt
        >>> requires_grad(lt.TextParameter("x")), requires_grad(lt.TextTensor("x"))
        (True, False)
    """
    if not isinstance(t, _BaseTensor):
        return False
    if t._grad_fn is not None:
        return t._grad_fn.requires_grad
    return _is_param(t) and bool(t.requires_grad)


_param_class: list[type] = []


def _is_param(t: Any) -> bool:
    if not _param_class:
        from langtorch.tensor import TextParameter

        _param_class.append(TextParameter)
    return isinstance(t, _param_class[0])


def _marked(t: Any) -> bool:
    return isinstance(t, _BaseTensor) and (t._grad_fn is not None or t._cut is not None or _is_param(t))


def _may_record(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether any TextTensor argument has a graph, a cut, or is a parameter (cheap scan)."""
    for a in args:
        if isinstance(a, _BaseTensor):
            if _marked(a):
                return True
        elif type(a) in (list, tuple):
            if any(_marked(w) for w in a):
                return True
        elif isinstance(a, dict):
            if any(_marked(w) for w in a.values()):
                return True
    return bool(kwargs) and _may_record(list(kwargs.values()), {})


def edge_for(t: _BaseTensor, index: np.ndarray, role: str) -> Edge:
    """The edge of input ``t`` (its producer, or itself when it is a parameter)."""
    param = t if _is_param(t) else None
    return Edge(t._grad_fn, param, t._texts, index, role)


def identity_index(shape: tuple[int, ...]) -> np.ndarray:
    """Lineage of an op whose output entry ``i`` is input entry ``i``."""
    return np.arange(int(np.prod(shape)) if shape else 1, dtype=np.int64).reshape(shape + (1,))


def broadcast_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """Lineage of an input broadcast to ``out_shape``."""
    src = np.arange(int(np.prod(in_shape)) if in_shape else 1, dtype=np.int64).reshape(in_shape)
    return np.broadcast_to(src, out_shape)[..., None]


def record_node(op: str, out: _BaseTensor, inputs: Sequence[tuple[Any, np.ndarray, str]], *,
                attrs: Mapping[str, Any] | None = None) -> Node | None:
    """Attach a node to ``out`` (in place) when recording; used by modules (LLM, losses).

    Args:
        op: the op name.
        out: the output tensor (gets ``_grad_fn``).
        inputs: ``(tensor, index, role)`` per input; non-TextTensor inputs are skipped.
        attrs: op details kept on the node.

    Returns:
        The node, or ``None`` when nothing is recorded (``out._cut`` then says why, if an input
        required grad).

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Q: {}")
        >>> out = lt.TextTensor("an answer", template=False)
        >>> record_node("tool", out, [(p, identity_index(()), "input")]).op
        'tool'
    """
    ts = [(t, idx, role) for t, idx, role in inputs if isinstance(t, _BaseTensor)]
    tracked = any(requires_grad(t) for t, _, _ in ts)
    trace = _context.active_trace.get()
    if not is_grad_enabled():
        if tracked:
            out._cut = "no_grad"
        return None
    if not (tracked or (trace is not None and trace.graph)):
        cut = next((t._cut for t, _, _ in ts if t._cut), None)
        if cut:
            out._cut = cut
        return None
    node = Node(op, [edge_for(t, idx, role) for t, idx, role in ts], out._texts,
                path=_context.path_string(), attrs=attrs)
    out._grad_fn = node
    if trace is not None:
        trace.add_node(node)
    return node


# ------------------------------------------------------------------ the __text_function__ hook
def _operands(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[_BaseTensor]:
    found: list[_BaseTensor] = []
    for v in itertools.chain(args, kwargs.values()):
        if isinstance(v, _BaseTensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(w for w in v if isinstance(w, _BaseTensor))
        elif isinstance(v, Mapping):
            found.extend(w for w in v.values() if isinstance(w, _BaseTensor))
    return found


def _tagged(t: _BaseTensor, key: str, values: np.ndarray) -> _BaseTensor:
    """``t`` with the hidden entry-number column ``key`` (a shallow copy, same class rules)."""
    meta = Metadata._trusted(t.shape, {**t._metadata._cols, key: values})
    # The operand's own result class (a user subclass stays itself; a parameter's is TextTensor).
    out = type(t)._result_class()._wrap(t._texts, t._fields, meta, t._embedding, t._template)
    out._pylist = t._pylist
    return out


def _substitute(args: Sequence[Any], kwargs: Mapping[str, Any], fn) -> tuple[list, dict]:
    def sub(v: Any) -> Any:
        if isinstance(v, _BaseTensor):
            return fn(v)
        if isinstance(v, (list, tuple)) and any(isinstance(w, _BaseTensor) for w in v):
            return type(v)(fn(w) if isinstance(w, _BaseTensor) else w for w in v)
        if isinstance(v, Mapping) and any(isinstance(w, _BaseTensor) for w in v.values()):
            return {k: fn(w) if isinstance(w, _BaseTensor) else w for k, w in v.items()}
        return v

    return [sub(a) for a in args], {k: sub(v) for k, v in kwargs.items()}


_signatures: dict[Any, inspect.Signature] = {}


def _bound(impl: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    sig = _signatures.get(impl)
    if sig is None:
        sig = _signatures[impl] = inspect.signature(impl)
    b = sig.bind(*args, **kwargs)
    b.apply_defaults()
    return dict(b.arguments)


def _roles(name: str, args: Sequence[Any], operands: list[_BaseTensor]) -> list[str]:
    if name == "fill" or (name == "add" and (not isinstance(args[0], _BaseTensor) or args[0].is_template)):
        positional = ["template", "values"]
    elif name in ("add", "concat"):
        positional = ["left", "right"]
    elif name in ("stack", "cat"):
        return [f"item{i}" for i in range(len(operands))]
    elif name == "records":
        return ["field"] * len(operands)
    else:
        return ["input"] * len(operands)
    roles = []
    for i, a in enumerate(args[:2]):
        if isinstance(a, _BaseTensor):
            roles.append(positional[i])
    return roles + ["input"] * (len(operands) - len(roles))


def _run(impl: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    token = _context.in_op.set(True)
    try:
        return impl(*args, **kwargs)
    finally:
        _context.in_op.reset(token)


def _run_in_span(trace: Any, span: Any, impl: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Run the op; close its span (if any) with the output's shape or the error."""
    try:
        out = _run(impl, args, kwargs)
    except BaseException as e:
        if span is not None:
            trace.close_op(span, None, e)
        raise
    if span is not None:
        trace.close_op(span, out)
    return out


def handle_text_function(name: str, impl: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """``langtorch.TextTensor.__text_function__``: run an op and record its node and span."""
    if _context.in_op.get():
        return impl(*args, **kwargs)
    trace = _context.active_trace.get()
    if trace is None and name != "detach" and not _may_record(args, kwargs):
        # Fast path: nothing records unless an operand has a graph, a cut or is a parameter.
        return impl(*args, **kwargs)
    operands = _operands(args, kwargs)
    grad_on = is_grad_enabled()
    tracked = any(requires_grad(t) for t in operands)
    record = name != "detach" and grad_on and (tracked or (trace is not None and trace.graph))
    if not record:
        span = trace.open_op(name, operands) if (trace is not None and trace.ops and grad_on
                                                 and name != "detach") else None
        out = _run_in_span(trace, span, impl, args, kwargs)
        if isinstance(out, _BaseTensor):
            if name == "detach":
                out._cut = "detach"
            elif tracked and not grad_on:
                out._cut = "no_grad"
            else:
                cut = next((t._cut for t in operands if t._cut), None)
                if cut:
                    out._cut = cut
        return out

    # Tag every operand with a hidden column of its entry numbers; the op moves it like the
    # entries, so the output's column is the exact lineage.
    keys: dict[int, str] = {}
    offsets: dict[int, int] = {}
    shared = name in _SHARED_KEY_OPS
    counter = itertools.count()
    running = [0]

    def tag(t: _BaseTensor) -> _BaseTensor:
        k = next(counter)
        n = t.size if t.ndim else 1
        key = _SRC if shared else f"{_SRC}{k}"
        offset = running[0] if shared else 0
        running[0] += n
        tagged = _tagged(t, key, np.arange(offset, offset + n, dtype=np.int64).reshape(t.shape))
        keys[id(tagged)] = key
        offsets[id(tagged)] = offset
        return tagged

    span = trace.open_op(name, operands) if trace is not None and trace.ops else None
    if name in _EXPLICIT_OPS:
        new_args, new_kwargs, tagged_ops = args, kwargs, operands
    else:
        new_args, new_kwargs = _substitute(args, kwargs, tag)
        tagged_ops = _operands(new_args, new_kwargs)
    out = _run_in_span(trace, span, impl, new_args, new_kwargs)
    if not isinstance(out, _BaseTensor):
        return out

    roles = _roles(name, args, operands)
    edges: list[Edge] = []
    if name == "join":
        bound = _bound(impl, args, kwargs)
        t, axis = operands[0], bound.get("axis", -1)
        src = np.arange(t.size if t.ndim else 1, dtype=np.int64).reshape(t.shape)
        if axis is None or t.ndim <= 1:
            index = src.reshape(out.shape + (-1,))
        else:
            index = np.moveaxis(src, axis % t.ndim, -1)
        edges.append(edge_for(t, index, "input"))
    elif name == "split":
        t = operands[0]
        src = np.arange(t.size if t.ndim else 1, dtype=np.int64).reshape(t.shape)
        edges.append(edge_for(t, np.broadcast_to(src[..., None], out.shape)[..., None], "input"))
    else:
        cols = out._metadata._cols
        if shared:
            col = cols.pop(_SRC, None)
            bounds = [offsets[id(t)] for t in tagged_ops] + [running[0]]
            for i, (orig, _tg) in enumerate(zip(operands, tagged_ops)):
                lo, hi = bounds[i], bounds[i + 1]
                if col is None:
                    index = np.full(out.shape + (1,), -1, np.int64)
                else:
                    index = np.where((col >= lo) & (col < hi), col - lo, -1)[..., None]
                edges.append(edge_for(orig, index.astype(np.int64), roles[i]))
        else:
            for i, (orig, tg) in enumerate(zip(operands, tagged_ops)):
                col = cols.pop(keys[id(tg)], None)
                if col is None:  # the op dropped metadata: fall back to broadcasting
                    index = broadcast_index(orig.shape, out.shape)
                else:
                    if col.dtype == object:  # merged (where, masked_scatter): None = not from it
                        missing = np.asarray(np.frompyfunc(lambda v: v is None, 1, 1)(col), dtype=bool)
                        col = np.where(missing, -1, col)
                    index = np.asarray(col, dtype=np.int64)[..., None]
                edges.append(edge_for(orig, index, roles[i]))
    # Any hidden column the op left behind (e.g. an operand used twice) goes too.
    for k in [k for k in out._metadata._cols if k.startswith(_SRC)]:
        del out._metadata._cols[k]
    if not grad_on:
        return out
    node = Node(name, edges, out._texts, path=_context.path_string(), attrs=_op_attrs(name, args, kwargs, impl))
    out._grad_fn = node
    if trace is not None:
        trace.add_node(node)
    return out


def _op_attrs(name: str, args: Sequence[Any], kwargs: Mapping[str, Any], impl: Any) -> dict[str, Any]:
    if name in ("join", "split", "concat"):
        b = _bound(impl, args, kwargs)
        return {k: b[k] for k in ("sep", "axis", "maxsplit") if k in b and k != "t"}
    if name == "map":
        fn = args[1] if len(args) > 1 else kwargs.get("fn")
        return {"fn": getattr(fn, "__qualname__", type(fn).__name__)}
    return {}


def topological_order(root: Node) -> list[Node]:
    """Nodes reachable from ``root``, each after every node that consumes it (root first).

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Q: {}")
        >>> out = (p + lt.TextTensor(["a"])).join("")
        >>> [n.op for n in topological_order(out.grad_fn)]
        ['join', 'add']
    """
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, Iterator[Edge]]] = [(root, iter(root.edges))]
    seen.add(root.id)
    while stack:
        node, it = stack[-1]
        for e in it:
            if e.node is not None and e.node.id not in seen:
                seen.add(e.node.id)
                stack.append((e.node, iter(e.node.edges)))
                break
        else:
            stack.pop()
            order.append(node)
    order.reverse()
    return order


def _combine_sources(cols: np.ndarray) -> np.ndarray:
    """Per row of ``cols`` ([n, m] of source ids, -1 none, -2 several): the single source, -1 or -2."""
    if cols.shape[1] == 0:
        return np.full(cols.shape[0], -1, np.int64)
    valid = cols >= 0
    big = np.iinfo(np.int64).max
    lo = np.where(valid, cols, big).min(axis=1)
    hi = np.where(valid, cols, -1).max(axis=1)
    out = np.where(lo == big, -1, np.where(lo == hi, lo, -2))
    return np.where((cols == -2).any(axis=1), -2, out)


def parameter_sources(out: Any, param: Any) -> np.ndarray | None:
    """For every entry of ``out``, the flat entry of ``param`` it was computed from, following
    the recorded lineage through every op (``-1``: none, ``-2``: several entries). ``None`` when
    ``out`` has no graph. ``param`` may also be a :class:`Node` (a tracked input, see
    :func:`tracked_leaf`).

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter([["A {}"], ["B {}"]])
        >>> out = (p + lt.TextTensor(["x", "y", "z"])).join(" ", axis=-1)
        >>> parameter_sources(out, p).tolist()
        [0, 1]
    """
    root = getattr(out, "_grad_fn", None)
    if root is None:
        return None
    if root is param:  # out is the tracked leaf itself
        n = int(np.prod(out.shape)) if out.shape else 1
        return np.arange(n, dtype=np.int64).reshape(out.shape)
    memo: dict[int, np.ndarray] = {}
    if out.size == 0:
        return np.full(out.shape, -1, np.int64)
    for node in reversed(topological_order(root)):
        n_out = int(np.prod(node.shape)) if node.shape else 1
        if n_out == 0:
            memo[node.id] = np.full(0, -1, np.int64)
            continue
        columns = [np.full((n_out, 1), -1, np.int64)]
        for e in node.edges:
            if e.index is None:
                continue
            src = np.asarray(e.index).reshape(n_out, -1)
            if e.param is param or (e.node is param and param is not None):
                columns.append(np.where(src >= 0, src, -1))
            elif e.node is not None and e.node.id in memo:
                prev = memo[e.node.id]
                columns.append(np.where(src >= 0, prev[np.clip(src, 0, None)], -1))
        memo[node.id] = _combine_sources(np.concatenate(columns, axis=1))
    return memo[root.id].reshape(out.shape)


def tracked_leaf(t: Any) -> tuple[Any, Node]:
    """A copy of ``t`` (same entries, fields, metadata, template flag) that requires grad, so
    that ops on it record their lineage; returns ``(copy, its leaf node)``. Used to check how a
    module maps inputs to outputs (``functional_call``)."""
    out = type(t)._result_class()._wrap(t._texts, t._fields, t._metadata.copy(), t._embedding, t._template)
    out._pylist = t._pylist
    node = Node("input", (), t._texts, path=_context.path_string())
    node.requires_grad = True
    node.out_texts = t._texts
    out._grad_fn = node
    return out, node
