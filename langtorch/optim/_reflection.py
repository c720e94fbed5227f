"""GEPA's reflection: show components with their own feedback, get rewrites in structured output."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.autograd import ask_feedback
from langtorch.optim._pool import get_entry, put_entry
from langtorch.optim._tgd import _escape_literal_braces, _fields
from langtorch.runtime import run_sync

__all__ = ["Reflector", "check_value", "examples_from_trace", "worst_components"]

_SYSTEM = (
    "You improve the text parameters (prompts, instructions, demonstrations) of a language-model "
    "pipeline. You are shown components of the pipeline, the feedback each component received "
    "(propagated back from the pipeline's outputs), and examples with their outputs and scores. "
    "Rewrite the components so that the failures described in the feedback do not happen again, "
    "keeping what works. Answer only with the JSON object asked for.")

# A component offered for rewriting: (display name, parameter name, entry index or None, its
# feedback, the mean loss score behind that feedback).
Offered = tuple[str, str, "tuple[int, ...] | None", str, float]


def schema(names: Sequence[str]) -> dict[str, Any]:
    """The JSON schema of a reflection answer for the offered component ``names``.

    Example:
        >>> schema(["prompt"])["properties"]["proposals"]["items"]["required"]
        ['rewrites']
    """
    rewrite = {"type": "object",
               "properties": {"component": {"type": "string", "enum": list(names)},
                              "new_value": {"type": "string"}},
               "required": ["component", "new_value"], "additionalProperties": False}
    proposal = {"type": "object", "properties": {"rewrites": {"type": "array", "items": rewrite, "minItems": 1}},
                "required": ["rewrites"], "additionalProperties": False}
    return {"type": "object",
            "properties": {"reasoning": {"type": "string"},
                           "proposals": {"type": "array", "items": proposal, "minItems": 1}},
            "required": ["reasoning", "proposals"], "additionalProperties": False}


def check_value(new: str, old: str) -> str:
    """The new value of a component when it keeps the old one's placeholders (literal braces an
    engine wrote single are doubled for it), else ``ValueError``.

    Example:
        >>> check_value(' Answer {q} as {"label": 1} ', "Answer {q}.")
        'Answer {q} as {{"label": 1}}'
    """
    new = new.strip()
    if not new:
        raise ValueError("the new value is empty")
    old_fields = _fields(old)
    if old_fields is None:
        return new  # the old value is not a template (plain text): any text will do
    if _fields(new) != old_fields:
        escaped = _escape_literal_braces(new, old_fields)
        if escaped is not None and _fields(escaped) == old_fields:
            return escaped
        raise ValueError(f"the new value must keep exactly the placeholders {list(old_fields)}, got "
                         f"{list(_fields(new) or ['<not a valid template>'])}")
    return new


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (json.JSONDecodeError, TypeError):
        return False


class Reflector:
    """Asks the reflection engine (a :class:`~langtorch.autograd.FeedbackEngine`) for up to ``proposals`` children of a
    candidate, each rewriting some of the offered components; malformed answers are asked again
    (not from the cache) up to ``max_attempts`` times.
    """

    def __init__(self, engine: Any, proposals: int, max_attempts: int):
        self.engine = engine
        self.proposals = proposals
        self.max_attempts = max_attempts

    def request(self, cand: Mapping[str, Any], offered: Sequence[Offered], rows: Sequence[tuple],
                examples: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
        """The chat messages asking for rewrites: each offered component with its value and its
        own feedback, the minibatch's ``(input, output, score, feedback)`` rows, and the four
        lowest-scored trace examples."""
        parts = ["Components you may rewrite, with the feedback each received:"]
        for name, pname, idx, text, s in offered:
            value = get_entry(cand[pname], idx)
            keep = _fields(value)
            rule = (f"\n(A template: keep exactly the placeholders {', '.join('{' + f + '}' for f in keep)}; "
                    "write literal braces doubled.)" if keep else "")
            score = f" (mean score {s:.3g} of the examples behind it)" if np.isfinite(s) else ""
            parts.append(f"### component: {name}\nCurrent value:\n<<<\n{value}\n>>>{rule}\n"
                         f"Feedback{score}:\n<<<\n{text}\n>>>")
        parts.append("Examples from this minibatch:\n" + "\n".join(
            f"- Input: {x}\n  Output: {o}\n  Score: {s:g}\n  Feedback: {f}" for x, o, s, f in rows))
        if examples:
            worst = sorted(examples, key=lambda e: e["score"])[:4]
            parts.append("Examples from production traces:\n" + "\n".join(
                f"- Input: {e['input']}\n  Output: {e['output']}\n  Score: {e['score']:g}\n  Feedback: {e['feedback']}"
                for e in worst))
        k = self.proposals
        parts.append(f"Write {k} proposal{'s' if k > 1 else ''}{' (different from each other)' if k > 1 else ''}; "
                     "each rewrites one or more of the components above. Reply with JSON: "
                     '{"reasoning": "<short>", "proposals": [{"rewrites": [{"component": "<name>", '
                     '"new_value": "<the new text>"}]}]}')
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]

    def propose(self, cand: Mapping[str, Any], offered: Sequence[Offered], rows: Sequence[tuple],
                examples: Sequence[Mapping[str, Any]], budget: Any) -> tuple[list[tuple[dict, list[str]]], str]:
        """``(children, problem)``: the usable children as ``(candidate, changed components)``
        (none equal to ``cand`` or to each other), and the last problem when there are none."""
        by_name = {name: (pname, idx) for name, pname, idx, _, _ in offered}
        fmt = {"type": "json_schema", "json_schema": {"name": "gepa_proposals", "schema": schema(list(by_name))}}
        request = self.request(cand, offered, rows, examples)
        room = 400 + sum(len(str(get_entry(cand[p], i))) for _, p, i, _, _ in offered) * self.proposals // 2
        problem = ""
        for _ in range(self.max_attempts):
            # An answer that is not the JSON asked for is never cached: asking again gets a new one.
            with budget:
                answer = run_sync(ask_feedback(self.engine, [request], response_format=fmt, token_room=room,
                                                validate=_is_json_object))[0]
            try:
                parsed = json.loads(answer.text)
            except (json.JSONDecodeError, TypeError):
                problem = f"the answer is not JSON: {answer.text[:200]!r}"
                continue
            children, problem = self.children(cand, parsed, by_name)
            if children:
                return children, ""
        return [], problem

    def children(self, cand: Mapping[str, Any], parsed: Any,
                 by_name: Mapping[str, tuple[str, Any]]) -> tuple[list[tuple[dict, list[str]]], str]:
        """The children a parsed answer describes; proposals that name an unknown component or
        drop a placeholder are skipped (the problem is returned)."""
        proposals = parsed.get("proposals") if isinstance(parsed, Mapping) else None
        if not isinstance(proposals, list):
            return [], f"the answer lacks a 'proposals' list: {str(parsed)[:200]!r}"
        out: list[tuple[dict, list[str]]] = []
        seen: list[Any] = [dict(cand)]
        problem = ""
        for prop in proposals[: self.proposals]:
            child, changed = dict(cand), []
            try:
                for rw in prop["rewrites"]:
                    name = rw["component"]
                    if name not in by_name:
                        raise ValueError(f"unknown component {name!r} (offered: {sorted(by_name)})")
                    pname, idx = by_name[name]
                    put_entry(child, pname, idx, check_value(str(rw["new_value"]), get_entry(child[pname], idx)))
                    changed.append(name)
            except (KeyError, TypeError, ValueError) as e:
                problem = f"{type(e).__name__}: {e}"
                continue
            if child not in seen:
                seen.append(child)
                out.append((child, changed))
        if not out and not problem:
            problem = "every proposal equals the parent"
        return out, problem


def worst_components(components: Sequence[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any, str, float]]:
    """``(name, parameter, index, feedback, score)`` of the components (``(name, parameter,
    entry index or None)``) whose ``grad`` is worst: the lowest mean loss score behind it (all
    with feedback when none is scored). Components without feedback are left out.

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter(["A: {}", "B: {}"])
        >>> loss = lt.nn.MetricLoss(lambda pred, t: float(pred.startswith("A")))(p + "x", "x")
        >>> loss.backward()
        >>> [(name, score) for name, _, _, _, score in worst_components([("p[0]", p, (0,)), ("p[1]", p, (1,))])]
        [('p[1]', 0.0)]
    """
    found = []
    for name, p, idx in components:
        if p.grad is None:
            continue
        texts = np.asarray(p.grad.texts, dtype=object)
        text = str(texts[idx] if idx is not None else (texts.item() if texts.ndim == 0 else texts))
        if not text.strip():
            continue
        col = np.asarray(p.grad.metadata.column("score"), dtype=np.float64) if "score" in p.grad.metadata else None
        s = float(col[idx] if idx is not None else col.reshape(-1)[0]) if col is not None else float("nan")
        found.append((name, p, idx, text, s))
    scored = [f for f in found if np.isfinite(f[4])]
    if not scored:
        return found
    worst = min(f[4] for f in scored)
    return [f for f in scored if f[4] <= worst + 1e-9]


def examples_from_trace(trace: Any, metric: Any) -> list[dict[str, Any]]:
    """``{"input", "output", "score", "feedback"}`` records of the top-level runs of a trace (an
    ``lt.Trace`` or a saved path), scored by ``metric(input, output) -> score | (score, feedback)``.

    Example:
        >>> import langtorch as lt
        >>> with lt.trace() as tr:
        ...     _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
        >>> examples_from_trace(tr, lambda x, y: (1.0, "fine"))
        [{'input': 'a', 'output': 'Q: a', 'score': 1.0, 'feedback': 'fine'}]
    """
    from langtorch.tracing import Trace

    if not isinstance(trace, Trace):
        trace = Trace.load(trace)
    if not callable(metric):
        raise TypeError(f"metric must be a callable (input, output) -> score | (score, feedback), got "
                        f"{type(metric).__name__}")
    out = []
    for span in trace.roots:
        if not span.inputs or not span.outputs:
            continue
        xs, ys = span.inputs[0].get("texts"), span.outputs[0].get("texts")
        if xs is None or ys is None or len(xs) != len(ys):
            continue
        for xi, yi in zip(xs, ys):
            value = metric(xi, yi)
            score, feedback = value if isinstance(value, tuple) else (value, "")
            out.append({"input": str(xi), "output": str(yi), "score": float(score), "feedback": str(feedback)})
    return out
