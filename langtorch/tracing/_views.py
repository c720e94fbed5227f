"""Views of a :class:`~langtorch.tracing.Trace`: a terminal tree, one self-contained HTML page,
and the provenance graph as DOT source or a rendered SVG.

Every view reads only the trace's plain data (its spans and :meth:`Trace.graph_records`), so it
works the same on a live trace and on one read back with :meth:`Trace.load`. Views stay bounded on
large traces: the tree collapses long child lists ("… N more requests"), the HTML page renders
children and timeline rows on demand, and the DOT graph draws at most ``max_nodes`` ops.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

from langtorch.core import user_path
from langtorch.tracing._records import plain, recorded_text

__all__ = ["render_dot", "render_graph", "render_html", "render_tree"]

# A child list longer than _COLLAPSE_AT shows its first _HEAD entries, then up to _MAX_ERRORS of
# the failed ones among the rest, then one summary line.
_COLLAPSE_AT = 8
_HEAD = 5
_MAX_ERRORS = 3


# ----------------------------------------------------------------------------- shared helpers
def _duration(s: Any) -> str:
    d = s.duration
    if d is None:
        return "open"
    if d < 1.0:
        return f"{d * 1000:.1f} ms"
    return f"{d:.2f} s"


def _shape(shape: Any) -> str:
    if not isinstance(shape, (list, tuple)):
        return "?"
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _summary_shape(summary: Mapping[str, Any]) -> str:
    if "shape" in summary:
        return _shape(summary["shape"])
    return str(summary.get("type", "?"))


def _shapes(summaries: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(_summary_shape(x) for x in summaries)


def _clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters (an ellipsis marks the cut)."""
    if len(text) > width:
        return text[: max(width - 1, 1)] + "…"
    return text


def _quoted(text: str, width: int) -> str:
    # json.dumps shows newlines and control characters as escapes, so one entry stays one line.
    return json.dumps(_clip(text, width), ensure_ascii=False)


def _chars(value: Any) -> int | None:
    """The length a redacted content recorded (``{"chars": n}``, also inside text parts or an
    embedding request's inputs); ``None`` when it recorded none."""
    if isinstance(value, Mapping):
        if isinstance(value.get("chars"), int):
            return value["chars"]
        return _chars(value.get("text"))  # a redacted text part
    if isinstance(value, list):
        counts = [n for n in map(_chars, value) if n is not None]
        return sum(counts) if counts else None
    return None


def _shown(value: Any, width: int) -> str:
    """A body field for the tree: quoted and clipped text, or ``‹N chars›`` when redacted."""
    text = recorded_text(value)
    if text is not None:
        return _quoted(text, width)
    n = _chars(value)
    return f"‹{n} chars›" if n is not None else "‹?›"


def _prompt(request: Mapping[str, Any] | None) -> Any:
    """The last user (or tool) message content of a request body (the question it asked)."""
    if not isinstance(request, Mapping):
        return None
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        for m in reversed(messages):
            if isinstance(m, Mapping) and m.get("role") in ("user", "tool"):
                return m.get("content")
        last = messages[-1]
        return last.get("content") if isinstance(last, Mapping) else None
    if "input" in request:  # an embedding request: its inputs, joined as one text
        inputs = request["input"]
        if isinstance(inputs, list) and inputs and all(isinstance(t, str) for t in inputs):
            return "".join(inputs)
        return inputs
    return None


def _answer(response: Mapping[str, Any] | None, width: int) -> str | None:
    if not isinstance(response, Mapping):
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    first = choices[0] if isinstance(choices[0], Mapping) else {}
    calls = first.get("tool_calls")
    if calls and first.get("text") in (None, ""):
        names = []
        for c in calls if isinstance(calls, list) else []:
            fn = c.get("function", c) if isinstance(c, Mapping) else {}
            names.append(str(fn.get("name", "?")) if isinstance(fn, Mapping) else "?")
        shown = "tool_calls " + ", ".join(names)
    else:
        shown = _shown(first.get("text"), width)
    if len(choices) > 1:
        shown += f" (+{len(choices) - 1} choices)"
    return shown


def _tokens(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, Mapping):
        return None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def _has_error(s: Any) -> bool:
    return bool(s.error)


