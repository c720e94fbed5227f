"""Soft-prompt math: a trainable ``[P, H]`` array prepended to input embeddings.

Pure JAX functions over arrays (no state, no torch). A soft prompt of ``P`` virtual tokens is put in
front of every sequence of ``inputs_embeds [B, T, H]``; the attention mask gains ``P`` ones at the
front, label positions of the prompt are masked with ``ignore_index`` so no loss is computed there,
and position ids are recomputed from the extended mask (left padding stays left of the prompt-free
text because padding is *inside* the original sequence, after the prompt).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional.soft_prompt import init_soft_prompt, prepend_soft_prompt
    >>> prompt = init_soft_prompt(jax.random.key(0), num_tokens=2, hidden=4)
    >>> embeds, mask = prepend_soft_prompt(prompt, jnp.zeros((3, 5, 4)), jnp.ones((3, 5), jnp.int32))
    >>> embeds.shape, mask.shape, int(mask.sum())
    ((3, 7, 4), (3, 7), 21)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from langtorch.functional.shapes import positions_from_mask

__all__ = [
    "init_soft_prompt",
    "init_soft_prompt_from_vocab",
    "prepend_soft_prompt",
    "extend_labels",
    "nearest_tokens",
    "positions_from_mask",
]


def init_soft_prompt(key: jax.Array, num_tokens: int, hidden: int, *, scale: float = 0.02,
                     dtype=jnp.float32) -> jax.Array:
    """Scaled Gaussian soft prompt of shape ``[num_tokens, hidden]``.

    Args:
        key: a JAX PRNG key.
        num_tokens: ``P``, the number of virtual tokens (>= 1).
        hidden: ``H``, the model's embedding width.
        scale: standard deviation of the entries (0.02 matches common embedding init).
        dtype: floating dtype of the result.

    Returns:
        A ``[P, H]`` array.

    Example:
        >>> import jax
        >>> init_soft_prompt(jax.random.key(0), 3, 8).shape
        (3, 8)
    """
    if num_tokens < 1 or hidden < 1:
        raise ValueError(f"expected num_tokens >= 1 and hidden >= 1, got {num_tokens=} {hidden=}")
    return scale * jax.random.normal(key, (num_tokens, hidden), dtype)


def init_soft_prompt_from_vocab(key: jax.Array, embedding_table: jax.Array,
                                num_tokens: int) -> jax.Array:
    """Soft prompt initialised with ``num_tokens`` vocabulary rows sampled without replacement.

    Starting from real token embeddings keeps the prompt on the scale the model expects (Lester et
    al., 2021 found this converges faster than random init).

    Args:
        key: a JAX PRNG key.
        embedding_table: the model's ``[V, H]`` input embedding matrix.
        num_tokens: ``P`` (at most ``V``).

    Returns:
        A ``[P, H]`` array (a copy of the sampled rows).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> table = jnp.arange(12.0).reshape(6, 2)
        >>> init_soft_prompt_from_vocab(jax.random.key(0), table, 2).shape
        (2, 2)
    """
    vocab = embedding_table.shape[0]
    if not 1 <= num_tokens <= vocab:
        raise ValueError(f"expected 1 <= num_tokens <= vocabulary size {vocab}, got {num_tokens}")
    rows = jax.random.choice(key, vocab, (num_tokens,), replace=False)
    return jnp.take(embedding_table, rows, axis=0)


def prepend_soft_prompt(prompt: jax.Array, inputs_embeds: jax.Array,
                        attention_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Prepend ``prompt [P, H]`` to ``inputs_embeds [..., T, H]`` and extend the mask.

    Args:
        prompt: the soft prompt, ``[P, H]`` (broadcast over the batch dimensions).
        inputs_embeds: token embeddings, ``[..., T, H]``.
        attention_mask: ``[..., T]`` of 0/1 (any int or bool dtype); ``None`` means all ones.

    Returns:
        ``(embeds [..., P+T, H], mask [..., P+T])``; the mask keeps the input mask's dtype
        (int32 when ``attention_mask`` is None) and has ones over the prompt.

    Example:
        >>> import jax.numpy as jnp
        >>> e, m = prepend_soft_prompt(jnp.ones((1, 2)), jnp.zeros((2, 3, 2)),
        ...                            jnp.array([[1, 1, 0], [1, 0, 0]]))
        >>> m.tolist()
        [[1, 1, 1, 0], [1, 1, 0, 0]]
    """
    if prompt.ndim != 2 or prompt.shape[-1] != inputs_embeds.shape[-1]:
        raise ValueError(
            f"expected prompt [P, H] with H = inputs_embeds.shape[-1] = {inputs_embeds.shape[-1]}, "
            f"got prompt shape {prompt.shape}"
        )
    batch = inputs_embeds.shape[:-2]
    p = prompt.shape[0]
    front = jnp.broadcast_to(prompt.astype(inputs_embeds.dtype), (*batch, *prompt.shape))
    embeds = jnp.concatenate([front, inputs_embeds], axis=-2)
    if attention_mask is None:
        attention_mask = jnp.ones(inputs_embeds.shape[:-1], jnp.int32)
    ones = jnp.ones((*batch, p), attention_mask.dtype)
    return embeds, jnp.concatenate([ones, attention_mask], axis=-1)


def extend_labels(labels: jax.Array, num_tokens: int, ignore_index: int = -100) -> jax.Array:
    """Prepend ``num_tokens`` ignored label positions to ``labels [..., T]``.

    Example:
        >>> import jax.numpy as jnp
        >>> extend_labels(jnp.array([[5, 6]]), 2).tolist()
        [[-100, -100, 5, 6]]
    """
    pad = jnp.full((*labels.shape[:-1], num_tokens), ignore_index, labels.dtype)
    return jnp.concatenate([pad, labels], axis=-1)


def nearest_tokens(prompt: jax.Array, table: jax.Array) -> jax.Array:
    """Ids ``[P]`` of the vocabulary rows nearest (Euclidean) to each prompt vector.

    Example:
        >>> import jax.numpy as jnp
        >>> nearest_tokens(jnp.array([[0.0, 2.0], [1.0, 0.1]]), jnp.eye(2)).tolist()
        [1, 0]
    """
    p = prompt.astype(jnp.float32)
    t = table.astype(jnp.float32)
    # argmin |p - t|^2 = argmax 2 p.t - |t|^2 (|p|^2 is constant per row): one matmul.
    scores = 2.0 * p @ t.T - jnp.sum(t * t, axis=-1)[None]
    return jnp.argmax(scores, axis=-1).astype(jnp.int32)
