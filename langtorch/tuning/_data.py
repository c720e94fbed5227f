"""Data and batching for :class:`~langtorch.tuning.PromptTuner`: texts -> token rows -> batches.

A *row* is one tokenised example: ``(ids, answer index, target class)`` in classification,
``(prompt ids, target ids)`` in generation. Rows become fixed-shape padded batches (bucketed
lengths, a fixed batch axis, zero-weight padding rows), and an epoch becomes jitted *calls* of
``steps_per_call`` stacked batches, so a run compiles a handful of times and never after warm-up.
Every function reads the tuner's settings when it runs (``template``, ``HARD_SEPARATOR``, ...).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from langtorch.functional import losses as L
from langtorch.functional import prompt_tuning as PT
from langtorch.functional import sharding as S
from langtorch.tuning._errors import PromptTuningError

if TYPE_CHECKING:
    from langtorch.tuning._tuner import PromptTuner

EVAL_BATCH = 32
"""Rows per evaluation batch (classification; generation uses 8)."""
_LABEL_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def is_int(value: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def texts(x: Any, what: str) -> list[str]:
    """``x`` (a str, a TextTensor or a sequence) as a non-empty flat list of str."""
    if isinstance(x, str):
        x = [x]
    found = getattr(x, "texts", None)
    flat = np.asarray(found).reshape(-1).tolist() if found is not None else [str(s) for s in x]
    if not flat:
        raise PromptTuningError(f"PromptTuner: expected a non-empty {what}, got 0 entries.")
    return [str(s) for s in flat]


def shape(x: Any) -> tuple[int, ...]:
    """The shape of ``x`` (``()`` for a single str)."""
    if isinstance(x, str):
        return ()
    return tuple(getattr(x, "shape", (len(x),)))


# ------------------------------------------------------------------ texts -> rows
def prefix_ids(t: PromptTuner, text: str, prefix: str = "") -> list[int]:
    """Token ids of ``text`` in the template (and the chat template with ``chat=True``)."""
    # A hard-prompt prefix is joined as in hard_template(): what any backend would see.
    prefix = prefix + t.HARD_SEPARATOR if prefix else ""
    filled = prefix + t.template.replace("{}", text)
    if t.kind == "decoder" and t.chat:
        msgs = ([{"role": "system", "content": t.system}] if t.system else [])
        msgs.append({"role": "user", "content": filled})
        return t._encode(t.model.apply_chat_template(msgs))
    return t._encode(filled)


def _check_len(t: PromptTuner, n: int, text: str, p: int, extra: int = 0) -> None:
    if n + p + extra > t.context:
        label = (f" and the {extra} label tokens read after it" if extra else "")
        raise PromptTuningError(
            f"PromptTuner: an input is {n} tokens; with the {p}-token prompt{label} that is "
            f"{n + p + extra}, more than the model's context of {t.context} tokens "
            f"(input starts {text[:60]!r}). Shorten the inputs or use fewer virtual tokens.")


def examples(t: PromptTuner, xs: list[str], targets: list[str] | None, prefix: str = "",
             p: int | None = None) -> list[tuple]:
    """The rows of ``xs`` (with ``targets``; ``None``: unlabelled, for prediction) for a prompt
    of ``p`` virtual tokens (default ``n_tokens``) after the text ``prefix``."""
    p = t.n_tokens if p is None else p
    out = []
    if t.labels is not None and targets is not None:
        index = {lab: i for i, lab in enumerate(t.labels)}
        bad = [y for y in targets if y not in index]
        if bad:
            raise PromptTuningError(f"PromptTuner: target {bad[0]!r} is not in the label "
                                    f"set {t.labels} ({len(bad)} such targets).")
    for i, text in enumerate(xs):
        ids = prefix_ids(t, text, prefix)
        if t.labels is not None:
            _check_len(t, len(ids), text, p, t.label_extra_tokens)
            target = index[targets[i]] if targets is not None else 0
            out.append((ids, len(ids) - 1, target))
        else:
            tgt = t._encode(targets[i]) + [int(t.model.eos_id)] if targets else []
            _check_len(t, len(ids) + len(tgt), text, p)
            out.append((ids, tgt))
    return out


def fit_data(t: PromptTuner, xs: Any, ys: Any, val: Any) -> tuple[list, list | None]:
    """The training rows and the validation rows (``None`` without ``val``) of :meth:`fit`."""
    xs, ys = texts(xs, "training set"), texts(ys, "list of targets")
    if len(xs) != len(ys):
        raise PromptTuningError(f"PromptTuner: expected as many targets as texts, got "
                                f"{len(xs)} texts and {len(ys)} targets.")
    train, held_out = examples(t, xs, ys), None
    if val is not None:
        if isinstance(val, (str, bytes)) or not isinstance(val, Sequence) or len(val) != 2:
            raise PromptTuningError("PromptTuner.fit: expected val=(texts, targets), got "
                                    f"{type(val).__name__}"
                                    + (f" of length {len(val)}" if hasattr(val, "__len__")
                                       else "") + ".")
        vx, vy = texts(val[0], "validation set"), texts(val[1], "validation targets")
        if len(vx) != len(vy):
            raise PromptTuningError(f"PromptTuner: validation has {len(vx)} texts and "
                                    f"{len(vy)} targets.")
        held_out = examples(t, vx, vy)
    return train, held_out


# ------------------------------------------------------------------ rows -> batches
def _row_len(t: PromptTuner, r: tuple) -> int:
    return len(r[0]) + (len(r[1]) if t.labels is None else 0)


def _label_k(rows: list[tuple], length: int) -> int:
    """Generation mode: the static number of label columns for rows padded to ``length``."""
    longest = max((len(r[1]) for r in rows), default=1)
    return min(PT.bucket(max(longest, 1), _LABEL_BUCKETS), length)


def batch(t: PromptTuner, rows: list[tuple], batch_size: int, length: int,
          label_k: int | None = None) -> dict:
    """``rows`` padded to ``[batch_size, length]`` (padding rows weigh 0) as a loss batch."""
    if t.labels is not None:
        ids, mask = PT.pad_rows([r[0] for r in rows], t.pad_id, length=length,
                                batch_size=batch_size)
        index = np.zeros(batch_size, np.int32)
        target = np.zeros(batch_size, np.int32)
        weight = np.zeros(batch_size, np.float32)
        for i, r in enumerate(rows):
            index[i], target[i], weight[i] = r[1], r[2], 1.0
        b = {"ids": ids, "mask": mask, "target": target, "weight": weight}
        if t.kind == "decoder":
            b["index"] = index
        return b
    seqs = [r[0] + r[1] for r in rows]
    ids, mask = PT.pad_rows(seqs, t.pad_id, length=length, batch_size=batch_size)
    labels = np.full_like(ids, L.IGNORE_INDEX)
    for i, r in enumerate(rows):
        labels[i, len(r[0]):len(r[0]) + len(r[1])] = r[1]
    k = label_k if label_k is not None else _label_k(rows, length)
    pos, valid = PT.label_positions(labels, buckets=(k,))
    return {"ids": ids, "mask": mask, "labels": labels, "label_positions": pos,
            "label_valid": valid}


def eval_batches(t: PromptTuner, rows: list[tuple],
                 batch_size: int = EVAL_BATCH) -> Iterator[tuple[list[int], dict]]:
    """``(indices into rows, batch)``: rows sorted by length, so each batch pads little."""
    order = sorted(range(len(rows)), key=lambda i: _row_len(t, rows[i]))
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        group = [rows[j] for j in idx]
        length = PT.bucket(max(_row_len(t, r) for r in group), t.length_buckets)
        yield idx, batch(t, group, batch_size, length)


# ------------------------------------------------------------------ an epoch -> jitted calls
def calls(t: PromptTuner, rows: list[tuple], batch_size: int, epoch: int, start: int = 0,
          budget: int | None = None) -> Iterator[tuple[dict, np.ndarray, int]]:
    """Yield ``(stacked batches, active [S] bool, next batch index)`` for one epoch.

    The epoch's batches are grouped into calls of ``steps_per_call`` exactly as in an
    uninterrupted run (same groups, same padded length), whatever ``start`` is: batches
    before ``start`` (already trained before a resume) and past ``budget`` (``max_steps``)
    ride along as inactive steps, so a resumed run computes bit-identical updates.
    """
    order = np.random.default_rng([t.seed, epoch]).permutation(len(rows))
    batches = [[rows[j] for j in order[i:i + batch_size]]
               for i in range(0, len(order), batch_size)]
    s = t.steps_per_call
    left = math.inf if budget is None else budget
    for i in range(0, len(batches), s):
        if i + s <= start:
            continue
        if left <= 0:
            return
        group = batches[i:i + s]
        active = np.zeros(s, bool)
        for j in range(len(group)):
            if i + j >= start and left > 0:
                active[j], left = True, left - 1
        if not active.any():
            return
        yield _stacked(t, group, active, batch_size), active, \
            i + int(np.flatnonzero(active)[-1]) + 1


def _stacked(t: PromptTuner, group: list[list[tuple]], active: np.ndarray,
             batch_size: int) -> dict:
    """One call's batches, padded to one length and stacked on a fixed step axis."""
    length = PT.bucket(max(_row_len(t, r) for g in group for r in g), t.length_buckets)
    k = None if t.labels is not None else _label_k([r for g in group for r in g], length)
    rows = -(-batch_size // S.data_size(t.mesh)) * S.data_size(t.mesh)
    stacked = [dict(batch(t, g, rows, length, k), active=np.asarray(a))
               for a, g in zip(active, group)]
    while len(stacked) < t.steps_per_call:  # keep the step axis fixed: inactive steps apply nothing
        stacked.append(dict(batch(t, [], rows, length, k), active=np.asarray(False)))
    return PT.stack_batches(stacked)
