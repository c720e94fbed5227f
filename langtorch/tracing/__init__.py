"""langtorch.tracing — see what a pipeline did: spans, views, OpenTelemetry export.

* :func:`trace` — ``with lt.trace() as tr:`` records a :class:`Trace`: a tree of :class:`Span`
  (kinds ``module``, ``llm``, ``embed``, ``tool``, ``op``, and ``request`` for each request sent),
  plus the provenance graph of the ops that ran.
* Views: ``print(tr)``, ``tr.to_html(path)``, ``tr.to_dot()`` / ``tr.render(path)``,
  ``tr.to_records()`` / ``tr.to_pandas()``, ``tr.save(path)`` / ``Trace.load(path)``.
* :func:`span` / :func:`set_outputs` — add your own steps (tools) to the active trace.
* The recording API, for library code: :meth:`Trace.open_span` / :meth:`Trace.close_span`,
  :meth:`Trace.open_request` / :meth:`Trace.close_request`, :meth:`Trace.open_op` /
  :meth:`Trace.close_op`, :meth:`Trace.add_node`, :meth:`Trace.add_secrets`.
* Request observers (``langtorch.core.events``), registered on import: :class:`RequestSpans`
  records each request the runtime answers in the active trace; :class:`RequestHistory` keeps
  ``backend.history`` and the list :func:`inspect_history` reads.

Example:
    >>> import langtorch as lt
    >>> with lt.trace() as tr:
    ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a", "b"]))
    >>> tr.find(kind="module")[0].outputs[0]["texts"]
    ['Q: a', 'Q: b']
"""

from langtorch.core.events import add_request_observer
from langtorch.tracing._history import RequestHistory, inspect_history
from langtorch.tracing._trace import (
    RequestSpans,
    Span,
    Trace,
    current_span,
    set_outputs,
    span,
    trace,
)

__all__ = [
    "RequestHistory",
    "RequestSpans",
    "Span",
    "Trace",
    "current_span",
    "inspect_history",
    "set_outputs",
    "span",
    "trace",
]

# The runtime reports every request to these (it cannot call tracing by name: tracing is below it).
REQUEST_SPANS = add_request_observer(RequestSpans())
REQUEST_HISTORY = add_request_observer(RequestHistory())
