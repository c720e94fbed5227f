"""langtorch.autograd — the provenance graph of TextTensors and text backpropagation.

* Grad mode: :class:`no_grad`, :class:`enable_grad`, :class:`set_grad_enabled`,
  :func:`is_grad_enabled` (as in torch).
* :class:`Node` / :class:`Edge`: what ``t.grad_fn`` holds — the op, its inputs, the per-entry
  lineage (see :mod:`langtorch.autograd._graph`).
* :func:`backward`: ``loss.backward()`` — textual feedback into ``param.grad`` (see
  :mod:`langtorch.autograd._backward`).
* :class:`FeedbackEngine`: the critic the backward pass (and the text optimizers) ask for text —
  ``lt.nn.LLM`` is one, :func:`as_feedback_engine` adapts a Backend; :func:`set_feedback_engine`
  / :func:`get_feedback_engine`: the default of ``loss.backward()`` (see
  :mod:`langtorch.autograd._feedback`).

Example:
    >>> import langtorch as lt
    >>> p = lt.TextParameter("Q: {}")
    >>> out = p + lt.TextTensor(["a", "b"])
    >>> out.grad_fn.op, out.requires_grad
    ('add', True)
"""

from langtorch.autograd._backward import backward
from langtorch.autograd._feedback import (
    Answer,
    FeedbackEngine,
    as_feedback_engine,
    get_backward_engine,
    get_feedback_engine,
    set_backward_engine,
    set_feedback_engine,
)
from langtorch.autograd._grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from langtorch.autograd._graph import Edge, Node, record_node, requires_grad, topological_order

__all__ = [
    "Answer",
    "FeedbackEngine",
    "as_feedback_engine",
    "backward",
    "get_backward_engine",
    "get_feedback_engine",
    "set_backward_engine",
    "set_feedback_engine",
    "Edge",
    "Node",
    "enable_grad",
    "is_grad_enabled",
    "no_grad",
    "record_node",
    "requires_grad",
    "set_grad_enabled",
    "topological_order",
]
