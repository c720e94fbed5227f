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

from langtorch.functional import sharding as S
from langtorch.functional.models import bert
from langtorch.functional.shapes import row_bucket

__all__ = [
    "normalize",
    "cosine_similarity",
    "mean_pool",
    "topk",
    "pack_rows",
    "embed_packed",
    "embed_token_ids",
    "embed_texts",
    "resolve_dtype",
    "cast_params",
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


_l2_normalize = normalize  # for functions whose `normalize` argument shadows it


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
    # Candidates in row order, so ties (duplicate documents) go to the lowest row as in a
    # single top_k over all rows, whatever the chunking or sharding.
    best_blocks = jnp.sort(best_blocks, axis=1)
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


def _check_finite_queries(q):
    # A NaN/inf query scores NaN against every row, and top_k then returns arbitrary rows.
    bad = np.flatnonzero(~np.isfinite(np.asarray(q, np.float32)).all(axis=-1))
    if bad.size:
        raise ValueError(f"queries: query {int(bad[0])} has NaN or inf values "
                         f"({bad.size} of {q.shape[0]} queries).")


def topk(
    queries: Any,
    corpus: Any,
    k: int = 10,
    *,
    chunk_size: int = 65536,
    metric: str = "cosine",
    mesh: Any = None,
    rows: int | None = None,
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
        mesh: ``None`` (one device), ``"auto"`` (all local devices on a ``data`` axis) or a
            :class:`jax.sharding.Mesh` with a ``data`` axis. The corpus is split row-wise across
            the ``data`` devices (padded to a multiple of their number; padding never wins), each
            device streams its own rows in ``chunk_size`` blocks and keeps its top-k, and one
            merge of the ``devices x k`` candidates gives the global top-k with global row
            indices. A corpus already placed with ``NamedSharding(mesh, P("data", None))`` is
            used in place; one committed to other devices is refused (``ValueError`` naming
            both shardings).
        rows: how many leading corpus rows are real (default: all). Pass the length that
            :func:`langtorch.functional.sharding.shard_batch` returned with a corpus it padded,
            so the padding rows are never returned.

    Returns:
        ``(scores [Q, k] float32, indices [Q, k] int)`` as numpy arrays, best first (a 1-d query
        gives 1-d results).

    Raises:
        ValueError: ``k`` outside ``1..N``, ``rows`` outside ``1..len(corpus)``, a query with
            NaN/inf values, mismatched widths.

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
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"topk: expected an int k, got {type(k).__name__}.")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) \
            or chunk_size < 1:
        raise ValueError(f"topk: expected chunk_size >= 1, got {chunk_size!r}.")
    if rows is not None:
        total = getattr(corpus, "shape", (0,))[0]
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) \
                or not 1 <= rows <= total:
            raise ValueError(f"rows: expected an int in 1..{total} (corpus rows), got {rows!r}.")
        rows = int(rows)
    mesh = S.resolve_mesh(mesh)
    if mesh is not None:
        return _topk_mesh(queries, corpus, int(k), int(chunk_size), metric, mesh, rows)
    return _topk_one_device(queries, corpus, int(k), int(chunk_size), metric, rows)


def _topk_one_device(queries, corpus, k, chunk_size, metric, rows):
    # topk on one device: stream same-shape chunks through _topk_chunk, merging the running best.
    q = jnp.asarray(queries)
    single = q.ndim == 1
    q = q[None] if single else q
    _check_finite_queries(q)
    n = corpus.shape[0] if rows is None else rows
    if not 0 < k <= n:
        raise ValueError(f"topk: expected 0 < k <= {n} (corpus rows), got k={k}.")
    if metric == "cosine":
        q = normalize(q)
    chunk_size = min(chunk_size, n)
    chunk_size = max(chunk_size, k)
    best_s = jnp.full((q.shape[0], k), -jnp.inf, jnp.float32)
    best_i = jnp.zeros((q.shape[0], k), jnp.int32)
    for start in range(0, n, chunk_size):
        chunk = corpus[start:min(start + chunk_size, n)]
        valid = chunk.shape[0]
        if valid < chunk_size:  # pad only the last chunk, so every step has the same shape
            pad = np.zeros((chunk_size - valid, chunk.shape[1]), dtype=np.asarray(chunk[:1]).dtype)
            chunk = jnp.concatenate([jnp.asarray(chunk), jnp.asarray(pad)])
        best_s, best_i = _topk_chunk(q, jnp.asarray(chunk), best_s, best_i,
                                     jnp.int32(start), jnp.int32(valid),
                                     k=k, cosine=metric == "cosine")
    scores, idx = np.asarray(best_s), np.asarray(best_i)
    return (scores[0], idx[0]) if single else (scores, idx)