def _entries(s: Any) -> str:
    entries = s.attrs.get("entries") if isinstance(s.attrs, Mapping) else None
    if isinstance(entries, list) and entries:
        shown = ",".join(str(e) for e in entries[:4])
        return shown + (",…" if len(entries) > 4 else "")
    return ""


def _visible(children: Iterable[Any], ops: bool) -> Iterator[Any]:
    """Children to show: hidden op spans are replaced by their own (visible) children."""
    for c in children:
        if c.kind == "op" and not ops:
            yield from _visible(c.children, ops)
        else:
            yield c


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# ------------------------------------------------------------------------------ terminal tree
def render_tree(trace: Any, *, ops: bool = False, width: int = 60) -> str:
    """The trace as a text tree: modules, LLM calls and their requests, one line each.

    Each line shows the module path and class, input and output shapes, tokens (prompt +
    completion), cost (when priced), latency, cache hits, retries and errors (``✗ Type:
    message``). Request lines show the prompt and the answer, cut to ``width`` characters. A long
    list of children shows its first few (and any failed ones), then ``… N more requests``, so
    the output stays short for traces of thousands of requests.

    Args:
        trace: a :class:`~langtorch.tracing.Trace`.
        ops: include text op spans (``fill``, ``add``, ...); hidden by default.
        width: longest text shown for a prompt or an answer (error messages get twice that).

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr:
        ...     _ = lt.TChain(lt.TLayer("Q: {}"), lt.TLayer("{} A:"))(lt.TextTensor(["x", "y"]))
        >>> print(render_tree(tr).splitlines()[2])  # doctest: +ELLIPSIS
        ├─ TChain.0 TLayer  [2] -> [2]  ... ms
    """
    if not isinstance(width, int) or isinstance(width, bool) or width < 4:
        raise ValueError(f"width must be an int >= 4, got {width!r}")
    lines = [_trace_line(trace)]
    roots = list(_visible(trace.roots, ops))
    if not roots:
        lines.append("(no spans recorded)")
    _render_children(roots, "", lines, ops, width, top=True)
    return "\n".join(lines)


def _trace_line(trace: Any) -> str:
    requests = [s for s in trace.spans if s.kind == "request"]
    parts = [str(getattr(trace, "name", "trace") or "trace"), f"{len(trace.spans)} spans"]
    if requests:
        cached = sum(1 for s in requests if s.cached is True)
        failed = sum(1 for s in requests if s.error)
        extra = ", ".join(x for x in (f"{cached} cached" if cached else "",
                                      f"{failed} failed" if failed else "") if x)
        parts.append(_plural(len(requests), "request") + (f" ({extra})" if extra else ""))
        p = sum((_tokens(s.usage) or (0, 0))[0] for s in requests)
        c = sum((_tokens(s.usage) or (0, 0))[1] for s in requests)
        parts.append(f"tokens {p}+{c}")
    cost = sum(s.cost or 0.0 for s in trace.spans if s.kind in ("llm", "embed"))
    if cost:
        parts.append(f"${cost:.4g}")
    start, end = getattr(trace, "start", None), getattr(trace, "end", None)
    if start is not None and end is not None:
        d = end - start
        parts.append(f"{d * 1000:.1f} ms" if d < 1 else f"{d:.2f} s")
    return "  ".join(parts)


def _select(children: list[Any]) -> tuple[list[Any], list[Any]]:
    """(shown, hidden) children: all when few, else the head, some failures, and the rest."""
    if len(children) <= _COLLAPSE_AT:
        return children, []
    head = children[:_HEAD]
    errors = [c for c in children[_HEAD:] if _has_error(c)][:_MAX_ERRORS]
    keep = {id(c) for c in head} | {id(c) for c in errors}
    return ([c for c in children if id(c) in keep],
            [c for c in children if id(c) not in keep])


def _render_children(children: list[Any], prefix: str, lines: list[str], ops: bool, width: int,
                     top: bool = False) -> None:
    shown, hidden = _select(children)
    items: list[Any] = list(shown)
    if hidden:
        items.append(_more_line(hidden))
    for k, item in enumerate(items):
        last = k == len(items) - 1
        branch, cont = ("", "") if top else (("└─ ", "   ") if last else ("├─ ", "│  "))
        if isinstance(item, str):
            lines.append(prefix + branch + item)
            continue
        lines.append(prefix + branch + _span_line(item, width))
        grandchildren = list(_visible(item.children, ops))
        if grandchildren:
            _render_children(grandchildren, prefix + cont, lines, ops, width)


