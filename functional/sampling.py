"""Logits transforms and a sort-free sampler: the OpenAI/vLLM sampling controls, per row.

Every function takes ``[B, V]`` logits and per-row parameters (``[B]`` arrays), and treats each
row on its own: a row's result never depends on the other rows (batch-invariant), so a request
samples the same tokens whichever batch it runs in. All are pure and jit-able.

The order the engine applies them in (vLLM's and Hugging Face's):

1. raw logits -> :func:`top_logprobs` (logprobs report the model's raw distribution);
2. :func:`apply_repetition_penalty` (HF semantics, over prompt + generated tokens),
   :func:`apply_penalties` (OpenAI ``frequency_penalty`` / ``presence_penalty``, over the
   generated tokens), :func:`apply_logit_bias`, :func:`apply_token_bitmask` (grammar);
3. :func:`sample`: greedy where ``temperature == 0``; else divide by the temperature and keep the
   tokens that pass ``top_k``, then ``top_p`` (over the renormalised top-k set), then ``min_p``
   (relative to the most likely token), and draw one (inverse CDF).

The sampler never sorts the vocabulary. Each filter keeps "every token whose logit is at least
some threshold", so the kept set is ``logits >= max(t_k, t_p, t_min)``. It is found first among a
row's ``candidates`` largest logits (``lax.top_k``, 64 by default): ``t_k`` is the k-th of them,
``t_p`` the first whose cumulative mass reaches ``top_p`` of the total, ``t_min`` is closed form
(``max + log(min_p)``); the token is then drawn among the candidates (inverse CDF). A row whose
kept set may reach past its candidates (a flat distribution, ``top_k`` above ``candidates``, no
filter at all, a tie at the last candidate) is resolved on the whole vocabulary instead: ``t_k``
and ``t_p`` by bisection over the float32 values' order-preserving integer codes (32 halvings
are exact: the result is one of the row's own logits, ties kept as Hugging Face keeps them), and
the draw by inverse CDF in vocabulary order, blocked (a uniform per row picks a block of 512
tokens by its block sum, then a token in it). Which way a row goes depends on that row alone,
and the full-vocabulary work runs only when some row of the batch needs it. Both ways sample
exactly ``softmax`` restricted to the kept set.

Greedy rows use :func:`argmax`, a blocked argmax (the row maximum by elementwise maxima, then
its first position), several times faster on CPU than ``jnp.argmax``'s index-carrying reduction
over a large vocabulary.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional import sampling
    >>> logits = jnp.array([[2.0, 1.0, 0.0, -1.0]])
    >>> keys = jax.random.split(jax.random.key(0), 1)
    >>> sampling.sample(logits, keys, jnp.array([1.0]), top_k=jnp.array([1])).tolist()
    [0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional.errors import BadRequestError

__all__ = [
    "apply_logit_bias",
    "apply_penalties",
    "apply_repetition_penalty",
    "apply_token_bitmask",
    "argmax",
    "check_sampling",
    "count_tokens",
    "draw",
    "keep_threshold",
    "logit_bias_arrays",
    "sample",
    "top_logprobs",
]

MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs
MIN_TEMPERATURE = 1e-5  # a smaller temperature divides as this one (vLLM: greedy below it)
CANDIDATES = 64  # top logits a sampled row is first resolved among (sample's ``candidates``)
_BLOCK = 512  # the full-vocabulary draw reads a row as [ceil(V / 512), 512]
_LANE_BLOCK = 2048  # argmax and _row_max read a row as [V // 2048, 2048] blocks and a tail
_LANES = 16  # what argmax, _row_max and the draw's block sums narrow a block to (_lanes)


def count_tokens(ids: jax.Array, vocab_size: int) -> jax.Array:
    """int32 ``[B, V]`` occurrence counts of token ids ``[B, T]`` (ids < 0 are padding).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.sampling import count_tokens
        >>> count_tokens(jnp.array([[1, 1, 3, -1]]), 4).tolist()
        [[0, 2, 0, 1]]
    """
    ids = jnp.asarray(ids, jnp.int32)
    b = ids.shape[0]
    safe = jnp.where(ids < 0, vocab_size, ids)  # out of range: dropped
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], ids.shape)
    return jnp.zeros((b, vocab_size), jnp.int32).at[rows, safe].add(1, mode="drop")


def apply_penalties(logits: jax.Array, counts: jax.Array, frequency_penalty: jax.Array,
                    presence_penalty: jax.Array) -> jax.Array:
    """OpenAI's penalties: ``logit - frequency * count - presence * (count > 0)``.

    ``counts [B, V]`` counts the tokens generated so far (not the prompt: OpenAI and vLLM
    penalise the completion only). Penalties are ``[B]``; 0 leaves a row unchanged.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.sampling import apply_penalties
        >>> apply_penalties(jnp.zeros((1, 3)), jnp.array([[0, 1, 3]]), jnp.array([0.5]),
        ...                 jnp.array([1.0])).tolist()
        [[0.0, -1.5, -2.5]]
    """
    c = counts.astype(logits.dtype)
    return (logits - frequency_penalty[:, None].astype(logits.dtype) * c
            - presence_penalty[:, None].astype(logits.dtype) * (c > 0))


def apply_repetition_penalty(logits: jax.Array, seen: jax.Array, penalty: jax.Array
                             ) -> jax.Array:
    """Hugging Face's ``repetition_penalty``: for tokens already seen (prompt or generated),
    a positive logit is divided by ``penalty`` and a negative one multiplied by it.

    Args:
        logits: ``[B, V]``; seen: ``[B, V]`` bool (or counts); penalty: ``[B]`` > 0 (1 = off).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.sampling import apply_repetition_penalty
        >>> apply_repetition_penalty(jnp.array([[2.0, -2.0, 2.0]]),
        ...                          jnp.array([[True, True, False]]), jnp.array([2.0])).tolist()
        [[1.0, -4.0, 2.0]]
    """
    p = penalty[:, None].astype(logits.dtype)
    hit = seen.astype(bool)
    return jnp.where(hit, jnp.where(logits < 0, logits * p, logits / p), logits)


def logit_bias_arrays(biases: list[Mapping[Any, float] | None], width: int | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per-row ``logit_bias`` dicts -> padded ``(ids [B, K] int32 (-1 = none), values [B, K])``.

    ``width`` fixes ``K`` (a shape bucket, so the jitted step does not recompile per request);
    default: the longest dict. Keys may be ints or strings of ints (OpenAI's JSON has strings).

    Example:
        >>> from langtorch.functional.sampling import logit_bias_arrays
        >>> ids, vals = logit_bias_arrays([{"5": -100}, None], width=2)
        >>> ids.tolist(), vals.tolist()
        ([[5, -1], [-1, -1]], [[-100.0, 0.0], [0.0, 0.0]])
    """
    k = width if width is not None else max([len(b or {}) for b in biases] + [1])
    ids = np.full((len(biases), k), -1, np.int32)
    vals = np.zeros((len(biases), k), np.float32)
    for r, b in enumerate(biases):
        items = list((b or {}).items())
        if len(items) > k:
            raise ValueError(f"logit_bias_arrays: row {r} has {len(items)} entries, more than "
                             f"width={k}.")
        for j, (tid, v) in enumerate(items):
            ids[r, j], vals[r, j] = int(tid), float(v)
    return ids, vals


