"""Shape policy shared by generation, tuning, token search and classification.

jit compiles once per input shape, so variable-length inputs are padded up to a small set of
*buckets*; every part of the functional core pads with the same table so that a prompt length
compiled by one (say, a tuner's evaluation) is reused by another (generation).

Lengths use :func:`bucket` over :data:`DEFAULT_LENGTH_BUCKETS`; batch rows (the decode
engine's live slots, token search's example batches, packed embedding batches) use
:func:`row_bucket`, each caller with its own table.

Example:
    >>> from langtorch.functional.shapes import bucket, row_bucket, DEFAULT_LENGTH_BUCKETS
    >>> bucket(17, DEFAULT_LENGTH_BUCKETS), row_bucket(5)
    (24, 8)
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = ["DEFAULT_LENGTH_BUCKETS", "ROW_BUCKETS", "bucket", "positions_from_mask", "row_bucket"]

# Token lengths: fine steps for short inputs, where padding would otherwise dominate (a 40-token
# chat padded to 64 wastes a third of the prefill); ~1.5x steps beyond.
DEFAULT_LENGTH_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
                          2048, 3072, 4096, 6144, 8192)


def bucket(n: int, buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS) -> int:
    """The smallest bucket ``>= n`` (multiples of the largest bucket beyond the table).

    Example:
        >>> from langtorch.functional.shapes import bucket
        >>> bucket(33, (32, 64)), bucket(130, (32, 64))
        (64, 192)
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"bucket: expected a non-negative size, got {n}.")
    if not buckets:
        raise ValueError("bucket: expected at least one bucket, got none.")
    for b in buckets:
        if n <= b:
            return int(b)
    top = int(buckets[-1])
    return -(-n // top) * top


ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
"""Batch rows: powers of two (the decode engine's slot counts)."""


def row_bucket(n: int, buckets: Sequence[int] = ROW_BUCKETS, *, cap: int | None = None) -> int:
    """The number of rows a batch of ``n`` is padded to (jit compiles once per row count).

    The smallest of ``buckets`` (ascending) ``>= n``; beyond the table, its last bucket doubled
    until it holds ``n``. With ``cap`` (the most rows the batch may have: the engine's slots,
    the rows one embedding batch holds) the buckets below ``cap`` are used and ``cap`` itself is
    the last one, so no batch is padded past it (and a batch larger than ``cap`` gets a
    multiple of it).

    Example:
        >>> from langtorch.functional.shapes import row_bucket
        >>> row_bucket(3), row_bucket(100), row_bucket(20, (8,))
        (4, 128, 32)
        >>> row_bucket(40, cap=48), row_bucket(5, (1, 4, 16), cap=6)
        (48, 6)
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"row_bucket: expected a non-negative number of rows, got {n}.")
    if not buckets or any(int(b) < 1 for b in buckets):
        raise ValueError(f"row_bucket: expected positive buckets, got {tuple(buckets)!r}.")
    if cap is not None:
        if int(cap) < 1:
            raise ValueError(f"row_bucket: expected cap >= 1, got {cap!r}.")
        return bucket(n, tuple(int(b) for b in buckets if b < cap) + (int(cap),))
    for b in buckets:
        if n <= b:
            return int(b)
    b = int(buckets[-1])
    while b < n:
        b *= 2
    return b


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Position ids ``0, 1, ...`` counted over the valid tokens of each (left- or right-padded) row.

    Padding slots get position 0 (they are masked anyway).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.shapes import positions_from_mask
        >>> positions_from_mask(jnp.array([[0, 0, 1, 1, 1], [1, 1, 0, 0, 0]])).tolist()
        [[0, 0, 0, 1, 2], [0, 1, 0, 0, 0]]
    """
    mask = jnp.asarray(mask).astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0) * mask