def _more_line(hidden: list[Any]) -> str:
    word = "request" if all(s.kind == "request" for s in hidden) else "span"
    details = []
    cached = sum(1 for s in hidden if s.cached is True)
    failed = sum(1 for s in hidden if s.error)
    if cached:
        details.append(f"{cached} cached")
    if failed:
        details.append(f"{failed} failed")
    usage = [_tokens(s.usage) for s in hidden if s.kind == "request"]
    if any(u is not None for u in usage):
        p = sum(u[0] for u in usage if u)
        c = sum(u[1] for u in usage if u)
        details.append(f"tokens {p}+{c}")
    return f"… {_plural(len(hidden), 'more ' + word)}" + (f" ({', '.join(details)})" if details else "")


def _label(s: Any) -> str:
    """Path and class, e.g. ``TChain.0 TLayer`` (the name once when the path ends with it)."""
    path = s.path or ""
    if s.kind == "module":
        if not path:
            return s.name
        return path if path.split(".")[-1] == s.name else f"{path} {s.name}"
    if s.kind in ("llm", "embed"):
        model = s.attrs.get("model") if isinstance(s.attrs, Mapping) else None
        base = (path if path.split(".")[-1] == s.name else f"{path} {s.name}") if path else s.name
        return f"{base}  {s.kind}" + (f" {model}" if model else "")
    if s.kind == "tool":
        return f"{path}  tool {s.name}" if path else f"tool {s.name}"
    if s.kind == "op":
        return f"op {s.name}"
    return s.name


def _span_line(s: Any, width: int) -> str:
    if s.kind == "request":
        return _request_line(s, width)
    parts = [_label(s)]
    if s.inputs or s.outputs:
        parts.append(f"{_shapes(s.inputs) or '-'} -> {_shapes(s.outputs) or '-'}")
    if s.kind == "tool":
        if s.inputs and s.inputs[0].get("texts"):
            text = _quoted(str(s.inputs[0]["texts"][0]), width)
            out = s.outputs[0].get("texts") if s.outputs else None
            parts.append(text + (f" -> {_quoted(str(out[0]), width)}" if out else ""))
    tokens = _tokens(s.usage)
    if tokens is not None and s.kind in ("llm", "embed") and any(tokens):
        parts.append(f"tokens {tokens[0]}+{tokens[1]}")
    if s.cost:
        parts.append(f"${s.cost:.4g}")
    parts.append(_duration(s))
    if s.kind in ("llm", "embed"):
        parts.extend(_call_counts(s))
    elif isinstance(s.attempts, int) and s.attempts > 1:
        parts.append(f"{s.attempts} attempts")
    if s.error:
        parts.append(_error(s.error, width))
    return "  ".join(p for p in parts if p)


def _call_counts(s: Any) -> list[str]:
    requests = [c for c in s.children if c.kind == "request"]
    out = []
    if requests:
        cached = sum(1 for c in requests if c.cached is True)
        failed = sum(1 for c in requests if c.error)
        extra = ", ".join(x for x in (f"{cached} cached" if cached else "",
                                      f"{failed} failed" if failed else "") if x)
        out.append(_plural(len(requests), "request") + (f" ({extra})" if extra else ""))
        sent = sum(1 for c in requests if c.cached is not True)
        if isinstance(s.attempts, int) and s.attempts > sent:
            retries = s.attempts - sent
            out.append(f"{retries} retr{'y' if retries == 1 else 'ies'}")
    elif isinstance(s.cached, int) and not isinstance(s.cached, bool) and s.cached:
        out.append(f"{s.cached} cached")
    return out


def _request_line(s: Any, width: int) -> str:
    entries = _entries(s)
    parts = ["request" + (f" {entries}" if entries else "")]
    if s.cached is True:
        parts.append("cached")
    prompt = _prompt(s.request)
    if prompt is not None or s.response:
        text = _shown(prompt, width) if prompt is not None else "‹?›"
        answer = _answer(s.response, width)
        parts.append(text + (f" -> {answer}" if answer else ""))
    tokens = _tokens(s.usage)
    if tokens is not None and (any(tokens) or s.cached is not True):
        parts.append(f"{tokens[0]}+{tokens[1]} tok")
    if s.cost:
        parts.append(f"${s.cost:.4g}")
    parts.append(_duration(s))
    if isinstance(s.attempts, int) and s.attempts > 1:
        parts.append(f"{s.attempts} attempts")
    if s.error:
        parts.append(_error(s.error, width))
    return "  ".join(parts)


