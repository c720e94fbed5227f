"""TGD: textual gradient descent (TextGrad's idea): rewrite each parameter from its gradient."""

from __future__ import annotations

import asyncio
import json
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from langtorch.autograd import Answer, as_feedback_engine, ask_feedback
from langtorch.core import require_capabilities
from langtorch.core.sync import run_sync
from langtorch.errors import BudgetExceededError, OptimizerError, TemplateError
from langtorch.functional.template import parse_template
from langtorch.optim._base import TextOptimizer, score_of
from langtorch.tensor import TextTensor

__all__ = ["TGD"]

_SYSTEM = (
    "You are an optimizer of text variables in a language-model pipeline (prompts, instructions, "
    "demonstrations). Given a variable's current value, feedback on it (its gradient), "
    "constraints and earlier values with their scores, write an improved value that addresses "
    "the feedback. Keep what works; change what the feedback asks for. Answer only with the JSON "
    "object asked for.")

_SCHEMA = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "improved_variable": {"type": "string"}},
    "required": ["reasoning", "improved_variable"],
    "additionalProperties": False,
}
_RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "proposal", "schema": _SCHEMA}}


def _fields(text: str) -> tuple[str, ...] | None:
    try:
        return tuple(sorted(parse_template(text).names))
    except TemplateError:
        return None


def _escape_literal_braces(text: str, fields: tuple[str, ...]) -> str | None:
    """Double the braces of ``text`` that cannot be placeholders (JSON and the like; existing
    ``{{``/``}}`` escapes are kept). ``None`` when ``text`` has a placeholder-shaped ``{name}``
    that is not one of ``fields`` (a new placeholder is an error, not a literal).

    Example:
        >>> _escape_literal_braces('Answer {q} as {"label": 1}', ("q",))
        'Answer {q} as {{"label": 1}}'
    """
    positional = any(f.isdigit() for f in fields)
    out, i = [], 0
    while i < len(text):
        if text.startswith("{{", i) or text.startswith("}}", i):
            out.append(text[i:i + 2])
            i += 2
            continue
        m = re.match(r"\{(\w*)\}", text[i:])
        if m:
            if not (m.group(1) in fields or (m.group(1) == "" and positional)):
                return None
            out.append(m.group(0))
            i += len(m.group(0))
            continue
        out.append(text[i] * 2 if text[i] in "{}" else text[i])
        i += 1
    return "".join(out)


def parse_proposal(text: str, old: str) -> str:
    """The improved value from an engine answer; ``ValueError`` saying what is wrong.

    The answer must be the JSON object ``{"reasoning": str, "improved_variable": str}``; the new
    value must be non-empty, a valid template, and keep exactly the placeholders of the old one.

    Example:
        >>> parse_proposal('{"reasoning": "r", "improved_variable": "Answer {q} briefly."}', "Answer {q}.")
        'Answer {q} briefly.'
    """
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        raise ValueError(f"the answer is not JSON: {str(text)[:200]!r}") from None
    if not isinstance(value, dict) or not isinstance(value.get("improved_variable"), str):
        raise ValueError(f"the answer lacks a string 'improved_variable': {str(text)[:200]!r}")
    new = value["improved_variable"].strip()
    if not new:
        raise ValueError("the proposed value is empty")
    old_fields = _fields(old)
    if old_fields is None:
        # The old value is not a template (e.g. a system prompt with JSON braces, used as text):
        # any text will do.
        return new
    new_fields = _fields(new)
    if new_fields != old_fields:
        # An engine often writes literal braces single ({"label": ...}): double every brace that
        # is not one of the old placeholders, and accept that when it keeps them exactly.
        escaped = _escape_literal_braces(new, old_fields)
        if escaped is not None and _fields(escaped) == old_fields:
            return escaped
    if new_fields is None:
        raise ValueError(f"the proposed value is not a valid template (single braces mark placeholders; "
                         f"literal braces must be doubled, {{{{ and }}}}): {new[:200]!r}")
    if new_fields != old_fields:
        raise ValueError(f"the proposed value must keep exactly the placeholders {list(old_fields)}, "
                         f"it has {list(new_fields)}")
    return new