def apply_logit_bias(logits: jax.Array, ids: jax.Array, values: jax.Array) -> jax.Array:
    """Add ``values [B, K]`` at token ``ids [B, K]`` of each row (ids < 0 are padding).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.sampling import apply_logit_bias
        >>> apply_logit_bias(jnp.zeros((1, 3)), jnp.array([[2, -1]]),
        ...                  jnp.array([[5.0, 9.0]])).tolist()
        [[0.0, 0.0, 5.0]]
    """
    b, v = logits.shape
    safe = jnp.where(ids < 0, v, ids)
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], ids.shape)
    return logits.at[rows, safe].add(values.astype(logits.dtype), mode="drop")


def apply_token_bitmask(logits: jax.Array, bitmask: jax.Array) -> jax.Array:
    """Set the logits of tokens a grammar forbids to ``-inf``.

    ``bitmask [B, W]`` int32 is the packed mask of :mod:`langtorch.functional.constrain`
    (bit ``i % 32`` of word ``i // 32`` allows token ``i``); an unconstrained row is all ``-1``
    (every bit set). Ids beyond ``32 * W`` are forbidden.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.sampling import apply_token_bitmask
        >>> apply_token_bitmask(jnp.zeros((2, 3)), jnp.array([[0b110], [-1]], jnp.int32)).tolist()
        [[-inf, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """
    v = logits.shape[-1]
    ids = jnp.arange(v)
    word = jnp.take(jnp.asarray(bitmask, jnp.int32), jnp.minimum(ids // 32, bitmask.shape[-1] - 1),
                    axis=-1)
    shift = jnp.broadcast_to((ids % 32).astype(jnp.int32), word.shape)
    bit = (jax.lax.shift_right_logical(word, shift) & 1) == 1
    bit = bit & (ids < 32 * bitmask.shape[-1])
    return jnp.where(bit, logits, -jnp.inf)


def _order_codes(x: jax.Array) -> jax.Array:
    """uint32 codes with the order of the float32 values (-inf lowest, +inf highest; -0.0
    and +0.0 are one value, as float comparison has them)."""
    x = x.astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, jnp.float32(0), x), jnp.uint32)
    neg = (bits >> 31) == 1
    return jnp.where(neg, ~bits, bits | jnp.uint32(0x80000000))