def _error(error: Any, width: int) -> str:
    if not isinstance(error, Mapping):
        return f"✗ {_clip(str(error), width)}"
    # Errors get twice the room of texts: the cause is usually at the end of the message.
    message = " ".join(str(error.get("message", "")).split())
    return f"✗ {error.get('type', 'Error')}: {_clip(message, 2 * width)}"


# ---------------------------------------------------------------------------------- HTML page
def _script_json(data: Any) -> str:
    """JSON for a ``<script type="application/json">`` block: ``<``, ``>`` and ``&`` as
    ``\\u`` escapes, so no text (``</script>``, ``<!--``) can end the block early. They only
    ever occur inside JSON strings, where the escapes mean the same characters."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_html(trace: Any) -> str:
    """The trace as one self-contained HTML page (inline CSS and JavaScript, no network).

    Left: the call tree (click ▸ to expand; long child lists show 50 at a time). Right: the
    selected span's kind, path, timing, inputs and outputs, the request messages and response
    (for a request span), metadata, usage, cost and error. Below: a timeline of the requests.
    Open ``page.html#span-7`` to select span 7. Texts are inserted as text (never as markup), and
    the data is embedded so that no text can end its ``<script>`` block.

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr:
        ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
        >>> page = render_html(tr)
        >>> page.startswith("<!DOCTYPE html>") and "lt-data" in page
        True
    """
    spans = []
    for s in trace.spans:
        d = s.to_dict()
        d["duration"] = s.duration
        spans.append(d)
    data = {"name": str(getattr(trace, "name", "trace") or "trace"),
            "start": getattr(trace, "start", None), "end": getattr(trace, "end", None),
            "redact_content": bool(getattr(trace, "redact_content", False)),
            "roots": [s.id for s in trace.roots], "spans": spans}
    title = html.escape(f"langtorch trace: {data['name']}")
    page, css, js = _page_parts()
    parts = {"TITLE": title, "CSS": css, "JS": js, "DATA": _script_json(plain(data))}
    # One pass, so a placeholder-like text inside the data or the title is never substituted.
    return re.sub(r"%(TITLE|CSS|JS|DATA)%", lambda m: parts[m.group(1)], page)


def _asset(name: str) -> str:
    """A file of the HTML view (``langtorch/tracing/assets/``), shipped as package data."""
    return resources.files("langtorch.tracing").joinpath("assets", name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _page_parts() -> tuple[str, str, str]:
    """The page template, its CSS and its script (read once). The script never assigns
    innerHTML: every text reaches the page through textContent."""
    return _asset("page.html"), _asset("trace.css"), _asset("trace.js")


# -------------------------------------------------------------------------------------- DOT
def _dot_str(text: Any) -> str:
    """``text`` as a DOT double-quoted string: backslashes and quotes escaped, line breaks as
    ``\\n``, ``&`` as ``&amp;`` (Graphviz decodes entities such as ``&amp;`` in labels), other
    control characters dropped (braces, ``<``, ``|`` are plain in a quoted label of a non-record
    shape)."""
    s = str(text)
    s = s.replace("&", "&amp;").replace("\\", "\\\\").replace('"', '\\"')
    s = s.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n")
    s = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", s)
    return f'"{s}"'


def _preview(value: Any, width: int = 40) -> str:
    """A short quoted form of a parameter value for a node label (escapes visible)."""
    if isinstance(value, list):
        if not value:
            return ""
        first = _preview(value[0], width)
        return first + (f" (+{len(value) - 1})" if len(value) > 1 else "")
    if value is None:
        return "(content not recorded)"
    return json.dumps(_clip(str(value), width), ensure_ascii=False)


def _dot_attrs(**attrs: Any) -> str:
    return "[" + ", ".join(f"{k}={_dot_str(v)}" for k, v in attrs.items() if v is not None) + "]"


def render_dot(trace: Any, *, max_nodes: int = 1000) -> str:
    """DOT source of the trace's provenance graph (:meth:`Trace.graph_records`).

    One node per op (its name and output shape) and per parameter (filled amber when it requires
    grad, grey when frozen, with its name and a short value); edges follow the data from each
    input to the op that used it, labelled by the input's role (``template``, ``values``,
    ``input``, ...). Leaf inputs are small ellipses. Ops are clustered by module call path, nested
    as the modules are. Graphs of more than ``max_nodes`` ops draw the first ``max_nodes`` and say
    how many were left out. A trace without graph nodes gives a valid empty graph with a note.

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr:
        ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
        >>> src = render_dot(tr)
        >>> src.startswith("digraph") and "cluster" in src
        True
    """
    records = list(trace.graph_records())
    head = ["digraph langtorch {",
            '  graph [rankdir=LR, fontname="Helvetica", fontsize=10, charset="UTF-8", '
            'labeljust=l, nodesep=0.25, ranksep=0.35];',
            '  node [fontname="Helvetica", fontsize=10, shape=box, style=rounded, height=0.3];',
            '  edge [fontname="Helvetica", fontsize=9, color="#57606a", fontcolor="#57606a"];']
    ops = [r for r in records if r.get("op") != "parameter"]
    params = {str(r["id"]): r for r in records if r.get("op") == "parameter"}
    if not ops and not params:
        note = "No provenance graph in this trace (no text ops ran, or they ran under lt.no_grad())."
        return "\n".join([*head, f"  note [shape=plaintext, label={_dot_str(note)}];", "}"]) + "\n"

    left_out = max(len(ops) - max_nodes, 0)
    ops = ops[:max_nodes]
    dot = _DotGraph(params, drawn={str(r["id"]) for r in ops}, recorded={str(r["id"]) for r in records})
    for r in ops:
        dot.op(r)
    for key, p in params.items():
        if left_out and key not in dot.used_params:  # used only by ops that are not drawn
            continue
        dot.param(key, p)
    return dot.source(head, left_out)


class _DotGraph:
    """The DOT statements of one provenance graph as they are collected: node lines grouped by
    module path (drawn as clusters), edges, and placeholders for producers outside the trace."""

    def __init__(self, params: Mapping[str, Mapping[str, Any]], drawn: set[str], recorded: set[str]):
        self.params, self.drawn, self.recorded = params, drawn, recorded
        self.by_path: dict[str, list[str]] = {}
        self.edges: list[str] = []
        self.external: dict[str, str] = {}
        self.used_params: set[str] = set()

    def place(self, path: str, line: str) -> None:
        self.by_path.setdefault(path or "", []).append(line)

    def op(self, r: Mapping[str, Any]) -> None:
        """An op's node and an edge from each of its inputs (a leaf input gets its own node)."""
        nid = f"n{r['id']}"
        path = str(r.get("path") or "")
        fill = "#dbeafe" if r.get("op") in ("llm", "embed") else "#ffffff"
        self.place(path, f"    {_dot_str(nid)} " + _dot_attrs(
            label=f"{r.get('op')}\n{_shape(r.get('shape'))}", style="rounded,filled", fillcolor=fill))
        for k, inp in enumerate(r.get("inputs") or []):
            src = inp.get("node")
            role = inp.get("role") or ""
            if src is None:
                leaf = f"in{r['id']}_{k}"
                self.place(path, f"    {_dot_str(leaf)} " + _dot_attrs(
                    label=f"input\n{_shape(inp.get('shape'))}", shape="ellipse", fontsize="9",
                    color="#8c959f", fontcolor="#57606a"))
                self.edges.append(f"  {_dot_str(leaf)} -> {_dot_str(nid)} {_dot_attrs(label=role)};")
                continue
            key = str(src)
            if key in self.params:
                self.used_params.add(key)
                self.edges.append(f"  {_dot_str(key)} -> {_dot_str(nid)} {_dot_attrs(label=role, color='#b45309')};")
            elif key in self.drawn:
                self.edges.append(f"  {_dot_str('n' + key)} -> {_dot_str(nid)} {_dot_attrs(label=role)};")
            elif key in self.recorded:  # a producer past max_nodes (ops are recorded producers first)
                continue
            else:
                ext = self.external.setdefault(key, f"ext{key}")
                self.edges.append(f"  {_dot_str(ext)} -> {_dot_str(nid)} {_dot_attrs(label=role, style='dashed')};")

    def param(self, key: str, p: Mapping[str, Any]) -> None:
        """A parameter's node: amber and bold when it requires grad, grey when frozen."""
        trainable = bool(p.get("requires_grad"))
        value = p.get("value")
        tooltip = "\n".join(str(v) for v in value)[:500] if isinstance(value, list) else None
        self.place(str(p.get("path") or ""), f"    {_dot_str(key)} " + _dot_attrs(
            label=f"{p.get('name') or 'TextParameter'}\n{_shape(p.get('shape'))}  "
                  f"{'requires_grad' if trainable else 'frozen'}\n{_preview(value)}",
            shape="box", style="rounded,filled,bold" if trainable else "rounded,filled",
            fillcolor="#fde68a" if trainable else "#e5e7eb", color="#b45309" if trainable else "#8c959f",
            penwidth="2" if trainable else None, tooltip=tooltip))

    def source(self, head: list[str], left_out: int) -> str:
        lines = list(head)
        for key, ext in self.external.items():
            lines.append(f"  {_dot_str(ext)} " + _dot_attrs(label=f"node {key}\n(outside this trace)",
                                                              shape="box", style="dashed", fontcolor="#57606a"))
        lines.extend(self.by_path.pop("", []))
        lines.extend(_clusters(self.by_path))
        if left_out:
            lines.append(f"  more [shape=plaintext, label={_dot_str(f'… {left_out} more ops not drawn')}];")
        lines.extend(self.edges)
        lines.append("}")
        return "\n".join(lines) + "\n"


