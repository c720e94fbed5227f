"""Embedding math: normalisation, cosine similarity, streaming top-k, and batched text encoding.

The encoder path packs several tokenised texts into each row (segment-masked attention, positions
restarting per text), so a batch carries almost no padding and only a handful of shapes are ever
compiled, whatever the mix of lengths.

Example:
    >>> import numpy as np
    >>> import langtorch.functional.embedding as E
    >>> a = np.array([[3.0, 4.0]])
    >>> np.asarray(E.normalize(a), dtype=np.float64).round(2).tolist()
    [[0.6, 0.8]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional.models import bert

__all__ = [
    "normalize",
    "cosine_similarity",
    "mean_pool",
    "topk",
    "pack_rows",
    "embed_packed",
    "embed_token_ids",
    "embed_texts",
]


@partial(jax.jit, static_argnames=("axis",))
def normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
    """L2-normalise along ``axis`` (zero vectors stay zero).

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.embedding import normalize
        >>> np.asarray(normalize(np.array([[0.0, 2.0], [0.0, 0.0]]))).tolist()
        [[0.0, 1.0], [0.0, 0.0]]
    """
    x = jnp.asarray(x)
    norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=axis, keepdims=True))
    return (x / jnp.maximum(norm, eps)).astype(x.dtype)


@jax.jit
def cosine_similarity(a: jax.Array, b: jax.Array) -> jax.Array:
    """Pairwise cosine similarity: ``[..., N, d] x [M, d] -> [..., N, M]`` (1-d inputs allowed).

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.embedding import cosine_similarity
        >>> float(cosine_similarity(np.array([1.0, 0.0]), np.array([1.0, 1.0]))).__round__(4)
        0.7071
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    an, bn = normalize(a), normalize(b)
    if b.ndim == 1:
        return jnp.sum(an * bn, axis=-1)
    return jnp.einsum("...d,md->...m", an, bn)