def _largest_code(codes: jax.Array, weight: jax.Array, target: jax.Array) -> jax.Array:
    """Per row, the largest code ``c`` with ``sum(weight[codes >= c]) >= target`` (bisection).

    ``target`` must be in ``(0, sum(weight)]``; then the answer is one of the row's codes.
    """
    lo = jnp.min(codes, axis=-1)  # the weight at or above lo is all of it: >= target
    hi = jnp.max(codes, axis=-1)

    def body(_, state):
        lo, hi = state  # invariant: f(lo) >= target, and the answer is in [lo, hi]
        mid = lo + (hi - lo + 1) // 2
        ok = jnp.sum(jnp.where(codes >= mid[:, None], weight, 0), axis=-1) >= target
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

    lo, _ = jax.lax.fori_loop(0, 33, body, (lo, hi))  # hi - lo < 2**32: 33 halvings suffice
    return lo


def keep_threshold(logits: jax.Array, top_k: jax.Array | None = None,
                   top_p: jax.Array | None = None, min_p: jax.Array | None = None
                   ) -> jax.Array:
    """bool ``[B, V]``: the tokens that pass ``top_k``, then ``top_p``, then ``min_p``.

    Semantics are Hugging Face's warpers applied in that order (ties at the top-k boundary are
    kept; top-p keeps the smallest top set whose mass, renormalised over the top-k set, reaches
    ``top_p``; min-p keeps tokens at least ``min_p`` times as likely as the most likely one).
    ``top_k <= 0`` or ``>= V``, ``top_p >= 1`` and ``min_p <= 0`` switch a filter off.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.sampling import keep_threshold
        >>> logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
        >>> keep_threshold(logits, top_p=jnp.array([0.8])).tolist()
        [[True, True, False, False]]
    """
    b = logits.shape[0]
    x = logits.astype(jnp.float32)
    codes = _order_codes(x)
    finite = x > -jnp.inf
    keep = finite
    if top_k is not None:
        k = jnp.asarray(top_k, jnp.int32)
        on = (k > 0) & (k < jnp.sum(finite, axis=-1))
        t = jax.lax.cond(jnp.any(on), lambda: _largest_code(
            codes, finite.astype(jnp.float32), jnp.where(on, k, 1).astype(jnp.float32)),
            lambda: jnp.zeros((b,), jnp.uint32))
        keep = keep & (~on[:, None] | (codes >= t[:, None]))
    if top_p is not None:
        p = jnp.asarray(top_p, jnp.float32)
        m = jnp.max(x, axis=-1, keepdims=True)
        w = jnp.where(keep, _weights(x, m), 0.0)
        total = jnp.sum(w, axis=-1)
        on = p < 1.0
        # Mass is compared in float32; the bisection finds the largest cut whose mass reaches
        # top_p of the (top-k) total, i.e. the smallest prefix of the sorted tokens.
        t = jax.lax.cond(jnp.any(on), lambda: _largest_code(
            codes, w, jnp.where(on, p * total, total)), lambda: jnp.zeros((b,), jnp.uint32))
        keep = keep & (~on[:, None] | (codes >= t[:, None]))
    if min_p is not None:
        mp = jnp.asarray(min_p, jnp.float32)
        m = jnp.max(x, axis=-1, keepdims=True)
        cut = m + jnp.log(jnp.where(mp > 0, mp, 1.0))[:, None]
        keep = keep & ((mp <= 0)[:, None] | (x >= cut))
    return keep


