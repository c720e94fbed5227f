"""White-box discrete token search over a slot of a prompt (GCG / AutoPrompt) on the local Llama.

A prompt per example is ``prefix + slot + suffix``, where the *slot* is ``S`` token ids shared by
every example, the tokens being searched. The task loss is label-word classification, as in
:func:`langtorch.functional.losses.decoder_classification_loss`: the model's next-token logits at
the last position, restricted to the ``K`` label words, are scored with cross-entropy against
each example's class. The search minimises, over slots of real tokens,

    ``total = task_loss + fluency_weight * fluency``

where ``fluency`` is the model's own mean negative log-probability of the slot tokens given what
precedes them (prefix and earlier slot tokens), a term that pushes the slot to read as text.

Method (Zou et al. 2023, "Universal and Transferable Adversarial Attacks", GCG; after Shin et al.
2020, AutoPrompt). Write the slot as one-hot rows ``X [S, V]`` and feed ``X @ E`` (``E`` the
``[V, H]`` embedding table) as ``inputs_embeds``. The gradient ``G = d total / d X`` linearises
the effect of a single-token swap: replacing the token at position ``s`` by ``v`` changes the loss
by about ``G[s, v] - G[s, current]``. Each step therefore

1. computes ``G`` at the current slot (:func:`slot_gradients`, one forward + backward pass);
2. keeps, per position, the ``top_k`` allowed tokens with the most negative ``G[s, v]``, and
   samples ``num_candidates`` slots that each change one random position to one random top-k
   token (:func:`candidate_swaps`);
3. evaluates the exact loss of every candidate in one batched call (:func:`score_candidates`) and
   moves to the best one if it beats the current slot (:func:`token_search`); the current slot
   is thus always the best seen so far.

Cost per step, with ``n`` examples: ``n * num_candidates`` forward passes to score candidates,
plus one gradient pass over the ``n`` examples (≈ 3 forwards in FLOPs) whenever the slot changed
(an unchanged slot reuses its gradient). :class:`TokenSearchResult` reports the exact count.

Batch layout (:class:`SearchBatch`): rows are *left*-padded, so the answer position is the last
column for every row; positions come from :func:`langtorch.functional.models.llama.positions_from_mask`
and row lengths are padded to the length buckets of :mod:`langtorch.functional.shapes`, so a new
prompt length does not recompile. Every function here is jitted once per shape and static option.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional.models import llama
    >>> from langtorch.functional import token_search as ts
    >>> cfg = llama.LlamaConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
    ...                         num_kv_heads=1, head_dim=8, intermediate_size=16)
    >>> params = llama.random_params(jax.random.key(0), cfg)
    >>> batch = ts.make_slot_batch([1, 2], [[3, 4], [5], [6, 7, 8]], targets=[0, 1, 0],
    ...                            label_ids=[10, 11], num_slots=2)
    >>> res = ts.token_search(params, batch, jnp.array([20, 21]), config=cfg, steps=3,
    ...                       top_k=4, num_candidates=8, key=jax.random.key(1))
    >>> res.slot_ids.shape, len(res.loss_history), bool(res.loss <= res.loss_history[0])
    ((2,), 4, True)
    >>> res.forward_passes == 3 * (8 * 3 + res.gradient_passes)
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional.losses import _label_head, _weighted_ce
from langtorch.functional.models import llama
from langtorch.functional.models.decoder import softcap_logits
from langtorch.functional.shapes import DEFAULT_LENGTH_BUCKETS, bucket

__all__ = [
    "SearchBatch",
    "CandidateScores",
    "TokenSearchResult",
    "make_slot_batch",
    "allowed_token_mask",
    "slot_gradients",
    "candidate_swaps",
    "score_candidates",
    "token_search",
]


class SearchBatch(NamedTuple):
    """A left-padded batch of ``prefix + slot + suffix`` prompts with label-word targets.

    (Formerly ``SlotBatch``: that name now means only the decode engine's
    :class:`langtorch.functional.engine.SlotBatch`; the old name still works and warns.)

    A pytree of arrays (it passes through ``jit``). Build it with :func:`make_slot_batch`.

    Attributes:
        ids: ``[B, T]`` int32 token ids, left padded; the slot columns hold a placeholder that
            every function here overwrites with the slot being evaluated.
        mask: ``[B, T]`` int32, 1 for real tokens (slot included).
        slot_pos: ``[B, S]`` int32 column of each slot token in each row.
        target: ``[B]`` int32 class index into ``label_ids``.
        weight: ``[B]`` float32 example weights (0 for padding rows).
        label_ids: ``[K]`` int32 token id of each class's label word.

    Example:
        >>> from langtorch.functional.token_search import make_slot_batch
        >>> b = make_slot_batch([7], [[8, 9]], targets=[1], label_ids=[3, 4], num_slots=2,
        ...                     buckets=(8,))
        >>> b.ids.tolist(), b.slot_pos.tolist()
        ([[0, 0, 0, 7, 0, 0, 8, 9]], [[4, 5]])
    """

    ids: jax.Array
    mask: jax.Array
    slot_pos: jax.Array
    target: jax.Array
    weight: jax.Array
    label_ids: jax.Array


class CandidateScores(NamedTuple):
    """Per-candidate results of :func:`score_candidates`, each ``[C]`` float32.

    Attributes:
        total: ``task + fluency_weight * fluency`` (what the search minimises).
        task: weighted mean label-word cross-entropy over the examples.
        fluency: mean negative log-probability of the slot tokens (zeros when
            ``fluency_weight == 0``: it is then not computed).
        accuracy: weighted fraction of examples whose argmax label word is the target.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.token_search import CandidateScores
        >>> CandidateScores(*([jnp.zeros(3)] * 4)).total.shape
        (3,)
    """

    total: jax.Array
    task: jax.Array
    fluency: jax.Array
    accuracy: jax.Array


class TokenSearchResult(NamedTuple):
    """Outcome of :func:`token_search`.

    Attributes:
        slot_ids: ``[S]`` int32 numpy array, the best slot found.
        loss: its objective (``task + fluency_weight * fluency``).
        loss_history: float numpy array ``[steps_run + 1]``: entry 0 is the loss of the initial
            slot, entry ``i`` the best loss after step ``i`` (never increasing).
        forward_passes: model evaluations of one example, exactly
            ``n * (num_candidates * steps_run + gradient_passes)`` with ``n`` the number of
            examples of nonzero weight; a gradient pass counts once although its backward costs
            about two more forwards, and padding (rows, candidate chunks) is not counted.
        gradient_passes: forward + backward passes over the examples: one for the initial slot
            and one at the start of each step that follows an accepted move.
        steps: steps run (fewer than asked when the callback stopped the search).

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.token_search import TokenSearchResult
        >>> r = TokenSearchResult(np.array([1, 2]), 0.5, np.array([0.7, 0.5]), 30, 2, 1)
        >>> bool(r.loss_history[-1] == r.loss)
        True
    """

    slot_ids: np.ndarray
    loss: float
    loss_history: np.ndarray
    forward_passes: int
    gradient_passes: int
    steps: int


# ------------------------------------------------------------------------------------ inputs


def _rows_of(value: Any, n: int, name: str) -> list[list[int]]:
    """One token list per example from a shared list or a list of per-example lists."""
    value = list(value)
    if all(isinstance(v, (int, np.integer)) for v in value):
        return [[int(v) for v in value]] * n
    if len(value) != n:
        raise ValueError(f"make_slot_batch: expected `{name}` to be one shared token list or "
                         f"{n} per-example lists (one per target), got {len(value)} lists.")
    return [[int(v) for v in row] for row in value]


def _slot_rows(pre: list[list[int]], suf: list[list[int]], num_slots: int, length: int,
               rows: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``[rows, length]`` ids and mask and ``[rows, S]`` slot positions of the rows
    ``prefix + [pad_id] * S + suffix``, left padded; rows past the examples copy row 0 (a
    well-formed row: no all-masked attention; :func:`make_slot_batch` gives them weight 0)."""
    n = len(pre)
    ids = np.full((rows, length), pad_id, np.int32)
    mask = np.zeros((rows, length), np.int32)
    slot_pos = np.zeros((rows, num_slots), np.int32)
    for i in range(n):
        row = pre[i] + [pad_id] * num_slots + suf[i]
        start = length - len(row)
        ids[i, start:] = row
        mask[i, start:] = 1
        slot_pos[i] = start + len(pre[i]) + np.arange(num_slots)
    ids[n:], mask[n:], slot_pos[n:] = ids[0], mask[0], slot_pos[0]
    return ids, mask, slot_pos