def mean_pool(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of ``hidden [B, T, H]`` over the tokens where ``mask [B, T]`` is 1.

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.embedding import mean_pool
        >>> h = np.array([[[1.0], [3.0], [100.0]]]); m = np.array([[1, 1, 0]])
        >>> np.asarray(mean_pool(h, m)).tolist()
        [[2.0]]
    """
    m = jnp.asarray(mask, jnp.float32)[..., None]
    return jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)


_TOPK_BLOCK = 512


def _chunk_topk(scores, k):
    # Exact top-k in two cheap passes: the k best entries lie in (at most) the k blocks with the
    # largest block maxima, so only k * block candidates go through the full top_k.
    q, n = scores.shape
    if n % _TOPK_BLOCK or n // _TOPK_BLOCK <= k:
        return jax.lax.top_k(scores, k)
    blocks = scores.reshape(q, n // _TOPK_BLOCK, _TOPK_BLOCK)
    _, best_blocks = jax.lax.top_k(jnp.max(blocks, axis=-1), k)
    cand = jnp.take_along_axis(blocks, best_blocks[:, :, None], axis=1).reshape(q, -1)
    s, i = jax.lax.top_k(cand, k)
    block = jnp.take_along_axis(best_blocks, i // _TOPK_BLOCK, axis=1)
    return s, block * _TOPK_BLOCK + i % _TOPK_BLOCK


@partial(jax.jit, static_argnames=("k", "cosine"))
def _topk_chunk(queries, chunk, best_scores, best_idx, offset, valid, *, k, cosine):
    if cosine:
        chunk = normalize(chunk)
    scores = (queries @ chunk.T.astype(queries.dtype)).astype(jnp.float32)
    scores = jnp.where(jnp.arange(chunk.shape[0])[None] < valid, scores, -jnp.inf)
    s, i = _chunk_topk(scores, k)
    # Merge the chunk's best with the running best; the candidates are only 2k per query.
    all_s = jnp.concatenate([best_scores, s], axis=1)
    all_i = jnp.concatenate([best_idx, i + offset], axis=1)
    s2, j = jax.lax.top_k(all_s, k)
    return s2, jnp.take_along_axis(all_i, j, axis=1)


def topk(
    queries: Any,
    corpus: Any,
    k: int = 10,
    *,
    chunk_size: int = 65536,
    metric: str = "cosine",
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` corpus rows for each query, streaming the corpus in chunks.

    Only a ``[Q, chunk_size]`` score block exists at any time, so a ``1,000,000 x 384`` corpus
    (numpy, memory-mapped or JAX) works with 256 queries without a ``256 x 1M`` score matrix.
    Each chunk is scored by one jitted matmul + ``top_k`` and merged into the running best; every
    chunk has the same shape (the last is padded), so there is a single compile.

    Args:
        queries: ``[Q, d]`` or ``[d]``.
        corpus: ``[N, d]``.
        k: number of results per query (``k <= N``).
        chunk_size: corpus rows scored per step.
        metric: ``"cosine"`` (normalises both sides) or ``"dot"`` (raw inner product, e.g. for
            embeddings that are already unit length).

    Returns:
        ``(scores [Q, k] float32, indices [Q, k] int)`` as numpy arrays, best first (a 1-d query
        gives 1-d results).

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.embedding import topk
        >>> corpus = np.eye(4, dtype=np.float32)
        >>> scores, idx = topk(np.array([0.0, 1.0, 0.1, 0.0]), corpus, k=2)
        >>> idx.tolist()
        [1, 2]
    """
    if metric not in ("cosine", "dot"):
        raise ValueError(f"topk: expected metric 'cosine' or 'dot', got {metric!r}.")
    q = jnp.asarray(queries)
    single = q.ndim == 1
    q = q[None] if single else q
    n = corpus.shape[0]
    if not 0 < k <= n:
        raise ValueError(f"topk: expected 0 < k <= {n} (corpus rows), got k={k}.")
    if metric == "cosine":
        q = normalize(q)
    chunk_size = min(chunk_size, n)
    chunk_size = max(chunk_size, k)
    best_s = jnp.full((q.shape[0], k), -jnp.inf, jnp.float32)
    best_i = jnp.zeros((q.shape[0], k), jnp.int32)
    for start in range(0, n, chunk_size):
        chunk = corpus[start:start + chunk_size]
        valid = chunk.shape[0]
        if valid < chunk_size:  # pad only the last chunk, so every step has the same shape
            pad = np.zeros((chunk_size - valid, chunk.shape[1]), dtype=np.asarray(chunk[:1]).dtype)
            chunk = jnp.concatenate([jnp.asarray(chunk), jnp.asarray(pad)])
        best_s, best_i = _topk_chunk(q, jnp.asarray(chunk), best_s, best_i,
                                     jnp.int32(start), jnp.int32(valid),
                                     k=k, cosine=metric == "cosine")
    scores, idx = np.asarray(best_s), np.asarray(best_i)
    return (scores[0], idx[0]) if single else (scores, idx)


def pack_rows(
    lengths: Sequence[int], row_len: int, max_segments: int
) -> list[list[int]]:
    """Plan rows of at most ``row_len`` tokens / ``max_segments`` sequences (first-fit decreasing).

    Returns a list of rows, each a list of sequence indices. Every length must be ``<= row_len``.

    Example:
        >>> from langtorch.functional.embedding import pack_rows
        >>> pack_rows([5, 3, 4, 2], row_len=8, max_segments=4)
        [[0, 1], [2, 3]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[int] = []
    # rows_by_free[c] = indices of rows with exactly c free tokens (and room for a segment);
    # a best-fit search scans at most row_len capacities per sequence.
    rows_by_free: dict[int, list[int]] = {}
    for i in order:
        n = lengths[i]
        if n > row_len:
            raise ValueError(f"pack_rows: sequence {i} has {n} tokens, more than row_len={row_len}.")
        target = None
        for c in range(n, row_len + 1):
            bucket = rows_by_free.get(c)
            if bucket:
                target = bucket.pop()
                break
        if target is None:
            rows.append([])
            free.append(row_len)
            target = len(rows) - 1
        rows[target].append(i)
        free[target] -= n
        if len(rows[target]) < max_segments and free[target] > 0:
            rows_by_free.setdefault(free[target], []).append(target)
    return rows


@partial(jax.jit, static_argnames=("config", "max_segments"))
def embed_packed(
    params: Any,
    ids: jax.Array,
    segment_ids: jax.Array,
    positions: jax.Array,
    *,
    config: bert.BertConfig = bert.MINILM_L6,
    max_segments: int = 32,
) -> jax.Array:
    """Encode packed rows and return unit-length mean-pooled embeddings ``[B, max_segments, H]``.

    ``segment_ids`` numbers the sequences of a row ``1..max_segments`` (0 = padding); slot
    ``s-1`` of the output holds sequence ``s``'s embedding (zeros where a row has fewer).

    Example:
        >>> import jax, numpy as np
        >>> from langtorch.functional.models import bert
        >>> from langtorch.functional.embedding import embed_packed
        >>> cfg = bert.BertConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2,
        ...                       intermediate_size=8, max_positions=8)
        >>> p = bert.random_params(jax.random.key(0), cfg)
        >>> ids = np.array([[1, 2, 3, 4, 0]]); seg = np.array([[1, 1, 2, 2, 0]])
        >>> pos = np.array([[0, 1, 0, 1, 0]])
        >>> embed_packed(p, ids, seg, pos, config=cfg, max_segments=2).shape
        (1, 2, 8)
    """
    mask = segment_ids > 0
    hidden = bert.encode(params, ids, mask, positions=positions, segment_ids=segment_ids,
                         config=config)
    onehot = (segment_ids[:, :, None] == jnp.arange(1, max_segments + 1)).astype(hidden.dtype)
    sums = jnp.einsum("bts,bth->bsh", onehot, hidden.astype(jnp.float32).astype(hidden.dtype))
    counts = jnp.sum(onehot, axis=1)[..., None]
    return normalize(sums.astype(jnp.float32) / jnp.maximum(counts, 1.0))


_ROW_BUCKETS = (1, 4, 16)


def embed_token_ids(
    params: Any,
    token_ids: Sequence[Sequence[int]],
    *,
    config: bert.BertConfig = bert.MINILM_L6,
    row_lengths: Sequence[int] = (128, 256),
    tokens_per_batch: int = 2048,
    max_segments: int = 32,
    encode_fn: Callable[..., Any] | None = None,
) -> np.ndarray:
    """Embed tokenised sequences (each already truncated) into ``[N, H]`` float32 unit vectors.

    Sequences are grouped by the smallest row length that fits them, packed into rows
    (:func:`pack_rows`), and rows are encoded ``tokens_per_batch // row_len`` at a time (a short
    final batch is padded to 1, 4 or 16 rows). Compiles: at most three row counts per row length.

    Args:
        params: BERT params (arrays already on device avoid a transfer per batch).
        token_ids: one list of ids per text (with ``[CLS]``/``[SEP]``).
        config: the encoder configuration.
        row_lengths: the packed row lengths, ascending; the last must be >= the longest input.
        tokens_per_batch: tokens encoded per jitted call.
        max_segments: most sequences in one row.
        encode_fn: replaces :func:`embed_packed` (same signature), e.g. a pre-bound version.

    Example:
        >>> import jax
        >>> from langtorch.functional.models import bert
        >>> from langtorch.functional.embedding import embed_token_ids
        >>> cfg = bert.BertConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2,
        ...                       intermediate_size=8, max_positions=16)
        >>> p = bert.random_params(jax.random.key(0), cfg)
        >>> embed_token_ids(p, [[1, 5, 2], [1, 2]], config=cfg, row_lengths=(16,)).shape
        (2, 8)
    """
    encode_fn = encode_fn or embed_packed
    n = len(token_ids)
    out = np.zeros((n, config.hidden_size), np.float32)
    if n == 0:
        return out
    lengths = [len(t) for t in token_ids]
    groups: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        row_len = next((r for r in row_lengths if length <= r), None)
        if row_len is None:
            raise ValueError(f"embed_token_ids: text {i} has {length} tokens, more than the "
                             f"largest row length {row_lengths[-1]}; truncate it first.")
        groups.setdefault(row_len, []).append(i)
    for row_len, members in groups.items():
        rows = pack_rows([lengths[i] for i in members], row_len, max_segments)
        rows = [[members[j] for j in row] for row in rows]
        per_batch = max(1, tokens_per_batch // row_len)
        for b0 in range(0, len(rows), per_batch):
            batch_rows = rows[b0:b0 + per_batch]
            nb = next((c for c in _ROW_BUCKETS if c >= len(batch_rows) and c <= per_batch),
                      per_batch)
            ids = np.zeros((nb, row_len), np.int32)
            seg = np.zeros((nb, row_len), np.int32)
            pos = np.zeros((nb, row_len), np.int32)
            for r, row in enumerate(batch_rows):
                at = 0
                for s, i in enumerate(row):
                    t = token_ids[i]
                    ids[r, at:at + len(t)] = t
                    seg[r, at:at + len(t)] = s + 1
                    pos[r, at:at + len(t)] = np.arange(len(t))
                    at += len(t)
            emb = np.asarray(encode_fn(params, ids, seg, pos, config=config,
                                       max_segments=max_segments))
            for r, row in enumerate(batch_rows):
                out[row] = emb[r, :len(row)]
    return out


def embed_texts(
    params: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    config: bert.BertConfig = bert.MINILM_L6,
    max_length: int = 256,
    **kwargs: Any,
) -> np.ndarray:
    """Tokenise ``texts`` with a Hugging Face ``tokenizers.Tokenizer`` and embed them ``[N, H]``.

    Inputs longer than ``max_length`` tokens are cut (keeping the final ``[SEP]``), as
    sentence-transformers does for all-MiniLM-L6-v2 (256).

    Example:
        >>> from langtorch.functional.embedding import embed_texts
        >>> emb = embed_texts(params, tokenizer, ["a cat", "a dog"])  # doctest: +SKIP
        >>> emb.shape  # doctest: +SKIP
        (2, 384)
    """
    encodings = tokenizer.encode_batch(list(texts))
    ids = []
    for e in encodings:
        t = e.ids
        if len(t) > max_length:  # the tokenizer may not truncate; keep [CLS] ... [SEP]
            t = t[:max_length - 1] + t[-1:]
        ids.append(t)
    row_lengths = tuple(r for r in (128, 256) if r < max_length) + (max_length,)
    kwargs.setdefault("row_lengths", row_lengths)
    return embed_token_ids(params, ids, config=config, **kwargs)
