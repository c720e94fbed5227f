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

**Ops carry their graph rules.** How an op enters the graph — its node name, its lineage, the
roles of its operands, the details kept on its node, and how feedback flows back through it — is
an :class:`OpRule` registered with :func:`register_op` *for the op's function object* (as JAX's
``ad.primitive_jvps`` and torch's ``derivatives.yaml`` keep a derivative with its primitive). The
recorder looks the rule up by the function that runs, never by its name: renaming or aliasing an
op keeps its rule, and a new op gets its own with one ``register_op`` call. The built-in ops'
rules are registered at the end of this module.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.autograd._grad_mode import is_grad_enabled
from langtorch.core import context as _context
from langtorch.functional import textops as _textops
from langtorch.functional.text import STRING_DTYPE as _STRING
from langtorch.functional.text import TextTensor as _BaseTensor

__all__ = [
    "ENGINE_FEEDBACK", "LLM_CALL", "TEXT_LOSS", "Edge", "Node", "OpRule", "broadcast_index",
    "fill_feedback", "handle_text_function", "identity_index", "loss_feedback", "may_record",
    "op_rule", "parameter_sources", "record_node", "register_op", "requires_grad", "route_feedback",
    "topological_order", "tracked_leaf",
]

_ids = itertools.count(1)
_SRC = "\x00lt_src"  # hidden metadata column carrying entry numbers through an op


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
        op: the op name (``"add"``, ``"fill"``, ``"getitem"``, ``"join"``, ``"llm"``, ...), as
            its :class:`OpRule` declares it.
        rule: the op's :class:`OpRule` (lineage, roles, and how feedback flows back).
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

    __slots__ = ("op", "rule", "path", "edges", "out_texts", "attrs", "id", "requires_grad",
                 "__weakref__")

    def __init__(self, op: str | OpRule, edges: Sequence[Edge], out_texts: np.ndarray, *,
                 path: str = "", attrs: Mapping[str, Any] | None = None):
        self.rule = op if isinstance(op, OpRule) else _plain_rule(op)
        self.op = self.rule.name
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


def _is_param(t: Any) -> bool:
    # A TextParameter (langtorch.tensor, above this package) declares itself with this class flag.
    return getattr(type(t), "__text_parameter__", False)


def _marked(t: Any) -> bool:
    return isinstance(t, _BaseTensor) and (t._grad_fn is not None or t._cut is not None or _is_param(t))


