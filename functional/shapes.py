"""Shape policy shared by generation, tuning, token search and classification.

jit compiles once per input shape, so variable-length inputs are padded up to a small set of
*buckets*; every part of the functional core pads with the same table so that a prompt length
compiled by one (say, a tuner's evaluation) is reused by another (generation).

Example:
    >>> from langtorch.functional.shapes import bucket, DEFAULT_LENGTH_BUCKETS
    >>> bucket(17, DEFAULT_LENGTH_BUCKETS)
    24
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

__all__ = ["DEFAULT_LENGTH_BUCKETS", "bucket", "positions_from_mask"]

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
