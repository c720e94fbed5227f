"""langtorch.tracing — see what a pipeline did: spans, views, OpenTelemetry export.

* :func:`trace` — ``with lt.trace() as tr:`` records a :class:`Trace`: a tree of :class:`Span`
  (kinds ``module``, ``llm``, ``embed``, ``tool``, ``op``, and ``request`` for each request sent),
  plus the provenance graph of the ops that ran.
* Views: ``print(tr)``, ``tr.to_html(path)``, ``tr.to_dot()`` / ``tr.render(path)``,
  ``tr.to_records()`` / ``tr.to_pandas()``, ``tr.save(path)`` / ``Trace.load(path)``.
* :func:`span` / :func:`set_outputs` — add your own steps (tools) to the active trace.

Example:
    >>> import langtorch as lt
    >>> with lt.trace() as tr:
    ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a", "b"]))
    >>> tr.find(kind="module")[0].outputs[0]["texts"]
    ['Q: a', 'Q: b']
"""

from langtorch.tracing._trace import Span, Trace, current_span, set_outputs, span, trace

__all__ = ["Span", "Trace", "current_span", "set_outputs", "span", "trace"]