def make_slot_batch(
    prefix: Sequence[int] | Sequence[Sequence[int]],
    suffix: Sequence[int] | Sequence[Sequence[int]],
    *,
    targets: Sequence[int],
    label_ids: Sequence[int],
    num_slots: int,
    pad_id: int = 0,
    weights: Sequence[float] | None = None,
    buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    length: int | None = None,
    batch_size: int | None = None,
) -> SearchBatch:
    """Build a :class:`SearchBatch` of rows ``prefix + [slot] * num_slots + suffix``, left padded.

    Args:
        prefix: token ids before the slot: one list shared by all examples or one list per
            example (may be empty).
        suffix: token ids after the slot, shared or per example; the model's next-token
            prediction after the last suffix token is scored (so the suffix usually ends with
            the answer cue, e.g. ``"Answer:"``).
        targets: ``[B]`` class index of each example (into ``label_ids``); fixes ``B``.
        label_ids: ``[K]`` token id of each class's label word.
        num_slots: ``S``, the slot length (>= 1).
        pad_id: id written in padding and slot placeholder columns (they are masked/overwritten).
        weights: optional per-example weights (default 1).
        buckets: row-length buckets (default: the generation engine's).
        length: pad to exactly this length instead of a bucket.
        batch_size: add rows up to this many (copies of row 0 with weight 0), so that the
            batch dimension is fixed too.

    Example:
        >>> from langtorch.functional.token_search import make_slot_batch
        >>> b = make_slot_batch([[5], []], [6], targets=[0, 1], label_ids=[1, 2], num_slots=1,
        ...                     length=4, batch_size=3)
        >>> b.mask.tolist(), b.slot_pos.tolist(), b.weight.tolist()
        ([[0, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]], [[2], [2], [2]], [1.0, 1.0, 0.0])
    """
    if num_slots < 1:
        raise ValueError(f"make_slot_batch: expected num_slots >= 1, got {num_slots}.")
    targets = [int(t) for t in targets]
    label_ids = [int(i) for i in label_ids]
    n = len(targets)
    if n == 0:
        raise ValueError("make_slot_batch: expected at least one example (target), got none.")
    if not label_ids:
        raise ValueError("make_slot_batch: expected at least one label id, got none.")
    bad = [t for t in targets if not 0 <= t < len(label_ids)]
    if bad:
        raise ValueError(f"make_slot_batch: targets index label_ids, so must lie in "
                         f"[0, {len(label_ids)}); got {bad[:5]}.")
    pre, suf = _rows_of(prefix, n, "prefix"), _rows_of(suffix, n, "suffix")
    lens = [len(p) + num_slots + len(s) for p, s in zip(pre, suf)]
    if length is None:
        length = bucket(max(lens), tuple(buckets))
    if max(lens) > length:
        raise ValueError(f"make_slot_batch: a row has {max(lens)} tokens (slot included), more "
                         f"than length={length}.")
    rows = n if batch_size is None else batch_size
    if rows < n:
        raise ValueError(f"make_slot_batch: {n} examples do not fit batch_size={batch_size}.")
    w = np.ones(n, np.float32) if weights is None else np.asarray(weights, np.float32)
    if w.shape != (n,):
        raise ValueError(f"make_slot_batch: expected {n} weights, got shape {w.shape}.")
    ids, mask, slot_pos = _slot_rows(pre, suf, num_slots, length, rows, pad_id)
    target = np.zeros(rows, np.int32)
    target[:n] = targets
    weight = np.zeros(rows, np.float32)
    weight[:n] = w
    return SearchBatch(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(slot_pos),
                     jnp.asarray(target), jnp.asarray(weight),
                     jnp.asarray(label_ids, jnp.int32))


