"""Text losses: TextTensors of feedback with a numeric ``metadata["score"]``.

A loss entry says how good one prediction was (``score``: higher is better, typically in
[0, 1]) and why (the entry's text, the *feedback*). ``loss.backward()`` sends the feedback back
through the pipeline's provenance graph into the ``grad`` of the TextParameters that made the
prediction (see :func:`langtorch.autograd.backward`).

* :class:`MetricLoss` — a Python metric (exact match, label accuracy, anything).
* :class:`TextLoss` — an LLM judge that critiques each prediction against a target or rubric,
  answering in structured output (JSON schema), retried when malformed.

Example:
    >>> import langtorch as lt
    >>> loss = lt.nn.MetricLoss("exact_match")(lt.TextTensor(["4", "5"]), lt.TextTensor(["4", "4"]))
    >>> loss.metadata["score"].tolist()
    [1.0, 0.0]
    >>> loss[1].item()
    "The output '5' is wrong: the expected answer is '4'."
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from langtorch import tracing
from langtorch.autograd import TEXT_LOSS, broadcast_index, record_node
from langtorch.backends.base import Backend
from langtorch.core import require_capabilities
from langtorch.errors import ParseError
from langtorch.functional.text import broadcast_shapes
from langtorch.nn.modules import TModule
from langtorch.runtime import acomplete, run_sync
from langtorch.tensor import TextTensor

__all__ = ["MetricLoss", "TextLoss", "mean_score"]


def _as_tensor(x: Any, what: str) -> TextTensor:
    if isinstance(x, TextTensor):
        return x
    try:
        return TextTensor(x, template=False)
    except TypeError as e:
        raise TypeError(f"{what}: expected texts (str, lists of str, TextTensor): {e}") from None


def _exact(pred: str, target: str) -> tuple[float, str]:
    if pred.strip() == target.strip():
        return 1.0, f"The output {pred.strip()!r} is correct."
    return 0.0, f"The output {pred.strip()!r} is wrong: the expected answer is {target.strip()!r}."


def _contains(pred: str, target: str) -> tuple[float, str]:
    if target.strip().lower() in pred.lower():
        return 1.0, f"The output contains the expected answer {target.strip()!r}."
    return 0.0, f"The output {pred.strip()[:200]!r} does not contain the expected answer {target.strip()!r}."


_METRICS: dict[str, Callable[[str, str], tuple[float, str]]] = {"exact_match": _exact, "contains": _contains}


def mean_score(loss: TextTensor) -> float:
    """The mean of a loss tensor's ``metadata["score"]`` (higher is better).

    Example:
        >>> import langtorch as lt
        >>> mean_score(lt.nn.MetricLoss("exact_match")(lt.TextTensor(["a", "b"]), "a"))
        0.5
    """
    if not isinstance(loss, TextTensor) or "score" not in loss.metadata:
        raise TypeError("mean_score expected a loss TextTensor with a metadata['score'] column "
                        "(from lt.nn.MetricLoss or lt.nn.TextLoss)")
    return float(np.mean(loss.metadata.column("score").astype(float)))


class MetricLoss(TModule):
    """A loss from a Python metric: ``MetricLoss(fn)(predictions, targets)``.

    Args:
        metric: ``"exact_match"``, ``"contains"``, or a callable ``(prediction: str, target: str)
            -> score | (score, feedback) | {"score": s, "feedback": text}``. Scores are floats,
            higher is better. Without a feedback text, one is written from the score.

    Returns (forward):
        A TextTensor of the broadcast shape of predictions and targets: entries are feedback
        texts, ``metadata["score"]`` the scores. It records a ``loss`` node, so
        ``loss.backward()`` routes each entry's feedback to its prediction.

    Raises:
        TypeError: the metric returned something else (names the entry).
        ValueError: a score is NaN or infinite.

    Example:
        >>> import langtorch as lt
        >>> label = lt.nn.MetricLoss(lambda p, t: float(p.lower().startswith(t)))
        >>> label(lt.TextTensor(["Positive!", "neg"]), lt.TextTensor(["positive", "positive"])).metadata["score"].tolist()
        [1.0, 0.0]
    """

    def __init__(self, metric: str | Callable[[str, str], Any] = "exact_match"):
        super().__init__()
        if isinstance(metric, str):
            if metric not in _METRICS:
                raise ValueError(f"unknown metric {metric!r}; use one of {sorted(_METRICS)} or a callable")
            self.name = metric
            metric = _METRICS[metric]
        elif callable(metric):
            self.name = getattr(metric, "__qualname__", type(metric).__name__)
        else:
            raise TypeError(f"MetricLoss expected a metric name or a callable, got {type(metric).__name__}")
        self.metric = metric

    def forward(self, predictions: Any, targets: Any) -> TextTensor:
        pred = _as_tensor(predictions, "predictions")
        target = _as_tensor(targets, "targets")
        shape = broadcast_shapes(pred.shape, target.shape)
        p_flat = np.broadcast_to(pred.texts, shape).reshape(-1).tolist()
        t_flat = np.broadcast_to(target.texts, shape).reshape(-1).tolist()
        scores, texts = [], []
        for i, (p, t) in enumerate(zip(p_flat, t_flat)):
            score, feedback = _score_of(self.metric(p, t), i, shape, p, t)
            scores.append(score)
            texts.append(feedback)
        out = TextTensor(np.array(texts, dtype=object).reshape(shape).astype(str) if shape else texts[0],
                         template=False)
        out.metadata["score"] = np.array(scores, dtype=np.float64).reshape(shape)
        record_node(TEXT_LOSS, out, [(pred, broadcast_index(pred.shape, shape), "prediction"),
                                  (target, broadcast_index(target.shape, shape), "target")],
                    attrs={"metric": self.name})
        return out

    def extra_repr(self) -> str:
        return self.name


def _score_of(value: Any, i: int, shape: tuple[int, ...], pred: str, target: str) -> tuple[float, str]:
    index = tuple(int(j) for j in np.unravel_index(i, shape)) if shape else ()
    feedback = None
    if isinstance(value, Mapping):
        score, feedback = value.get("score"), value.get("feedback")
    elif isinstance(value, tuple) and len(value) == 2:
        score, feedback = value
    else:
        score = value
    if isinstance(score, (bool, np.bool_)):
        score = float(score)
    if not isinstance(score, (int, float, np.integer, np.floating)):
        raise TypeError(f"the metric must return a score (float), (score, feedback) or "
                        f"{{'score', 'feedback'}}; it returned {type(value).__name__} at entry {index}")
    score = float(score)
    if not math.isfinite(score):
        raise ValueError(f"the metric returned a non-finite score {score} at entry {index}")
    if feedback is None:
        feedback = (f"The output {pred.strip()[:300]!r} scored {score:g} against the target "
                    f"{target.strip()[:300]!r}.")
    elif not isinstance(feedback, str):
        raise TypeError(f"the metric's feedback must be a str, got {type(feedback).__name__} at entry {index}")
    return score, feedback


_JUDGE_SYSTEM = (
    "You evaluate outputs of a language-model pipeline. For the output you are shown, give a "
    "score from 0 (useless) to 1 (perfect) and concise, specific feedback: what is wrong and what "
    "would make it better. Answer only with the JSON object asked for.")

_JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "number"}, "feedback": {"type": "string"}},
    "required": ["score", "feedback"],
    "additionalProperties": False,
}


class TextLoss(TModule):
    """An LLM judge as a loss: ``TextLoss(instruction, backend)(predictions, targets=None)``.

    Each entry is one request: the instruction (a rubric, or how to compare with the target),
    the prediction, and the target when given. The judge answers in structured output
    (``{"score": number in [0, 1], "feedback": str}`` as a JSON schema); a malformed answer
    (empty, not JSON, off-schema, score out of range) is asked again up to ``max_attempts``
    times (not from the cache), then raises :class:`~langtorch.errors.ParseError` naming the entry.

    The judge's backend must declare structured output (``backend.capabilities``; ``OpenAIBackend``
    and ``LocalBackend`` do): one that does not raises :class:`~langtorch.errors.CapabilityError` here,
    before any request.

    Args:
        instruction: what to judge, e.g. ``"Is the answer correct and concise?"``.
        backend: the judge's :class:`~langtorch.backends.Backend`.
        max_attempts: tries per entry for a well-formed answer.
        **chat_params: sent with every request (default ``temperature=0``).

    Example:
        >>> import json, langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> judge = lambda body: json.dumps({"score": 0.5, "feedback": "Too long."})
        >>> with OpenAIServer(judge) as server:
        ...     loss_fn = lt.nn.TextLoss("Be brief.", OpenAIBackend("j", base_url=server.url, api_key="sk-x1234567"))
        ...     loss = loss_fn(lt.TextTensor(["a very long answer"]))
        >>> loss.tolist(), loss.metadata["score"].tolist()
        (['Too long.'], [0.5])
    """

    _trace_kind = "module"

    def __init__(self, instruction: str, backend: Backend, *, max_attempts: int = 3, **chat_params: Any):
        super().__init__()
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError("TextLoss needs a non-empty instruction (str): what the judge should assess")
        if not isinstance(backend, Backend):
            raise TypeError(f"TextLoss expected a langtorch Backend, got {type(backend).__name__}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be a positive int, got {max_attempts!r}")
        require_capabilities(backend, "structured_output", who="lt.nn.TextLoss (an LLM judge)", alternatives=[
            "lt.nn.MetricLoss(metric): a Python metric (\"exact_match\", \"contains\" or your "
            "function (prediction, target) -> score or (score, feedback)) asks no judge.",
            "a judge backend with structured output, e.g. OpenAIBackend(\"gpt-4o-mini\").",
        ])
        self.instruction = instruction
        self.backend = backend
        self.max_attempts = max_attempts
        self.chat_params = {"temperature": 0, **chat_params}

    def _request(self, pred: str, target: str | None) -> dict[str, Any]:
        parts = [f"Instruction:\n{self.instruction}", f"Output to evaluate:\n<<<\n{pred}\n>>>"]
        if target is not None:
            parts.append(f"Target (reference answer):\n<<<\n{target}\n>>>")
        parts.append('Reply with JSON: {"score": <number from 0 to 1>, "feedback": "<specific critique>"}')
        return {"messages": [{"role": "system", "content": _JUDGE_SYSTEM},
                             {"role": "user", "content": "\n\n".join(parts)}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "judgement", "schema": _JUDGE_SCHEMA}},
                **self.chat_params}

    def forward(self, predictions: Any, targets: Any = None) -> TextTensor:
        pred = _as_tensor(predictions, "predictions")
        target = _as_tensor(targets, "targets") if targets is not None else None
        shape = broadcast_shapes(pred.shape, target.shape) if target is not None else pred.shape
        p_flat = np.broadcast_to(pred.texts, shape).reshape(-1).tolist()
        t_flat = (np.broadcast_to(target.texts, shape).reshape(-1).tolist() if target is not None
                  else [None] * len(p_flat))
        requests = [self._request(p, t) for p, t in zip(p_flat, t_flat)]
        judged = run_sync(_judge_all(self.backend, requests, self.max_attempts, shape))
        scores = [s for s, _ in judged]
        texts = [f for _, f in judged]
        out = TextTensor(np.array(texts, dtype=object).reshape(shape).astype(str) if shape else texts[0],
                         template=False)
        out.metadata["score"] = np.array(scores, dtype=np.float64).reshape(shape)
        inputs = [(pred, broadcast_index(pred.shape, shape), "prediction")]
        if target is not None:
            inputs.append((target, broadcast_index(target.shape, shape), "target"))
        record_node(TEXT_LOSS, out, inputs, attrs={"judge": self.backend.model, "instruction": self.instruction})
        return out


def parse_judgement(text: str) -> tuple[float, str]:
    """``(score, feedback)`` from a judge's JSON answer; :class:`ParseError` when malformed.

    Example:
        >>> parse_judgement('{"score": 0.8, "feedback": "Good."}')
        (0.8, 'Good.')
    """
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        raise ParseError(f"the judge's answer is not JSON: {str(text)[:200]!r}", text=text) from None
    if not isinstance(value, dict) or "score" not in value or "feedback" not in value:
        raise ParseError(f"the judge's answer lacks 'score' and 'feedback': {str(text)[:200]!r}", text=text)
    score, feedback = value["score"], value["feedback"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0.0 <= float(score) <= 1.0:
        raise ParseError(f"the judge's score must be a number in [0, 1], got {score!r}", text=text)
    if not isinstance(feedback, str) or not feedback.strip():
        raise ParseError("the judge's feedback must be a non-empty string", text=text)
    return float(score), feedback.strip()


async def _judge_all(backend: Backend, requests: list[dict[str, Any]], max_attempts: int,
                     shape: tuple[int, ...]) -> list[tuple[float, str]]:
    results: list[tuple[float, str] | None] = [None] * len(requests)
    todo = list(range(len(requests)))
    last: dict[int, ParseError] = {}
    with tracing.span("llm", "TextLoss", attrs={"model": backend.model}, backend=backend):
        for _attempt in range(max_attempts):
            if not todo:
                break
            # Malformed answers are never cached (validate), so a retry asks the judge again.
            batch = [requests[i] for i in todo]
            call = await acomplete(backend, batch, validate=lambda c: _well_formed(c.text))
            if len(call.errors) == len(batch):
                raise next(iter(call.errors.values()))
            nxt = []
            for j, i in enumerate(todo):
                if j in call.errors:
                    raise call.errors[j]
                try:
                    results[i] = parse_judgement(call.completions[j].text)
                except ParseError as e:
                    last[i] = e
                    nxt.append(i)
            todo = nxt
    if todo:
        i = todo[0]
        index = tuple(int(v) for v in np.unravel_index(i, shape)) if shape else ()
        raise ParseError(f"the judge gave no well-formed answer for entry {index} after "
                         f"{max_attempts} attempts: {last[i]}", text=last[i].text, index=index)
    return [r for r in results if r is not None]


def _well_formed(text: str) -> bool:
    try:
        parse_judgement(text)
    except ParseError:
        return False
    return True