def may_record(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether an op on ``args``/``kwargs`` may record a node: some TextTensor among them (or
    one level inside a list, tuple or dict) has a graph, a cut, or is a parameter. A cheap scan
    that lets unrecorded ops skip all graph work.

    Example:
        >>> import langtorch as lt
        >>> may_record([lt.TextTensor("a")], {}), may_record([], {"x": [lt.TextParameter("p")]})
        (False, True)
    """
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
    return bool(kwargs) and may_record(list(kwargs.values()), {})


def edge_for(t: _BaseTensor, index: np.ndarray, role: str) -> Edge:
    """The edge of input ``t`` (its producer, or itself when it is a parameter)."""
    param = t if _is_param(t) else None
    return Edge(t._grad_fn, param, t._texts, index, role)


def identity_index(shape: tuple[int, ...]) -> np.ndarray:
    """Lineage of an op whose output entry ``i`` is input entry ``i`` (an ``index`` for
    :func:`record_node`: shape ``shape + (1,)``).

    Example:
        >>> identity_index((2,)).tolist()
        [[0], [1]]
    """
    return np.arange(int(np.prod(shape)) if shape else 1, dtype=np.int64).reshape(shape + (1,))


def broadcast_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """Lineage of an input of shape ``in_shape`` broadcast to ``out_shape`` (an ``index`` for
    :func:`record_node`: shape ``out_shape + (1,)``).

    Example:
        >>> broadcast_index((2, 1), (2, 3))[..., 0].tolist()
        [[0, 0, 0], [1, 1, 1]]
    """
    src = np.arange(int(np.prod(in_shape)) if in_shape else 1, dtype=np.int64).reshape(in_shape)
    return np.broadcast_to(src, out_shape)[..., None]


def record_node(op: str | OpRule, out: _BaseTensor, inputs: Sequence[tuple[Any, np.ndarray, str]], *,
                attrs: Mapping[str, Any] | None = None) -> Node | None:
    """Attach a node to ``out`` (in place) when recording: how a module that computes its output
    itself (an LLM call, a loss, retrieval, a classifier) enters the graph.

    Args:
        op: the op's :class:`OpRule` (e.g. :data:`LLM_CALL`, :data:`TEXT_LOSS`), or a name for
            an op whose feedback is routed entry by entry along ``index`` (:func:`route_feedback`).
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


# --------------------------------------------------------------------------------- op rules
Item = tuple[str, "float | None"]  # a feedback item: (text, score of the loss entries behind it)


def route_feedback(node: Node, edge: Edge, out_entry: int, items: list[Item]) -> list[Item] | None:
    """The default backward rule: feedback on output entry ``out_entry`` goes, as it is, to the
    input entries it came from (``edge.sources(out_entry)``) — structural ops (indexing,
    reshape, stack, join, ...) scatter and gather feedback along their lineage.

    Returns the items for ``edge`` (``None``: nothing flows into this input).

    Example:
        >>> import langtorch as lt
        >>> node = lt.TextParameter(["a", "b"]).reshape(2, 1).grad_fn
        >>> route_feedback(node, node.edges[0], 1, [("too short", 0.0)])
        [('too short', 0.0)]
    """
    return items


def fill_feedback(node: Node, edge: Edge, out_entry: int, items: list[Item]) -> list[Item] | None:
    """The backward rule of a fill: the template's feedback says which filled prompt it was
    about (a template entry makes many prompts); the values get the feedback as it is.

    Example:
        >>> import langtorch as lt
        >>> node = (lt.TextParameter("Q: {}") + lt.TextTensor(["a", "b"])).grad_fn
        >>> fill_feedback(node, node.edges[0], 1, [("vague", None)])
        [('On the prompt this template produced, <<<Q: b>>>: vague', None)]
    """
    if edge.role != "template":
        return items
    produced = str(node.out_texts.reshape(-1)[out_entry])
    return [(f"On the prompt this template produced, <<<{produced}>>>: {fb}", sc) for fb, sc in items]


def loss_feedback(node: Node, edge: Edge, out_entry: int, items: list[Item]) -> list[Item] | None:
    """The backward rule of a loss: the feedback goes to the prediction; the target is the
    reference, not something to change.

    Example:
        >>> import langtorch as lt
        >>> loss = lt.nn.MetricLoss("exact_match")(lt.TextParameter("a") + "", "b")
        >>> [loss_feedback(loss.grad_fn, e, 0, [("wrong", 0.0)]) for e in loss.grad_fn.edges]
        [[('wrong', 0.0)], None]
    """
    return None if edge.role == "target" else items


class _EngineFeedback:
    """The backward rule of an LLM call: the feedback engine (an LLM) writes, per output entry
    and per input that requires grad, how that input should change; all such requests of one
    level of the graph go out together (see :func:`langtorch.autograd.backward`).

    Example:
        >>> LLM_CALL.feedback is ENGINE_FEEDBACK
        True
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "ENGINE_FEEDBACK"


ENGINE_FEEDBACK = _EngineFeedback()


class OpRule:
    """How one op enters the provenance graph and how feedback flows back through it.

    Registered for the op's function with :func:`register_op` and looked up by that function
    object (never by its name) each time the op runs on a recording TextTensor.

    Args:
        name: the node's ``op`` (``grad_fn.op``; the display name ``FillBackward`` derives from it).
        lineage: how output entries map to operand entries. ``"tagged"`` (default): each
            operand carries a hidden metadata column of entry numbers that the op moves like its
            entries (a dropped column falls back to broadcasting). ``"shared"``: one column for
            all operands, for ops that keep only the metadata keys all operands share (stack,
            cat). Or a function ``(operands, bound_args, out) -> [index per operand]`` for ops
            that drop metadata (join, split); ``bound_args`` maps parameter names to values.
        roles: a tuple of role names for the first positional arguments (``("template",
            "values")``), or a function ``(args, operands) -> [role per operand]``; other
            operands are ``"input"``.
        attrs: a function ``bound_args -> dict`` of op details kept on the node (``sep``, ...).
        feedback: the backward rule, a function ``(node, edge, out_entry, items) -> items or
            None`` (:func:`route_feedback`, :func:`fill_feedback`, :func:`loss_feedback`), or
            :data:`ENGINE_FEEDBACK` when an LLM writes it.
        cut: a reason (``"detach"``) when the op's output leaves the graph on purpose.

    Example:
        >>> import langtorch as lt
        >>> from langtorch.functional.text import text_function
        >>> @text_function
        ... def shout(t):
        ...     return t.map(str.upper)
        >>> _ = register_op(shout, OpRule("shout", roles=("speech",)))
        >>> out = shout(lt.TextParameter(["a", "b"]))
        >>> out.grad_fn.op, out.grad_fn.edges[0].role
        ('shout', 'speech')
    """

    __slots__ = ("name", "lineage", "roles", "attrs", "feedback", "cut")

    def __init__(self, name: str, *, lineage: str | Callable[..., list[np.ndarray]] = "tagged",
                 roles: Sequence[str] | Callable[..., list[str]] | None = None,
                 attrs: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 feedback: Callable[..., list[Item] | None] | _EngineFeedback = route_feedback,
                 cut: str | None = None):
        if not isinstance(name, str) or not name:
            raise TypeError(f"OpRule(name): a non-empty str naming the op, got {name!r}")
        if lineage not in ("tagged", "shared") and not callable(lineage):
            raise ValueError(f"OpRule({name!r}, lineage=...): 'tagged', 'shared' or a function "
                             f"(operands, bound_args, out) -> indices, got {lineage!r}")
        if not (feedback is ENGINE_FEEDBACK or callable(feedback)):
            raise TypeError(f"OpRule({name!r}, feedback=...): a function (node, edge, out_entry, "
                            f"items) -> items, or ENGINE_FEEDBACK; got {feedback!r}")
        self.name, self.lineage, self.attrs, self.feedback, self.cut = name, lineage, attrs, feedback, cut
        self.roles = _positional_roles(*roles) if isinstance(roles, (tuple, list)) else roles

    def roles_of(self, args: Sequence[Any], operands: list[_BaseTensor]) -> list[str]:
        """The role of every TextTensor operand (see ``roles``)."""
        return ["input"] * len(operands) if self.roles is None else list(self.roles(args, operands))

    def __repr__(self) -> str:
        return f"OpRule({self.name!r})"


def _positional_roles(*names: str) -> Callable[[Sequence[Any], list[_BaseTensor]], list[str]]:
    """Roles by argument position: ``names[i]`` for a TextTensor at position ``i``."""
    def roles(args: Sequence[Any], operands: list[_BaseTensor]) -> list[str]:
        out = [names[i] for i, a in enumerate(args[: len(names)]) if isinstance(a, _BaseTensor)]
        return out + ["input"] * (len(operands) - len(out))

    return roles


_rules: dict[Any, OpRule] = {}
_plain: dict[str, OpRule] = {}


def _plain_rule(name: str) -> OpRule:
    rule = _plain.get(name)
    if rule is None:
        rule = _plain[name] = OpRule(name)
    return rule


def register_op(fn: Callable[..., Any], rule: OpRule) -> Callable[..., Any]:
    """Declare ``rule`` as the graph rule of the text op ``fn`` (a function decorated with
    :func:`langtorch.functional.text.text_function`, or its undecorated implementation); returns
    ``fn``. Registering again replaces the rule. An op without a rule records with the default
    (tagged lineage, ``"input"`` roles, :func:`route_feedback`) under its function's name.

    Example:
        >>> import langtorch as lt
        >>> from langtorch.functional.text import text_function
        >>> @text_function
        ... def bracket(t):
        ...     return lt.functional.concat(lt.functional.concat("[", t), "]")
        >>> _ = register_op(bracket, OpRule("bracket"))
        >>> bracket(lt.TextParameter(["a"])).grad_fn.op
        'bracket'
    """
    if not isinstance(rule, OpRule):
        raise TypeError(f"register_op(fn, rule): rule must be an OpRule, got {type(rule).__name__}")
    impl = getattr(fn, "__text_impl__", fn)
    if not callable(impl):
        raise TypeError(f"register_op(fn, rule): fn must be a text op (a function), got {fn!r}")
    _rules[impl] = rule
    return fn


def op_rule(fn: Callable[..., Any]) -> OpRule | None:
    """The :class:`OpRule` registered for the text op ``fn`` (``None`` when it has none).

    Example:
        >>> import langtorch as lt
        >>> op_rule(lt.functional.fill).feedback is fill_feedback
        True
    """
    return _rules.get(getattr(fn, "__text_impl__", fn))


# Rules of modules that compute their output themselves (they call record_node with them).
LLM_CALL = OpRule("llm", feedback=ENGINE_FEEDBACK)
TEXT_LOSS = OpRule("loss", feedback=loss_feedback)


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
    meta = t.metadata.with_column(key, values)
    # The operand's own result class (a user subclass stays itself; a parameter's is TextTensor).
    out = type(t)._result_class()._wrap(t._texts, t._fields, meta, t._embedding, t._template)
    out._pylist = t._pylist
    return out


def _pop_column(out: _BaseTensor, key: str) -> np.ndarray | None:
    meta = out.metadata
    if key not in meta:
        return None
    col = meta.column(key)
    del meta[key]
    return col


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
    """``langtorch.TextTensor.__text_function__``: run an op and record its node and span.

    The op's :class:`OpRule` is looked up by ``impl`` (the function object); ``name`` (the
    dispatcher's name for it) names only ops that have no rule.

    Example:
        >>> import langtorch as lt
        >>> impl = lt.functional.fill.__text_impl__
        >>> out = handle_text_function("any name", impl, (lt.TextParameter("Q: {}"), "a"), {})
        >>> out.item(), out.grad_fn.op
        ('Q: a', 'fill')
    """
    if _context.in_op.get():
        return impl(*args, **kwargs)
    rule = _rules.get(impl) or _plain_rule(name)
    name = rule.name
    trace = _context.active_trace.get()
    if trace is None and rule.cut is None and not may_record(args, kwargs):
        # Fast path: nothing records unless an operand has a graph, a cut or is a parameter.
        return impl(*args, **kwargs)
    operands = _operands(args, kwargs)
    grad_on = is_grad_enabled()
    tracked = any(requires_grad(t) for t in operands)
    record = rule.cut is None and grad_on and (tracked or (trace is not None and trace.graph))
    if not record:
        span = trace.open_op(name, operands) if (trace is not None and trace.ops and grad_on
                                                 and rule.cut is None) else None
        out = _run_in_span(trace, span, impl, args, kwargs)
        reason = _cut_reason(rule, operands, tracked, grad_on)
        if reason and isinstance(out, _BaseTensor):
            out._cut = reason
        return out
    span = trace.open_op(name, operands) if trace is not None and trace.ops else None
    out, indices = _run_with_lineage(rule, trace, span, impl, args, kwargs, operands)
    if not isinstance(out, _BaseTensor):
        return out
    roles = rule.roles_of(args, operands)
    edges = [edge_for(t, index, role) for t, index, role in zip(operands, indices, roles)]
    attrs = rule.attrs(_bound(impl, args, kwargs)) if rule.attrs is not None else None
    node = Node(rule, edges, out._texts, path=_context.path_string(), attrs=attrs)
    out._grad_fn = node
    if trace is not None:
        trace.add_node(node)
    return out


def _cut_reason(rule: OpRule, operands: list[_BaseTensor], tracked: bool, grad_on: bool) -> str | None:
    """Why an unrecorded output has no graph (``None``: nothing it came from had one)."""
    if rule.cut is not None:
        return rule.cut
    if tracked and not grad_on:
        return "no_grad"
    return next((t._cut for t in operands if t._cut), None)


def _run_with_lineage(rule: OpRule, trace: Any, span: Any, impl: Any, args: Sequence[Any],
                      kwargs: Mapping[str, Any], operands: list[_BaseTensor]) -> tuple[Any, list[np.ndarray]]:
    """Run the op and compute, per operand, its ``index`` (see :class:`Edge`)."""
    if callable(rule.lineage):
        out = _run_in_span(trace, span, impl, args, kwargs)
        if not isinstance(out, _BaseTensor):
            return out, []
        return out, list(rule.lineage(operands, _bound(impl, args, kwargs), out))
    # Tag every operand with a hidden column of its entry numbers; the op moves it like the
    # entries, so the output's column is the exact lineage.
    shared = rule.lineage == "shared"
    keys: dict[int, str] = {}
    bounds = [0]

    def tag(t: _BaseTensor) -> _BaseTensor:
        n = t.size if t.ndim else 1
        key = _SRC if shared else f"{_SRC}{len(keys)}"
        offset = bounds[-1] if shared else 0
        bounds.append(bounds[-1] + n)
        tagged = _tagged(t, key, np.arange(offset, offset + n, dtype=np.int64).reshape(t.shape))
        keys[id(tagged)] = key
        return tagged

    new_args, new_kwargs = _substitute(args, kwargs, tag)
    tagged_ops = _operands(new_args, new_kwargs)
    out = _run_in_span(trace, span, impl, new_args, new_kwargs)
    if not isinstance(out, _BaseTensor):
        return out, []
    if shared:
        indices = _shared_lineage(_pop_column(out, _SRC), bounds, out.shape)
    else:
        indices = [_tagged_lineage(_pop_column(out, keys[id(tg)]), orig.shape, out.shape)
                   for orig, tg in zip(operands, tagged_ops)]
    # Any hidden column the op left behind (e.g. an operand used twice) goes too.
    for k in [k for k in out.metadata if k.startswith(_SRC)]:
        del out.metadata[k]
    return out, indices


def _tagged_lineage(col: np.ndarray | None, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    if col is None:  # the op dropped metadata: fall back to broadcasting
        return broadcast_index(in_shape, out_shape)
    if col.dtype == object:  # merged (where, masked_scatter): None = not from it
        missing = np.asarray(np.frompyfunc(lambda v: v is None, 1, 1)(col), dtype=bool)
        col = np.where(missing, -1, col)
    return np.asarray(col, dtype=np.int64)[..., None]


def _shared_lineage(col: np.ndarray | None, bounds: list[int], out_shape: tuple[int, ...]) -> list[np.ndarray]:
    """Split one shared entry-number column into each operand's index (``bounds``: offsets)."""
    indices = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if col is None:
            index = np.full(out_shape + (1,), -1, np.int64)
        else:
            index = np.where((col >= lo) & (col < hi), col - lo, -1)[..., None]
        indices.append(index.astype(np.int64))
    return indices


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
    module maps inputs to outputs (``functional_call``, with :func:`parameter_sources`).

    Example:
        >>> import langtorch as lt
        >>> x, node = tracked_leaf(lt.TextTensor(["a", "b"]))
        >>> parameter_sources(x.reshape(2, 1), node).tolist()
        [[0], [1]]
    """
    out = type(t)._result_class()._wrap(t._texts, t._fields, t._metadata.copy(), t._embedding, t._template)
    out._pylist = t._pylist
    node = Node("input", (), t._texts, path=_context.path_string())
    node.requires_grad = True
    node.out_texts = t._texts
    out._grad_fn = node
    return out, node


# ---------------------------------------------------------------- the built-in ops' rules
def _join_lineage(operands: list[_BaseTensor], bound: dict[str, Any], out: _BaseTensor) -> list[np.ndarray]:
    """Output entry ``i`` of a join came from the entries joined along its axis."""
    t, axis = operands[0], bound.get("axis", -1)
    src = np.arange(t.size if t.ndim else 1, dtype=np.int64).reshape(t.shape)
    if axis is None or t.ndim <= 1:
        return [src.reshape(out.shape + (-1,))]
    return [np.moveaxis(src, axis % t.ndim, -1)]


def _split_lineage(operands: list[_BaseTensor], bound: dict[str, Any], out: _BaseTensor) -> list[np.ndarray]:
    """Every piece of a split came from the entry it was cut from."""
    t = operands[0]
    src = np.arange(t.size if t.ndim else 1, dtype=np.int64).reshape(t.shape)
    return [np.broadcast_to(src[..., None], out.shape)[..., None]]


def _add_roles(args: Sequence[Any], operands: list[_BaseTensor]) -> list[str]:
    # add fills or concatenates by textops' own rule; the roles (and so the backward) follow it.
    fills = bool(args) and _textops.add_fills(args[0])
    return _positional_roles(*(("template", "values") if fills else ("left", "right")))(args, operands)


def _keep(*names: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def attrs(bound: dict[str, Any]) -> dict[str, Any]:
        return {k: bound[k] for k in names if k in bound}

    return attrs


def _map_attrs(bound: dict[str, Any]) -> dict[str, Any]:
    fn = bound.get("fn")
    return {"fn": getattr(fn, "__qualname__", type(fn).__name__)}


for _fn, _rule in [
    (_textops.fill, OpRule("fill", roles=("template", "values"), feedback=fill_feedback)),
    (_textops.add, OpRule("add", roles=_add_roles, feedback=fill_feedback)),
    (_textops.concat, OpRule("concat", roles=("left", "right"), attrs=_keep("sep"))),
    (_textops.records, OpRule("records", roles=lambda args, ops: ["field"] * len(ops))),
    (_textops.join, OpRule("join", lineage=_join_lineage, attrs=_keep("sep", "axis"))),
    (_textops.split, OpRule("split", lineage=_split_lineage, attrs=_keep("sep", "maxsplit"))),
    (_textops.stack, OpRule("stack", lineage="shared", roles=lambda args, ops: [f"item{i}" for i in range(len(ops))])),
    (_textops.cat, OpRule("cat", lineage="shared", roles=lambda args, ops: [f"item{i}" for i in range(len(ops))])),
    (_textops.where, OpRule("where")),
    (_textops.masked_scatter, OpRule("masked_scatter")),
    (_textops.index_put, OpRule("index_put")),
    (_BaseTensor.__getitem__, OpRule("getitem")),
    (_BaseTensor.reshape, OpRule("reshape")),
    (_BaseTensor.transpose, OpRule("transpose")),
    (_BaseTensor.squeeze, OpRule("squeeze")),
    (_BaseTensor.unsqueeze, OpRule("unsqueeze")),
    (_BaseTensor.map, OpRule("map", attrs=_map_attrs)),
    (_BaseTensor.with_embedding, OpRule("with_embedding")),
    (_BaseTensor.with_metadata, OpRule("with_metadata")),
    (_BaseTensor.embed, OpRule("embed")),
    (_BaseTensor.detach, OpRule("detach", cut="detach")),
]:
    register_op(_fn, _rule)
del _fn, _rule