def _weights(v: jax.Array, m: jax.Array) -> jax.Array:
    """``exp(v - m)`` for the row maximum ``m``: where ``m`` is ``+inf`` the ``+inf`` entries
    weigh 1 and the rest 0 (``exp(inf - inf)`` is NaN); where it is ``-inf``, 0."""
    return jnp.where(m == jnp.inf, (v == jnp.inf).astype(jnp.float32),
                     jnp.exp(v - jnp.where(jnp.isfinite(m), m, 0.0)))


def _blocks(x: jax.Array, fill: float) -> jax.Array:
    """``[B, V]`` -> ``[B, ceil(V / _BLOCK), _BLOCK]``, the tail padded with ``fill``."""
    b, v = x.shape
    nb = -(-v // _BLOCK)
    if nb * _BLOCK != v:
        x = jnp.pad(x, ((0, 0), (0, nb * _BLOCK - v)), constant_values=fill)
    return x.reshape(b, nb, _BLOCK)


def _first(mask: jax.Array) -> jax.Array:
    """Index of the first True along the last axis (its length when there is none)."""
    n = mask.shape[-1]
    return jnp.min(jnp.where(mask, jnp.arange(n, dtype=jnp.int32), n), axis=-1)


def _pick_in_block(xb: jax.Array, j: jax.Array) -> jax.Array:
    """Row ``r``'s block ``j[r]`` of ``xb [B, NB, BS]``: ``[B, BS]``."""
    return jnp.take_along_axis(xb, j[:, None, None], axis=1)[:, 0]


def _lanes(x: jax.Array, op: Any = jnp.maximum) -> jax.Array:
    """``[..., W]`` (``W`` a power of two >= ``_LANES``) -> ``[..., _LANES]``: ``op`` of the
    two halves elementwise, halved again down to ``_LANES`` columns (one fused elementwise pass
    over ``x``; each lane combines ``W / _LANES`` of its entries, pairwise)."""
    w = x.shape[-1]
    if w < _LANES or w & (w - 1):
        raise ValueError(f"_lanes: expected a power-of-two width >= {_LANES}, got {w}.")
    while x.shape[-1] > _LANES:
        h = x.shape[-1] // 2
        x = op(x[..., :h], x[..., h:])
    return x


def _block_maxima(x: jax.Array) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """``[B, V]`` NaN-free -> ``(maxima [B, NB], blocks, tail)``: the maximum of each block of
    ``_LANE_BLOCK`` entries (``blocks [B, V // _LANE_BLOCK, _LANE_BLOCK]``, narrowed to lanes by
    :func:`_lanes`) and, last, of the ``tail [B, V mod _LANE_BLOCK]`` (``None`` where there is
    no such part). The tail is sliced off, not padded: padding copied the whole ``[B, V]``
    array (13 ms against 1.4 for argmax at 64 x 151,936 on CPU)."""
    b, v = x.shape
    nf, tail = divmod(v, _LANE_BLOCK)
    xb = (x[:, :nf * _LANE_BLOCK] if tail else x).reshape(b, nf, _LANE_BLOCK) if nf else None
    xt = x[:, nf * _LANE_BLOCK:] if tail else None
    maxima = ([jnp.max(_lanes(xb), axis=-1)] if nf else []) + (
        [jnp.max(xt, axis=-1, keepdims=True)] if tail else [])
    return (jnp.concatenate(maxima, axis=-1) if len(maxima) > 1 else maxima[0]), xb, xt


def _row_max(x: jax.Array) -> jax.Array:
    """``[B, V]`` NaN-free -> ``[B]``: each row's maximum, as the largest of
    :func:`_block_maxima`. Under the decode chunk's compile options
    (:func:`~langtorch.functional.engine.decode_compiler_options`) XLA:CPU ran ``jnp.max``
    over a long last axis as reduce-windows, several times slower at 16-64 rows of a 50k-262k
    vocabulary; with XLA's default options the two were about even."""
    return jnp.max(_block_maxima(x)[0], axis=-1)


def argmax(logits: jax.Array) -> jax.Array:
    """int32 ``[B]``: the position of each row's largest logit (the first of ties).

    For float logits (others are cast to float32). A NaN counts as ``+inf``: the first NaN or
    ``+inf`` wins (``jnp.argmax`` prefers a NaN to an earlier ``+inf``); otherwise the answer
    is ``jnp.argmax``'s. Computed blockwise: each block of 2,048 logits is narrowed to 16 lanes
    by elementwise maxima of its halves, which XLA:CPU fuses into one vectorised pass over the
    row; the row maximum is the largest of those, and its first position is looked for in the
    first block whose maximum it is (a row's last ``V mod 2048`` logits form one more, shorter
    block). A row reduction over the vocabulary axis, as ``jnp.argmax`` (it carries an index
    along) or ``jnp.max`` run it, was 6-30x slower on CPU at 16-64 rows of a 50k-262k
    vocabulary (docs/benchmarks.md).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.sampling import argmax
        >>> argmax(jnp.array([[0.0, 3.0, 3.0, 1.0], [-jnp.inf, -jnp.inf, -jnp.inf, 2.0]])).tolist()
        [1, 3]
    """
    x = jnp.asarray(logits)
    if x.ndim != 2 or x.shape[-1] == 0:
        raise ValueError(f"argmax: expected [B, V] logits with V >= 1, got shape {x.shape}.")
    x = x.astype(jnp.float32)
    block_max, xb, xt = _block_maxima(jnp.where(jnp.isnan(x), jnp.inf, x))
    bs, nf = _LANE_BLOCK, 0 if xb is None else xb.shape[1]  # nf whole blocks before the tail
    m = jnp.max(block_max, axis=-1, keepdims=True)
    j = jnp.minimum(_first(block_max == m), block_max.shape[1] - 1)  # the first block with m
    if xb is not None:
        i = jnp.minimum(_first(_pick_in_block(xb, jnp.minimum(j, nf - 1)) == m), bs - 1)
    if xt is not None:
        i_tail = jnp.minimum(_first(xt == m), xt.shape[1] - 1)
        i = i_tail if xb is None else jnp.where(j == nf, i_tail, i)
    return (j * bs + i).astype(jnp.int32)


def _draw_full(s: jax.Array, keep: jax.Array, u: jax.Array) -> jax.Array:
    """Inverse-CDF draw over the kept tokens of ``s [B, V]`` in vocabulary order, blocked.

    ``u [B]`` in ``(0, 1]``: the first token whose cumulative weight reaches ``u`` of the total.
    Block sums pick the block, a cumulative sum over that block picks the token; the result
    always has weight > 0 (the rest is clamped into the block's own total).
    """
    m = _row_max(jnp.where(keep, s, -jnp.inf))[:, None]
    w = jnp.where(keep, _weights(s, m), 0.0)
    wb = _blocks(w, 0.0)
    cb = jnp.cumsum(jnp.sum(_lanes(wb, jnp.add), axis=-1), axis=-1)  # [B, NB] block sums
    target = u * cb[:, -1]
    nb = wb.shape[1]
    j = jnp.minimum(jnp.sum(cb < target[:, None], axis=-1), nb - 1).astype(jnp.int32)
    before = jnp.where(j > 0, jnp.take_along_axis(cb, jnp.maximum(j - 1, 0)[:, None], -1)[:, 0],
                       0.0)
    c = jnp.cumsum(_pick_in_block(wb, j), axis=-1)
    rest = jnp.clip(target - before, jnp.finfo(jnp.float32).tiny, c[:, -1])
    i = jnp.minimum(jnp.sum(c < rest[:, None], axis=-1), _BLOCK - 1).astype(jnp.int32)
    return j * _BLOCK + i


def _candidate_threshold(vals: jax.Array, m: jax.Array, v: int, total: Any,
                         top_k: jax.Array | None, top_p: jax.Array | None,
                         min_p: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """The kept set's threshold from each row's top ``K`` logits ``vals [B, K]`` (sorted; ``m``
    ``[B, 1]`` their max), and
    whether it is exact: the kept set lies inside the candidates (``theta > vals[:, -1]``, or the
    candidates hold every finite logit) and each filter's threshold was found among them.

    ``total`` is a thunk for the whole row's mass ``sum(exp(s - max))`` (top-p without a top-k
    inside the candidates needs it; it is computed only when some such row exists).
    """
    b, k_c = vals.shape
    last = jnp.min(vals, axis=-1)  # (sorted: the last; a reduction, not a slice: see draw)
    complete = jnp.full((b,), k_c >= v) | (last == -jnp.inf)
    theta = jnp.full((b,), -jnp.inf, jnp.float32)
    ok = jnp.ones((b,), bool)  # every filter's threshold found among the candidates
    k_inside = jnp.zeros((b,), bool)
    if top_k is not None:
        k = jnp.asarray(top_k, jnp.int32)
        on = (k > 0) & (k <= k_c)  # k past the finite count keeps every finite token: -inf
        t_k = jnp.where(on, jnp.take_along_axis(vals, jnp.clip(k, 1, k_c)[:, None] - 1, -1)[:, 0],
                        -jnp.inf)
        theta = jnp.maximum(theta, t_k)
        k_inside = on & ((t_k > last) | complete)
        ok = ok & ((k <= 0) | complete | k_inside)
    if top_p is not None:
        p = jnp.asarray(top_p, jnp.float32)
        on = p < 1.0
        w = jnp.where(vals >= theta[:, None], _weights(vals, m), 0.0)
        inside = k_inside | complete
        full_total = jax.lax.cond(jnp.any(on & ~inside), total, lambda: jnp.zeros((b,)))
        mass = jnp.where(inside, jnp.sum(w, axis=-1), full_total)
        cum = jnp.cumsum(w, axis=-1)
        j = jnp.sum(cum < (p * mass)[:, None], axis=-1)  # first candidate reaching top_p
        # Not found: the nucleus holds every candidate, its threshold is <= vals[:, -1] and
        # only a higher threshold of another filter can resolve the row (the final check).
        t_p = jnp.take_along_axis(vals, jnp.minimum(j, k_c - 1)[:, None], -1)[:, 0]
        theta = jnp.maximum(theta, jnp.where(on & (j < k_c), t_p, -jnp.inf))
    if min_p is not None:
        mp = jnp.asarray(min_p, jnp.float32)
        theta = jnp.maximum(theta, jnp.where(
            mp > 0, m[:, 0] + jnp.log(jnp.where(mp > 0, mp, 1.0)), -jnp.inf))
    return theta, ok & (complete | (theta > last))


def draw(logits: jax.Array, keys: jax.Array, temperature: jax.Array, *,
         top_k: jax.Array | None = None, top_p: jax.Array | None = None,
         min_p: jax.Array | None = None, candidates: int = CANDIDATES) -> jax.Array:
    """int32 ``[B]``: each sampling row's token, as :func:`sample` draws it.

    :func:`sample` without the greedy rows: the result is meaningful only where
    ``temperature > 0`` (a row with ``temperature <= 0`` gets some token, which may depend on
    its batch-mates: callers holding the greedy tokens select them there, as :func:`sample`
    does). A NaN logit is never drawn; a row with ``+inf`` logits draws among those.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.sampling import draw
        >>> keys = jax.random.split(jax.random.key(1), 2)
        >>> draw(jnp.array([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]]), keys, jnp.array([0.5, 1.0]),
        ...      top_k=jnp.array([1, 1])).tolist()
        [1, 0]
    """
    if not isinstance(candidates, int) or isinstance(candidates, bool) or candidates < 1:
        raise ValueError(f"draw: expected candidates >= 1 (an int), got {candidates!r}.")
    x = jnp.asarray(logits)
    if x.ndim != 2 or x.shape[-1] == 0:
        raise ValueError(f"draw: expected [B, V] logits with V >= 1, got shape {x.shape}.")
    x = x.astype(jnp.float32)
    b, v = x.shape
    temp = jnp.asarray(temperature, jnp.float32)
    # NaN is no token (keep_threshold's reading: not > -inf). Temperatures below
    # MIN_TEMPERATURE divide as MIN_TEMPERATURE: logits / 1e-37 would overflow to +inf and tie.
    x = jnp.where(jnp.isnan(x), -jnp.inf, x)
    s = x / jnp.where(temp > 0, jnp.maximum(temp, MIN_TEMPERATURE), 1.0)[:, None]
    # u in (0, 1]: the first token whose cumulative weight reaches u * total has weight > 0.
    u = 1.0 - jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
    if top_k is None and top_p is None and min_p is None:
        return _draw_full(s, s > -jnp.inf, u)
    # No static slice of top_k's result (vals[:, :1], vals[:, -1]) anywhere: XLA:CPU merges it
    # with top_k's own slice, the sort -> slice pattern of its TopK kernel is lost and the
    # whole row is sorted (~100x slower at V = 262k; the test reads the compiled HLO). The row
    # max and min of the sorted candidates are taken by reductions instead. (An
    # optimization_barrier also kept the kernel, but crashed XLA's SPMD partitioner.)
    vals, ids = jax.lax.top_k(s, min(candidates, v))
    m = jnp.max(vals, axis=-1, keepdims=True)  # the row max (vals[:, :1], without the slice)
    theta, resolved = _candidate_threshold(
        vals, m, v, lambda: jnp.sum(_weights(s, m), axis=-1), top_k, top_p, min_p)
    w = jnp.where(vals >= theta[:, None], _weights(vals, m), 0.0)
    cum = jnp.cumsum(w, axis=-1)
    j = jnp.minimum(jnp.sum(cum < (u * cum[:, -1])[:, None], axis=-1), vals.shape[1] - 1)
    fast = jnp.take_along_axis(ids, j[:, None], -1)[:, 0].astype(jnp.int32)

    def full(_):
        return _draw_full(s, keep_threshold(s, top_k, top_p, min_p), u)

    slow = jax.lax.cond(jnp.any((temp > 0) & ~resolved), full, lambda _: fast, None)
    return jnp.where(resolved, fast, slow)


def sample(logits: jax.Array, keys: jax.Array, temperature: jax.Array, *,
           top_k: jax.Array | None = None, top_p: jax.Array | None = None,
           min_p: jax.Array | None = None, candidates: int = CANDIDATES) -> jax.Array:
    """One token per row: greedy where ``temperature == 0``, else a draw from the kept set.

    Args:
        logits: ``[B, V]`` (after penalties, bias and grammar masks).
        keys: ``[B]`` typed PRNG keys (the engine's per-(seed, choice, t) keys).
        temperature: ``[B]`` >= 0; top_k ``[B]`` int; top_p, min_p ``[B]`` float (see
            :func:`keep_threshold`); None switches a filter off for every row.
        candidates: how many of a row's largest logits a filtered row is resolved among before
            the whole vocabulary is searched (static; the module docstring says how).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.sampling import sample
        >>> keys = jax.random.split(jax.random.key(1), 2)
        >>> sample(jnp.array([[0.0, 3.0, 1.0], [5.0, 0.0, 0.0]]), keys,
        ...        jnp.array([0.0, 1.0]), top_k=jnp.array([0, 1])).tolist()
        [1, 0]
    """
    hot = jnp.asarray(temperature, jnp.float32) > 0
    greedy = argmax(logits)

    def sampled(_):
        return jnp.where(hot, draw(logits, keys, temperature, top_k=top_k, top_p=top_p,
                                   min_p=min_p, candidates=candidates), greedy)

    return jax.lax.cond(jnp.any(hot), sampled, lambda _: greedy, None)


def top_logprobs(logits: jax.Array, tokens: jax.Array, k: int = MAX_TOP_LOGPROBS
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The raw distribution's logprobs: of each row's chosen token, and its ``k`` most likely.

    ``log_softmax(logits)`` in float32, before temperature, penalties and grammar masks (what
    vLLM and OpenAI report). ``k`` is static (<= 20); slice to a request's ``top_logprobs``.

    Returns:
        ``(token_logprob [B], top_ids [B, k] int32, top_logprobs [B, k])``, most likely first.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.sampling import top_logprobs
        >>> lp, ids, top = top_logprobs(jnp.log(jnp.array([[0.25, 0.75]])), jnp.array([0]), k=2)
        >>> round(float(lp[0]), 4), ids.tolist(), [round(float(t), 4) for t in top[0]]
        (-1.3863, [[1, 0]], [-0.2877, -1.3863])
    """
    if not 0 < k <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs: expected 0 < k <= {MAX_TOP_LOGPROBS}, got {k}.")
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(lp, tokens.astype(jnp.int32)[:, None], axis=-1)[:, 0]
    vals, ids = jax.lax.top_k(lp, min(k, lp.shape[-1]))
    return chosen, ids.astype(jnp.int32), vals


def check_sampling(*, vocab_size: int, frequency_penalty: float = 0.0,
                   presence_penalty: float = 0.0, repetition_penalty: float = 1.0,
                   top_k: int = 0, min_p: float = 0.0, logit_bias: Mapping[Any, float] | None
                   = None, logprobs: bool = False, top_logprobs: int | None = None) -> None:
    """Validate one request's sampling controls; raise ``BadRequestError`` naming the field.

    Ranges are OpenAI's (penalties in [-2, 2], bias in [-100, 100], ``top_logprobs`` 0..20 and
    only with ``logprobs``) and vLLM's (``top_k`` -1/0 = off or >= 1, ``min_p`` in [0, 1],
    ``repetition_penalty`` > 0).

    Example:
        >>> from langtorch.functional.sampling import check_sampling
        >>> check_sampling(vocab_size=10, logprobs=True, top_logprobs=21)
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.BadRequestError: top_logprobs: expected an integer in [0, 20], got 21.
    """
    def num(name, v, lo, hi, lo_open=False):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                v > hi or v < lo or (lo_open and v == lo):
            rng = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
            raise BadRequestError(f"{name}: expected a number in {rng}, got {v!r}.", param=name)

    num("frequency_penalty", frequency_penalty, -2.0, 2.0)
    num("presence_penalty", presence_penalty, -2.0, 2.0)
    num("repetition_penalty", repetition_penalty, 0.0, math.inf, lo_open=True)
    num("min_p", min_p, 0.0, 1.0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise BadRequestError(f"top_k: expected -1 or 0 (off) or an integer >= 1, got {top_k!r}.",
                              param="top_k")
    if top_logprobs is not None:
        if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or \
                not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise BadRequestError(f"top_logprobs: expected an integer in [0, "
                                  f"{MAX_TOP_LOGPROBS}], got {top_logprobs!r}.",
                                  param="top_logprobs")
        if not logprobs:
            raise BadRequestError("top_logprobs: requires logprobs=true.", param="top_logprobs")
    for tid, v in (logit_bias or {}).items():
        try:
            i = int(tid)
        except (TypeError, ValueError):
            i = -1
        if not 0 <= i < vocab_size or (isinstance(tid, str) and not tid.strip().isdigit()):
            raise BadRequestError(f"logit_bias: expected token ids in [0, {vocab_size}), got "
                                  f"{tid!r}.", param="logit_bias")
        num("logit_bias", v, -100.0, 100.0)
