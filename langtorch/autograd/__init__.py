"""langtorch.autograd — the provenance graph of TextTensors and text backpropagation.

* Grad mode: :class:`no_grad`, :class:`enable_grad`, :class:`set_grad_enabled`,
  :func:`is_grad_enabled` (as in torch).
* :class:`Node` / :class:`Edge`: what ``t.grad_fn`` holds — the op, its inputs, the per-entry
  lineage (see :mod:`langtorch.autograd._graph`).
* :func:`backward`: ``loss.backward()`` — textual feedback into ``param.grad`` (see
  :mod:`langtorch.autograd._backward`).
* :class:`FeedbackEngine`: the critic the backward pass (and the text optimizers) ask for text —
  ``lt.nn.LLM`` is one, :func:`as_feedback_engine` adapts a Backend, :func:`ask_feedback` asks
  one and checks its reply; :func:`set_feedback_engine`
  / :func:`get_feedback_engine`: the default of ``loss.backward()`` (see
  :mod:`langtorch.autograd._feedback`).

**Recording API** (what ``langtorch.tensor``, modules and ``langtorch.func`` build on; this package
sits below them and never imports them):

* :class:`OpRule`, :func:`register_op`, :func:`op_rule`: each text op's graph rule — node name,
  lineage, operand roles, node details, backward rule — registered for the op's function object.
  Backward rules: :func:`route_feedback` (default), :func:`fill_feedback`, :func:`loss_feedback`,
  :data:`ENGINE_FEEDBACK`; ready rules for modules: :data:`LLM_CALL`, :data:`TEXT_LOSS`.
* :func:`handle_text_function`: the ``__text_function__`` hook of ``langtorch.TextTensor``;
  :func:`may_record`: whether an op's arguments can record at all.
* :func:`record_node` with :func:`identity_index` / :func:`broadcast_index`: a module that
  computes its output itself (LLM call, loss, retrieval) attaches its node.
* :func:`requires_grad`, :func:`topological_order`, :func:`parameter_sources`,
  :func:`tracked_leaf`: reading the graph.

A class is a parameter (a leaf feedback accumulates into) when it sets the class attribute
``__text_parameter__ = True``, as :class:`langtorch.TextParameter` does.

Example:
    >>> import langtorch as lt
    >>> p = lt.TextParameter("Q: {}")
    >>> out = p + lt.TextTensor(["a", "b"])
    >>> out.grad_fn.op, out.requires_grad
    ('add', True)
    >>> loss = lt.TextTensor(["ok", "ok"], template=False)
    >>> _ = lt.autograd.record_node(lt.autograd.TEXT_LOSS, loss,
    ...                             [(out, lt.autograd.identity_index(out.shape), "prediction")])
    >>> loss.grad_fn.op, loss.grad_fn.rule.feedback is lt.autograd.loss_feedback
    ('loss', True)
"""

from langtorch.autograd._backward import backward
from langtorch.autograd._feedback import (
    Answer,
    FeedbackEngine,
    as_feedback_engine,
    ask_feedback,
    get_backward_engine,
    get_feedback_engine,
    set_backward_engine,
    set_feedback_engine,
)
from langtorch.autograd._grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from langtorch.autograd._graph import (
    ENGINE_FEEDBACK,
    LLM_CALL,
    TEXT_LOSS,
    Edge,
    Node,
    OpRule,
    broadcast_index,
    fill_feedback,
    handle_text_function,
    identity_index,
    loss_feedback,
    may_record,
    op_rule,
    parameter_sources,
    record_node,
    register_op,
    requires_grad,
    route_feedback,
    topological_order,
    tracked_leaf,
)

__all__ = [
    "Answer",
    "FeedbackEngine",
    "as_feedback_engine",
    "ask_feedback",
    "backward",
    "get_backward_engine",
    "get_feedback_engine",
    "set_backward_engine",
    "set_feedback_engine",
    "ENGINE_FEEDBACK",
    "LLM_CALL",
    "TEXT_LOSS",
    "Edge",
    "Node",
    "OpRule",
    "broadcast_index",
    "enable_grad",
    "fill_feedback",
    "handle_text_function",
    "identity_index",
    "is_grad_enabled",
    "loss_feedback",
    "may_record",
    "no_grad",
    "op_rule",
    "parameter_sources",
    "record_node",
    "register_op",
    "requires_grad",
    "route_feedback",
    "set_grad_enabled",
    "topological_order",
    "tracked_leaf",
]