def _local_topk(q, c, valid, *, k, chunk, cosine):
    # One device's part of a sharded top-k: stream its [R, d] rows in `chunk` blocks (the last
    # block is shifted back to end at R and its already-seen rows masked, so no copy/padding of
    # the shard is needed) and keep the running best with global row indices.
    shard = jax.lax.axis_index(S.DATA)
    r = c.shape[0]
    cs = min(max(chunk, k), r)  # a block holds >= k rows unless the shard is smaller
    kk = min(k, cs)
    n_chunks = -(-r // cs)

    def body(j, carry):
        bs, bi = carry
        start = jnp.minimum(j * cs, r - cs)
        blk = jax.lax.dynamic_slice_in_dim(c, start, cs, 0)
        if cosine:
            blk = normalize(blk)
        s = (q @ blk.T.astype(q.dtype)).astype(jnp.float32)
        rows = start + jnp.arange(cs)
        ok = (rows >= j * cs) & (shard * r + rows < valid)
        s = jnp.where(ok[None], s, -jnp.inf)
        ts, ti = _chunk_topk(s, kk)
        all_s = jnp.concatenate([bs, ts], axis=1)
        all_i = jnp.concatenate([bi, ti + start + shard * r], axis=1)
        s2, sel = jax.lax.top_k(all_s, kk)
        return s2, jnp.take_along_axis(all_i, sel, axis=1)

    init = (jnp.full((q.shape[0], kk), -jnp.inf, jnp.float32),
            jnp.zeros((q.shape[0], kk), jnp.int32))
    init = jax.lax.pcast(init, (S.DATA,), to="varying")  # the carry differs per shard
    bs, bi = jax.lax.fori_loop(0, n_chunks, body, init)
    return bs[None], bi[None]


@partial(jax.jit, static_argnames=("mesh", "k", "chunk", "cosine"))
def _topk_sharded(q, corpus, valid, *, mesh, k, chunk, cosine):
    P = jax.sharding.PartitionSpec
    local = partial(_local_topk, k=k, chunk=chunk, cosine=cosine)
    s, i = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(S.DATA, None), P()),
                         out_specs=(P(S.DATA), P(S.DATA)))(q, corpus, valid)
    # [shards, Q, kk] candidates -> one global merge.
    nq = q.shape[0]
    s = s.transpose(1, 0, 2).reshape(nq, -1)
    i = i.transpose(1, 0, 2).reshape(nq, -1)
    best, sel = jax.lax.top_k(s, k)
    return best, jnp.take_along_axis(i, sel, axis=1)


def _topk_mesh(queries, corpus, k, chunk_size, metric, mesh, rows=None):
    S.check_local(mesh)
    S.check_placement(queries, mesh, name="queries", want=S.replicated(mesh))
    want = S.data_sharding(mesh, 2)
    S.check_placement(corpus, mesh, name="corpus", want=want)
    if getattr(corpus, "ndim", None) != 2:
        raise ValueError(f"topk: expected a 2-d corpus [N, d], got shape "
                         f"{getattr(corpus, 'shape', None)}.")
    n = corpus.shape[0] if rows is None else rows
    if not 0 < k <= n:
        raise ValueError(f"topk: expected 0 < k <= {n} (corpus rows), got k={k}.")
    q = jnp.asarray(queries)
    single = q.ndim == 1
    q = q[None] if single else q
    if q.ndim != 2 or q.shape[1] != corpus.shape[1]:
        raise ValueError(f"topk: queries have shape {tuple(q.shape)}, corpus rows have "
                         f"{corpus.shape[1]} dims.")
    _check_finite_queries(q)
    if metric == "cosine":
        q = normalize(q)
    q = jax.device_put(q, S.replicated(mesh))
    on_mesh = (isinstance(corpus, jax.Array) and isinstance(corpus.sharding, jax.sharding.NamedSharding)
               and corpus.sharding.mesh == mesh and corpus.sharding.spec == want.spec
               and corpus.shape[0] % S.data_size(mesh) == 0)
    if not on_mesh:
        corpus, n = S.shard_batch(np.asarray(corpus[:n]), mesh, name="corpus")
    s, i = _topk_sharded(q, corpus, jnp.int32(n), mesh=mesh, k=k, chunk=chunk_size,
                         cosine=metric == "cosine")
    scores, idx = np.asarray(s), np.asarray(i)
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