def allowed_token_mask(vocab_size: int, *, token_texts: Sequence[str] | None = None,
                       exclude_ids: Sequence[int] = (), ascii_only: bool = True) -> np.ndarray:
    """A ``[V]`` bool mask of the tokens the search may put in the slot.

    Args:
        vocab_size: ``V``.
        token_texts: optional decoded text of each token id (e.g.
            ``[tok.decode([i]) for i in range(V)]``); tokens whose text is empty, whitespace
            only, or holds a non-printable (or, with ``ascii_only``, non-ASCII) character are
            excluded.
        exclude_ids: ids to exclude whatever their text (special tokens: BOS/EOS, chat markers).
        ascii_only: also exclude tokens with non-ASCII characters (the usual GCG filter).

    Example:
        >>> from langtorch.functional.token_search import allowed_token_mask
        >>> allowed_token_mask(5, token_texts=["<s>", " the", "\\n", "é", ""],
        ...                    exclude_ids=[0]).tolist()
        [False, True, False, False, False]
    """
    mask = np.ones(vocab_size, bool)
    if token_texts is not None:
        if len(token_texts) != vocab_size:
            raise ValueError(f"allowed_token_mask: expected {vocab_size} token texts, got "
                             f"{len(token_texts)}.")
        for i, text in enumerate(token_texts):
            ok = bool(text.strip()) and text.isprintable() and (not ascii_only or text.isascii())
            mask[i] = ok
    ex = np.asarray(list(exclude_ids), np.int64)
    if ex.size and (ex.min() < 0 or ex.max() >= vocab_size):
        raise ValueError(f"allowed_token_mask: exclude_ids must lie in [0, {vocab_size}), got "
                         f"{ex[(ex < 0) | (ex >= vocab_size)][:5].tolist()}.")
    mask[ex] = False
    return mask


