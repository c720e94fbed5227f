"""Evaluation metrics over TextTensors: :func:`accuracy`, :func:`exact_match`, :func:`f1`.

Each takes predictions and targets (TextTensors, strings or nested lists; broadcast together,
numpy rules) and returns a :class:`MetricResult`: the mean as ``.value`` (also ``float(r)``) and
the per-entry scores as ``.per_entry`` (an array of the broadcast shape), ready to attach as a
metadata column (``preds.with_metadata(f1=r.per_entry)``) and show with ``to_pandas()``.

* ``accuracy`` — exact equality of the texts after stripping surrounding whitespace (labels);
  ``ignore_case=True`` compares case-insensitively.
* ``exact_match`` — SQuAD's EM: equality after normalisation (lower case, punctuation and the
  articles a/an/the removed, whitespace collapsed).
* ``f1`` — SQuAD's token-level F1 between the normalised texts (bag of tokens, with counts).

With ``multiple=True`` the last axis of ``targets`` lists alternative references and each
entry scores its best match, as the SQuAD evaluation script does.

Example:
    >>> import langtorch as lt
    >>> preds = lt.TextTensor(["Paris", "the Eiffel tower", "1889"])
    >>> golds = lt.TextTensor(["Paris", "Eiffel Tower", "1887"])
    >>> lt.metrics.exact_match(preds, golds)
    MetricResult(exact_match=0.6667, n=3)
    >>> lt.metrics.exact_match(preds, golds).per_entry.tolist()
    [1.0, 1.0, 0.0]
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any

import numpy as np

from langtorch.functional.text import TextTensor as _BaseTensor
from langtorch.functional.text import broadcast_shapes

__all__ = ["MetricResult", "accuracy", "exact_match", "f1", "normalize_answer"]


class MetricResult:
    """The result of a metric: ``value`` (the mean over entries), ``per_entry`` (one score per
    entry, an array of the broadcast shape of predictions and targets) and ``name``.

    ``float(result)`` is the value; results compare and format as that number.

    Example:
        >>> import langtorch as lt
        >>> r = lt.metrics.accuracy(["a", "b"], ["a", "c"])
        >>> float(r), r.per_entry.tolist(), f"{r:.2f}"
        (0.5, [1.0, 0.0], '0.50')
        >>> r >= 0.5, round(r, 1)
        (True, 0.5)
    """

    __slots__ = ("name", "value", "per_entry")

    def __init__(self, name: str, per_entry: np.ndarray):
        self.name = name
        self.per_entry = per_entry
        self.value = float(per_entry.mean())

    @property
    def n(self) -> int:
        """The number of entries scored."""
        return int(self.per_entry.size)

    def __float__(self) -> float:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, MetricResult):
            return self.name == other.name and np.array_equal(self.per_entry, other.per_entry)
        return self.value == other

    def __lt__(self, other: Any) -> bool:
        return self.value < float(other)

    def __gt__(self, other: Any) -> bool:
        return self.value > float(other)

    def __le__(self, other: Any) -> bool:
        return self.value <= float(other)

    def __ge__(self, other: Any) -> bool:
        return self.value >= float(other)

    def __round__(self, ndigits: int | None = None) -> float:
        return round(self.value, ndigits)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MetricResult({self.name}={self.value:.4f}, n={self.n})"


_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD's answer normalisation: lower case, drop punctuation and articles, collapse spaces.

    Example:
        >>> normalize_answer("The  Eiffel-Tower!")
        'eiffeltower'
    """
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _texts(x: Any, name: str) -> np.ndarray:
    if isinstance(x, _BaseTensor):
        return x.texts
    try:
        return _BaseTensor(x).texts
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None


def _score(name: str, predictions: Any, targets: Any, multiple: bool, fn) -> MetricResult:
    if not isinstance(multiple, bool):
        raise TypeError(f"{name}(multiple=...) must be a bool, got {multiple!r}")
    p, t = _texts(predictions, "predictions"), _texts(targets, "targets")
    if multiple:
        if t.ndim == 0 or t.shape[-1] == 0:
            raise ValueError(f"{name}(multiple=True): the last axis of targets lists the references "
                             f"and must not be empty; got targets of shape {t.shape}")
        shape = broadcast_shapes(p.shape, t.shape[:-1])
        p_b = np.broadcast_to(p, shape).reshape(-1).tolist()
        t_b = np.broadcast_to(t, shape + t.shape[-1:]).reshape(-1, t.shape[-1]).tolist()
        scores = [max(fn(a, r) for r in refs) for a, refs in zip(p_b, t_b)]
    else:
        shape = broadcast_shapes(p.shape, t.shape)
        p_b = np.broadcast_to(p, shape).reshape(-1).tolist()
        t_b = np.broadcast_to(t, shape).reshape(-1).tolist()
        scores = [fn(a, b) for a, b in zip(p_b, t_b)]
    if not scores:
        raise ValueError(f"{name}: there are no entries to score (shape {shape})")
    return MetricResult(name, np.asarray(scores, dtype=np.float64).reshape(shape))


def accuracy(predictions: Any, targets: Any, *, ignore_case: bool = False, multiple: bool = False) -> MetricResult:
    """The share of entries whose text equals the target's (surrounding whitespace ignored).

    Args:
        predictions: texts (TextTensor, str or nested lists).
        targets: texts that broadcast with ``predictions``; with ``multiple=True``, one more
            trailing axis of alternative references.
        ignore_case: compare case-insensitively.
        multiple: the last axis of ``targets`` holds alternatives (best match counts).

    Raises:
        ShapeError: the shapes do not broadcast.
        ValueError: nothing to score.

    Example:
        >>> import langtorch as lt
        >>> lt.metrics.accuracy(["yes", "No ", "no"], ["yes", "no", "yes"], ignore_case=True).value
        0.6666666666666666
    """
    if not isinstance(ignore_case, bool):
        raise TypeError(f"accuracy(ignore_case=...) must be a bool, got {ignore_case!r}")
    if ignore_case:
        return _score("accuracy", predictions, targets, multiple,
                      lambda a, b: float(a.strip().casefold() == b.strip().casefold()))
    return _score("accuracy", predictions, targets, multiple, lambda a, b: float(a.strip() == b.strip()))


def exact_match(predictions: Any, targets: Any, *, multiple: bool = False) -> MetricResult:
    """SQuAD exact match: 1 where the normalised texts are equal (see :func:`normalize_answer`).

    Example:
        >>> import langtorch as lt
        >>> lt.metrics.exact_match(["The cat."], [["a dog", "cat"]], multiple=True).per_entry.tolist()
        [1.0]
    """
    return _score("exact_match", predictions, targets, multiple,
                  lambda a, b: float(normalize_answer(a) == normalize_answer(b)))


def _f1(prediction: str, target: str) -> float:
    p, t = normalize_answer(prediction).split(), normalize_answer(target).split()
    if not p or not t:  # SQuAD: two empty answers agree; one empty answer scores 0
        return float(p == t)
    common = collections.Counter(p) & collections.Counter(t)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(t)
    return 2 * precision * recall / (precision + recall)


def f1(predictions: Any, targets: Any, *, multiple: bool = False) -> MetricResult:
    """SQuAD token-level F1 between normalised prediction and target (token counts matter).

    Example:
        >>> import langtorch as lt
        >>> r = lt.metrics.f1(["the big red dog"], ["a red dog"])
        >>> round(r.value, 4)   # tokens [big, red, dog] vs [red, dog]: P=2/3, R=1
        0.8
    """
    return _score("f1", predictions, targets, multiple, _f1)
