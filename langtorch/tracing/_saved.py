"""A trace as a file: :meth:`Trace.save` writes JSON lines (a header, one line per span, one per
graph node; strict JSON, no pickle) and :meth:`Trace.load` reads them back, checking every record
and the span tree they describe."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langtorch.core import user_path
from langtorch.tracing._records import plain
from langtorch.tracing._trace import Span

if TYPE_CHECKING:
    from langtorch.tracing._trace import Trace

__all__ = ["load_trace", "save_trace"]


def save_trace(trace: Trace, path: Any) -> None:
    """Write ``trace`` to ``path`` (what :meth:`Trace.save` does)."""
    header = {"type": "trace", "version": 1, "name": trace.name, "start": trace.start, "end": trace.end,
              "redact_content": trace.redact_content, "max_text_chars": trace.max_text_chars}
    path = user_path(path, what="Trace.save: path")
    with open(path, "w", encoding="utf-8") as f:
        for record in itertools.chain([header], ({"type": "span", **s.to_dict()} for s in trace.spans),
                                      ({"type": "node", **n} for n in trace.graph_records())):
            f.write(json.dumps(plain(record), ensure_ascii=False, allow_nan=False) + "\n")


def load_trace(cls: type[Trace], path: Any) -> Trace:
    """Read a trace written by :func:`save_trace` as a ``cls`` (what :meth:`Trace.load` does)."""
    path = user_path(path, what="Trace.load: path")
    tr = cls()
    by_id: dict[int, Span] = {}
    children: dict[int, list[int]] = {}
    header = False

    def bad(lineno: int, what: str) -> ValueError:
        return ValueError(f"{path}: line {lineno}: {what}; not a trace written by Trace.save")

    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise bad(lineno, f"not JSON ({e})") from None
            if not isinstance(d, dict):
                raise bad(lineno, f"expected a JSON object, got {type(d).__name__}")
            kind = d.pop("type", None)
            if not header and kind != "trace":
                raise bad(lineno, "the first record must be the trace header")
            if kind == "trace":
                if header:
                    raise bad(lineno, "a second trace header")
                header = True
                tr.name, tr.start, tr.end = str(d.get("name", "trace")), d.get("start"), d.get("end")
                tr.redact_content = bool(d.get("redact_content", False))
            elif kind == "span":
                problem = _span_record_problem(d, by_id)
                if problem is not None:
                    raise bad(lineno, problem)
                s = Span.from_dict(d)
                by_id[s.id] = s
                children[s.id] = d.get("children", [])
                tr.spans.append(s)
            elif kind == "node":
                tr.nodes.append(d)
            else:
                raise bad(lineno, f"unknown record type {kind!r}")
    if not header:
        raise ValueError(f"{path}: empty file; not a trace written by Trace.save")
    _link_tree(tr, by_id, children, path)
    return tr


def _span_record_problem(d: Mapping[str, Any], by_id: Mapping[int, Span]) -> str | None:
    """What is wrong with one span record of a saved trace (``None``: nothing)."""
    sid, kids, pid = d.get("id"), d.get("children", []), d.get("parent_id")
    if not isinstance(sid, int) or isinstance(sid, bool) or sid < 1 or sid in by_id:
        return f"span id must be a new positive int, got {sid!r}"
    if not isinstance(kids, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in kids):
        return "span children must be a list of span ids"
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        return f"parent_id must be an int or null, got {pid!r}"
    for key, types in (("name", str), ("kind", str), ("path", str), ("inputs", list),
                       ("outputs", list), ("attrs", dict), ("metadata", dict)):
        if key in d and not isinstance(d[key], types):
            return f"span field {key!r} has the wrong type ({type(d[key]).__name__})"
    for key in ("start", "end", "cost"):
        if d.get(key) is not None and not isinstance(d[key], (int, float)):
            return f"span field {key!r} must be a number"
    for key in ("usage", "error", "request", "response"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            return f"span field {key!r} must be an object or null"
    if "name" not in d or "kind" not in d:
        return "a span needs 'name' and 'kind'"
    return None


def _link_tree(tr: Trace, by_id: dict[int, Span], children: dict[int, list[int]], path: Any) -> None:
    """Link read-back spans to their parents and children (filling ``tr.roots``), checking that
    both sides agree and that every span is reached from a root exactly once."""
    for s in tr.spans:
        kids = children[s.id]
        for c in kids:
            if c not in by_id or by_id[c].parent_id != s.id:
                raise ValueError(f"{path}: span {s.id} lists child {c}, whose parent_id does not match")
        s.children = [by_id[c] for c in kids]
        if s.parent_id is not None:
            if s.parent_id not in by_id or s.id not in children[s.parent_id]:
                raise ValueError(f"{path}: span {s.id} has parent_id {s.parent_id}, which does not list it")
            s.parent = by_id[s.parent_id]
        else:
            tr.roots.append(s)
    # Every span must be reachable from a root exactly once (no cycles).
    seen: set[int] = set()
    stack = list(tr.roots)
    while stack:
        s = stack.pop()
        if s.id in seen:
            raise ValueError(f"{path}: span {s.id} is reached twice; the tree has a cycle")
        seen.add(s.id)
        stack.extend(s.children)
    if len(seen) != len(tr.spans):
        raise ValueError(f"{path}: {len(tr.spans) - len(seen)} spans are not reachable from a root (a cycle)")