# ------------------------------------------------------------------------------------ checks


def _concrete(x: Any) -> np.ndarray | None:
    """``x`` as numpy, or None under a trace (checks of values then defer to the caller)."""
    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def _check_ids(ids: Any, vocab: int, fn: str, name: str) -> None:
    """Integer dtype and (when concrete) every id in ``[0, vocab)``."""
    dtype = jnp.result_type(ids)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{fn}: expected integer token ids in `{name}`, got dtype {dtype}.")
    v = _concrete(ids)
    if v is not None and v.size and (v.min() < 0 or v.max() >= vocab):
        bad = v[(v < 0) | (v >= vocab)]
        raise ValueError(f"{fn}: token ids in `{name}` must lie in [0, vocab_size={vocab}), got "
                         f"{bad[:5].tolist()}.")


def _check_slot(slot_ids: Any, batch: SearchBatch, vocab: int, fn: str,
                name: str = "slot_ids") -> jax.Array:
    """``slot_ids`` as an int32 array after checking it against the batch and the vocabulary."""
    if not isinstance(slot_ids, jax.Array):
        slot_ids = np.asarray(slot_ids)
    shape = tuple(jnp.shape(slot_ids))
    s = batch.slot_pos.shape[-1]
    if len(shape) != 1 or shape[0] == 0:
        raise ValueError(f"{fn}: expected `{name}` to be a non-empty 1-d array of token ids, got "
                         f"shape {shape}.")
    if shape[0] != s:
        raise ValueError(f"{fn}: the batch was built with a slot of {s} tokens, got `{name}` "
                         f"of {shape[0]} tokens; rebuild the batch with num_slots={shape[0]}.")
    _check_ids(slot_ids, vocab, fn, name)
    return jnp.asarray(slot_ids, jnp.int32)


def _check_batch(batch: Any, vocab: int, fn: str) -> None:
    """A :class:`SearchBatch` whose token ids (prompt and label words) are in the vocabulary."""
    if not isinstance(batch, SearchBatch):
        raise ValueError(f"{fn}: expected a SearchBatch (see make_slot_batch), got "
                         f"{type(batch).__name__}.")
    _check_ids(batch.ids, vocab, fn, "batch.ids")
    _check_ids(batch.label_ids, vocab, fn, "batch.label_ids")


def _check_swap_options(vocab: int, top_k: Any, num_candidates: Any, allowed_mask: Any,
                        fn: str) -> jax.Array:
    """Validate the GCG sampling options; return the ``[V]`` bool allowed mask."""
    if not isinstance(num_candidates, (int, np.integer)) or num_candidates < 1:
        raise ValueError(f"{fn}: expected an int num_candidates >= 1, got {num_candidates!r}.")
    allowed = jnp.ones((vocab,), bool) if allowed_mask is None \
        else jnp.asarray(allowed_mask, bool)
    if allowed.shape != (vocab,):
        raise ValueError(f"{fn}: expected allowed_mask of shape ({vocab},) (one flag per "
                         f"vocabulary token), got shape {allowed.shape}.")
    a = _concrete(allowed)
    n_allowed = vocab if a is None else int(a.sum())
    if not isinstance(top_k, (int, np.integer)) or not 1 <= top_k <= n_allowed:
        raise ValueError(f"{fn}: expected an int top_k in [1, {n_allowed}] (the number of "
                         f"allowed tokens), got {top_k!r}; lower top_k or allow more tokens.")
    return allowed


def _check_chunk(chunk_size: Any, num: int, fn: str) -> int:
    chunk = num if chunk_size is None else chunk_size
    if not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"{fn}: expected an int chunk_size >= 1 or None, got {chunk_size!r}.")
    return int(min(chunk, num))


