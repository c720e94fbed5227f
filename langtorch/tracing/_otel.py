"""Send a recorded :class:`~langtorch.tracing.Trace` to OpenTelemetry, following the GenAI
semantic conventions.

The export runs after the fact: each langtorch span becomes one OpenTelemetry span with the
recorded start and end times and the same parent/child links, so any OTel backend (Jaeger,
Tempo, Langfuse, Phoenix, Honeycomb, ...) shows the pipeline as it ran. Top-level spans become
children of whatever OTel span is current when the export runs (so a ``with lt.trace(otel=True)``
block inside an application span nests under it).

Mapping:

* ``llm`` and ``request`` spans: ``chat {model}`` (client spans) with ``gen_ai.operation.name =
  "chat"``, ``gen_ai.provider.name``, ``gen_ai.request.model`` and the request parameters
  (``temperature``, ``max_tokens``, ``top_p``, ``seed``, ...). Each ``request`` span (one call to
  the provider) carries ``gen_ai.response.model``, ``gen_ai.response.finish_reasons`` and
  ``gen_ai.usage.input_tokens`` / ``output_tokens``; the enclosing ``llm`` span (a batch of
  requests) carries the batch totals as ``langtorch.usage.*``, so that backends summing
  ``gen_ai.usage.*`` over spans count every token once.
* ``embed`` spans: ``embeddings {model}``; ``tool`` spans: ``execute_tool {name}`` with
  ``gen_ai.tool.name``; ``module`` and ``op`` spans: their path and class.
* Every span: ``langtorch.kind``, ``langtorch.path``, ``langtorch.span_id``, shapes, and where
  known ``langtorch.cached`` / ``langtorch.cache_hits``, ``langtorch.attempts``,
  ``langtorch.cost``. A failed span gets status ``ERROR``, ``error.type`` and an ``exception``
  event.
* With ``capture_content``: ``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON, in the
  conventions' parts format) on request spans, ``langtorch.input.texts`` /
  ``langtorch.output.texts`` on the others. Without it, no prompt or completion text leaves.

Every string attribute passes through :func:`langtorch.core.redact.redact`, so strings
shaped like API keys never reach an exporter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langtorch.tracing._records import recorded_role, recorded_text

__all__ = ["export_otel", "require_otel"]

_INSTALL = "pip install opentelemetry-sdk (or langtorch's otel extra: pip install 'langtorch-jax[otel]')"

# Request body fields -> GenAI attributes (numbers; ``stop`` is handled separately).
_PARAMS = {
    "temperature": "gen_ai.request.temperature",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}
# Texts kept per tensor summary in langtorch.*.texts attributes.
_MAX_TEXTS = 64


def require_otel() -> None:
    """Raise a helpful :class:`ImportError` unless OpenTelemetry is importable.

    Raises:
        ImportError: ``opentelemetry`` is not installed; the message names ``pip install
            opentelemetry-sdk`` and the ``otel`` extra.

    Example:
        >>> require_otel()  # silent when opentelemetry-sdk is installed
    """
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        raise ImportError(f"OpenTelemetry export of langtorch traces needs OpenTelemetry: {_INSTALL}.") from None


def export_otel(trace: Any, *, capture_content: bool = True, tracer_provider: Any = None) -> None:
    """Emit every span of ``trace`` to OpenTelemetry (see the module docstring for the mapping).

    Args:
        trace: a finished :class:`~langtorch.tracing.Trace`.
        capture_content: include prompts, completions and tensor texts in span attributes.
        tracer_provider: the ``TracerProvider`` to use; by default OpenTelemetry's global one
            (set with ``opentelemetry.trace.set_tracer_provider``).

    Raises:
        ImportError: OpenTelemetry is not installed (see :func:`require_otel`).

    Example:
        >>> import langtorch as lt
        >>> from opentelemetry.sdk.trace import TracerProvider
        >>> from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        >>> exporter = InMemorySpanExporter()
        >>> provider = TracerProvider(); provider.add_span_processor(SimpleSpanProcessor(exporter))
        >>> with lt.trace() as tr:
        ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
        >>> export_otel(tr, tracer_provider=provider)
        >>> [s.attributes["langtorch.kind"] for s in exporter.get_finished_spans()][-1]
        'module'
    """
    require_otel()
    from opentelemetry import trace as otel_trace

    try:
        from langtorch.core import __version__ as version
    except ImportError:  # pragma: no cover - a partial install
        version = None
    provider = tracer_provider if tracer_provider is not None else otel_trace.get_tracer_provider()
    tracer = provider.get_tracer("langtorch", version)
    fallback_end = getattr(trace, "end", None)
    # Depth first with an explicit stack: deep module nesting cannot hit the recursion limit.
    # Each entry is (span, parent OTel span, exit?) so a span ends after all its children.
    stack: list[tuple[Any, Any, Any]] = [(root, None, None) for root in reversed(trace.roots)]
    while stack:
        s, parent, opened = stack.pop()
        if opened is not None:
            opened.end(end_time=_ns(s.end if s.end is not None else (fallback_end or s.start)))
            continue
        name, kind, attributes = _describe(s, capture_content)
        context = otel_trace.set_span_in_context(parent) if parent is not None else None
        o = tracer.start_span(name, context=context, kind=kind, attributes=attributes,
                              start_time=_ns(s.start))
        if s.error:
            _set_error(o, s, fallback_end)
        stack.append((s, parent, o))
        stack.extend((c, o, None) for c in reversed(s.children))


def _ns(seconds: float) -> int:
    return int(round(float(seconds) * 1e9))


def _redact(text: str) -> str:
    from langtorch.core.redact import redact

    return redact(text) or ""


def _set_error(o: Any, s: Any, fallback_end: Any) -> None:
    from opentelemetry.trace import Status, StatusCode

    error = s.error if isinstance(s.error, Mapping) else {"type": "Error", "message": str(s.error)}
    kind = _redact(str(error.get("type") or "Error"))
    message = _redact(str(error.get("message") or ""))
    o.set_status(Status(StatusCode.ERROR, f"{kind}: {message}"[:2000]))
    o.set_attribute("error.type", kind)
    end = s.end if s.end is not None else (fallback_end or s.start)
    o.add_event("exception", {"exception.type": kind, "exception.message": message}, timestamp=_ns(end))


def _describe(s: Any, capture_content: bool) -> tuple[str, Any, dict[str, Any]]:
    """(span name, SpanKind, attributes) of one langtorch span."""
    from opentelemetry.trace import SpanKind

    attrs = _langtorch_attrs(s)
    info = s.attrs if isinstance(s.attrs, Mapping) else {}
    span_kind = SpanKind.CLIENT if s.kind in ("llm", "request", "embed") else SpanKind.INTERNAL
    if s.kind in ("llm", "request"):
        name = _chat(s, info, attrs, capture_content)
    elif s.kind == "embed":
        name = _embeddings(s, info, attrs)
    elif s.kind == "tool":
        name = _tool(s, attrs, capture_content)
    elif s.kind == "op":
        name = f"op {s.name}"
    else:
        last = s.path.split(".")[-1] if s.path else ""
        name = s.name if not s.path else (s.path if last == s.name else f"{s.path} {s.name}")

    if capture_content and s.kind not in ("request",):
        for key, summaries in (("langtorch.input.texts", s.inputs), ("langtorch.output.texts", s.outputs)):
            texts = _texts(summaries)
            if texts:
                attrs[key] = tuple(texts)
    return _redact(name), span_kind, _clean(attrs)


def _langtorch_attrs(s: Any) -> dict[str, Any]:
    """The ``langtorch.*`` attributes every span has: kind, name, path, shapes, attempts, cost,
    cache."""
    attrs: dict[str, Any] = {"langtorch.kind": s.kind, "langtorch.name": s.name, "langtorch.span_id": int(s.id)}
    if s.path:
        attrs["langtorch.path"] = s.path
    if s.inputs:
        attrs["langtorch.input.shapes"] = tuple(_shape(x) for x in s.inputs)
    if s.outputs:
        attrs["langtorch.output.shapes"] = tuple(_shape(x) for x in s.outputs)
    if isinstance(s.attempts, int) and not isinstance(s.attempts, bool):
        attrs["langtorch.attempts"] = s.attempts
    if isinstance(s.cost, (int, float)) and not isinstance(s.cost, bool):
        attrs["langtorch.cost"] = float(s.cost)
    if isinstance(s.cached, bool):
        attrs["langtorch.cached"] = s.cached
    elif isinstance(s.cached, int):
        attrs["langtorch.cache_hits"] = s.cached
    return attrs


def _chat(s: Any, info: Mapping[str, Any], attrs: dict[str, Any], capture_content: bool) -> str:
    """GenAI chat attributes of an ``llm`` span or one of its ``request`` spans; the span name."""
    llm = s if s.kind == "llm" else (s.parent if s.parent is not None and s.parent.kind == "llm" else None)
    llm_info = llm.attrs if llm is not None and isinstance(llm.attrs, Mapping) else {}
    body = s.request if isinstance(s.request, Mapping) else {}
    model = body.get("model") if isinstance(body.get("model"), str) else llm_info.get("model")
    provider = _provider(llm_info.get("backend"))
    attrs["gen_ai.operation.name"] = "chat"
    attrs["gen_ai.provider.name"] = provider
    attrs["gen_ai.system"] = provider  # the older name of gen_ai.provider.name
    if model:
        attrs["gen_ai.request.model"] = str(model)
    params = dict(llm_info.get("params") or {}) if s.kind == "llm" else {}
    if isinstance(body.get("params"), Mapping):
        params.update(body["params"])
    params.update({k: v for k, v in body.items() if k not in ("messages", "model", "params")})
    attrs.update(_request_params(params))
    if s.kind == "request":
        attrs.update(_response_attrs(s))
        if isinstance(info.get("entries"), list):
            attrs["langtorch.entries"] = tuple(int(e) for e in info["entries"] if isinstance(e, int))
        if capture_content:
            attrs.update(_messages(body, s.response))
    else:
        tokens = _tokens(s.usage)
        has_requests = any(c.kind == "request" for c in s.children)
        if tokens is not None:
            prefix = "langtorch.usage" if has_requests else "gen_ai.usage"
            attrs[f"{prefix}.input_tokens"], attrs[f"{prefix}.output_tokens"] = tokens
        if isinstance(info.get("n"), int):
            attrs["gen_ai.request.choice.count"] = info["n"]
    return f"chat {model}" if model else "chat"


def _embeddings(s: Any, info: Mapping[str, Any], attrs: dict[str, Any]) -> str:
    """GenAI embeddings attributes of an ``embed`` span; the span name."""
    model = info.get("model")
    attrs["gen_ai.operation.name"] = "embeddings"
    attrs["gen_ai.provider.name"] = attrs["gen_ai.system"] = _provider(info.get("backend"))
    if model:
        attrs["gen_ai.request.model"] = str(model)
    tokens = _tokens(s.usage)
    if tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = tokens[0]
    if isinstance(info.get("dimensions"), int):
        attrs["gen_ai.embeddings.dimension.count"] = info["dimensions"]
    return f"embeddings {model}" if model else "embeddings"


def _tool(s: Any, attrs: dict[str, Any], capture_content: bool) -> str:
    """GenAI tool-call attributes of a ``tool`` span; the span name."""
    attrs["gen_ai.operation.name"] = "execute_tool"
    attrs["gen_ai.tool.name"] = s.name
    if capture_content:
        args = _texts(s.inputs)
        result = _texts(s.outputs)
        if args:
            attrs["gen_ai.tool.call.arguments"] = args[0] if len(args) == 1 else json.dumps(args, ensure_ascii=False)
        if result:
            attrs["gen_ai.tool.call.result"] = result[0] if len(result) == 1 else json.dumps(result, ensure_ascii=False)
    return f"execute_tool {s.name}"


def _shape(summary: Any) -> str:
    if isinstance(summary, Mapping) and isinstance(summary.get("shape"), list):
        return "[" + ", ".join(str(n) for n in summary["shape"]) + "]"
    if isinstance(summary, Mapping) and "type" in summary:
        return str(summary["type"])
    return "?"


def _texts(summaries: Sequence[Any]) -> list[str]:
    """The recorded texts of the first tensor summary that has any (none when redacted)."""
    for x in summaries or []:
        if isinstance(x, Mapping) and isinstance(x.get("texts"), list):
            return [str(t) for t in x["texts"][:_MAX_TEXTS]]
    return []


def _tokens(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, Mapping):
        return None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def _provider(backend: Any) -> str:
    """``gen_ai.provider.name`` from the backend's repr (``"OpenAIBackend(...)"`` -> openai)."""
    name = str(backend or "").split("(")[0].strip()
    if not name:
        return "openai"
    known = {"OpenAIBackend": "openai", "LocalBackend": "langtorch.local"}
    if name in known:
        return known[name]
    return name.removesuffix("Backend").lower() or "unknown"


