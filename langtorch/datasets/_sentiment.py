"""Deterministic splits of the bundled sentiment sentences."""

from __future__ import annotations

import hashlib

import numpy as np

from langtorch.datasets._sentiment_data import RAW
from langtorch.tensor import TextTensor

__all__ = ["load_sentiment", "SENTIMENT_LABELS"]

SENTIMENT_LABELS = ("negative", "positive")
"""The label vocabulary of :func:`load_sentiment`, in sorted order."""

_SPLITS = ("train", "val", "test")
# Fractions per label; the remainder goes to test.
_TRAIN, _VAL = 0.6, 0.2


def _records() -> list[tuple[str, str, str]]:
    out = []
    for line in RAW.strip().splitlines():
        head, text = line.split("|", 1)
        sign, domain = head.split()
        out.append((text.strip(), "positive" if sign == "+" else "negative", domain))
    return out


def _split_of(records) -> dict[str, list[tuple[str, str, str]]]:
    # Order each label's examples by a content hash: stable across Python versions and
    # processes (unlike hash() or a seeded shuffle whose algorithm may change), and adding a
    # sentence moves no other sentence between splits except at the boundaries.
    parts: dict[str, list] = {s: [] for s in _SPLITS}
    for label in SENTIMENT_LABELS:
        rows = sorted((r for r in records if r[1] == label),
                      key=lambda r: hashlib.sha256(r[0].encode()).hexdigest())
        n_train, n_val = round(len(rows) * _TRAIN), round(len(rows) * _VAL)
        parts["train"] += rows[:n_train]
        parts["val"] += rows[n_train:n_train + n_val]
        parts["test"] += rows[n_train + n_val:]
    for s in _SPLITS:
        # Interleave the labels deterministically (again by hash), so a prefix is balanced-ish.
        parts[s].sort(key=lambda r: hashlib.sha256(("order:" + r[0]).encode()).hexdigest())
    return parts


def load_sentiment(split: str = "train") -> tuple[TextTensor, TextTensor]:
    """The bundled binary sentiment set: ``(texts, labels)`` TextTensors of shape ``[N]``.

    416 English sentences written for langtorch (no third-party data), balanced between
    ``"positive"`` and ``"negative"`` and across five domains (products, food, travel, media,
    services), with negation ("not bad at all"), contrast ("..., but ..."), sarcasm ("Oh great,
    another charger that stops working") and mixed feelings labelled by their overall verdict.
    Splits are stratified by label and fixed (60/20/20 by a content hash): the same on every
    machine and run. ``texts.metadata["domain"]`` holds each sentence's domain. Texts are data
    (``template=False``): braces in them are never parsed as placeholders.

    Args:
        split: ``"train"`` (250), ``"val"`` (84) or ``"test"`` (82); ``"all"`` gives every
            sentence (train, then val, then test).

    Returns:
        ``(texts, labels)``, both ``[N]``; labels are ``"positive"`` / ``"negative"``.

    Raises:
        ValueError: for an unknown split name.

    Example:
        >>> from langtorch.datasets import load_sentiment
        >>> texts, labels = load_sentiment("val")
        >>> texts.shape, sorted(set(labels.tolist()))
        ((84,), ['negative', 'positive'])
    """
    parts = _split_of(_records())
    if split == "all":
        rows = parts["train"] + parts["val"] + parts["test"]
    elif split in parts:
        rows = parts[split]
    else:
        raise ValueError(f"load_sentiment: expected split 'train', 'val', 'test' or 'all', "
                         f"got {split!r}.")
    texts = [r[0] for r in rows]
    meta = {"domain": np.array([r[2] for r in rows])}
    return (TextTensor(texts, metadata=meta, template=False),
            TextTensor([r[1] for r in rows], metadata=meta, template=False))