def _check_fluency(fluency_weight: Any, fn: str) -> float:
    try:
        w = float(fluency_weight)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise ValueError(f"{fn}: fluency_weight is a static option and must be a Python number, "
                         f"got {type(fluency_weight).__name__}.") from None
    if not np.isfinite(w) or w < 0:
        raise ValueError(f"{fn}: expected a finite fluency_weight >= 0, got {fluency_weight}.")
    return w


# ------------------------------------------------------------------------------------ objective


class _Parts(NamedTuple):
    task: jax.Array
    fluency: jax.Array
    accuracy: jax.Array


def _objective(params: Any, batch: SearchBatch, embeds: jax.Array, slot_target: jax.Array, *,
               config: llama.LlamaConfig, with_fluency: bool) -> _Parts:
    """Task loss, fluency and accuracy for ``embeds [B, T, H]`` whose slot columns are written.

    ``slot_target`` is the slot as ids ``[S]`` or as (one-hot) rows ``[S, V]``: the fluency term
    reads the slot tokens' log-probabilities by gather or by dot product respectively, so that it
    is differentiable in the one-hot relaxation.
    """
    mask = batch.mask
    h, _ = llama.hidden_states(params, None, llama.positions_from_mask(mask), mask,
                               inputs_embeds=embeds, config=config)
    # Left padding: every row's answer is predicted at the last column.
    label_logits = softcap_logits(
        (h[:, -1] @ _label_head(params, batch.label_ids)).astype(jnp.float32), config)
    task, metrics = _weighted_ce(label_logits, {"target": batch.target, "weight": batch.weight})
    if not with_fluency:
        return _Parts(task, jnp.zeros((), jnp.float32), metrics["accuracy"])
    # Slot token s is predicted at column slot_pos - 1, if that column holds a real token.
    prev = batch.slot_pos - 1
    safe = jnp.maximum(prev, 0)
    hp = jnp.take_along_axis(h, safe[..., None], axis=1)  # [B, S, H]
    logp = jax.nn.log_softmax(llama.lm_head(params, hp, config), axis=-1)  # [B, S, V]
    if slot_target.ndim == 1:
        nll = -jnp.take_along_axis(logp, jnp.broadcast_to(slot_target, prev.shape)[..., None],
                                   axis=-1)[..., 0]
    else:
        nll = -jnp.einsum("bsv,sv->bs", logp, slot_target.astype(jnp.float32))
    valid = (prev >= 0) & (jnp.take_along_axis(mask, safe, axis=1) > 0)
    w = valid.astype(jnp.float32) * batch.weight[:, None].astype(jnp.float32)
    fluency = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1e-9)
    return _Parts(task, fluency, metrics["accuracy"])


def _write_slot(values: jax.Array, slot_pos: jax.Array, slot: jax.Array) -> jax.Array:
    """``values [B, T, ...]`` with ``slot [S, ...]`` written at each row's slot columns."""
    rows = jnp.arange(values.shape[0])[:, None]
    return values.at[rows, slot_pos].set(
        jnp.broadcast_to(slot.astype(values.dtype), (*slot_pos.shape, *slot.shape[1:])))


@functools.partial(jax.jit, static_argnames=("config", "fluency_weight"))
def _slot_gradients(params, batch, slot_ids, *, config, fluency_weight):
    table = params["embed"]

    def total(onehot):
        tok = jnp.take(table, batch.ids, axis=0)
        embeds = _write_slot(tok, batch.slot_pos, onehot @ table.astype(jnp.float32))
        parts = _objective(params, batch, embeds, onehot, config=config,
                           with_fluency=fluency_weight != 0)
        return parts.task + fluency_weight * parts.fluency

    onehot = jax.nn.one_hot(slot_ids, table.shape[0], dtype=jnp.float32)
    return jax.value_and_grad(total)(onehot)