def _request_params(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, attr in _PARAMS.items():
        value = params.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[attr] = value
    stop = params.get("stop")
    if isinstance(stop, str):
        out["gen_ai.request.stop_sequences"] = (stop,)
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        out["gen_ai.request.stop_sequences"] = tuple(stop)
    n = params.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n != 1:
        out["gen_ai.request.choice.count"] = n
    if isinstance(params.get("stream"), bool):
        out["gen_ai.request.stream"] = params["stream"]
    fmt = params.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") in ("json_schema", "json_object"):
        out["gen_ai.output.type"] = "json"
    return out


def _response_attrs(s: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    response = s.response if isinstance(s.response, Mapping) else {}
    if isinstance(response.get("model"), str):
        out["gen_ai.response.model"] = response["model"]
    reasons = [c.get("finish_reason") for c in response.get("choices") or [] if isinstance(c, Mapping)]
    reasons = [r for r in reasons if isinstance(r, str)]
    if reasons:
        out["gen_ai.response.finish_reasons"] = tuple(reasons)
    tokens = _tokens(s.usage)
    if tokens is not None:
        out["gen_ai.usage.input_tokens"], out["gen_ai.usage.output_tokens"] = tokens
    return out


def _tool_call_part(call: Any) -> dict[str, Any] | None:
    if not isinstance(call, Mapping):
        return None
    fn = call.get("function") if isinstance(call.get("function"), Mapping) else call
    arguments = fn.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    part = {"type": "tool_call", "name": fn.get("name"), "arguments": arguments}
    if call.get("id") is not None:
        part["id"] = call["id"]
    return part


def _messages(body: Mapping[str, Any], response: Any) -> dict[str, Any]:
    """``gen_ai.input.messages`` / ``gen_ai.output.messages`` in the conventions' parts format
    (absent when the trace kept no content). Messages are read as every view reads them
    (``tracing._records``: leniently, the role as sent)."""
    out: dict[str, Any] = {}
    messages = []
    for m in body.get("messages") or []:
        if not isinstance(m, Mapping):
            continue
        role = recorded_role(m)
        parts: list[dict[str, Any]] = []
        text = recorded_text(m.get("content"))
        if role == "tool" and text is not None:
            parts.append({"type": "tool_call_response", "id": m.get("tool_call_id"), "response": text})
        elif text is not None:
            parts.append({"type": "text", "content": text})
        for call in m.get("tool_calls") or []:
            part = _tool_call_part(call)
            if part is not None:
                parts.append(part)
        if parts:
            messages.append({"role": role, "parts": parts})
    if messages:
        out["gen_ai.input.messages"] = json.dumps(messages, ensure_ascii=False)
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        out["gen_ai.tool.definitions"] = json.dumps(tools, ensure_ascii=False, default=str)
    outputs = []
    choices = response.get("choices") if isinstance(response, Mapping) else None
    for c in choices if isinstance(choices, list) else []:
        if not isinstance(c, Mapping):
            continue
        parts = []
        if isinstance(c.get("text"), str) and c["text"]:
            parts.append({"type": "text", "content": c["text"]})
        for call in c.get("tool_calls") or []:
            part = _tool_call_part(call)
            if part is not None:
                parts.append(part)
        if parts:
            item: dict[str, Any] = {"role": "assistant", "parts": parts}
            if isinstance(c.get("finish_reason"), str):
                item["finish_reason"] = c["finish_reason"]
            outputs.append(item)
    if outputs:
        out["gen_ai.output.messages"] = json.dumps(outputs, ensure_ascii=False)
    return out


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes OTel accepts (str, bool, int, float or homogeneous tuples), strings redacted."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if value is None:
            continue
        if isinstance(value, str):
            out[key] = _redact(value)
        elif isinstance(value, (bool, int, float)):
            out[key] = value
        elif isinstance(value, (tuple, list)):
            items = [_redact(v) if isinstance(v, str) else v for v in value if v is not None]
            if items and len({type(v) for v in items}) == 1:
                out[key] = tuple(items)
        else:
            out[key] = _redact(str(value))
    return out
