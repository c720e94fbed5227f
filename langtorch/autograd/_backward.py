"""Text backpropagation: ``loss.backward()`` turns feedback on outputs into ``param.grad``.

The chain rule in text. Starting from a loss (entries = feedback texts, from
:class:`~langtorch.nn.MetricLoss` or :class:`~langtorch.nn.TextLoss`), the provenance graph is
walked in reverse topological order, level by level. Each node carries its op's backward rule
(``node.rule.feedback``, registered with the op; never looked up by name) that turns the
feedback on its output entries into feedback on its input entries:

* a loss (:func:`~langtorch.autograd.loss_feedback`): each entry's feedback goes to its
  prediction entry (the score is kept with it), never to the target.
* an LLM call (:data:`~langtorch.autograd.ENGINE_FEEDBACK`): the *feedback engine* (:class:`~langtorch.autograd.FeedbackEngine`, e.g. an
  ``lt.nn.LLM``) is asked, per output entry and per input that requires grad (the prompt, the
  system prompt), how that input should change given the output and its feedback. All prompts
  of one level go to it as one batch (an LLM sends them together through the runtime:
  concurrency, rate limits, retries, cache, usage accounting, budgets).
* a fill (:func:`~langtorch.autograd.fill_feedback`): feedback on a filled prompt goes to the
  template entry (with the filled prompt it was about, as context) and to the values.
* structural ops (indexing, reshape, transpose, stack, cat, join, split, map, ...;
  :func:`~langtorch.autograd.route_feedback`): feedback is scattered and gathered entry by
  entry along the recorded lineage.

At a :class:`~langtorch.TextParameter` the feedback items of each entry are reduced to one text
— by the feedback engine when there are several (at most ``max_feedback`` shown), or kept as is when
there is one — and *accumulated* into ``param.grad`` (a TextTensor of the parameter's shape;
``optimizer.zero_grad()`` clears it). ``param.grad.metadata["count"]`` holds how many feedback
items each entry received and ``metadata["score"]`` the mean loss score behind them.

Example:
    >>> import langtorch as lt
    >>> prompt = lt.TextParameter([["Capital of {}?"], ["Name the capital of {}."]])
    >>> filled = prompt + lt.TextTensor(["France", "Peru"])           # [2, 2]
    >>> loss = lt.nn.MetricLoss(lambda p, t: 0.0)(filled, "x")
    >>> loss.backward()                 # no LLM in the graph, one item per entry: no engine needed
    >>> prompt.grad.shape, prompt.grad.metadata["count"].tolist()
    ((2, 1), [[2], [2]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from langtorch.autograd._feedback import (
    FeedbackEngine,
    as_feedback_engine,
    ask_feedback,
    get_feedback_engine,
    renamed_feedback_engine,
)
from langtorch.autograd._graph import ENGINE_FEEDBACK, Edge, Node, topological_order
from langtorch.core.sync import run_sync
from langtorch.errors import GraphError

__all__ = ["backward"]

_BACKWARD_SYSTEM = (
    "You are the backward pass of a text optimizer. You turn feedback on a language model's "
    "answer into feedback on one of the inputs that produced it. Be specific and concise (at "
    "most five sentences). Do not rewrite the input: say what about it should change, and why.")

_REDUCE_SYSTEM = (
    "You merge feedback. Several pieces of feedback were given about the same text. Combine them "
    "into one concise feedback that keeps every distinct, actionable point and drops repetition. "
    "Answer with the merged feedback only.")

_ROLE_WORDS = {"input": "prompt", "system": "system prompt"}


# A feedback item: (text, score of the loss entries behind it, or None).
Item = tuple[str, "float | None"]
# A prompt to the feedback engine: chat messages.
Prompt = list[dict[str, Any]]


def _worst_first(items: Sequence[Item]) -> list[Item]:
    """Items ordered by score, lowest first (unscored last), stable."""
    return sorted(items, key=lambda it: (it[1] is None, it[1] if it[1] is not None else 0.0))


def _bullets(items: Sequence[Item], cap: int) -> str:
    ordered = _worst_first(items)
    shown = ordered[:cap]
    text = "\n".join(f"- {t}" for t, _ in shown)
    if len(ordered) > cap:
        text += f"\n- ({len(ordered) - cap} more items not shown; the ones shown scored lowest)"
    return text


def _cut_message(t: Any) -> str:
    reason = getattr(t, "_cut", None)
    if reason == "detach":
        return ("it was cut by detach(): a tensor made by t.detach() (or from one) has no history. "
                "Use the tensor before detach().")
    if reason == "no_grad":
        return ("it was computed under lt.no_grad() (or set_grad_enabled(False)), which records "
                "nothing. Run the forward pass outside no_grad.")
    return ("no TextParameter with requires_grad=True was used to compute it, or a value left "
            "the TextTensor world on the way (an f-string, str(t), t.tolist(), a new "
            "TextTensor from plain strings). Build prompts with TextTensor ops (prompt + x, "
            "template * record) so that the graph is recorded.")


def backward(loss: Any, feedback_engine: Any = None, *, max_feedback: int = 8,
             max_score: float | None = None, engine: Any = None) -> None:
    """Propagate ``loss``'s feedback to the TextParameters that produced it (``param.grad``).

    Args:
        loss: a TextTensor with a provenance graph, usually from a text loss; its entries are
            the feedback, ``metadata["score"]`` (optional) the scores.
        feedback_engine: the critic that writes feedback through LLM calls and merges many
            feedback items (an ``lt.nn.LLM``, a Backend, or any
            :class:`~langtorch.autograd.FeedbackEngine`); default:
            :func:`~langtorch.autograd.set_feedback_engine`'s. Not needed when the graph has no
            LLM call and no entry gets more than one item.
        engine: deprecated name of ``feedback_engine`` (warns; "engine" is the decode engine).
        max_feedback: at most this many feedback items are shown in one engine request.
        max_score: entries of the loss scoring above this send no feedback (saves calls on what
            is already right); ``None`` sends all.

    Raises:
        GraphError: ``loss`` has no graph (the message says which op cut it), or an engine is
            needed and none is set.
        TypeError: ``loss`` is not a TextTensor, ``feedback_engine`` is not a feedback engine,
            or both ``feedback_engine`` and ``engine`` are given.

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Q: {}")
        >>> loss = lt.nn.MetricLoss("exact_match")(p + "a", "A")
        >>> lt.autograd.backward(loss)
        >>> p.grad.metadata["count"]
        1
    """
    from langtorch.functional.text import TextTensor as _Base

    feedback_engine = renamed_feedback_engine(feedback_engine, engine, "backward()")
    if not isinstance(loss, _Base):
        raise TypeError(f"backward() needs a TextTensor loss, got {type(loss).__name__}")
    if not isinstance(max_feedback, int) or isinstance(max_feedback, bool) or max_feedback < 1:
        raise ValueError(f"max_feedback must be a positive int, got {max_feedback!r}")
    root: Node | None = loss._grad_fn
    if root is None or not root.requires_grad:
        raise GraphError("backward(): this tensor has no provenance graph, so there is nothing to "
                         "propagate to: " + _cut_message(loss))
    critic = (as_feedback_engine(feedback_engine) if feedback_engine is not None
              else get_feedback_engine())
    order = topological_order(root)
    needs_engine = any(n.rule.feedback is ENGINE_FEEDBACK and any(e.requires_grad for e in n.edges)
                       for n in order)
    if needs_engine and critic is None:
        raise GraphError(
            "backward(): the graph has LLM calls, and feedback through an LLM call is written by a "
            "feedback engine: pass loss.backward(feedback_engine=llm_or_backend) or set "
            "lt.autograd.set_feedback_engine(...) first. No request was sent.")
    run_sync(_abackward(loss, root, order, critic, max_feedback, max_score))


class _Flow:
    """The feedback items in flight during one backward pass: per node output entry, and per
    TextParameter entry (where they end)."""

    def __init__(self) -> None:
        self.grads: dict[int, list[list[Item]]] = {}
        self.params: dict[int, tuple[Any, list[list[Item]]]] = {}

    def sink(self, e: Edge, j: int, items: list[Item]) -> None:
        """Send ``items`` along edge ``e`` to entry ``j`` of its source (a node or a parameter)."""
        if e.node is not None:
            g = self.grads.setdefault(e.node.id, [[] for _ in range(_size(e.texts.shape))])
            g[j].extend(items)
        elif e.param is not None and e.param.requires_grad:
            entry = self.params.setdefault(id(e.param), (e.param, [[] for _ in range(_size(e.texts.shape))]))
            entry[1][j].extend(items)


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) if shape else 1


def _seed(loss: Any, max_score: float | None) -> list[list[Item]]:
    """The loss entries as feedback items on the root (scores kept; ``max_score`` filters)."""
    out: list[list[Item]] = [[] for _ in range(_size(loss.shape))]
    flat_loss = loss.texts.reshape(-1).tolist() if loss.ndim else [str(loss)]
    score_col = loss.metadata.column("score").reshape(-1) if "score" in loss.metadata else None
    for i, text in enumerate(flat_loss):
        s = float(score_col[i]) if score_col is not None else None
        if s is not None and not np.isfinite(s):
            s = None
        if max_score is not None and s is not None and s > max_score:
            continue
        if text.strip():
            out[i].append((text if s is None else f"{text} (score {s:g})", s))
    return out


def _levels(root: Node, order: list[Node]) -> list[list[Node]]:
    """Nodes grouped so that a node runs after all its consumers (depth = longest path from the
    root); the LLM requests of one level go out together."""
    depth: dict[int, int] = {root.id: 0}
    for node in order:
        for e in node.edges:
            if e.node is not None:
                depth[e.node.id] = max(depth.get(e.node.id, 0), depth[node.id] + 1)
    levels: dict[int, list[Node]] = {}
    for node in order:
        levels.setdefault(depth[node.id], []).append(node)
    return [levels[d] for d in sorted(levels)]


def _llm_jobs(node: Node, g: list[list[Item]], cap: int) -> list[tuple[Edge, int, float | None, Prompt]]:
    """The engine prompts of an LLM call (rule :data:`~langtorch.autograd.ENGINE_FEEDBACK`): per
    output entry with feedback and per input entry behind it that requires grad, "how should
    this input change?"."""
    jobs = []
    failed = node.attrs.get("failed") or ()
    n = int(node.attrs.get("n", 1) or 1)
    for o, items in enumerate(g):
        if not items or (o // n) in failed:
            continue  # a failed request's empty answer says nothing about the prompt
        worst = min((sc for _, sc in items if sc is not None), default=None)
        for e in node.edges:
            if not e.requires_grad:
                continue
            for j in e.sources(o):
                jobs.append((e, int(j), worst, _llm_backward_prompt(node, e, o, int(j), items, cap)))
    return jobs


def _route(node: Node, g: list[list[Item]], flow: _Flow) -> None:
    """Feedback through an op whose rule routes it (not an LLM call): the op's backward rule
    (``node.rule.feedback``) gives each input's items, sent along the recorded lineage."""
    rule = node.rule.feedback
    for o, items in enumerate(g):
        if not items:
            continue
        for e in node.edges:
            if not e.requires_grad:
                continue
            routed = rule(node, e, o, items)
            if routed is None:
                continue  # e.g. a loss's target: the reference, not something to change
            for j in e.sources(o):
                flow.sink(e, int(j), routed)


async def _abackward(loss: Any, root: Node, order: list[Node], engine: FeedbackEngine | None, cap: int,
                     max_score: float | None) -> None:
    flow = _Flow()
    flow.grads[root.id] = _seed(loss, max_score)
    for level in _levels(root, order):
        jobs: list[tuple[Edge, int, float | None, Prompt]] = []
        for node in level:
            g = flow.grads.get(node.id)
            if g is None or not any(g):
                continue
            if node.rule.feedback is ENGINE_FEEDBACK:
                jobs += _llm_jobs(node, g, cap)
            else:
                _route(node, g, flow)
        if jobs:
            answers = await _ask(engine, [prompt for *_, prompt in jobs])
            for (e, j, worst, _), text in zip(jobs, answers):
                if text:
                    flow.sink(e, j, [(text, worst)])
    finals = await _reduce(flow.params, engine, cap)
    for pid, (param, items) in flow.params.items():
        param.grad = _accumulated(type(loss)._result_class(), param, items, finals[pid])


async def _reduce(params: dict[int, tuple[Any, list[list[Item]]]], engine: FeedbackEngine | None,
                  cap: int) -> dict[int, list[str]]:
    """Each parameter entry's items (and its earlier grad) reduced to one feedback text: merged
    by the engine at most ``cap`` at a time, the lowest-scored first, then the merges merged;
    without an engine, listed as bullets."""
    finals: dict[int, list[str]] = {}
    pending: dict[tuple[int, int], list[Item]] = {}
    for pid, (param, items) in params.items():
        old = param.grad.texts.reshape(-1).tolist() if param.grad is not None else None
        out = []
        for j, its in enumerate(items):
            merged = ([(old[j], None)] if old is not None and old[j] else []) + list(its)
            out.append(merged[0][0] if len(merged) == 1 else "")
            if len(merged) > 1:
                if engine is None:
                    out[j] = _bullets(merged, cap)
                else:
                    pending[(pid, j)] = merged
        finals[pid] = out
    while pending:
        keys, prompts, shapes = [], [], []
        for key, items in pending.items():
            ordered = _worst_first(items)
            chunks = [ordered[i:i + cap] for i in range(0, len(ordered), cap)]
            for c in chunks:
                keys.append(key)
                prompts.append(_reduce_prompt(params[key[0]][0], key[1], c, cap))
            shapes.append((key, len(chunks), min((sc for _, sc in items if sc is not None), default=None)))
        answers = await _ask(engine, prompts)
        nxt: dict[tuple[int, int], list[Item]] = {}
        at = 0
        for key, n_chunks, worst in shapes:
            texts = [t for t in answers[at:at + n_chunks] if t]
            at += n_chunks
            if n_chunks == 1 or len(texts) <= 1:
                finals[key[0]][key[1]] = texts[0] if texts else ""
            else:
                nxt[key] = [(t, worst) for t in texts]
        pending = nxt
    return finals


def _accumulated(tensor_type: type, param: Any, items: list[list[Item]], finals: list[str]) -> Any:
    """``param``'s new grad: the reduced texts, with ``count`` / ``scored`` / mean ``score``
    metadata accumulated onto the grad it had (a tensor of ``tensor_type``: the user-facing class
    of the loss, as ``langtorch.tensor`` is above this package)."""
    counts = np.array([len(its) for its in items], dtype=np.int64)
    sums = np.array([sum(sc for _, sc in its if sc is not None) for its in items], dtype=np.float64)
    scored = np.array([sum(1 for _, sc in its if sc is not None) for its in items], dtype=np.int64)
    shape = param.shape
    if param.grad is not None and "count" in param.grad.metadata:
        old_count = np.asarray(param.grad.metadata.column("count")).reshape(-1).astype(np.int64)
        old_scored = (np.asarray(param.grad.metadata.column("scored")).reshape(-1).astype(np.int64)
                      if "scored" in param.grad.metadata else old_count)
        old_mean = np.nan_to_num(np.asarray(param.grad.metadata.column("score"), dtype=np.float64).reshape(-1))
        counts, sums, scored = counts + old_count, sums + old_mean * old_scored, scored + old_scored
    mean = np.where(scored > 0, sums / np.maximum(scored, 1), np.nan)
    grad = tensor_type(np.array(finals, dtype=object).astype(str).reshape(shape) if shape else finals[0],
                       template=False)
    grad.metadata["count"] = counts.reshape(shape)
    grad.metadata["scored"] = scored.reshape(shape)
    grad.metadata["score"] = mean.reshape(shape)
    return grad


def _llm_backward_prompt(node: Node, e: Edge, o: int, j: int, items: list[Item], cap: int) -> Prompt:
    out_flat = node.out_texts.reshape(-1)
    answer = str(out_flat[o])
    requests = node.attrs.get("requests") or []
    n = int(node.attrs.get("n", 1) or 1)
    request = requests[o // n] if requests and o // n < len(requests) else None
    what = _ROLE_WORDS.get(e.role, e.role)
    value = str(e.texts.reshape(-1)[j])
    parts = [f"A language model was called with this {what}:\n<<<\n{value}\n>>>"]
    if request is not None:
        msgs = request.get("messages", [])
        system = next((m.get("content") for m in msgs if m.get("role") == "system"), None)
        if e.role != "system" and system:
            parts.append(f"Its system prompt was:\n<<<\n{system}\n>>>")
        history = [m for m in msgs if m.get("role") != "system"][:-1]
        if history:
            turns = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in history[-6:])
            parts.append(f"Earlier turns of the conversation:\n<<<\n{turns}\n>>>")
        if e.role == "system":
            user = next((m.get("content") for m in reversed(msgs) if m.get("role") == "user"), None)
            if user:
                parts.append(f"The user message was:\n<<<\n{user}\n>>>")
    parts.append(f"It answered:\n<<<\n{answer}\n>>>")
    parts.append("Feedback on the answer (from later steps of the pipeline):\n" + _bullets(items, cap))
    parts.append(f"How should the {what} change so that the answer addresses this feedback?")
    return [{"role": "system", "content": _BACKWARD_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def _reduce_prompt(param: Any, j: int, items: list[Item], cap: int) -> Prompt:
    value = str(param.texts.reshape(-1)[j])
    name = getattr(param, "name", None) or "text parameter"
    user = (f"The text ({name}):\n<<<\n{value}\n>>>\n\n{len(items)} pieces of feedback on it:\n"
            + _bullets(items, cap))
    return [{"role": "system", "content": _REDUCE_SYSTEM}, {"role": "user", "content": user}]


async def _ask(engine: FeedbackEngine | None, prompts: list[Prompt]) -> list[str]:
    assert engine is not None  # backward() checked that the graph's LLM calls have one
    return [a.text for a in await ask_feedback(engine, prompts)]