def slot_gradients(params: Any, batch: SearchBatch, slot_ids: jax.Array, *,
                   config: llama.LlamaConfig,
                   fluency_weight: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """``(loss, grad [S, V])``: the objective at ``slot_ids`` and its gradient w.r.t. the slot's
    one-hot encoding.

    The slot enters the model as ``one_hot(slot_ids) @ E`` through ``inputs_embeds``, so
    ``grad == d loss / d slot_embeds @ E.T``; ``grad[s, v] - grad[s, slot_ids[s]]`` is the
    first-order estimate of the loss change when position ``s`` becomes token ``v``.

    Args:
        params: Llama params.
        batch: a :class:`SearchBatch`.
        slot_ids: ``[S]`` int token ids.
        config: the decoder's static configuration.
        fluency_weight: weight of the fluency term in the objective (static).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.token_search import make_slot_batch, slot_gradients
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> b = make_slot_batch([1], [[2], [3, 4]], targets=[0, 1], label_ids=[5, 6],
        ...                     num_slots=3)
        >>> loss, grad = slot_gradients(p, b, jnp.array([7, 8, 9]), config=cfg)
        >>> grad.shape, bool(loss > 0)
        ((3, 16), True)
    """
    _check_batch(batch, config.vocab_size, "slot_gradients")
    slot = _check_slot(slot_ids, batch, config.vocab_size, "slot_gradients")
    w = _check_fluency(fluency_weight, "slot_gradients")
    return _slot_gradients(params, batch, slot, config=config, fluency_weight=w)


# ------------------------------------------------------------------------------------ candidates


@functools.partial(jax.jit, static_argnames=("top_k", "num_candidates"))
def _candidate_swaps(grad, slot_ids, key, allowed, *, top_k, num_candidates):
    s, v = grad.shape
    score = jnp.where(allowed[None, :], -grad.astype(jnp.float32), -jnp.inf)
    # The current token ranks last among allowed ones: proposing it again is a wasted evaluation,
    # but with top_k == #allowed it is the only filler that is still an allowed token.
    current = jax.nn.one_hot(slot_ids, v, dtype=bool) & allowed[None, :]
    score = jnp.where(current, jnp.finfo(jnp.float32).min, score)
    _, top = jax.lax.top_k(score, top_k)  # [S, top_k]
    kpos, ktok = jax.random.split(key)
    pos = jax.random.randint(kpos, (num_candidates,), 0, s)
    pick = jax.random.randint(ktok, (num_candidates,), 0, top_k)
    cands = jnp.broadcast_to(slot_ids.astype(jnp.int32), (num_candidates, s))
    return cands.at[jnp.arange(num_candidates), pos].set(top[pos, pick].astype(jnp.int32))


def candidate_swaps(grad: jax.Array, slot_ids: jax.Array, key: jax.Array, *, top_k: int,
                    num_candidates: int, allowed_mask: jax.Array | None = None) -> jax.Array:
    """GCG proposals ``[num_candidates, S]``: each is ``slot_ids`` with one position swapped.

    Per position ``s`` the ``top_k`` allowed tokens with the most negative ``grad[s]`` form the
    shortlist (the current token is ranked last, so it is proposed only when ``top_k`` equals the
    number of allowed tokens); each candidate then draws a uniformly random position and a
    uniformly random shortlisted token for it. Shapes are fixed by the static ``top_k`` and
    ``num_candidates``.

    Args:
        grad: ``[S, V]`` from :func:`slot_gradients`.
        slot_ids: ``[S]`` the current slot.
        key: a JAX PRNG key.
        top_k: shortlist size per position, ``1 <= top_k <= number of allowed tokens``.
        num_candidates: ``C >= 1``.
        allowed_mask: optional ``[V]`` bool, the tokens that may be proposed
            (see :func:`allowed_token_mask`); default all.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.token_search import candidate_swaps
        >>> grad = jnp.zeros((2, 6)).at[:, 4].set(-1.0)      # token 4 looks best everywhere
        >>> c = candidate_swaps(grad, jnp.array([0, 1]), jax.random.key(0), top_k=1,
        ...                     num_candidates=3)
        >>> c.shape, bool(((c == 4).sum(1) == 1).all())
        ((3, 2), True)
    """
    fn = "candidate_swaps"
    gshape = tuple(jnp.shape(grad))
    if len(gshape) != 2 or gshape[0] == 0:
        raise ValueError(f"{fn}: expected grad of shape [S >= 1, V], got shape {gshape}.")
    s, v = gshape
    if not isinstance(slot_ids, jax.Array):
        slot_ids = np.asarray(slot_ids)
    sshape = tuple(jnp.shape(slot_ids))
    if sshape != (s,):
        raise ValueError(f"{fn}: expected slot_ids of shape ({s},) to match grad {gshape}, got "
                         f"shape {sshape}.")
    _check_ids(slot_ids, v, fn, "slot_ids")
    allowed = _check_swap_options(v, top_k, num_candidates, allowed_mask, fn)
    return _candidate_swaps(grad, jnp.asarray(slot_ids, jnp.int32), key, allowed,
                            top_k=int(top_k), num_candidates=int(num_candidates))


# ------------------------------------------------------------------------------------ scoring


@functools.partial(jax.jit, static_argnames=("config", "fluency_weight", "chunk_size"))
def _score_candidates(params, batch, candidates, *, config, fluency_weight, chunk_size):
    c, s = candidates.shape
    n_chunks = -(-c // chunk_size)
    # Pad to whole chunks with copies of the last candidate (dropped below): fixed shapes.
    padded = jnp.concatenate(
        [candidates, jnp.broadcast_to(candidates[-1:], (n_chunks * chunk_size - c, s))])
    table = params["embed"]

    def one(slot):
        ids = _write_slot(batch.ids, batch.slot_pos, slot)
        return _objective(params, batch, jnp.take(table, ids, axis=0), slot, config=config,
                          with_fluency=fluency_weight != 0)

    parts = jax.lax.map(jax.vmap(one), padded.reshape(n_chunks, chunk_size, s))
    parts = jax.tree.map(lambda x: x.reshape(-1)[:c], parts)
    return CandidateScores(parts.task + fluency_weight * parts.fluency, parts.task,
                           parts.fluency, parts.accuracy)


def score_candidates(params: Any, batch: SearchBatch, candidates: jax.Array, *,
                     config: llama.LlamaConfig, fluency_weight: float = 0.0,
                     chunk_size: int | None = None) -> CandidateScores:
    """The exact objective of every candidate slot ``[C, S]`` in one jitted batched call.

    Each candidate runs over the whole batch (``C * B`` rows); the candidates are processed
    ``chunk_size`` at a time under ``lax.map`` (one compiled body), which bounds activation memory
    to ``chunk_size * B`` rows (plus ``chunk_size * B * S * V`` fluency logits when
    ``fluency_weight > 0``).

    Args:
        params: Llama params.
        batch: a :class:`SearchBatch`.
        candidates: ``[C, S]`` int token ids (e.g. from :func:`candidate_swaps`).
        config: the decoder's static configuration.
        fluency_weight: weight of the fluency term (static); 0 skips computing it.
        chunk_size: candidates per chunk (static); default all ``C`` at once.

    Returns:
        :class:`CandidateScores`, each field ``[C]``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.token_search import make_slot_batch, score_candidates
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> b = make_slot_batch([1], [[2], [3]], targets=[0, 1], label_ids=[5, 6], num_slots=2)
        >>> sc = score_candidates(p, b, jnp.array([[7, 8], [9, 10], [11, 12]]), config=cfg,
        ...                       fluency_weight=0.5, chunk_size=2)
        >>> sc.total.shape, bool(jnp.allclose(sc.total, sc.task + 0.5 * sc.fluency))
        ((3,), True)
    """
    fn = "score_candidates"
    _check_batch(batch, config.vocab_size, fn)
    if not isinstance(candidates, jax.Array):
        candidates = np.asarray(candidates)
    shape = tuple(jnp.shape(candidates))
    s = batch.slot_pos.shape[-1]
    if len(shape) != 2 or shape[0] < 1 or shape[1] != s:
        raise ValueError(f"{fn}: expected candidates of shape [C >= 1, S = {s}] (the batch's "
                         f"slot length), got shape {shape}.")
    _check_ids(candidates, config.vocab_size, fn, "candidates")
    w = _check_fluency(fluency_weight, fn)
    chunk = _check_chunk(chunk_size, shape[0], fn)
    return _score_candidates(params, batch, jnp.asarray(candidates, jnp.int32), config=config,
                             fluency_weight=w, chunk_size=chunk)


# ------------------------------------------------------------------------------------ search


@functools.partial(jax.jit, static_argnames=("config", "fluency_weight", "top_k",
                                             "num_candidates", "chunk_size"))
def _propose(params, batch, grad, slot_ids, key, allowed, *, config, fluency_weight, top_k,
             num_candidates, chunk_size):
    """One GCG step after the gradient: sample, score, return the best candidate and its loss."""
    cands = _candidate_swaps(grad, slot_ids, key, allowed, top_k=top_k,
                             num_candidates=num_candidates)
    scores = _score_candidates(params, batch, cands, config=config,
                               fluency_weight=fluency_weight, chunk_size=chunk_size)
    best = jnp.argmin(scores.total)
    return cands[best], scores.total[best]


def token_search(
    params: Any,
    batch: SearchBatch,
    init_slot_ids: jax.Array,
    *,
    config: llama.LlamaConfig,
    steps: int,
    top_k: int,
    num_candidates: int,
    key: jax.Array,
    fluency_weight: float = 0.0,
    allowed_mask: jax.Array | None = None,
    chunk_size: int | None = None,
    callback: Callable[[int, np.ndarray, float], Any] | None = None,
) -> TokenSearchResult:
    """Greedy Coordinate Gradient search for the slot that minimises the objective.

    Each step proposes ``num_candidates`` one-token swaps of the current slot from the gradient
    shortlist (:func:`candidate_swaps`), scores them exactly (:func:`score_candidates`) and moves
    to the best one only if its loss is strictly lower: the current slot is always the best seen,
    and ``loss_history`` never increases. The gradient is recomputed only after a move.

    The loop runs in Python (one jitted call per step, plus one gradient call after a move), so a
    callback can watch or stop it; the jitted pieces compile once per shape and static option.

    Args:
        params: Llama params.
        batch: a :class:`SearchBatch` (:func:`make_slot_batch`).
        init_slot_ids: ``[S]`` starting token ids.
        config: the decoder's static configuration.
        steps: number of steps (>= 0).
        top_k: shortlist size per position (see :func:`candidate_swaps`).
        num_candidates: candidates scored per step.
        key: a JAX PRNG key (split once per step).
        fluency_weight: weight of the fluency term (>= 0).
        allowed_mask: optional ``[V]`` bool of tokens that may enter the slot.
        chunk_size: candidates per scoring chunk (see :func:`score_candidates`).
        callback: ``callback(step, slot_ids, loss)`` after each step (step counts from 1); a
            truthy return value stops the search.

    Returns:
        :class:`TokenSearchResult` (the forward-pass count is documented there).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.token_search import make_slot_batch, token_search
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> b = make_slot_batch([1], [[2], [3]], targets=[0, 1], label_ids=[5, 6], num_slots=2)
        >>> seen = []
        >>> r = token_search(p, b, jnp.array([7, 8]), config=cfg, steps=5, top_k=3,
        ...                  num_candidates=4, key=jax.random.key(0),
        ...                  callback=lambda step, ids, loss: seen.append(step) or step == 2)
        >>> r.steps, seen, bool((jnp.diff(jnp.asarray(r.loss_history)) <= 0).all())
        (2, [1, 2], True)
    """
    fn = "token_search"
    _check_batch(batch, config.vocab_size, fn)
    slot = _check_slot(init_slot_ids, batch, config.vocab_size, fn, "init_slot_ids")
    w = _check_fluency(fluency_weight, fn)
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"{fn}: expected an int steps >= 0, got {steps!r}.")
    allowed = _check_swap_options(config.vocab_size, top_k, num_candidates, allowed_mask, fn)
    chunk = _check_chunk(chunk_size, int(num_candidates), fn)
    opts = dict(config=config, fluency_weight=w, top_k=int(top_k),
                num_candidates=int(num_candidates), chunk_size=chunk)
    n = int(np.count_nonzero(np.asarray(batch.weight)))
    loss, grad = _slot_gradients(params, batch, slot, config=config, fluency_weight=w)
    best_loss = float(loss)
    history = [best_loss]
    grad_passes, done, stale = 1, 0, False
    for step in range(1, steps + 1):
        if stale:  # the slot moved: a fresh gradient (an unchanged slot reuses the last one)
            _, grad = _slot_gradients(params, batch, slot, config=config, fluency_weight=w)
            grad_passes, stale = grad_passes + 1, False
        key, sub = jax.random.split(key)
        cand, cand_loss = _propose(params, batch, grad, slot, sub, allowed, **opts)
        cand_loss = float(cand_loss)
        done = step
        if cand_loss < best_loss:
            slot, best_loss, stale = cand, cand_loss, True
        history.append(best_loss)
        if callback is not None and callback(step, np.asarray(slot), best_loss):
            break
    return TokenSearchResult(
        slot_ids=np.asarray(slot), loss=best_loss, loss_history=np.asarray(history),
        forward_passes=n * (int(num_candidates) * done + grad_passes),
        gradient_passes=grad_passes, steps=done)


def __getattr__(name: str) -> Any:
    # Renamed: the decode engine's `langtorch.functional.engine.SlotBatch` (KV-cache slots) is
    # unrelated to this batch of prompts with search slots.
    if name == "SlotBatch":
        import warnings

        warnings.warn("langtorch.functional.token_search.SlotBatch is renamed SearchBatch "
                      "(SlotBatch is the decode engine's class); use SearchBatch.",
                      DeprecationWarning, stacklevel=2)
        return SearchBatch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