def _clusters(by_path: Mapping[str, list[str]]) -> list[str]:
    """Nested ``subgraph cluster_*`` blocks, one per module path (``A.b`` inside ``A``)."""
    tree: dict[str, Any] = {}
    for path in by_path:
        level = tree
        for part in path.split("."):
            level = level.setdefault(part, {})
    out: list[str] = []
    counter = [0]

    def emit(level: Mapping[str, Any], prefix: str, indent: str) -> None:
        for part, sub in level.items():
            path = f"{prefix}.{part}" if prefix else part
            counter[0] += 1
            out.append(f"{indent}subgraph {_dot_str(f'cluster_{counter[0]}')} {{")
            out.append(f"{indent}  label={_dot_str(path)}; style=\"rounded,dashed\"; color=\"#8c959f\"; "
                       f"fontcolor=\"#57606a\";")
            out.extend(f"{indent}  {line.strip()}" for line in by_path.get(path, []))
            emit(sub, path, indent + "  ")
            out.append(f"{indent}}}")

    emit(tree, "", "  ")
    return out


_INSTALL_DOT = ("install the Graphviz programs: apt-get install graphviz (Debian/Ubuntu), "
                "brew install graphviz (macOS), or see https://graphviz.org/download/")


def render_graph(trace: Any, path: Any, format: str = "svg") -> str:
    """Render :func:`render_dot` with Graphviz's ``dot`` into the file ``path``; returns it.

    Args:
        trace: a :class:`~langtorch.tracing.Trace`.
        path: the file to write (written as given; no extension is added).
        format: any Graphviz output format (``"svg"``, ``"png"``, ``"pdf"``, ...).

    Raises:
        RuntimeError: the ``graphviz`` Python package or the ``dot`` program is missing (the
            message names the install commands).

    Example:
        >>> import os, tempfile, langtorch as lt
        >>> with lt.trace() as tr:
        ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
        >>> out = render_graph(tr, os.path.join(tempfile.mkdtemp(), "g.svg"))  # doctest: +SKIP
        >>> open(out).read().lstrip().startswith("<?xml")  # doctest: +SKIP
        True
    """
    try:
        import graphviz
    except ImportError:
        raise RuntimeError("Trace.render() needs the graphviz Python package: pip install graphviz "
                           f"(and the Graphviz programs; {_INSTALL_DOT}).") from None
    if shutil.which("dot") is None:
        raise RuntimeError(f"Trace.render() needs the Graphviz 'dot' program, which is not on PATH: {_INSTALL_DOT}.")
    source = graphviz.Source(render_dot(trace))
    try:
        data = source.pipe(format=format)
    except graphviz.ExecutableNotFound:
        raise RuntimeError(f"Trace.render() could not run Graphviz 'dot': {_INSTALL_DOT}.") from None
    path = os.fspath(user_path(path, what="Trace.render: path"))
    with open(path, "wb") as f:
        f.write(data)
    return path