class TGD(TextOptimizer):
    """Textual gradient descent: each parameter entry with feedback in ``grad`` is rewritten by
    the engine from its value, its gradient, constraints and the history of earlier values with
    their scores.

    The engine answers in structured output (``{"reasoning", "improved_variable"}`` as a JSON
    schema); an answer that is empty, not JSON, off-schema, not a valid template or that drops or
    adds a placeholder is asked again (never read back from the cache) up to ``max_attempts``
    times, then :class:`~langtorch.errors.OptimizerError` names the parameter, which is left
    unchanged. All entries of all parameters are requested concurrently in one call.

    ``step(closure)``: ``closure()`` evaluates the current parameters (returns a loss TextTensor
    or a float score, higher is better). It is called before and after the update; when the
    new score is lower the update is reverted. Without a closure the update is kept.

    Args:
        params: TextParameters (or ``named_text_parameters()``).
        feedback_engine: the critic that proposes new values (an ``lt.nn.LLM``, a Backend, or
            any :class:`~langtorch.autograd.FeedbackEngine`). One that declares no structured
            output (``capabilities``) raises :class:`~langtorch.errors.CapabilityError` here, before
            anything is sent.
        constraints: texts every new value must respect (added to the request).
        history_size: how many earlier (value, score) pairs are shown.
        max_attempts: tries per entry for a well-formed proposal.
        max_calls, max_tokens, max_cost: the optimizer's budget.
        engine: deprecated name of ``feedback_engine`` (warns; "engine" is the decode engine).

    Example:
        >>> import json, langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> answer = json.dumps({"reasoning": "be specific", "improved_variable": "Answer {q} in one word."})
        >>> with OpenAIServer(lambda body: answer) as server:
        ...     engine = OpenAIBackend("e", base_url=server.url, api_key="sk-test1234")
        ...     p = lt.TextParameter("Answer {q}.")
        ...     p.grad = lt.TextTensor("The answers are too long.")
        ...     lt.optim.TGD([p], engine).step()
        >>> str(p)
        'Answer {q} in one word.'
    """

    def __init__(self, params: Any, feedback_engine: Any = None, *, constraints: Sequence[str] = (),
                 history_size: int = 5, max_attempts: int = 3, max_calls: int | None = None,
                 max_tokens: int | None = None, max_cost: float | None = None, engine: Any = None):
        if engine is not None:
            if feedback_engine is not None:
                raise TypeError("TGD: got both feedback_engine= and its deprecated name engine=; "
                                "pass feedback_engine= only.")
            warnings.warn("TGD: engine= is deprecated; pass feedback_engine= (the critic that "
                          "proposes new values; 'engine' names the decode engine).",
                          DeprecationWarning, stacklevel=2)
            feedback_engine = engine
        if feedback_engine is None:
            raise TypeError("TGD: expected a feedback_engine (an lt.nn.LLM, a Backend or any "
                            "lt.autograd.FeedbackEngine) to propose the new values, got none.")
        feedback_engine = as_feedback_engine(feedback_engine)
        # The proposals come in a JSON schema: an engine that declares no structured output
        # fails here, not after the forward and backward passes that made the gradients.
        require_capabilities(feedback_engine, "structured_output", who="lt.optim.TGD", alternatives=[
            "an engine over a backend with structured output, e.g. "
            "TGD(params, lt.nn.LLM(OpenAIBackend(\"gpt-4o-mini\"))); the backward pass "
            "(loss.backward(feedback_engine=...)) can keep this engine, it asks for free text.",
            "lt.optim.Search with a mutation proposer (a callable (value, k, rng) -> list[str]), "
            "which asks no engine.",
        ])
        if isinstance(constraints, str) or not all(isinstance(c, str) for c in constraints):
            raise TypeError("constraints must be a list of str")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be a positive int, got {max_attempts!r}")
        super().__init__(params, {"constraints": list(constraints), "history_size": int(history_size)},
                         max_calls=max_calls, max_tokens=max_tokens, max_cost=max_cost)
        self.feedback_engine = feedback_engine
        self.max_attempts = max_attempts

    @property
    def engine(self) -> Any:
        """Deprecated name of :attr:`feedback_engine` (warns)."""
        warnings.warn("TGD.engine is deprecated; use TGD.feedback_engine ('engine' names the "
                      "decode engine).", DeprecationWarning, stacklevel=2)
        return self.feedback_engine

    def estimate(self) -> dict[str, int]:
        """Requests one ``step()`` makes at least: one per parameter entry with feedback (plus
        retries for malformed answers, and the closure's calls)."""
        n = 0
        for p in self.parameters():
            if p.requires_grad and p.grad is not None:
                n += sum(1 for t in p.grad.texts.reshape(-1).tolist() if t.strip())
        return {"calls": n}

    def _prompt(self, group: dict[str, Any], p: Any, j: int, value: str, grad: str) -> list[dict[str, Any]]:
        name = self.name_of(p)
        if p.ndim:
            name += f"[{', '.join(str(int(i)) for i in np.unravel_index(j, p.shape))}]"
        parts = [f"Variable: {name}", f"Current value:\n<<<\n{value}\n>>>",
                 f"Feedback (gradient):\n<<<\n{grad}\n>>>"]
        constraints = list(group.get("constraints", []))
        fields = _fields(value)
        if fields is not None and (fields or "{{" in value or "}}" in value):
            keep = ("Keep every placeholder exactly as written: " + ", ".join("{" + f + "}" for f in fields)
                    + " (and add no new ones). " if fields else "")
            constraints.append(keep + "This is a template: single braces mark placeholders, so write "
                               "literal braces doubled ({{ and }}), as the current value does.")
        if constraints:
            parts.append("Constraints:\n" + "\n".join(f"- {c}" for c in constraints))
        past = [h for h in self.history if h["param"] == self.name_of(p) and h["score"] is not None]
        past = sorted(past, key=lambda h: -h["score"])[: group.get("history_size", 5)]
        if past:
            lines = []
            for h in past:
                v = h["value"]
                v = v if isinstance(v, str) else np.asarray(v, dtype=object).reshape(-1)[j]
                lines.append(f"- score {h['score']:.3g}: <<<{v}>>>")
            parts.append("Earlier values and their scores (higher is better):\n" + "\n".join(lines))
        parts.append('Reply with JSON: {"reasoning": "<short>", "improved_variable": "<the new value>"}')
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]

    async def _ask(self, prompts: list[Any], room: list[int], todo: list[int]) -> list[Answer]:
        """The answers to ``prompts[i]`` for ``i`` in ``todo``, all concurrent; prompts that need
        the same room for their answer go out as one batch."""
        groups: dict[int, list[int]] = {}
        for i in todo:
            groups.setdefault(room[i], []).append(i)
        batches = await asyncio.gather(*(
            ask_feedback(self.feedback_engine, [prompts[i] for i in ids], response_format=_RESPONSE_FORMAT, token_room=r,
                         validate=_valid_json, raise_errors=False)
            for r, ids in groups.items()))
        by_index = {i: a for ids, answers in zip(groups.values(), batches) for i, a in zip(ids, answers)}
        return [by_index[i] for i in todo]

    def _propose(self) -> list[tuple[Any, int, str]]:
        jobs = []
        for g in self.param_groups:
            for p in g["params"]:
                if not p.requires_grad or p.grad is None:
                    continue
                if p.grad.shape != p.shape:
                    raise OptimizerError(f"the grad of {self.name_of(p)!r} has shape {p.grad.shape}, "
                                         f"the parameter {p.shape}", parameter=self.name_of(p))
                values = p.texts.reshape(-1).tolist()
                for j, grad in enumerate(p.grad.texts.reshape(-1).tolist()):
                    if grad.strip():
                        jobs.append((g, p, j, values[j], grad))
        if not jobs:
            return []
        prompts = [self._prompt(g, p, j, v, gr) for g, p, j, v, gr in jobs]
        # Room for the whole new value (about chars/4 tokens) plus the reasoning.
        room = [max(800, int(len(v) * 0.4) + 400) for _, _, _, v, _ in jobs]
        proposals: dict[int, str] = {}
        errors: dict[int, str] = {}
        todo = list(range(len(jobs)))
        with self.budget:
            for _ in range(self.max_attempts):
                if not todo:
                    break
                old = {i: jobs[i][3] for i in todo}
                answers = run_sync(self._ask(prompts, room, todo))
                nxt = []
                for i, answer in zip(todo, answers):
                    if answer.error is not None:
                        err = answer.error
                        if isinstance(err, BudgetExceededError) or not getattr(err, "retryable", True):
                            # The runtime already retried what can be retried (401, 400, budget: no).
                            raise err
                        errors[i] = f"{type(err).__name__}: {err}"
                        nxt.append(i)
                        continue
                    try:
                        proposals[i] = parse_proposal(answer.text, old[i])
                    except ValueError as e:
                        if answer.finish_reason == "length":
                            name = self.name_of(jobs[i][1])
                            raise OptimizerError(
                                f"TGD's proposal for {name!r} was cut at max_tokens (finish_reason "
                                "'length'); asking again would be cut the same way. Give the engine "
                                "a larger max_tokens (lt.nn.LLM(backend, max_tokens=...)). The "
                                "parameter is unchanged.", parameter=name) from None
                        errors[i] = str(e)
                        nxt.append(i)
                todo = nxt
        if todo:
            i = todo[0]
            name = self.name_of(jobs[i][1])
            raise OptimizerError(f"TGD got no valid proposal for {name!r} (entry {jobs[i][2]}) after "
                                 f"{self.max_attempts} attempts; the parameter is unchanged. Last "
                                 f"problem: {errors[i]}", parameter=name)
        return [(jobs[i][1], jobs[i][2], proposals[i]) for i in range(len(jobs))]

    def step(self, closure: Callable[[], Any] | None = None) -> float | None:
        """Apply one update (see the class docstring); returns the score kept (or ``None``).

        Raises:
            BudgetExceededError: the proposals (one request per entry with feedback) do not fit
                in the remaining budget — raised before any call; nothing changes.
            OptimizerError: no valid proposal after ``max_attempts``; nothing changes.
        """
        need = self.estimate()["calls"]
        left = self.budget.remaining_calls()
        if left is not None and need > left:
            raise BudgetExceededError(
                f"TGD.step needs at least {need} calls (one per parameter entry with feedback) and "
                f"the budget has {left} left; nothing was sent and nothing changed.",
                spent=self.budget.cost, budget=self.budget.max_cost or 0.0)
        before = None
        if closure is not None:
            with self.budget:
                before = score_of(closure())
            for p in self.parameters():
                # The value before the update, with its score: the history the engine sees.
                if p.requires_grad and p.grad is not None and not any(
                        h["param"] == self.name_of(p) and h["value"] == p.tolist() for h in self.history):
                    self._record(p, before)
        proposals = self._propose()
        if not proposals:
            return before
        old_values = {id(p): p.data for p, _, _ in proposals}
        grouped: dict[int, tuple[Any, list[str]]] = {}
        for p, j, new in proposals:
            entry = grouped.setdefault(id(p), (p, p.texts.reshape(-1).tolist()))
            entry[1][j] = new
        for p, values in grouped.values():
            p.data = TextTensor(np.array(values, dtype=object).reshape(p.shape).astype(str) if p.ndim
                                else values[0])
        self.step_count += 1
        score = before
        if closure is not None:
            try:
                with self.budget:
                    after = score_of(closure())
            except BaseException:
                # Unevaluated updates are not kept: back to the values before the step.
                for p, _ in grouped.values():
                    p.data = old_values[id(p)]
                self.step_count -= 1
                raise
            if before is not None and after < before:
                for p, _ in grouped.values():
                    self._record(p, after, reverted=True)
                    p.data = old_values[id(p)]
                return before
            score = after
        for p, _ in grouped.values():
            self._record(p, score)
        return score


def _valid_json(text: str) -> bool:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return isinstance(value, dict) and isinstance(value.get("improved_variable"), str) and bool(
        value["improved_variable"].strip())
