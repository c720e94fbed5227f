"""Traces: a tree of spans recording what a pipeline did (``with lt.trace() as tr``).

A :class:`Span` is one module call, LLM call, embedding call, tool call, text op, or one request
sent to a backend (kind ``"request"``, a child of its ``llm``/``embed`` span). Spans nest by
:mod:`contextvars`, so concurrent asyncio tasks each nest under the span that was current when
they were created, and a synchronous call that langtorch runs on its private event loop carries
the caller's context along.

Memory: a trace stores every text once (equal texts share one string) and cuts texts longer than
``max_text_chars``; with ``redact_content=True`` it stores only shapes, lengths and usage.

Example:
    >>> import langtorch as lt
    >>> with lt.trace() as tr:
    ...     out = lt.TLayer("Q: {}")(lt.TextTensor(["a", "b"]))
    >>> [(s.kind, s.path) for s in tr.spans if s.kind == "module"]
    [('module', 'TLayer')]
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from langtorch.core import context as _context
from langtorch.core import secrets_of, user_path
from langtorch.tracing._records import plain

__all__ = ["Span", "Trace", "current_span", "span", "trace"]

KINDS = ("module", "llm", "embed", "tool", "op", "request")
# Body keys whose string values are names, not content: kept under redact_content.
_STRUCTURAL_KEYS = frozenset({"model", "role", "finish_reason", "type", "name", "id", "tool_call_id",
                              "backend"})
# Cheap pre-check before the key-redaction regexes run on a text.
_MAYBE_KEY = re.compile(r"k-|bearer", re.IGNORECASE)
DEFAULT_MAX_TEXT_CHARS = 20_000


class Span:
    """One recorded step. Plain data: every field is JSON-serialisable.

    Attributes:
        id: number within the trace (1, 2, ...); ``parent_id``: the enclosing span's (or None).
        name: what ran (module class, ``"LLM"``, op name, ``"request"``).
        kind: one of ``module``, ``llm``, ``embed``, ``tool``, ``op``, ``request``.
        path: the module call path (``"Pipeline.qa.llm"``), distinct per use of a shared module.
        start, end: wall-clock times (seconds since the epoch); ``duration`` = ``end - start``.
        inputs, outputs: TextTensor summaries ``{"shape": [...], "texts": [flat entries]}`` (texts
            absent with ``redact_content``, which keeps ``"chars"`` instead).
        metadata: the output's metadata columns (flat lists of plain values).
        usage: ``{"prompt_tokens", "completion_tokens"}`` or ``None``; ``cost``: float or None.
        cached: for a request, whether the cache answered; for an llm span, cache hits count.
        attempts: attempts made (retries included), where known.
        error: ``{"type", "message"}`` when the step raised (the exception still propagates).
        request, response: for a request span, the body sent and the answer received.
        attrs: other details (model, backend, n, dimensions ...).
        children: child spans, in start order.

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr:
        ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
        >>> s = tr.spans[0]
        >>> s.kind, s.path, s.outputs[0]["texts"], s.duration >= 0
        ('module', 'TLayer', ['Q: a'], True)
    """

    __slots__ = (
        "id", "parent_id", "name", "kind", "path", "start", "end", "inputs", "outputs", "metadata",
        "usage", "cost", "cached", "attempts", "error", "request", "response", "attrs", "children",
        "parent",
    )

    def __init__(self, id: int, name: str, kind: str, path: str = "", parent: Span | None = None):
        self.id = id
        self.parent = parent
        self.parent_id = parent.id if parent is not None else None
        self.name = name
        self.kind = kind
        self.path = path
        self.start = time.time()
        self.end: float | None = None
        self.inputs: list[dict[str, Any]] = []
        self.outputs: list[dict[str, Any]] = []
        self.metadata: dict[str, Any] = {}
        self.usage: dict[str, int] | None = None
        self.cost: float | None = None
        self.cached: Any = None
        self.attempts: int | None = None
        self.error: dict[str, str] | None = None
        self.request: dict[str, Any] | None = None
        self.response: dict[str, Any] | None = None
        self.attrs: dict[str, Any] = {}
        self.children: list[Span] = []

    @property
    def duration(self) -> float | None:
        """Seconds from start to end (``None`` while open)."""
        return None if self.end is None else self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        """The span as a JSON-ready dict (children as ids)."""
        d = {k: getattr(self, k) for k in self.__slots__ if k not in ("children", "parent")}
        d["children"] = [c.id for c in self.children]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Span:
        """Rebuild a span from :meth:`to_dict` (children linked by :class:`Trace.load`)."""
        s = cls(int(d["id"]), str(d["name"]), str(d["kind"]), str(d.get("path", "")))
        for k in cls.__slots__:
            if k in ("children", "parent", "id", "name", "kind", "path"):
                continue
            if k in d:
                setattr(s, k, d[k])
        return s

    def walk(self) -> Iterator[Span]:
        """This span and all its descendants, depth first."""
        yield self
        for c in self.children:
            yield from c.walk()

    def __repr__(self) -> str:
        dur = f" {self.duration * 1000:.1f} ms" if self.duration is not None else ""
        err = f" error={self.error['type']}" if self.error else ""
        return f"Span({self.kind} {self.path or self.name!r}{dur}{err})"


class Trace:
    """The spans (and provenance nodes) recorded by one ``with lt.trace()`` block.

    Use :func:`trace` to make one. Views: ``print(tr)`` (a tree), :meth:`to_html`,
    :meth:`to_dot` / :meth:`render`, :meth:`to_records` / :meth:`to_pandas`, :meth:`save` /
    :meth:`load`; :meth:`export_otel` sends the spans to OpenTelemetry.

    Attributes:
        spans: every span in start order; ``roots``: the top-level ones.
        graph: whether the provenance graph is recorded for every op (not only for ops whose
            inputs require grad).
        ops: whether text ops get ``op`` spans.
        nodes: the provenance graph as plain data (filled when the block ends; see
            :meth:`graph_records`).

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr:
        ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
        >>> repr(tr)
        'Trace(2 spans: module=1, op=1)'
    """

    def __init__(self, *, graph: bool = True, ops: bool = True, redact_content: bool = False,
                 max_text_chars: int = DEFAULT_MAX_TEXT_CHARS, max_entries: int = 10_000,
                 otel: bool = False, capture_content: bool = True, name: str = "trace",
                 max_spans: int = 1_000_000):
        if not isinstance(max_text_chars, int) or isinstance(max_text_chars, bool) or max_text_chars < 1:
            raise ValueError(f"max_text_chars must be a positive int, got {max_text_chars!r}")
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        self.graph = bool(graph)
        self.ops = bool(ops)
        self.redact_content = bool(redact_content)
        self.max_text_chars = max_text_chars
        self.max_entries = max_entries
        self.otel = bool(otel)
        self.capture_content = bool(capture_content)
        self.name = name
        self.spans: list[Span] = []
        self.roots: list[Span] = []
        self.nodes: list[dict[str, Any]] = []
        self._live_nodes: list[Any] = []
        self._strings: dict[str, str] = {}
        self._ids = itertools.count(1)
        self.start: float | None = None
        self.end: float | None = None
        self.max_spans = int(max_spans)
        self.dropped_spans = 0
        self._lock = threading.Lock()
        self._secrets: set[str] = set()

    # ------------------------------------------------------------------ recording API
    # What library code (the runtime's request observer, nn, autograd) calls to record into a
    # trace. User code usually needs only ``with lt.tracing.span(...)``.
    def add_secrets(self, *sources: Any) -> None:
        """Redact these secrets from every text the trace stores from now on.

        Each source is a secret string, or an object that declares its secrets (a backend:
        its API key; see :func:`langtorch.core.secrets_of`). Secrets shorter than 4 characters
        are ignored (they would redact ordinary text).

        Example:
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     tr.add_secrets("hunter22")
            ...     with lt.tracing.span("tool", "login", inputs=[lt.TextTensor("pw hunter22")]) as s:
            ...         pass
            >>> tr.spans[0].inputs[0]["texts"]
            ['pw ***']
        """
        for source in sources:
            self._secrets.update(x for x in secrets_of(source) if len(x) >= 4)

    def open_span(self, kind: str, name: str, *, path: str | None = None, inputs: Sequence[Any] = (),
                  attrs: Mapping[str, Any] | None = None) -> Span:
        """Open a span under the current one, without making it current; end it with
        :meth:`close_span`.

        For a step whose start and end are not one ``with`` block, e.g. a stream consumed one
        chunk at a time (each chunk may run in its own task); inside a block use
        :func:`span`. ``inputs``: TextTensors (or strings) stored as summaries; ``attrs``: details
        stored as content (texts redacted, interned and cut like every text).

        Example:
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     s = tr.open_span("llm", "LLM", inputs=[lt.TextTensor(["q"])], attrs={"stream": True})
            ...     tr.close_span(s, outputs=[lt.TextTensor(["a"])])
            >>> s.kind, s.attrs, s.outputs[0]["texts"], s.end is not None
            ('llm', {'stream': True}, ['a'], True)
        """
        if kind not in KINDS:
            raise ValueError(f"span kind must be one of {KINDS}, got {kind!r}")
        s = self._open(kind, name, _context.path_string() if path is None else path)
        s.inputs = [self._summary(x) for x in inputs]
        if attrs:
            s.attrs.update({k: self._content(plain(v), k) for k, v in attrs.items()})
        return s

    def close_span(self, s: Span, *, outputs: Sequence[Any] | None = None,
                   error: BaseException | None = None) -> None:
        """End span ``s`` now: record ``outputs`` (TextTensors, as summaries) and/or the
        ``error`` that ended it (its type and redacted message).

        Example:
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     s = tr.open_span("tool", "fetch")
            ...     tr.close_span(s, error=TimeoutError("no answer"))
            >>> s.error
            {'type': 'TimeoutError', 'message': 'no answer'}
        """
        s.end = time.time()
        if outputs is not None:
            s.outputs = [self._summary(o) for o in outputs]
        if error is not None:
            s.error = self._error(error)

    def open_request(self, body: Mapping[str, Any], *, entries: Sequence[int] = ()) -> Span:
        """Open a ``request`` span for one request body sent to a backend (under the current
        span); end it with :meth:`close_request`.

        The messages are stored as content (key-shaped text redacted); every other string in
        the body is redacted as a whole field would be in a log (headers or tokens put in extra
        fields). ``entries``: the caller's entry numbers that this request answers.

        Example:
            >>> import langtorch as lt
            >>> from langtorch.core import Choice, Completion, Usage
            >>> with lt.trace() as tr:
            ...     s = tr.open_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            ...                         entries=[0])
            ...     tr.close_request(s, Completion((Choice("hello"),), Usage(3, 1), "m"), attempts=1)
            >>> s.attrs["entries"], s.response["choices"][0]["text"], s.usage, s.attempts
            ([0], 'hello', {'prompt_tokens': 3, 'completion_tokens': 1}, 1)
        """
        s = self._open("request", "request", _context.path_string())
        s.attrs["entries"] = list(entries)
        s.request = self._content(_redacted_body(body))
        return s

    def close_request(self, s: Span, result: Any = None, *, attempts: int = 0,
                      error: BaseException | None = None) -> None:
        """End a ``request`` span with its answer (a :class:`~langtorch.core.Completion`: the
        choices' texts, tool calls, usage, whether the cache answered) or the ``error`` that
        ended it; ``attempts``: how many were sent (retries included; 0 for a cache hit).

        Example:
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     s = tr.open_request({"model": "m", "messages": []})
            ...     tr.close_request(s, error=ValueError("key sk-abcdefgh123 refused"), attempts=2)
            >>> s.error, s.attempts
            ({'type': 'ValueError', 'message': 'key *** refused'}, 2)
        """
        s.end = time.time()
        s.attempts = attempts
        if error is not None:
            s.error = self._error(error)
            return
        if result is None:
            raise ValueError("close_request needs the request's result (a Completion) or its error")
        choices = []
        for c in result.choices:
            item: dict[str, Any] = {"text": c.text, "finish_reason": c.finish_reason}
            if c.message and c.message.get("tool_calls"):
                item["tool_calls"] = c.message["tool_calls"]
            choices.append(item)
        s.response = self._content({"model": result.model, "choices": choices})
        s.usage = {"prompt_tokens": result.usage.prompt_tokens,
                   "completion_tokens": result.usage.completion_tokens}
        s.cached = bool(result.cached)

    def open_op(self, name: str, operands: Sequence[Any]) -> Span:
        """Open an ``op`` span for a text op (stored as shapes only: ops are many). When the
        trace holds ``max_spans`` spans, the span is recorded nowhere (counted in
        ``dropped_spans``). End it with :meth:`close_op`.

        Example:
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     s = tr.open_op("join", [lt.TextTensor(["a", "b"])])
            ...     tr.close_op(s, lt.TextTensor("a b"))
            >>> s.kind, s.inputs, s.outputs
            ('op', [{'shape': [2]}], [{'shape': []}])
        """
        s = self._open("op", name, _context.path_string())
        s.inputs = [{"shape": list(t.shape)} for t in operands]
        return s

    def close_op(self, s: Span, out: Any = None, error: BaseException | None = None) -> None:
        """End an ``op`` span with its output's shape, or the error the op raised."""
        s.end = time.time()
        if error is not None:
            s.error = self._error(error)
        elif hasattr(out, "shape"):
            s.outputs = [{"shape": list(out.shape)}]

    def add_node(self, node: Any) -> None:
        """Record a provenance-graph node (``langtorch.autograd``'s ``Node``: ``id``, ``op``,
        ``path``, ``shape``, ``edges``); :meth:`graph_records` turns the recorded nodes into
        plain data when the block ends.

        Example:
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     _ = lt.TextTensor(["a", "b"]).join(", ")
            >>> [n["op"] for n in tr.nodes]
            ['join']
        """
        self._live_nodes.append(node)

    # ------------------------------------------------------------------ recording internals
    def _error(self, error: BaseException) -> dict[str, str]:
        return {"type": type(error).__name__, "message": self._text(str(error))[:2000]}

    def _text(self, s: str) -> str:
        # Redact before cutting, so that no prefix of a key survives the cut. A key pasted into
        # a prompt (or echoed by a server) stays out of the trace.
        if _MAYBE_KEY.search(s) is not None or (self._secrets and any(k in s for k in self._secrets)):
            s = _redacted(s, *self._secrets)
        if len(s) > self.max_text_chars:
            s = s[: self.max_text_chars] + f"… [{len(s)} chars]"
        return self._strings.setdefault(s, s)

    def _summary(self, t: Any) -> dict[str, Any]:
        from langtorch.functional.text import TextTensor

        if not isinstance(t, TextTensor):
            if isinstance(t, str):
                t_texts, shape = [t], []
            else:
                return {"type": type(t).__name__}
        else:
            shape = list(t.shape)
            t_texts = t._flat_list()
        d: dict[str, Any] = {"shape": shape}
        cut = t_texts[: self.max_entries]
        if self.redact_content:
            d["chars"] = [len(s) for s in cut]
        else:
            d["texts"] = [self._text(s) for s in cut]
        if len(t_texts) > len(cut):
            d["omitted"] = len(t_texts) - len(cut)
        return d

    def _content(self, value: Any, key: str | None = None) -> Any:
        """A request/response body with texts interned (or removed with redact_content; names
        such as ``model``, ``role`` and ``finish_reason`` are kept)."""
        if isinstance(value, str):
            if not self.redact_content or key in _STRUCTURAL_KEYS:
                return self._text(value)
            return {"chars": len(value)}
        if isinstance(value, Mapping):
            return {str(k): self._content(v, str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._content(v, key) for v in value]
        return plain(value)

    def _open(self, kind: str, name: str, path: str) -> Span:
        parent = _context.current_span.get()
        with self._lock:  # spans may come from several threads (functional_call, user threads)
            if parent is not None and not _belongs(parent, self):
                parent = None
            if len(self.spans) >= self.max_spans and kind == "op":
                self.dropped_spans += 1
                return Span(0, name, kind, path, None)  # recorded nowhere: the trace is full
            s = Span(next(self._ids), name, kind, path, parent)
            self.spans.append(s)
            if parent is None:
                self.roots.append(s)
            else:
                parent.children.append(s)
        return s

    def _finish(self, raising: bool = False) -> None:
        self.end = time.time()
        self.nodes = self.graph_records()
        self._live_nodes = []
        if self.otel:
            from langtorch.tracing._otel import export_otel

            try:
                export_otel(self, capture_content=self.capture_content)
            except Exception as e:  # noqa: BLE001
                if not raising:
                    raise
                # The block's own exception matters more than a failed export: warn, not mask.
                import warnings

                warnings.warn(f"OpenTelemetry export of the trace failed: {type(e).__name__}: {e}",
                              RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------------- reading
    def graph_records(self) -> list[dict[str, Any]]:
        """The provenance graph recorded in this trace as plain data: one dict per node
        (``id``, ``op``, ``path``, ``shape``, ``inputs`` = list of ``{"node": id | None,
        "param": name | None, "role", "shape"}``), parameters included as their own entries
        (``op == "parameter"``)."""
        if not self._live_nodes:
            return list(self.nodes)
        records: dict[Any, dict[str, Any]] = {}
        params: dict[int, dict[str, Any]] = {}
        for node in self._live_nodes:
            inputs = []
            for e in node.edges:
                item: dict[str, Any] = {"role": e.role, "shape": list(e.texts.shape),
                                        "node": e.node.id if e.node is not None else None}
                if e.param is not None:
                    pid = params[id(e.param)]["id"] if id(e.param) in params else f"p{len(params) + 1}"
                    if id(e.param) not in params:
                        params[id(e.param)] = {
                            "id": pid, "op": "parameter", "path": node.path,
                            "name": getattr(e.param, "name", None) or "TextParameter",
                            "shape": list(e.texts.shape), "inputs": [],
                            "requires_grad": bool(e.param.requires_grad),
                            "value": None if self.redact_content else [
                                self._text(s) for s in e.texts.reshape(-1).tolist()[:8]],
                        }
                    item["node"] = pid
                inputs.append(item)
            records[node.id] = {"id": node.id, "op": node.op, "path": node.path,
                                "shape": list(node.shape), "inputs": inputs}
        return list(params.values()) + list(records.values())

    def find(self, kind: str | None = None, path: str | None = None, name: str | None = None) -> list[Span]:
        """Spans matching every given field (``path`` matches exactly).

        Example:
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
            >>> len(tr.find(kind="module"))
            1
        """
        return [s for s in self.spans
                if (kind is None or s.kind == kind) and (path is None or s.path == path)
                and (name is None or s.name == name)]

    @property
    def usage(self) -> dict[str, int]:
        """Tokens over all request spans."""
        p = c = 0
        for s in self.spans:
            if s.kind == "request" and s.usage:
                p += int(s.usage.get("prompt_tokens", 0))
                c += int(s.usage.get("completion_tokens", 0))
        return {"prompt_tokens": p, "completion_tokens": c}

    @property
    def cost(self) -> float:
        """Cost over all llm/embed spans (0 when no price is set)."""
        return float(sum(s.cost or 0.0 for s in self.spans if s.kind in ("llm", "embed")))

    def to_records(self) -> list[dict[str, Any]]:
        """One flat row per span (for tables): ids, kind, name, path, times, shapes, usage, cost,
        cached, attempts, error type.

        Example:
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
            >>> tr.to_records()[0]["kind"]
            'module'
        """
        rows = []
        for s in self.spans:
            usage = s.usage or {}
            rows.append({
                "id": s.id, "parent_id": s.parent_id, "kind": s.kind, "name": s.name,
                "path": s.path, "start": s.start, "end": s.end, "duration": s.duration,
                "input_shapes": [i.get("shape") for i in s.inputs],
                "output_shapes": [o.get("shape") for o in s.outputs],
                "prompt_tokens": usage.get("prompt_tokens"),
                "completion_tokens": usage.get("completion_tokens"),
                "cost": s.cost, "cached": s.cached, "attempts": s.attempts,
                "error": s.error["type"] if s.error else None,
            })
        return rows

    def to_pandas(self) -> Any:
        """:meth:`to_records` as a ``pandas.DataFrame`` (needs pandas installed).

        Raises:
            ImportError: pandas is not installed (the message says how to install it).
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Trace.to_pandas() needs pandas: pip install langtorch-jax[pandas] (or pandas)") from None
        return pd.DataFrame(self.to_records())

    def save(self, path: Any) -> None:
        """Write the trace as JSON lines (a header line, one line per span, one per graph node)
        to the file ``path`` (``~`` and environment variables are expanded). No pickle:
        :meth:`load` reads it back with ``json``.

        Example:
            >>> import os, tempfile, langtorch as lt
            >>> with lt.trace() as tr:
            ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
            >>> f = os.path.join(tempfile.mkdtemp(), "t.jsonl"); tr.save(f)
            >>> len(lt.Trace.load(f).spans) == len(tr.spans)
            True
        """
        from langtorch.tracing._saved import save_trace

        save_trace(self, path)

    @classmethod
    def load(cls, path: Any) -> Trace:
        """Read a trace written by :meth:`save` from ``path`` (``~`` and environment variables
        are expanded).

        Raises:
            ValueError: the file is not a langtorch trace (names the line that is wrong).
        """
        from langtorch.tracing._saved import load_trace

        return load_trace(cls, path)

    # ----------------------------------------------------------------------------- views
    def tree(self, *, ops: bool = False, width: int = 60) -> str:
        """The span tree as text (what ``print(tr)`` shows); ``ops=True`` includes op spans."""
        from langtorch.tracing._views import render_tree

        return render_tree(self, ops=ops, width=width)

    def __str__(self) -> str:
        return self.tree()

    def __repr__(self) -> str:
        kinds: dict[str, int] = {}
        for s in self.spans:
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
        parts = ", ".join(f"{k}={v}" for k, v in kinds.items())
        return f"Trace({len(self.spans)} spans: {parts})"

    def to_html(self, path: Any = None) -> str:
        """One self-contained HTML page (no network): the call tree, the selected span's
        inputs/outputs/messages/metadata, a timeline of the requests. Written to ``path`` when
        given; the HTML text is returned."""
        from langtorch.tracing._views import render_html

        html = render_html(self)
        if path is not None:
            with open(user_path(path, what="Trace.to_html: path"), "w", encoding="utf-8") as f:
                f.write(html)
        return html

    def to_dot(self) -> str:
        """DOT source of the provenance graph: ops and modules as nodes (clustered by module
        path), data flow as edges, parameters highlighted."""
        from langtorch.tracing._views import render_dot

        return render_dot(self)

    def render(self, path: Any, format: str = "svg") -> str:
        """Render :meth:`to_dot` with Graphviz to ``path`` (SVG by default); returns the path.

        Raises:
            RuntimeError: the ``graphviz`` package or the ``dot`` program is missing (the
                message names the install commands).
        """
        from langtorch.tracing._views import render_graph

        return render_graph(self, path, format=format)

    def export_otel(self, *, capture_content: bool | None = None, tracer_provider: Any = None) -> None:
        """Emit the spans to OpenTelemetry (GenAI semantic conventions); see ``lt.trace(otel=True)``."""
        from langtorch.tracing._otel import export_otel

        export_otel(self, capture_content=self.capture_content if capture_content is None else capture_content,
                    tracer_provider=tracer_provider)


def _belongs(s: Span, tr: Trace) -> bool:
    return bool(tr.spans) and s.id <= len(tr.spans) and tr.spans[s.id - 1] is s


@contextlib.contextmanager
def trace(*, graph: bool = True, ops: bool = True, redact_content: bool = False,
          max_text_chars: int = DEFAULT_MAX_TEXT_CHARS, max_entries: int = 10_000, otel: bool = False,
          capture_content: bool = True, name: str = "trace") -> Iterator[Trace]:
    """Record a :class:`Trace` of everything run inside the block.

    Tracing never changes results or their order. Errors raised inside are recorded on the
    spans they crossed and propagate unchanged.

    Args:
        graph: record the provenance graph of every op (for :meth:`Trace.to_dot`), not only of
            ops whose inputs require grad. ``lt.no_grad()`` still turns it off.
        ops: give text ops (fill, join, indexing, ...) their own ``op`` spans.
        redact_content: keep only shapes, text lengths and usage (no texts, no messages).
        max_text_chars: texts longer than this are cut (with a note of their length).
        max_entries: at most this many entries are stored per tensor summary.
        otel: also emit the spans to the global OpenTelemetry tracer provider when the block
            ends (needs the ``otel`` extra: ``pip install opentelemetry-sdk``).
        capture_content: with ``otel``, put messages and completions into span attributes.
        name: a label for the trace.

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr:
        ...     _ = lt.TChain(lt.TLayer("Q: {}"), lt.TLayer("{} A:"))(lt.TextTensor(["x"]))
        >>> sorted(s.path for s in tr.find(kind="module"))
        ['TChain', 'TChain.0', 'TChain.1']
    """
    tr = Trace(graph=graph, ops=ops, redact_content=redact_content, max_text_chars=max_text_chars,
               max_entries=max_entries, otel=otel, capture_content=capture_content, name=name)
    if otel:
        from langtorch.tracing._otel import require_otel

        require_otel()
    tr.start = time.time()
    token = _context.active_trace.set(tr)
    span_token = _context.current_span.set(None)
    raising = False
    try:
        yield tr
    except BaseException:
        raising = True
        raise
    finally:
        _context.current_span.reset(span_token)
        _context.active_trace.reset(token)
        tr._finish(raising)


def current_span() -> Span | None:
    """The innermost open span of the active trace, or ``None``.

    Example:
        >>> import langtorch as lt
        >>> with lt.trace(), lt.tracing.span("tool", "t") as s:
        ...     lt.tracing.current_span() is s
        True
    """
    return _context.current_span.get()


@contextlib.contextmanager
def span(kind: str, name: str, *, path: str | None = None, inputs: Sequence[Any] = (),
         attrs: Mapping[str, Any] | None = None, backend: Any = None) -> Iterator[Span | None]:
    """Open a span in the active trace (yields ``None`` when no trace is active).

    For code that adds its own steps to traces, e.g. a tool: ``with lt.tracing.span("tool",
    "search", inputs=[query]) as s: ...``; set ``s.outputs`` with :func:`set_outputs`. An
    exception is recorded in ``s.error`` and re-raised unchanged. ``backend``: a backend whose
    own secrets (API key) must be redacted from every text the trace stores.

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr:
        ...     with lt.tracing.span("tool", "search", inputs=[lt.TextTensor("q")]) as s:
        ...         lt.tracing.set_outputs(s, lt.TextTensor("result"))
        >>> tr.spans[0].kind, tr.spans[0].outputs[0]["texts"]
        ('tool', ['result'])
    """
    if kind not in KINDS:
        raise ValueError(f"span kind must be one of {KINDS}, got {kind!r}")
    tr = _context.active_trace.get()
    if tr is None:
        yield None
        return
    if backend is not None:
        tr.add_secrets(backend)  # before any text of this step is stored
    s = tr.open_span(kind, name, path=path, inputs=inputs, attrs=attrs)
    token = _context.current_span.set(s)
    error = None
    try:
        yield s
    except BaseException as e:
        error = e
        raise
    finally:
        tr.close_span(s, error=error)
        _context.current_span.reset(token)


def set_outputs(s: Span | None, *outputs: Any, metadata: bool = True) -> None:
    """Record ``outputs`` (TextTensors) on span ``s`` (no-op for ``None``); with ``metadata``
    also the first output's metadata columns (hidden ones and object columns summarised).

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr, lt.tracing.span("tool", "lookup") as s:
        ...     lt.tracing.set_outputs(s, lt.TextTensor(["hit"]).with_metadata(score=0.9))
        >>> tr.spans[0].metadata
        {'score': [0.9]}
    """
    if s is None:
        return
    tr = _context.active_trace.get()
    if tr is None:
        return
    s.outputs = [tr._summary(o) for o in outputs]
    first = outputs[0] if outputs else None
    if metadata and first is not None and hasattr(first, "metadata"):
        meta = {}
        for k in first.metadata:
            col = first.metadata.column(k)
            values = col.reshape(-1)[: tr.max_entries]
            if col.dtype.kind in "biuf":
                meta[k] = plain(values)
            else:
                # Texts and objects are content: interned, cut, redacted (or only their lengths).
                meta[k] = [tr._content(plain(v), k) for v in values.tolist()]
        s.metadata = meta


def _redacted_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A request body for a trace: messages as sent (the trace redacts key-shaped text itself),
    every other string leaf redacted (headers or tokens someone put into extra fields)."""
    from langtorch.core.redact import redact

    def leaf(v: Any) -> Any:
        if isinstance(v, str):
            return redact(v)
        if isinstance(v, Mapping):
            return {k: leaf(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [leaf(x) for x in v]
        return v

    return {k: (v if k == "messages" else leaf(v)) for k, v in body.items()}


def _redacted(text: str, *secrets: str) -> str:
    from langtorch.core.redact import redact

    return redact(text, *secrets) or ""


class RequestSpans:
    """The request observer that records each request in the active trace: a ``request`` span
    opened when the runtime starts the request (under the span current then, e.g. the ``llm``
    call's) and closed with its answer or error. Registered by ``langtorch.tracing``.

    Example:
        >>> import langtorch as lt
        >>> from langtorch.core import Choice, Completion
        >>> from langtorch.core.events import RequestEvent, observe_request
        >>> with lt.trace() as tr:
        ...     with observe_request(RequestEvent(None, {"model": "m", "messages": []}, [0])) as ev:
        ...         ev.result = Completion((Choice("ok"),), model="m")
        >>> [(s.kind, s.response["choices"][0]["text"]) for s in tr.spans]
        [('request', 'ok')]
    """

    def request_started(self, event: Any) -> tuple[Trace, Span] | None:
        tr = _context.active_trace.get()
        if tr is None:
            return None
        if event.backend is not None:
            tr.add_secrets(event.backend)  # before the body is stored
        return tr, tr.open_request(event.body, entries=event.entries)

    def request_ended(self, event: Any, state: tuple[Trace, Span] | None) -> None:
        if state is not None:
            tr, s = state
            tr.close_request(s, event.result, attempts=event.attempts, error=event.error)