_POOLING = ("mean", "cls", "lasttoken")


@partial(jax.jit, static_argnames=("config", "max_segments", "pooling", "normalize"))
def embed_packed(
    params: Any,
    ids: jax.Array,
    segment_ids: jax.Array,
    positions: jax.Array,
    *,
    config: bert.BertConfig = bert.MINILM_L6,
    max_segments: int = 32,
    pooling: str = "mean",
    normalize: bool = True,
) -> jax.Array:
    """Encode packed rows and return pooled embeddings ``[B, max_segments, H]``.

    ``segment_ids`` numbers the sequences of a row ``1..max_segments`` (0 = padding); slot
    ``s-1`` of the output holds sequence ``s``'s embedding (zeros where a row has fewer). The
    encoder's weight products run in the dtype of ``params`` (float32 or bfloat16, with f32
    accumulation); activations, pooling and normalisation are always float32 and so is the
    result.

    Args:
        pooling: ``"mean"`` (default) over each sequence's tokens, ``"cls"`` (its first token)
            or ``"lasttoken"`` (its last token), as sentence-transformers' Pooling modes.
        normalize: L2-normalise each embedding (default True; sentence-transformers' Normalize).

    Differentiable in reverse mode (``grad``, ``vjp``); with bf16/fp16 weights not in forward
    mode (``jvp``: their inference scan has a custom VJP).

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
    if pooling not in _POOLING:
        raise ValueError(f"embed_packed: expected pooling in {_POOLING}, got {pooling!r}.")
    mask = segment_ids > 0
    # frozen: bf16 weight stacks scanned without an f32 round trip (bert._scan_frozen).
    hidden = bert._encode(params, ids, mask, positions=positions, segment_ids=segment_ids,
                          config=config, dtype=jnp.float32, frozen=True)
    member = segment_ids[:, :, None] == jnp.arange(1, max_segments + 1)  # [B, T, S]
    if pooling == "mean":
        weights = member.astype(jnp.float32)
        weights = weights / jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), 1.0)
    elif pooling == "cls":  # a sequence's first token has position 0
        weights = (member & (positions == 0)[:, :, None]).astype(jnp.float32)
    else:  # lasttoken: the next token belongs to another sequence (or the row ends)
        nxt = jnp.concatenate([segment_ids[:, 1:], jnp.zeros_like(segment_ids[:, :1])], axis=1)
        weights = (member & (nxt != segment_ids)[:, :, None]).astype(jnp.float32)
    pooled = jnp.einsum("bts,bth->bsh", weights, hidden.astype(jnp.float32))
    return _l2_normalize(pooled) if normalize else pooled


# Row lengths of the packed batches (the longest is max_length). Attention spans a whole row,
# so its cost per token grows with the row length: rows of 64 for short texts cut a batch's
# CPU time ~10% against 128 at the same padding (0.9% on the benchmark's 5-40 word texts);
# rows of 32 pad ~26% (a text of 17+ tokens fills one alone) and are slower.
_ROW_LENGTHS = (64, 128, 256)
_ROW_BUCKETS = (1, 4, 16)  # rows of one packed batch, at most its rows (shapes.row_bucket)
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def resolve_dtype(dtype: Any) -> Any:
    """``"float32"``/``"bfloat16"`` (or the numpy/JAX dtypes) -> the JAX dtype; anything else raises.

    Example:
        >>> from langtorch.functional.embedding import resolve_dtype
        >>> resolve_dtype("bfloat16").__name__
        'bfloat16'
    """
    try:
        name = None if dtype is None else np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in _DTYPES:
        raise ValueError(f"dtype: expected 'float32' or 'bfloat16', got {dtype!r}.")
    return _DTYPES[name]


def cast_params(params: Any, dtype: Any) -> Any:
    """Cast every floating array of a parameter pytree to ``dtype`` (see :func:`resolve_dtype`).

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.embedding import cast_params
        >>> cast_params({"w": np.ones(2, np.float32)}, "bfloat16")["w"].dtype
        dtype(bfloat16)
    """
    dt = resolve_dtype(dtype)
    return jax.tree.map(lambda a: jnp.asarray(a).astype(dt)
                        if jnp.issubdtype(jnp.asarray(a).dtype, jnp.floating) else a, params)


def _check_lengths(lengths, config, row_lengths, offset=0):
    for i, length in enumerate(lengths, offset):
        if length < 1:
            raise ValueError(f"token_ids: text {i} has no tokens (an empty sequence has no "
                             f"embedding).")
        if length > config.max_positions:
            raise ValueError(f"token_ids: text {i} has {length} tokens, more than the model's "
                             f"{config.max_positions} positions; truncate it first.")
        if length > row_lengths[-1]:
            raise ValueError(f"embed_token_ids: text {i} has {length} tokens, more than the "
                             f"largest row length {row_lengths[-1]}; truncate it first.")


class _Pending:
    """Device results not yet copied back, so that packing the next batch overlaps compute."""

    def __init__(self, out: np.ndarray, lag: int = 2):
        self.out, self.lag, self.items = out, lag, []

    def add(self, batch_rows, emb):
        self.items.append((batch_rows, emb))
        while len(self.items) > self.lag:
            self._drain_one()

    def _drain_one(self):
        batch_rows, emb = self.items.pop(0)
        emb = np.asarray(emb)
        for r, row in enumerate(batch_rows):
            self.out[row] = emb[r, :len(row)]

    def finish(self) -> np.ndarray:
        while self.items:
            self._drain_one()
        return self.out


def _dispatch(params, token_ids, index, pending, *, config, row_lengths, tokens_per_batch,
              max_segments, encode_fn, mesh):
    # Pack and launch every batch of `token_ids` (global indices `index`) without waiting.
    lengths = [len(t) for t in token_ids]
    groups: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        groups.setdefault(next(r for r in row_lengths if length <= r), []).append(i)
    shards = S.data_size(mesh)
    for row_len, members in groups.items():
        rows = pack_rows([lengths[i] for i in members], row_len, max_segments)
        rows = [[members[j] for j in row] for row in rows]
        per_batch = max(1, tokens_per_batch // row_len)
        for b0 in range(0, len(rows), per_batch):
            batch_rows = rows[b0:b0 + per_batch]
            nb = row_bucket(len(batch_rows), _ROW_BUCKETS, cap=per_batch)
            nb = -(-nb // shards) * shards  # the data axis must divide the batch: pad rows
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
            if ids.min() < 0 or ids.max() >= config.vocab_size:  # jnp.take would give NaN
                bad = next(i for row in batch_rows for i in row
                           if min(token_ids[i]) < 0 or max(token_ids[i]) >= config.vocab_size)
                raise ValueError(f"token_ids: text {index[bad]} has token ids outside "
                                 f"0..{config.vocab_size - 1} (the model's vocabulary).")
            if mesh is not None:
                ids, seg, pos = (jax.device_put(a, S.data_sharding(mesh, 2))
                                 for a in (ids, seg, pos))
            emb = encode_fn(params, ids, seg, pos, config=config, max_segments=max_segments)
            pending.add([[index[i] for i in row] for row in batch_rows], emb)


def _prepare(params, config, row_lengths, max_segments, mesh, dtype):
    if not row_lengths or list(row_lengths) != sorted(row_lengths):
        raise ValueError(f"row_lengths: expected ascending lengths, got {row_lengths!r}.")
    if max_segments < 1:
        raise ValueError(f"max_segments: expected >= 1, got {max_segments}.")
    if dtype is not None:
        params = cast_params(params, dtype)
    mesh = S.resolve_mesh(mesh)
    if mesh is not None:
        S.check_local(mesh)
        params = S.replicate(params, mesh)
    return params, mesh


def embed_token_ids(
    params: Any,
    token_ids: Sequence[Sequence[int]],
    *,
    config: bert.BertConfig = bert.MINILM_L6,
    row_lengths: Sequence[int] = (64, 128, 256),
    tokens_per_batch: int = 2048,
    max_segments: int = 32,
    encode_fn: Callable[..., Any] | None = None,
    mesh: Any = None,
    dtype: Any = None,
) -> np.ndarray:
    """Embed tokenised sequences (each already truncated) into ``[N, H]`` float32 unit vectors.

    Sequences are grouped by the smallest row length that fits them, packed into rows
    (:func:`pack_rows`), and rows are encoded ``tokens_per_batch // row_len`` at a time (a short
    final batch is padded to 1, 4 or 16 rows). Compiles: at most three row counts per row length.
    Batches are launched without waiting (JAX dispatches asynchronously), so packing batch
    ``i+1`` on the host overlaps the encoding of batch ``i``; results are copied back two
    batches behind.

    Args:
        params: BERT params (arrays already on device avoid a transfer per batch).
        token_ids: one list of ids per text (with ``[CLS]``/``[SEP]``).
        config: the encoder configuration.
        row_lengths: the packed row lengths, ascending; the last must be >= the longest input.
        tokens_per_batch: tokens encoded per jitted call.
        max_segments: most sequences in one row.
        encode_fn: replaces :func:`embed_packed` (same signature), e.g. a pre-bound version.
        mesh: ``None``, ``"auto"`` or a :class:`jax.sharding.Mesh` with a ``data`` axis: each
            batch's rows are split along ``data`` (the row count is padded to a multiple of the
            axis size), the params replicated; results come back in input order.
        dtype: ``None`` (the params' dtype), ``"float32"`` or ``"bfloat16"`` for the encoder.

    Raises:
        ValueError: an empty sequence, one longer than ``config.max_positions`` or the largest
            row length, or a token id outside the vocabulary.

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
    params, mesh = _prepare(params, config, row_lengths, max_segments, mesh, dtype)
    n = len(token_ids)
    out = np.zeros((n, config.hidden_size), np.float32)
    if n == 0:
        return out
    _check_lengths([len(t) for t in token_ids], config, row_lengths)
    pending = _Pending(out)
    _dispatch(params, token_ids, list(range(n)), pending, config=config,
              row_lengths=tuple(row_lengths), tokens_per_batch=tokens_per_batch,
              max_segments=max_segments, encode_fn=encode_fn, mesh=mesh)
    return pending.finish()


def embed_texts(
    params: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    config: bert.BertConfig = bert.MINILM_L6,
    max_length: int = 256,
    texts_per_chunk: int = 2048,
    mesh: Any = None,
    dtype: Any = None,
    **kwargs: Any,
) -> np.ndarray:
    """Tokenise ``texts`` with a Hugging Face ``tokenizers.Tokenizer`` and embed them ``[N, H]``.

    Inputs longer than ``max_length`` tokens are cut (keeping the final ``[SEP]``), as
    sentence-transformers does for all-MiniLM-L6-v2 (256). Texts are tokenised
    ``texts_per_chunk`` at a time and each chunk's batches are launched before the next chunk
    is tokenised, so tokenising overlaps the device's work on the previous chunk.

    Args:
        max_length: truncation length; at most ``config.max_positions`` (512 for MiniLM: the
            position table has no rows beyond it).
        texts_per_chunk: texts tokenised and packed per step.
        mesh, dtype: see :func:`embed_token_ids`.
        **kwargs: passed to :func:`embed_token_ids` (``row_lengths``, ``tokens_per_batch``...).

    Raises:
        ValueError: ``max_length`` outside ``2..config.max_positions``.

    Example:
        >>> from langtorch.functional.embedding import embed_texts
        >>> emb = embed_texts(params, tokenizer, ["a cat", "a dog"])  # doctest: +SKIP
        >>> emb.shape  # doctest: +SKIP
        (2, 384)
    """
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) \
            or not 2 <= max_length <= config.max_positions:
        raise ValueError(f"max_length: expected an int in 2..{config.max_positions} (the "
                         f"model's position table), got {max_length!r}.")
    if texts_per_chunk < 1:
        raise ValueError(f"texts_per_chunk: expected >= 1, got {texts_per_chunk}.")
    texts = list(texts)
    row_lengths = tuple(kwargs.pop("row_lengths", None)
                        or tuple(r for r in _ROW_LENGTHS if r < max_length) + (max_length,))
    tokens_per_batch = kwargs.pop("tokens_per_batch", 2048)
    max_segments = kwargs.pop("max_segments", 32)
    encode_fn = kwargs.pop("encode_fn", None) or embed_packed
    if kwargs:
        raise TypeError(f"embed_texts: unexpected arguments {sorted(kwargs)}.")
    params, mesh = _prepare(params, config, row_lengths, max_segments, mesh, dtype)
    out = np.zeros((len(texts), config.hidden_size), np.float32)
    pending = _Pending(out)
    for c0 in range(0, len(texts), texts_per_chunk):
        chunk = texts[c0:c0 + texts_per_chunk]
        ids = []
        for e in tokenizer.encode_batch(chunk):
            t = e.ids
            if len(t) > max_length:  # the tokenizer may not truncate; keep [CLS] ... [SEP]
                t = t[:max_length - 1] + t[-1:]
            ids.append(t)
        _check_lengths([len(t) for t in ids], config, row_lengths, offset=c0)
        _dispatch(params, ids, list(range(c0, c0 + len(chunk))), pending, config=config,
                  row_lengths=row_lengths, tokens_per_batch=tokens_per_batch,
                  max_segments=max_segments, encode_fn=encode_fn, mesh=mesh)
    return pending.finish()
