"""The decode engine's core: slots of a KV cache, batched chunked prefill, jitted decode chunks.

Iteration-level (continuous) batching. A :class:`SlotBatch` holds ``R`` slots (rows) of a KV
cache with ``C`` positions each; every slot holds one sequence at its own length. Between
chunks the host prefills waiting prompts and drops finished sequences; :meth:`SlotBatch.step`
advances every waiting prompt by one prefill chunk (one or more batched prefill calls), then runs
one jitted chunk of up to ``chunk`` decode steps (fewer where steps are slow: ``chunk_seconds``)
for all decoding slots at once, and returns each row's new tokens. Inside the chunk every row checks its own
EOS ids and token budget and stops counting when done; the chunk ends early when every row is
done.

Shapes are buckets, so a few programs serve every request mix:

* ``R`` (live slots) is a bucket of the number of live sequences (decoding, and still
  prefilling: a burst grows the cache once): a joining sequence takes a free row, a finished one
  frees its row; when the live ones fit a smaller bucket they are compacted into the first rows
  and the cache shrinks, so finished and padding rows stop computing; when more join than the
  bucket holds, it grows. (While a long prompt prefills over several steps, the decoding rows
  run at the bucket that counts it.)
* ``C`` (cache positions) is a bucket of the longest live sequence (plus the chunk), so each step
  attends over the filled part of the cache, not a preallocated 8k context.
* Prefill (:func:`prefill_blocks`) is batched and chunked: one call runs ``prefill_chunk``
  (64) tokens of up to ``prefill_rows`` (16) waiting prompts, each attending over its earlier
  blocks; a prompt's last (or only) chunk runs at the narrowest of :func:`prefill_widths` that
  holds it (16, 32, 48 or 64 positions), and one call runs one width. A long prompt advances
  one chunk per step, between decode chunks, so decoding rows never wait for its whole length.
  It compiles per (prompt rows, past, width) bucket triple: rows out of
  :data:`PREFILL_ROW_BUCKETS` (1, 4, 8, 16; capped at ``prefill_rows`` and the slots), the past
  out of the cache buckets (or none), four widths; prompts up to 1,024 tokens use at most 64
  programs. A
  finished prompt's keys/values are written into a free row, in place (the cache is rewritten
  only when its row or length bucket changes). Soft-prompt prompts are prefilled whole
  (:func:`prefill`, one program per prompt-length bucket). Logits are computed at each
  prompt's last position only.
* Prefix caching (:mod:`langtorch.functional.prefix_cache`): a prompt's whole blocks of
  ``prefill_chunk`` tokens are kept under a chained hash of their tokens, in an LRU store of
  ``prefix_cache_tokens`` tokens (4096; 0: off); a later prompt with the same first blocks
  reuses them and computes the rest. Since every chunk attends over keys stored in the KV dtype,
  a hit computes exactly what a miss does.

Sampling (:func:`langtorch.functional.sampling.sample`, sort-free; it replaced this module's
:func:`sample` in the decode step, which changed the tokens a given seed samples once — greedy
rows are unchanged): per-row temperature (0 = greedy), top-p and a 64-bit seed; the key of
a row's ``t``-th token is ``fold_in(fold_in(fold_in(key(lo), hi), choice), t)`` so a sample
depends only on (seed, choice, t), never on which slot or batch it ran in, and seed ``s``'s
second choice never equals seed ``s+1``'s first. (The logits it is drawn from can differ by
float rounding between batch compositions, ~1e-2 with a bf16 cache, so a near-tied token may
flip; greedy rows and the fp32 cache are far less sensitive.)

Per-row controls (:class:`Sequence`: ``top_k``, ``min_p``, frequency / presence / repetition
penalties, ``logit_bias``, ``top_logprobs``, a grammar ``matcher``) are applied inside the
jitted step (:func:`decode_chunk`'s ``features`` are static: a batch that uses none of them
runs the same program as before). Logprobs are of the raw distribution (before temperature,
penalties and masks). While a grammar-constrained row is live the batch decodes one token per
chunk: its mask depends on the token just sampled.

Dtypes: prefill runs in ``prefill_params``' dtype (bf16 is ~2x faster for the many-row matmuls of
a prompt on CPUs with bf16 dot units); decode steps in ``params``' dtype (``langtorch.models``
passes bf16 weights on such CPUs: with a lone 16-bit row decoded as two, ``SlotBatch.min_rows``,
and :func:`decode_compiler_options`, a row then computes bit for bit alike at every row count);
the cache stores fp32 by default, heads-major per layer, values
``[R, Nkv, C, D]`` and keys transposed in blocks of 128 slots ``[R, Nkv, C/128, D, 128]``
(:func:`langtorch.functional.models.decoder.blocked_keys`): XLA:CPU updates it in place (a bf16
cache is upcast to fp32 and back on every write: two full-cache passes per layer per step) and
attention reads each block's ``[D, 128]`` keys and ``[128, D]`` values contiguously (no
transposed copies), block by block, so a row's attention keeps its bits when the cache grows
(cache lengths that are multiples of 256); ``kv_dtype=jnp.bfloat16`` halves the memory.

Example:
    >>> import jax
    >>> from langtorch.functional.models import llama
    >>> from langtorch.functional.engine import SlotBatch, Sequence
    >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
    ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
    >>> p = llama.random_params(jax.random.key(0), cfg)
    >>> batch = SlotBatch(p, config=cfg, max_slots=2, chunk=4)
    >>> _ = batch.admit([Sequence([1, 2, 3], max_tokens=6), Sequence([4], max_tokens=2)])
    >>> done = {}
    >>> while batch.live:
    ...     for seq in batch.step():
    ...         if seq.finished:
    ...             done[len(seq.prompt)] = len(seq.tokens)
    >>> done
    {1: 2, 3: 6}
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import threading
import time
import weakref
from collections.abc import Callable
from collections.abc import Sequence as Seq
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional import sampling as SM
from langtorch.functional import sharding as S
from langtorch.functional.errors import (  # defined there; re-exported here
    SequenceError,
)
from langtorch.functional.models import decoder, llama
from langtorch.functional.models.quant import QuantizedMatrix
from langtorch.functional.prefix_cache import PrefixCache, block_hashes
from langtorch.functional.shapes import DEFAULT_LENGTH_BUCKETS, bucket, row_bucket

__all__ = [
    "CACHE_BUCKETS",
    "PREFILL_CHUNK",
    "PREFILL_ROW_BUCKETS",
    "CHUNK_SECONDS",
    "MIN_DECODE_STEPS",
    "PREFIX_CACHE_TOKENS",
    "SLOT_BUCKETS",
    "Sequence",
    "SequenceError",
    "SlotBatch",
    "decode_chunk",
    "decode_compiler_options",
    "embedding_bits",
    "prefill",
    "prefill_blocks",
    "prefill_widths",
    "sample",
    "seed_words",
]

SLOT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# Decode programs hold at least this many steps (a shorter chunk runs fewer of them through
# decode_chunk's ``limit``): loops of one or two steps compiled to programs whose rows round
# differently in the last bits (SmolLM2, bf16 weights, XLA:CPU 2026-12); 3, 4, 8 and 16 steps
# rounded alike.
MIN_DECODE_STEPS = 4
# Chunked prefill (see SlotBatch): one program per (prompt rows, past length, width) bucket
# triple — rows out of PREFILL_ROW_BUCKETS (capped at prefill_rows), the past out of the cache
# buckets (0 for a first chunk), the width out of prefill_widths(PREFILL_CHUNK) (a call whose
# prompts all end within a quarter, half or three quarters of a chunk computes only that many
# positions: a 40-token chat prompt runs 48, not 64). Prompts up to 1024 tokens with the default
# 16 prefill rows: at most 4 x 4 x 4 = 64 programs. The 8-row bucket keeps a call of 5-8
# prompts of one width from padding to 16 rows (calls are per width: a burst of mixed lengths
# makes several).
PREFILL_CHUNK = 64
CHUNK_SECONDS = 0.5
"""About how long a decode chunk runs at most (:class:`SlotBatch`'s ``chunk_seconds``)."""
PREFILL_ROW_BUCKETS = (1, 4, 8, 16)
PREFIX_CACHE_TOKENS = 4096
# Cache lengths. Attention reads every slot of the bucket, so a bucket twice a row's context
# doubles its attention: with 512 between 256 and 1,024, a 64-request grid of 438-token
# prompts (bench_prefix_cache.py, SmolLM2, AMX Xeon, 2026-12-07) ran 5.7 s instead of 14.1
# with the prefix cache and 18.4 instead of 31.9 without; a step of 16 rows x 512 slots took
# 68.8 ms, of 16 x 1,024 103.1. A row's bits do not move with the bucket: decode attention runs
# in key blocks of decoder.KEY_BLOCK (128) slots summed in a fixed order
# (tests/functional/test_decode_attention_blocks.py; with one product over the cache,
# XLA:CPU's kernels, picked by the cache length, rounded SmolLM2's scores differently from
# 1,024 slots on, which changed a greedy answer on an AMX Xeon). No bucket under 256: a cache
# of one 128-slot block did not always round as the first of two blocks (SmolLM2's shapes at
# 16 rows), which would split the common case of short requests.
CACHE_BUCKETS = (256, 512, 1024, 4096, 8192)
_MIN_PREFILL_WIDTH = 16


def prefill_widths(chunk: int) -> tuple[int, ...]:
    """The widths a prefill call of ``chunk``-token blocks runs at: quarters of the chunk, none
    under 16 positions (fewer programs to compile where a narrower one saves little).

    Example:
        >>> from langtorch.functional.engine import prefill_widths
        >>> prefill_widths(64), prefill_widths(32), prefill_widths(8)
        ((16, 32, 48, 64), (16, 24, 32), (8,))
    """
    chunk = int(chunk)
    return tuple(sorted({min(chunk, max(_MIN_PREFILL_WIDTH, -(-chunk * k // 4)))
                         for k in range(1, 5)}))


def seed_words(seed: int) -> tuple[int, int]:
    """Split an integer seed into two uint32 words; every seed in ``[0, 2**64)`` keys apart.

    Negative seeds are taken modulo ``2**64``.

    Example:
        >>> from langtorch.functional.engine import seed_words
        >>> seed_words(5), seed_words(2**32)
        ((5, 0), (0, 1))
    """
    s = int(seed) % (1 << 64)
    return s & 0xFFFFFFFF, s >> 32


def _keys(seeds: jax.Array, t: jax.Array) -> jax.Array:
    """PRNG keys ``[B]`` from ``seeds [B, 3]`` uint32 (lo, hi, choice) and token indices ``[B]``."""
    def one(s, i):
        k = jax.random.fold_in(jax.random.key(s[0]), s[1])
        return jax.random.fold_in(jax.random.fold_in(k, s[2]), i)

    return jax.vmap(one)(seeds, t)


def sample(logits: jax.Array, seeds: jax.Array, t: jax.Array, temperature: jax.Array,
           top_p: jax.Array) -> jax.Array:
    """Pick one token per row: greedy where ``temperature == 0``, else nucleus sampling.

    :func:`langtorch.functional.sampling.sample` with the engine's per-row keys (``seeds`` and
    the token index ``t``) and top-p only: a row is resolved among its 64 largest logits, the
    whole vocabulary only when its nucleus may reach past them.

    Args:
        logits: ``[B, V]`` float32.
        seeds: ``[B, 3]`` uint32 ``(lo, hi, choice)`` words (see :func:`seed_words`).
        t: ``[B]`` int32 index of the token being sampled in its sequence.
        temperature: ``[B]`` (>= 0), top_p: ``[B]`` in ``(0, 1]``.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.engine import sample
        >>> logits = jnp.array([[0.0, 5.0, 1.0]])
        >>> sample(logits, jnp.zeros((1, 3), jnp.uint32), jnp.zeros(1, jnp.int32),
        ...        jnp.zeros(1), jnp.ones(1)).tolist()
        [1]
    """
    return SM.sample(logits, _keys(seeds, t), temperature, top_p=top_p)


@jax.jit
def _unstack_jit(params):
    return llama.unstack_layers(params)


def _unstacked(params):
    # One jitted call: slicing 30 layers x 9 weights eagerly costs ~500 dispatches (seconds).
    if isinstance(params["layers"], (list, tuple)):
        return params
    return _unstack_jit(params)


def _sixteen_bit(params: Any) -> bool:
    """Whether every floating-point matrix of ``params`` is bf16 or fp16."""
    mats = [a for a in jax.tree.leaves(params)
            if getattr(a, "ndim", 0) >= 2 and jnp.issubdtype(a.dtype, jnp.floating)]
    return bool(mats) and all(a.dtype in (jnp.bfloat16, jnp.float16) for a in mats)


def _layers(params):
    return llama.unstack_layers(params)["layers"]


#: ``SlotBatch(decode_layout=...)`` values: how a decode step multiplies the layer weights.
DECODE_LAYOUTS = ("auto", "rows", "columns")

# Column-major copies (decoder.arrange_columns) per set of weights: the ids of its layer
# matrices -> (weak references to them, per layer a {"<name>_t": transposed matrix} dict, a
# token). An entry goes as soon as one of its matrices goes; every batch of the same weights
# shares one copy.
_COLUMNS: dict[tuple, tuple[list, Any, object]] = {}
_COLUMNS_LOCK = threading.Lock()


def _float32_matrices(params: Any) -> bool:
    return all(lay[k].dtype == jnp.float32 for lay in _layers(params)
               for k in decoder.COLUMN_MATRICES)


def resolve_decode_layout(layout: str, params: Any) -> str:
    """``"rows"`` or ``"columns"``: what ``decode_layout`` (:data:`DECODE_LAYOUTS`) means for
    ``params`` on this backend. ``"auto"`` is ``"columns"`` on a CPU for fp32 layer matrices
    (XLA:CPU's YNNPACK products repack a right-hand weight on every call; see
    :func:`~langtorch.functional.models.decoder.block_columns`), else ``"rows"`` (16-bit
    weights: not measured faster yet; quantized ones keep their int8 products' layout).
    Raises ``ValueError`` for an unknown layout, or ``"columns"`` with a layer matrix that is
    not a float matrix (:func:`~langtorch.functional.models.decoder.column_problem`).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.engine import resolve_decode_layout
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=6)
        >>> resolve_decode_layout("rows", llama.random_params(jax.random.key(0), cfg))
        'rows'
    """
    if layout not in DECODE_LAYOUTS:
        raise ValueError(f"expected decode_layout 'auto', 'rows' or 'columns', got "
                         f"{layout!r}.")
    if layout == "rows":
        return "rows"
    problem = decoder.column_problem(params)
    if layout == "columns":
        if problem is not None:
            raise ValueError(f"decode_layout='columns' needs float layer matrices: {problem} "
                             f"(use 'rows' or 'auto').")
        return "columns"
    # "auto": measured for fp32 weights only. With 16-bit weights XLA:CPU converted a weight to
    # fp32 on some steps (the w_o product at 2-16 rows, every product at one row).
    return auto_decode_layout(problem is None and _float32_matrices(params))


def auto_decode_layout(float32_matrices: bool) -> str:
    """What ``decode_layout="auto"`` resolves to on this backend for layer matrices that are
    (``True``) or are not (16-bit or quantized) float32: ``"columns"`` on a CPU for float32,
    else ``"rows"`` (the rule of :func:`resolve_decode_layout`, for callers that know the
    dtype before the weights load).

    Example:
        >>> from langtorch.functional.engine import auto_decode_layout
        >>> auto_decode_layout(False)
        'rows'
    """
    return "columns" if float32_matrices and jax.default_backend() == "cpu" else "rows"


def columns_params(params: Any) -> Any:
    """``decoder.arrange_columns(params)`` (every layer matrix transposed, ``[out, in]``), the
    transposed matrices made once per set of per-layer weights
    (:func:`~langtorch.functional.models.decoder.unstack_layers`, as a :class:`SlotBatch` holds
    them) and kept while they live: every batch of the same weights decodes with one copy. The
    copy holds the layer matrices' bytes again (SmolLM2 in fp32: 425 MB). The rest of the
    returned tree (norms, biases, embedding, head) is ``params``' own.

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.engine import columns_params
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=6)
        >>> p = llama.unstack_layers(llama.random_params(jax.random.key(0), cfg))
        >>> cols = columns_params(p)
        >>> w_up = cols["layers"][0]["w_up_t"]
        >>> w_up.shape, columns_params(p)["layers"][0]["w_up_t"] is w_up  # the same copy
        ((6, 8), True)
    """
    # (Stacked weights are sliced into new per-layer arrays on every call, so their copy is
    # made per call and goes with those arrays: pass unstacked weights to share one copy.)
    params = _unstacked(params)
    problem = decoder.column_problem(params)
    if problem is not None:
        raise ValueError(f"columns_params: {problem}.")
    mats = [lay[k] for lay in params["layers"] for k in decoder.COLUMN_MATRICES]
    if not all(isinstance(m, jax.Array) and not isinstance(m, jax.core.Tracer) for m in mats):
        return decoder.arrange_columns(params)  # (kept only for concrete device arrays)
    key = tuple(map(id, mats))

    def kept():
        entry = _COLUMNS.get(key)
        if entry is not None and all(r() is m for r, m in zip(entry[0], mats)):
            return entry[1]
        return None

    moved = kept()
    if moved is None:
        with _COLUMNS_LOCK:
            moved = kept()
            if moved is None:
                # Only the transposed matrices are kept: the rest of the tree (norms, biases,
                # the embedding, the head) is always the caller's own, so two trees sharing
                # layer matrices but not, say, their embedding never mix.
                arranged = decoder.arrange_columns(params)
                moved = tuple({k + "_t": lay[k + "_t"] for k in decoder.COLUMN_MATRICES}
                              for lay in arranged["layers"])
                if any(isinstance(m, jax.core.Tracer) for m in jax.tree.leaves(moved)):
                    return arranged  # (called while tracing: a tracer is never kept)
                token = object()  # (the finalizers hold this, never the copy)
                watched = {id(m): m for m in mats}  # (a matrix used twice is watched once)
                for m in watched.values():
                    weakref.finalize(m, _forget_columns, key, token)
                _COLUMNS[key] = ([weakref.ref(m) for m in mats], moved, token)
    return {**params, "layers": tuple(
        {**{k: v for k, v in lay.items() if k not in decoder.COLUMN_MATRICES}, **mats_t}
        for lay, mats_t in zip(params["layers"], moved))}


def _forget_columns(key: tuple, token: object) -> None:
    entry = _COLUMNS.get(key)
    if entry is not None and entry[2] is token:
        _COLUMNS.pop(key, None)


@partial(jax.jit, static_argnames=("config", "kv_dtype"))
def prefill(params: Any, ids: jax.Array, prefix: jax.Array, length: jax.Array, *,
            config: llama.LlamaConfig, kv_dtype: Any = jnp.bfloat16
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Run one prompt ``[prefix | ids]`` and return its keys, values and last-position logits.

    Args:
        params: Llama params (their dtype is the compute dtype).
        ids: ``[T]`` right-padded prompt ids (a length bucket).
        prefix: ``[P, H]`` soft prompt put before the ids (``P`` may be 0).
        length: real tokens ``P + n`` (``n`` ids; the rest of ``ids`` is padding).
        config: the model configuration.
        kv_dtype: dtype of the returned keys/values.

    Returns:
        ``(k [L, Nkv, P+T, D], v [L, Nkv, P+T, D], logits [V] fp32)`` (keys/values in the
        cache's heads-major layout).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.engine import prefill
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> k, v, logits = prefill(p, jnp.array([1, 2, 0, 0]), jnp.zeros((0, 8)), 2, config=cfg)
        >>> k.shape, logits.shape
        ((1, 1, 4, 4), (16,))
    """
    c = config
    dtype = params["embed"].dtype
    x = decoder.embedding_rows(params["embed"], ids)[None]
    x = decoder.scale_embeddings(jnp.concatenate([prefix.astype(dtype)[None], x], axis=1), c)
    t = x.shape[1]
    positions = jnp.arange(t)[None]
    tables = decoder.rope_tables(positions, c)
    valid = jnp.arange(t) < length
    distance = jnp.arange(t)[:, None] - jnp.arange(t)[None, :]
    allowed = (distance >= 0) & valid[None, :]
    biases = decoder.layer_biases(allowed[None], distance[None], c)
    sliding = c.sliding_layers or (False,) * c.num_layers
    ks, vs = [], []
    for li, p in enumerate(_layers(params)):
        def keep(k, v):
            return k, v, (k.astype(kv_dtype), v.astype(kv_dtype))

        x, (k, v) = decoder.layer(p, x, tables, biases, keep, config=c, sliding=sliding[li])
        ks.append(k[0])
        vs.append(v[0])
    last = jax.lax.dynamic_index_in_dim(x, length - 1, axis=1, keepdims=True)
    logits = decoder.lm_head(params, decoder.final_norm(params, last, config=c), c)[0, 0]
    return jnp.stack(ks), jnp.stack(vs), logits


# Position-aligned cache: a row's token at sequence position p sits at cache slot p (its tokens
# are slots 0 .. lens[r] - 1); every decode step writes each row's new key/value at its own slot
# lens[r] (one in-place scatter per layer and array, ~0.2 ms per step for SmolLM2's 60 arrays at
# 16 rows). A row's attention therefore reads the same slots in the same order whatever the
# other rows are and whatever ran in the cache before it, so its reductions (the softmax sum,
# the value product) do not depend on the batch's history. (A ring shared by all rows, the
# design before, put a row's tokens at an offset set by the batch's history, and those
# reductions rounded differently with it: a request's logprobs moved by ~1e-5 in fp32 between
# runs, enough to flip near-ties in bf16.)


def _write_rows(cache, k, v, slots):
    # Layout helper (the only place prefill output meets the decode cache's layout): put one
    # prompt's keys/values ``[L, Nkv, T, D]`` (its first positions real, the rest padding) into
    # rows `slots` at slots 0 .. T - 1. The donated cache is updated in place, one row per slot: an
    # admission never rewrites the rows of other sequences. The cache's keys are stored
    # transposed in blocks, [R, Nkv, C/b, D, b] (decoder.blocked_keys): the prompt's keys are
    # padded to whole blocks and blocked here (a prompt-sized copy per admission, never one of
    # the cache). Only the prompt's slots (and the rest of its last block) are written: slots
    # from the prompt's length on (its padding, or an earlier sequence's entries) are never
    # attended, since a decode step writes a row's slot `lens` before its attention reads
    # 0 .. lens.
    cap = cache["v"][0].shape[2]
    kb = decoder.key_block(cap)
    out_k, out_v = [], []
    for i, (ck, cv) in enumerate(zip(cache["k"], cache["v"])):
        ki = k[i][:, :cap]
        ki = jnp.pad(ki, ((0, 0), (0, -ki.shape[1] % kb), (0, 0)))
        rk = decoder.blocked_keys(ki, cap).astype(ck.dtype)[None]
        rv = v[i][:, :cap].astype(cv.dtype)[None]
        for s in range(slots.shape[0]):
            ck = jax.lax.dynamic_update_slice(ck, rk, (slots[s], 0, 0, 0, 0))
            cv = jax.lax.dynamic_update_slice(cv, rv, (slots[s], 0, 0, 0))
        out_k.append(ck)
        out_v.append(cv)
    return {"k": tuple(out_k), "v": tuple(out_v)}


@partial(jax.jit, donate_argnums=(0,))
def _insert(cache, k, v, slots):
    # One prompt's keys/values [L, Nkv, T, D] (a soft-prompt prefill) into rows `slots`.
    return _write_rows(cache, k, v, slots)


# ---- prompt blocks: the unit of chunked prefill and of the prefix cache -----------------------
# A block is one device array [2, L, Nkv, c, D] (keys, values of `c` consecutive prompt positions
# for every layer, heads-major like the decode cache, in the KV dtype). Only the three helpers
# below (and _write_rows) know this layout.


def _blocks_from_chunk(ks, vs):
    """Per-layer chunk keys/values ``L x [R, Nkv, T, D]`` -> ``R`` blocks ``[2, L, Nkv, T, D]``."""
    kv = jnp.stack([jnp.stack(ks), jnp.stack(vs)])  # [2, L, R, Nkv, T, D]
    return tuple(kv[:, :, r] for r in range(kv.shape[2]))


def _past_from_blocks(blocks, rows, nb):
    """``rows * nb`` blocks (row-major) -> per-layer past keys and values ``L x [R, Nkv, nb*c,
    D]``."""
    kv = jnp.stack(blocks).reshape(rows, nb, *blocks[0].shape)  # [R, nb, 2, L, Nkv, c, D]
    _, _, _, n_layers, nkv, c, d = kv.shape
    kv = kv.transpose(2, 3, 0, 4, 1, 5, 6).reshape(2, n_layers, rows, nkv, nb * c, d)
    return tuple(kv[0]), tuple(kv[1])


def _kv_from_blocks(blocks):
    """A sequence's blocks -> its keys and values ``[L, Nkv, nb*c, D]``."""
    kv = jnp.concatenate(blocks, axis=3)
    return kv[0], kv[1]


@partial(jax.jit, donate_argnums=(0,))
def _insert_blocks(cache, blocks, slots):
    # A prefilled prompt's blocks into rows `slots` (see _write_rows).
    k, v = _kv_from_blocks(blocks)
    return _write_rows(cache, k, v, slots)


@partial(jax.jit, static_argnames=("config", "kv_dtype", "block"))
def prefill_blocks(params: Any, ids: jax.Array, start: jax.Array, length: jax.Array,
                   past: tuple, *, config: llama.LlamaConfig, kv_dtype: Any = jnp.bfloat16,
                   block: int | None = None) -> tuple[tuple, jax.Array]:
    """One chunk of prefill for ``R`` prompts at once, each continuing after its cached blocks.

    Row ``r`` runs the ids ``ids[r, :length[r]]`` at positions ``start[r]...``; its keys and
    values before ``start[r]`` are read from ``past`` (blocks of earlier chunks of the same
    prompt, computed before or found in the prefix cache). Every query attends over keys stored
    in ``kv_dtype`` — the past ones and this chunk's own — so a chunk computes the same whether
    its past was computed just before or came from the cache. Attention runs over blocks of
    the block width, this chunk's own first (:func:`decoder.block`'s blocked keys), so a row's
    result does not depend on how many past blocks the call's other rows bring.

    Args:
        params: per-layer or stacked Llama params (their dtype is the compute dtype).
        ids: ``[R, T]`` int32 (right-padded); ``start``, ``length``: ``[R]`` int32 (``start``
            a multiple of the block width ``B``, ``1 <= length <= T``).
        past: ``R * nb`` blocks ``[2, L, Nkv, B, D]``, row-major (row ``r``'s first
            ``start[r] / B`` are real; the rest any padding), ``nb >= 0``.
        config: the model configuration; kv_dtype: the dtype of the keys/values.
        block: the block width ``B >= T`` (default ``T``): a chunk narrower than the blocks
            (a prompt's last, short one) computes ``T`` positions and its block is padded
            with zeros to ``B``.

    Returns:
        ``(blocks, logits)``: this chunk's ``R`` blocks ``[2, L, Nkv, B, D]`` and the logits
        ``[R, V]`` (fp32) at each row's last position ``start + length - 1``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.engine import prefill_blocks
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> i32 = lambda *x: jnp.array(x, jnp.int32)  # i32([1, 2]): one row [[1, 2]]
        >>> (b0,), _ = prefill_blocks(p, i32([1, 2]), i32(0), i32(2), (), config=cfg)
        >>> (b1,), last = prefill_blocks(p, i32([3, 0]), i32(2), i32(1), (b0,), config=cfg)
        >>> b1.shape, last.shape  # [k|v, layers, kv heads, chunk, head dim], [rows, vocab]
        ((2, 1, 1, 2, 4), (1, 16))
    """
    c = config
    rows, t = ids.shape
    bw = t if block is None else int(block)
    if bw < t:
        raise ValueError(f"prefill_blocks: block={bw} is narrower than the chunk ({t} ids).")
    nb = len(past) // rows
    if past and past[0].shape[3] != bw:
        raise ValueError(f"prefill_blocks: the past blocks are {past[0].shape[3]} positions "
                         f"wide, the block width is {bw} (pass block= the blocks' width).")
    x = decoder.scale_embeddings(decoder.embedding_rows(params["embed"], ids), c)
    positions = start[:, None] + jnp.arange(t)[None]  # [R, T]
    tables = decoder.rope_tables(positions, c)
    # Attention runs over key blocks of the block width (decoder.block's blocked keys): this
    # chunk's own keys first (padded to a block), then the past blocks; without a past, one
    # block of zeros (masked) stands in, so there are always two blocks or more. A row's
    # blocks past its own past are masked and add exact zeros to sums taken in a fixed order,
    # so its attention keeps its bits whatever past the call's other rows bring (a prompt
    # prefilled beside a long prompt's late chunk: a past of 1,024 slots, not none).
    npast = max(nb, 1)
    own_pos = jnp.pad(positions, ((0, 0), (0, bw - t)))
    key_pos = jnp.concatenate(
        [own_pos, jnp.broadcast_to(jnp.arange(npast * bw)[None], (rows, npast * bw))], axis=1)
    real = jnp.concatenate([jnp.arange(bw)[None] < length[:, None],
                            jnp.arange(npast * bw)[None] < start[:, None] * (nb > 0)], axis=1)
    if nb:
        past_k, past_v = _past_from_blocks(past, rows, nb)
    else:
        zeros = jnp.zeros((rows, c.num_kv_heads, bw, c.head_dim), kv_dtype)
        past_k = past_v = (zeros,) * c.num_layers
    distance = positions[:, :, None] - key_pos[:, None, :]  # [R, T, (1 + npast) * B]
    allowed = (distance >= 0) & real[:, None, :]
    biases = decoder.layer_biases(allowed, distance, c)
    sliding = c.sliding_layers or (False,) * c.num_layers
    ks, vs = [], []
    for li, p in enumerate(_layers(params)):
        def attend(k, v, li=li):
            k, v = k.astype(kv_dtype), v.astype(kv_dtype)
            pad = ((0, 0), (0, 0), (0, bw - t), (0, 0))
            keys = jnp.concatenate([jnp.pad(k, pad), past_k[li]], axis=2)  # [R, Nkv, S, D]
            values = jnp.concatenate([jnp.pad(v, pad), past_v[li]], axis=2)
            keys = keys.reshape(rows, c.num_kv_heads, -1, bw, c.head_dim)  # blocks
            return keys, values, (k, v)

        x, (k, v) = decoder.layer(p, x, tables, biases, attend, config=c, sliding=sliding[li])
        if bw > t:  # [R, Nkv, T, D] -> the block width
            k, v = (jnp.pad(a, ((0, 0), (0, 0), (0, bw - t), (0, 0))) for a in (k, v))
        ks.append(k)
        vs.append(v)
    last = jnp.take_along_axis(x, (length - 1)[:, None, None], axis=1)  # [R, 1, H]
    logits = decoder.lm_head(params, decoder.final_norm(params, last, config=c), c)[:, 0]
    return _blocks_from_chunk(ks, vs), logits.astype(jnp.float32)


def _fit(a, axis, length):
    # `a` cut to or zero-padded at the end to `length` along `axis`.
    cap = a.shape[axis]
    if cap >= length:
        return jax.lax.slice_in_dim(a, 0, length, axis=axis)
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, length - cap)
    return jnp.pad(a, pad)


@partial(jax.jit, static_argnames=("keys", "length"))
def _resize_one(a, order, *, keys, length):
    # Rows `order` of one layer's values [R, Nkv, C, D] or blocked keys [R, Nkv, C/b, D, b]
    # (a gather: compaction or growth), cut to or padded at the end to `length` slots (a row's
    # tokens are its first slots; the cache only shrinks when every live row fits). Keys whose
    # block size stays are cut or padded by whole blocks; a cache shorter than a block (one
    # block of its length) is re-blocked. One small program per array shape (two per cache,
    # shared by every layer), not one over all the layers' arrays (a 64 -> 32 compaction of
    # SmolLM2's 256-position cache: 0.44 s as one program, 0.044 s this way).
    a = jnp.take(a, order, axis=0, mode="clip")
    if not keys:
        return _fit(a, 2, length)
    kb = decoder.key_block(length)
    if a.shape[-1] == kb:
        return _fit(a, 2, length // kb)
    flat = jnp.swapaxes(a, -1, -2).reshape(a.shape[:2] + (-1, a.shape[3]))  # [R, Nkv, C, D]
    return decoder.blocked_keys(_fit(flat, 2, length), length)


def _resize(cache, order, *, rows, length):
    # The cache with `len(order) == rows` rows (row i = old row order[i]) and `length` slots.
    assert order.shape[0] == rows, (order.shape, rows)
    ks, vs = list(cache["k"]), list(cache["v"])
    for i in range(len(ks)):
        ks[i] = _resize_one(ks[i], order, keys=True, length=length)
        vs[i] = _resize_one(vs[i], order, keys=False, length=length)
    return {"k": tuple(ks), "v": tuple(vs)}


_FEATURES = ("bias", "filter", "logprobs", "mask", "penalty", "repetition")
LOGPROBS_K = SM.MAX_TOP_LOGPROBS  # the engine computes the top 20; a request slices its own


def _pick(logits, seeds, t, temperature, top_p, ctl, features):
    """One token per row from ``[R, V]`` logits under the rows' controls.

    ``features`` (static) says which transforms any row uses, so a batch without penalties,
    bias, top-k/min-p, grammar masks or logprobs pays nothing for them. Order (vLLM's):
    raw logits -> logprobs; repetition penalty, frequency/presence penalties, logit bias,
    grammar mask; then :func:`langtorch.functional.sampling.sample`.
    """
    raw = logits.astype(jnp.float32)
    x = raw
    if "repetition" in features:
        x = SM.apply_repetition_penalty(x, ctl["seen"], ctl["repetition_penalty"])
    if "penalty" in features:
        x = SM.apply_penalties(x, ctl["counts"], ctl["frequency_penalty"],
                               ctl["presence_penalty"])
    if "bias" in features:
        x = SM.apply_logit_bias(x, ctl["bias_ids"], ctl["bias_values"])
    if "mask" in features:
        x = SM.apply_token_bitmask(x, ctl["bitmask"])
    filt = "filter" in features
    tok = SM.sample(x, _keys(seeds, t), temperature, top_k=ctl["top_k"] if filt else None,
                    top_p=top_p, min_p=ctl["min_p"] if filt else None)
    lp = SM.top_logprobs(raw, tok, k=LOGPROBS_K) if "logprobs" in features else None
    return tok, lp


def _count(arr, tok, active, op):
    rows = jnp.arange(tok.shape[0])
    if op == "add":
        return arr.at[rows, tok].add(active.astype(arr.dtype), mode="drop")
    return arr.at[rows, tok].max(active, mode="drop")


# XLA:CPU hands some elementwise/reduce work (the RMS norm's reduce, the rotary math fused into
# the score product) to YNNPACK fusions from about 8 rows on and emits its own loops below: the
# two round differently, so a bf16 row's logprobs moved with the number of rows beside it.
# Giving YNNPACK the dots only keeps every other op on one code path at every row count; the
# decode chunk then computes each row bit for bit alike among 1 to 64 rows (bf16 weights; fp32
# products still change their blocking from ~48 rows). Measured on a Zen 4 (2 cores,
# profile_engine, SmolLM2, 2026-12-06): bf16 steps equal within noise at 1-16 rows and 13%
# faster at 64; fp32 steps 26% faster at 64 rows.
_DECODE_CPU_OPTIONS = (("xla_cpu_experimental_ynn_fusion_type",
                        "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),)


_bits16 = jax.jit(lambda table: jax.lax.bitcast_convert_type(table, jnp.uint16))
# Bits made per table: id(table) -> (weakref to the table, bits). An entry goes with its table.
_TABLE_BITS: dict[int, tuple[Any, jax.Array]] = {}
_BITS_LOCK = threading.Lock()


def _forget_bits(ref: Any, key: int) -> None:
    if _TABLE_BITS.get(key, (None,))[0] is ref:
        _TABLE_BITS.pop(key, None)


def _is_16bit_table(table: Any) -> bool:
    return (not isinstance(table, QuantizedMatrix) and hasattr(table, "dtype")
            and table.dtype in (jnp.bfloat16, jnp.float16))


def embedding_bits(params: Any) -> Any:
    """The uint16 bits of a 16-bit (bf16/fp16) embedding table ``params["embed"]``, for
    :func:`decode_chunk`; ``None`` for any other table (fp32, quantized). An abstract table
    (``jax.ShapeDtypeStruct``) gives abstract bits.

    XLA:CPU gathers rows of a 16-bit table by first converting the whole table, and a bitcast
    of it taken inside the decode program is a copy of the table on every step (SmolLM2's
    [49152, 576] bf16 table: ~1.7 ms per step at any row count). Handed in as bits, a step
    gathers just its rows. The bits are a copy of the table (its bytes again on the device),
    made once per table and kept while the table lives: every engine of a model shares them.
    They carry no gradient (decoding is not differentiated).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.engine import embedding_bits
        >>> p = {"embed": jnp.ones((2, 3), jnp.bfloat16)}
        >>> embedding_bits(p).dtype, embedding_bits(p) is embedding_bits(p)
        (dtype('uint16'), True)
        >>> embedding_bits({"embed": jnp.ones((2, 3))}) is None
        True
    """
    table = params["embed"]
    if not _is_16bit_table(table):
        return None
    if isinstance(table, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(table.shape, jnp.uint16)
    if not isinstance(table, jax.Array) or isinstance(table, jax.core.Tracer):
        # Kept only for concrete device arrays: a numpy table can change in place, and the
        # bits of a traced table would keep its trace alive.
        return _bits16(table)
    key = id(table)
    kept = _TABLE_BITS.get(key)
    if kept is not None and kept[0]() is table:
        return kept[1]
    with _BITS_LOCK:  # one copy per table, also when engines start on several threads
        kept = _TABLE_BITS.get(key)
        if kept is not None and kept[0]() is table:
            return kept[1]
        bits = _bits16(table)
        ref = weakref.ref(table)
        weakref.finalize(table, _forget_bits, ref, key)
        _TABLE_BITS[key] = (ref, bits)
    return bits


def _bits_arg(params: Any, bits: Any) -> Any:
    # decode_chunk's embed_bits: looked up (or made) when not given, else checked.
    if bits is None:
        return embedding_bits(params)
    _check_bits(params, bits)
    return bits


def _check_bits(params: Any, bits: Any) -> None:
    table = params["embed"]
    if not _is_16bit_table(table):
        kind = (type(table).__name__ if isinstance(table, QuantizedMatrix)
                else getattr(table, "dtype", type(table).__name__))
        raise ValueError(f"decode_chunk: embed_bits is for a bf16/fp16 embedding table; this "
                         f"table is {kind} (pass embed_bits=None).")
    shape, dtype = getattr(bits, "shape", None), getattr(bits, "dtype", type(bits).__name__)
    if shape is None or tuple(shape) != tuple(table.shape) or dtype != jnp.uint16:
        raise ValueError(f"decode_chunk: expected embed_bits = embedding_bits(params) (uint16 "
                         f"{tuple(table.shape)}), got {dtype} {shape}.")


@functools.cache
def decode_compiler_options() -> dict[str, str]:
    """The XLA compiler options :func:`decode_chunk` is compiled with on this backend.

    On a CPU: YNNPACK library calls for the dot products only (``xla_cpu_experimental_ynn_
    fusion_type``), so that the norms, rotary embeddings and softmax take the same code path
    at every row count and a row's logprobs do not depend on how many rows share its decode
    chunk. Empty elsewhere, and where this jaxlib does not know the option (checked once per
    process by compiling a scalar program with it).

    Example:
        >>> from langtorch.functional.engine import decode_compiler_options
        >>> isinstance(decode_compiler_options(), dict)
        True
    """
    if jax.default_backend() != "cpu":
        return {}
    options = dict(_DECODE_CPU_OPTIONS)
    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.zeros(())).compile()
    except Exception:  # an older jaxlib: no such option
        return {}
    return options


@functools.cache
def _decode_jit() -> Any:
    """The jitted :func:`_decode_chunk`, compiled with :func:`decode_compiler_options`."""
    return jax.jit(_decode_chunk, static_argnames=("config", "steps", "features"),
                   donate_argnums=(1,), compiler_options=decode_compiler_options() or None)


def decode_chunk(params: Any, cache: dict, tok: jax.Array, lens: jax.Array,
                 active: jax.Array, remaining: jax.Array, t: jax.Array, temperature: jax.Array,
                 top_p: jax.Array, seeds: jax.Array, eos_ids: jax.Array,
                 controls: dict | None = None, *, config: llama.LlamaConfig, steps: int,
                 features: tuple = (), limit: jax.Array | None = None,
                 embed_bits: jax.Array | None = None) -> tuple:
    """Decode up to ``steps`` tokens for every active row of the slot cache.

    Each step feeds a row's pending token ``tok`` at rotary position ``lens``, writes its
    key/value at cache slot ``lens`` (a row's cached tokens are its slots ``0 .. lens - 1``, in
    sequence order, so its attention does not depend on the other rows), samples the next
    token and counts it; a row stops when it samples an EOS id or its ``remaining`` budget
    reaches 0. The loop ends early once no row is active. Every active row needs
    ``lens + min(steps, limit) <= C``; an inactive row's write goes to slot
    ``min(lens, C - 1)`` of its own row.

    Jitted (``config``, ``steps`` and ``features`` static, ``cache`` donated) with
    :func:`decode_compiler_options`; ``decode_chunk.lower(...)`` lowers that program (for its
    HLO).

    Args:
        params: per-layer or stacked Llama params (decode compute dtype).
        cache: ``{"k": (L x [R, Nkv, C/b, D, b]), "v": (L x [R, Nkv, C, D])}`` (donated;
            heads-major with the keys transposed in blocks of ``b =
            decoder.key_block(C)`` slots, so each step's write is in place and each block's
            score product reads its keys contiguously; see
            :func:`langtorch.functional.models.decoder.blocked_keys` and
            :func:`~langtorch.functional.models.decoder.block`'s ``transposed_keys``). Another
            layout raises ``ValueError``.
        tok, lens, remaining, t: ``[R]`` int32 pending token, cached length, token budget left
            and index of the next sampled token in its sequence.
        active: ``[R]`` bool.
        temperature, top_p: ``[R]`` float32; seeds: ``[R, 3]`` uint32.
        controls: the per-row arrays the ``features`` need (see :meth:`SlotBatch.step`):
            ``counts [R, V]`` int32 (generated tokens) and ``frequency_penalty`` /
            ``presence_penalty [R]`` for ``"penalty"``; ``seen [R, V]`` bool (prompt and
            generated) and ``repetition_penalty [R]`` for ``"repetition"``; ``bias_ids`` /
            ``bias_values [R, K]`` for ``"bias"``; ``top_k [R]`` int32 and ``min_p [R]`` for
            ``"filter"``; ``bitmask [R, W]`` int32 for ``"mask"`` (a grammar's packed mask:
            run one step, ``limit=1``: the mask holds for one token).
        features: static names of the transforms any row uses (a sorted tuple out of
            ``"bias", "filter", "logprobs", "mask", "penalty", "repetition"``).
        eos_ids: ``[E]`` int32.
        config: the model configuration; steps: the chunk length (static).
        limit: optional int32 scalar ``<= steps``: run at most this many steps (traced, so
            one compiled program serves every shorter chunk; the outputs keep ``steps``
            columns).
        embed_bits: :func:`embedding_bits` of ``params`` (``None``: looked up or made here,
            once per table). Bits of another table of the same shape would decode with that
            table; a wrong shape or dtype raises ``ValueError``.

    Returns:
        ``(cache, out [R, steps] int32 (-1 where a row produced nothing), tok, lens,
        active, remaining, t, hit_eos [R] bool, logprobs)``; ``logprobs`` is ``None`` or,
        with ``"logprobs"``, ``(chosen [R, steps], top_ids [R, steps, 20], top_logprobs
        [R, steps, 20])`` of the raw distribution.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.engine import decode_chunk
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> cache = {"k": (jnp.zeros((1, 1, 1, 4, 8)),), "v": (jnp.zeros((1, 1, 8, 4)),)}
        >>> i32 = lambda *x: jnp.array(x, jnp.int32)
        >>> out = decode_chunk(p, cache, i32(3), i32(0), jnp.array([True]), i32(2),
        ...                    i32(0), jnp.zeros(1), jnp.ones(1), jnp.zeros((1, 3), jnp.uint32),
        ...                    i32(), config=cfg, steps=4)
        >>> (out[1] >= 0).sum().item(), out[4].tolist()
        (2, [False])
    """
    _check_cache_layout(cache)
    return _decode_jit()(params, cache, tok, lens, active, remaining, t, temperature, top_p,
                         seeds, eos_ids, controls, config=config, steps=steps,
                         features=features, limit=limit,
                         embed_bits=_bits_arg(params, embed_bits))


def _check_cache_layout(cache: Any) -> None:
    # decode_chunk's cache: keys [R, Nkv, C/b, D, b] (b = decoder.key_block(C)) beside values
    # [R, Nkv, C, D], layer by layer.
    try:
        pairs = list(zip(cache["k"], cache["v"], strict=True))
    except (KeyError, TypeError, ValueError):
        raise ValueError("decode_chunk: cache must be {'k': per-layer keys, 'v': per-layer "
                         "values}, one array of each per layer.") from None
    for k, v in pairs:
        ks, vs = tuple(k.shape), tuple(v.shape)
        want = None
        if len(vs) == 4:
            r, nkv, c, d = vs
            b = decoder.key_block(c)
            want = (r, nkv, c // b, d, b)
        if ks != want:
            raise ValueError(f"decode_chunk: keys {ks} do not fit values {vs}: the decode cache "
                             f"stores values [R, Nkv, C, D] and keys in blocks, {want} "
                             "(decoder.init_kv_cache(..., per_layer=True, "
                             "transposed_keys=True)).")


def _lower(*args: Any, **kwargs: Any) -> Any:
    # decode_chunk's program lowered as decode_chunk runs it: with the table's bits handed in
    # (abstract ones for an abstract table).
    params = args[0] if args else kwargs["params"]
    kwargs["embed_bits"] = _bits_arg(params, kwargs.get("embed_bits"))
    return _decode_jit().lower(*args, **kwargs)


# jax.jit's own introspection, on the program compiled with this backend's options.
decode_chunk.lower = _lower
decode_chunk._cache_size = lambda: _decode_jit()._cache_size()


def _decode_chunk(params: Any, cache: dict, tok: jax.Array, lens: jax.Array,
                 active: jax.Array, remaining: jax.Array, t: jax.Array, temperature: jax.Array,
                 top_p: jax.Array, seeds: jax.Array, eos_ids: jax.Array,
                 controls: dict | None = None, *, config: llama.LlamaConfig, steps: int,
                 features: tuple = (), limit: jax.Array | None = None,
                 embed_bits: jax.Array | None = None) -> tuple:
    """:func:`decode_chunk`'s body (jitted once by :func:`_decode_jit`)."""
    c = config
    layers = _layers(params)
    r = tok.shape[0]
    cap = cache["v"][0].shape[2]
    slots = jnp.arange(cap)
    sliding = c.sliding_layers or (False,) * c.num_layers
    # The loop carries each cache array without its size-1 row and KV-head axes (one decode
    # row; one KV head, as in Gemma 3 270M). XLA drops a size-1 batch axis from the attention
    # products; with the axis in the carry, the reshape between the in-place write and the
    # product got the write fused twice (once for the product, once for the carry) and cost
    # four full-cache copies per array per step. Written squeezed, the array the product reads
    # is the written one (the reshape handed to attention folds into XLA's own): one write,
    # no copy (tests/functional/test_engine_hlo.py). Left: with one KV head and several rows,
    # or a cache of one key block and several rows, XLA:CPU lays the final un-squeeze out
    # another way and copies each array twice after the loop (once per chunk; before, four
    # copies per step inside it).
    # Keys [R, Nkv, C/b, D, b] (decoder.blocked_keys) and values [R, Nkv, C, D] are carried
    # in blocks too, values as [.., C/b, b, D]: attention reads them per block, and a carried
    # [C, D] reshaped for it got the write fused twice again (once per shape; 8 full-cache
    # copies per step at one row, one KV head). A cache of one block carries no block axis,
    # for the same reason as the size-1 row and head axes.
    kfull, vfull = cache["k"][0].shape, cache["v"][0].shape
    lead = tuple(n for n in vfull[:2] if n != 1)
    nblocks, kb = kfull[2], kfull[-1]
    blocks = (nblocks,) if nblocks != 1 else ()
    kcarry = lead + blocks + kfull[3:]
    vcarry = lead + blocks + (kb, vfull[-1])

    ctl = dict(controls or {})

    rows_axis = r != 1  # (the squeezed carry has a row axis only for several rows)
    row_ids = jnp.arange(r)

    def put(a, new, axes):
        # Each row's new key/value [.., D] into its slot `at[row]` of the (squeezed) carry
        # array `a`, in place: a scatter over rows (a dynamic-update-slice for one row). `axes`
        # maps the slot's coordinates to axes of `a`: values {C axis: at}, blocked keys
        # {block axis: at // b, last axis: at % b}.
        if not rows_axis:
            start = [0] * a.ndim
            for ax, i in axes.items():
                start[ax] = i[0]
            return jax.lax.dynamic_update_slice(a, jnp.expand_dims(new, tuple(axes)), start)
        index = [slice(None)] * a.ndim
        index[0] = row_ids
        for ax, i in axes.items():
            index[ax] = i
        return a.at[tuple(index)].set(new, mode="promise_in_bounds", unique_indices=True)

    table = params["embed"]

    def embed(tok):
        if embed_bits is None:
            return decoder.embed_tokens(params, tok, config=c)
        # A 16-bit table's rows, gathered from its uint16 bits (see embedding_bits).
        rows = jax.lax.bitcast_convert_type(jnp.take(embed_bits, tok, axis=0), table.dtype)
        return decoder.scale_embeddings(rows, c)

    # Params from decoder.arrange_columns: the hidden states run as columns [H, R] and every
    # layer product is weight [N, K] x states [K, R] (see decoder.block_columns).
    columns = "wq_t" in layers[0]

    def body(state):
        i, ks, vs, tok, lens, active, remaining, t, out, hit, ctl, lps = state
        x = embed(tok).T if columns else embed(tok)[:, None]
        tables = decoder.rope_tables(lens[:, None], c)
        # After this step's write, a row's keys are its slots 0 .. lens (position = slot).
        distance = lens[:, None] - slots[None, :]
        allowed = distance >= 0
        biases = decoder.layer_biases(allowed[:, None, :], distance[:, None, :], c)
        at = jnp.minimum(lens, cap - 1)  # (an inactive row may sit at the end: its own row)
        new_k, new_v = [], []
        for li, p in enumerate(layers):
            def write(k, v, li=li):
                # k, v: [R, Nkv, 1, D] -> squeezed [(R,) (Nkv,) D]
                kn = k[:, :, 0].reshape(lead + (k.shape[-1],)).astype(ks[li].dtype)
                vn = v[:, :, 0].reshape(lead + (v.shape[-1],)).astype(vs[li].dtype)
                nd = ks[li].ndim  # keys [.., (C/b,) D, b], values [.., (C/b,) b, D]
                ck = put(ks[li], kn, {nd - 1: at % kb, **({nd - 3: at // kb} if blocks else {})})
                cv = put(vs[li], vn, {nd - 2: at % kb, **({nd - 3: at // kb} if blocks else {})})
                return ck.reshape(kfull), cv.reshape(vfull), (ck, cv)

            x, (ck, cv) = decoder.layer(p, x, tables, biases, write, config=c,
                                        sliding=sliding[li], transposed_keys=True,
                                        columns=columns)
            new_k.append(ck)
            new_v.append(cv)
        if columns:  # (the head's product reads the normed states as rows)
            x = x.T[:, None]
        logits = decoder.lm_head(params, decoder.final_norm(params, x, config=c), c)[:, 0]
        new, lp = _pick(logits, seeds, t, temperature, top_p, ctl, features)
        out = out.at[:, i].set(jnp.where(active, new, -1))
        if lp is not None:
            lps = tuple(a.at[:, i].set(b) for a, b in zip(lps, lp))
        if "penalty" in features:
            ctl = {**ctl, "counts": _count(ctl["counts"], new, active, "add")}
        if "repetition" in features:
            ctl = {**ctl, "seen": _count(ctl["seen"], new, active, "max")}
        lens = lens + active
        remaining = remaining - active
        t = t + active
        is_eos = jnp.any(new[:, None] == eos_ids[None, :], axis=-1)
        hit = hit | (active & is_eos)
        tok = jnp.where(active, new, tok)
        active = active & ~is_eos & (remaining > 0)
        return (i + 1, tuple(new_k), tuple(new_v), tok, lens, active, remaining, t, out, hit,
                ctl, lps)

    bound = steps if limit is None else jnp.minimum(jnp.asarray(limit, jnp.int32), steps)

    def cond(state):
        return (state[0] < bound) & jnp.any(state[5])

    out = jnp.full((r, steps), -1, jnp.int32)
    lps = ()
    if "logprobs" in features:
        k = min(LOGPROBS_K, c.vocab_size)
        lps = (jnp.zeros((r, steps), jnp.float32), jnp.zeros((r, steps, k), jnp.int32),
               jnp.zeros((r, steps, k), jnp.float32))
    state = (jnp.int32(0), tuple(a.reshape(kcarry) for a in cache["k"]),
             tuple(a.reshape(vcarry) for a in cache["v"]),
             tok, lens, active, remaining, t, out, jnp.zeros((r,), bool), ctl, lps)
    _, ks, vs, tok, lens, active, remaining, t, out, hit, _, lps = jax.lax.while_loop(
        cond, body, state)
    return ({"k": tuple(a.reshape(kfull) for a in ks), "v": tuple(a.reshape(vfull) for a in vs)},
            out, tok, lens, active, remaining, t, hit, lps if lps else None)


@partial(jax.jit, static_argnames=("features",))
def _first_tokens(logits, seeds, temperature, top_p, controls=None, *, features=()):
    n = seeds.shape[0]
    return _pick(jnp.broadcast_to(logits, (n, logits.shape[-1])), seeds,
                 jnp.zeros((n,), jnp.int32), temperature, top_p, dict(controls or {}), features)


@dataclasses.dataclass(eq=False)
class Sequence:
    """One sequence to decode (one choice of one request) and, as it runs, its output.

    Attributes:
        prompt: token ids (validated against the vocabulary on admission).
        max_tokens: most tokens to generate (>= 1).
        temperature, top_p, seed, choice: sampling (see :func:`sample`).
        prefix: optional ``[P, H]`` soft prompt (numpy or jax array) put before the prompt;
            sequences with the same prefix object share its device copy.
        tokens: tokens generated so far (an EOS is not included).
        finished: True once the sequence stopped; ``finish_reason`` ``"stop"`` (EOS or
            :meth:`SlotBatch.finish`) or ``"length"``; ``completion_tokens`` counts the EOS.
        tag: anything the caller wants to find the sequence by.
        top_k, min_p, frequency_penalty, presence_penalty, repetition_penalty, logit_bias:
            the sampling controls of :mod:`langtorch.functional.sampling` (0 / 1 / ``None``:
            off), applied inside the jitted step for this row only.
        top_logprobs: ``None`` (no logprobs) or ``k`` in ``0..20``: record each generated
            token's logprob in the raw distribution and the ``k`` most likely tokens in
            ``logprobs`` (one ``(token, logprob, top_ids, top_logprobs)`` per token of ``tokens``).
        matcher: a :class:`langtorch.functional.constrain.TokenMatcher`: only tokens its
            grammar allows are sampled (the batch decodes one token per chunk while such a
            row is live). When it refuses a token or raises building the first token's mask
            (a grammar-engine failure), the sequence ends with ``finish_reason == "error"``
            and ``error`` says why (the other rows go on).

    Example:
        >>> from langtorch.functional.engine import Sequence
        >>> Sequence([1, 2], max_tokens=4).finished
        False
    """

    prompt: Seq[int]
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    choice: int = 0
    prefix: Any = None
    tag: Any = None
    tokens: list = dataclasses.field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    completion_tokens: int = 0
    slot: int = -1
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Any = None
    top_logprobs: int | None = None
    matcher: Any = None
    logprobs: list = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def prompt_tokens(self) -> int:
        """Prompt ids plus the soft prompt's virtual tokens."""
        p = 0 if self.prefix is None else int(np.shape(self.prefix)[0])
        return p + len(self.prompt)


@dataclasses.dataclass(eq=False)
class _Prefill:
    """One prompt being prefilled for its sequences (the ``n`` choices of a request share it)."""

    seqs: list
    ids: np.ndarray           # the prompt ids (int32)
    keys: list                # chained block hashes of its whole blocks (empty: not cached)
    blocks: list = dataclasses.field(default_factory=list)  # its first `done` positions
    done: int = 0
    logits: Any = None        # [V] at the last prompt position, once done
    soft: bool = False        # a soft-prompt (prefix embeddings) prompt: one prefill call

    @property
    def n(self) -> int:
        return len(self.ids)


class SlotBatch:
    """The host side of continuous batching: slots, admission, chunks, compaction.

    Not thread-safe: one thread drives it (``langtorch.models`` runs it in a worker thread).

    Args:
        params: Llama params used for decode steps (e.g. fp32).
        config: the model configuration.
        prefill_params: params used for prefill (e.g. a bf16 copy); default ``params``.
        wide_params, wide_rows: params for decode chunks of ``wide_rows`` rows or more (e.g. a
            bf16 copy where bf16 products win at many rows and lose at one); default none:
            ``params`` at every row count. With them a sequence's tokens can depend on how many
            others share its chunk (the products differ in precision), so the default keeps
            one dtype for all shapes.
        max_slots: most sequences decoded together.
        chunk: most decode steps per jitted call (stop strings, joins and cancellation are
            handled between chunks).
        chunk_seconds: a decode chunk is cut to about this long (default
            :data:`CHUNK_SECONDS`, 0.5 s): where a step is slow (many rows on a small CPU) it
            runs fewer than ``chunk`` steps, so a request that arrives meanwhile waits about
            that long, not ``chunk`` slow steps, to be prefilled. The step time is measured
            per shape from the chunks before. ``None``: always ``chunk`` steps. The tokens
            do not depend on where chunks end.
        kv_dtype: the cache dtype (default fp32; see the module docstring).
        eos_ids: ids that end a sequence.
        length_buckets: prompt-length buckets for prefill.
        cache_buckets: cache-length buckets (the last must cover the model's context). A
            row's attention keeps its bits across buckets that are multiples of 256 (two key
            blocks or more, ``decoder.KEY_BLOCK``); a bucket of 128 slots, or one that is not
            a multiple of 128 (one block), rounds within float tolerance of the others but
            not bit for bit.
        mesh: ``None``, ``"auto"`` or a ``jax.sharding.Mesh`` with a ``data`` axis: the slots
            (cache rows and per-row state) are split along ``data`` (the row count is padded
            to a multiple of its size; padding rows are inactive), the weights replicated.
        prefill_chunk: prompt tokens per prefill call and row (default 64; also the prefix
            cache's block size): a long prompt is prefilled ``prefill_chunk`` tokens per
            :meth:`step`, between decode chunks, so it never stalls the decoding rows for its
            whole length.
        prefill_rows: most prompts prefilled together in one call (default 16).
        prefix_cache_tokens: capacity of the prefix cache in tokens (default 4096; ``0``
            turns it off); see :mod:`langtorch.functional.prefix_cache`.
        decode_layout: how decode steps multiply the layer weights: ``"columns"`` (the hidden
            states as columns, every weight the left operand of its product:
            :func:`~langtorch.functional.models.decoder.block_columns`, with a transposed copy
            of the layer matrices, :func:`columns_params`), ``"rows"`` (the params as they
            are) or ``"auto"`` (default: columns on a CPU for fp32 weights, rows for 16-bit
            and quantized ones and on other backends; per params tree, so a bf16
            ``wide_params`` decodes as rows; see :func:`resolve_decode_layout`). Measured on
            a Zen 3 class CPU (fp32 SmolLM2, 2026-12-07): decode chunks 1.24-1.34x faster at
            4-16 rows, about even at one row.

    Attributes:
        decode_layout: ``"rows"`` or ``"columns"``: the layout ``params`` decode in, as
            resolved from the argument.
        min_rows: the fewest rows a decode chunk runs: 2 when ``params``' matrices are 16-bit
            and ``max_slots >= 2`` (a lone row decodes beside an inactive one: XLA:CPU's
            one-row program rounds differently from every other row count, so a row's
            logprobs would depend on whether it decodes alone), else 1 (fp32's one-row
            program is ~1.5x faster than two rows).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.engine import SlotBatch, Sequence
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg)
        >>> _ = b.admit([Sequence([1, 2], max_tokens=3)])
        >>> while b.live:
        ...     finished = [s for s in b.step() if s.finished]
        >>> len(finished[0].tokens)
        3
    """

    def __init__(self, params: Any, *, config: llama.LlamaConfig, prefill_params: Any = None,
                 wide_params: Any = None, wide_rows: int | None = None, max_slots: int = 16, chunk: int = 8, kv_dtype: Any = jnp.float32,
                 eos_ids: Seq[int] = (), length_buckets: Seq[int] = DEFAULT_LENGTH_BUCKETS,
                 cache_buckets: Seq[int] = CACHE_BUCKETS, mesh: Any = None,
                 prefill_chunk: int = PREFILL_CHUNK, prefill_rows: int = 16,
                 prefix_cache_tokens: int = PREFIX_CACHE_TOKENS,
                 chunk_seconds: float | None = CHUNK_SECONDS, decode_layout: str = "auto"):
        if decode_layout not in DECODE_LAYOUTS:
            raise ValueError(f"SlotBatch: expected decode_layout 'auto', 'rows' or 'columns', "
                             f"got {decode_layout!r}.")
        if chunk_seconds is not None and (isinstance(chunk_seconds, bool) or not isinstance(
                chunk_seconds, numbers.Real) or not 0 < chunk_seconds < float("inf")):
            raise ValueError(f"SlotBatch: expected chunk_seconds > 0 (or None), got "
                             f"{chunk_seconds!r}.")
        if max_slots < 1 or chunk < 1 or prefill_chunk < 1 or prefill_rows < 1:
            raise ValueError(f"SlotBatch: expected max_slots, chunk, prefill_chunk and "
                             f"prefill_rows >= 1, got {max_slots=} {chunk=} {prefill_chunk=} "
                             f"{prefill_rows=}.")
        self.mesh = S.resolve_mesh(mesh)
        if self.mesh is not None:
            S.check_local(self.mesh)  # the sampled tokens are fetched to the host every chunk
        self.params = _unstacked(params)
        # The same tree as ``params`` is not unstacked twice (that would hold a second copy of
        # the weights on the device for as long as the batch lives).
        self.prefill_params = self.params if prefill_params is None or \
            prefill_params is params else _unstacked(prefill_params)
        if (wide_params is None) != (wide_rows is None) or (wide_rows is not None and (
                isinstance(wide_rows, bool) or not isinstance(wide_rows, (int, np.integer))
                or wide_rows < 1)):
            raise ValueError(f"SlotBatch: expected wide_params and wide_rows >= 1 together (or "
                             f"neither), got wide_rows={wide_rows!r}.")
        self.wide_rows = None if wide_rows is None else int(wide_rows)
        self.wide_params = None if wide_params is None else (
            self.params if wide_params is params else
            self.prefill_params if wide_params is prefill_params else _unstacked(wide_params))
        if self.mesh is not None:
            same = self.prefill_params is self.params
            wide_is_params = self.wide_params is self.params
            wide_same = self.wide_params is self.prefill_params
            # One replicated copy of an array the trees share (the int8 storage of a
            # quantized model's fp32 and bf16 views).
            memo: dict = {}
            self.params = S.replicate(self.params, self.mesh, memo=memo)
            self.prefill_params = self.params if same else S.replicate(
                self.prefill_params, self.mesh, memo=memo)
            if self.wide_params is not None:
                self.wide_params = (self.params if wide_is_params else self.prefill_params
                                    if wide_same else S.replicate(self.wide_params, self.mesh,
                                                                  memo=memo))
        # The layout of each params tree (the wide tree may differ under "auto": e.g. fp32
        # params as columns, a bf16 wide copy as rows), by identity; a tree assigned later is
        # resolved when it first decodes.
        self._layout_asked = decode_layout
        self._layouts: list[tuple[Any, str, Any]] = []  # (params, layout, tree decoded)
        try:
            self.decode_layout = self._layout_of(self.params)
            if self.wide_params is not None:
                self._layout_of(self.wide_params)
        except ValueError as e:
            raise ValueError(f"SlotBatch: {e}") from None
        self.config = config
        self.max_slots = int(max_slots)
        # Decoding with 16-bit weights, one row runs as two (the second inactive): XLA:CPU's
        # one-row program rounds differently from every other row count (its bf16 products
        # already ran padded to matmul.product_min_rows() rows, found per machine: 2 on a Zen
        # 4 or 5, 3 on an AMX Xeon; the inactive row's attention, norms and LM head are the
        # extra cost), so a row's logprobs would depend on whether it decodes alone. fp32
        # keeps one-row programs: its one-row products are ~1.5x faster than two rows. A
        # one-slot batch never has company.
        self.min_rows = min(2, self.max_slots) if _sixteen_bit(self.params) else 1
        self.chunk = int(chunk)
        self.chunk_seconds = None if chunk_seconds is None else float(chunk_seconds)
        # Seconds per decode step, per decode program (rows, cache length, steps, features):
        # None after its first chunk (which may include compiling), then a running mean.
        self._step_s: dict[tuple, float | None] = {}
        self.kv_dtype = kv_dtype
        self.eos = jnp.asarray(np.asarray(list(eos_ids), np.int32).reshape(-1))
        self.length_buckets = tuple(length_buckets)
        self.cache_buckets = tuple(sorted(set(int(b) for b in cache_buckets)
                                          | {int(config.max_positions)}))
        self.slot_buckets = tuple(b for b in SLOT_BUCKETS if b < self.max_slots) + (
            self.max_slots,)
        self.live: list[Sequence] = []
        self.cache = None
        self._rows = 0
        self._len = 0
        self._zero_prefix = jnp.zeros((0, config.hidden_size),
                                      self.prefill_params["embed"].dtype)
        self._prefix_cache: dict[int, tuple[Any, jax.Array]] = {}
        # Per-slot host state (numpy, index = slot).
        self._state: dict[str, np.ndarray] = {}
        # Chunked, batched prefill: prompts admitted and not yet in a decode row, oldest first.
        self.prefill_chunk = int(prefill_chunk)
        self.prefill_rows = min(int(prefill_rows), self.max_slots)  # never more than the slots
        self._prefill_row_buckets = tuple(b for b in PREFILL_ROW_BUCKETS
                                          if b < self.prefill_rows) + (self.prefill_rows,)
        self._prefill_widths = prefill_widths(self.prefill_chunk)
        self._jobs: list[_Prefill] = []
        self.prefix_cache = PrefixCache(int(prefix_cache_tokens), self.prefill_chunk)
        self._zero_block = None
        self.counters = {"prefill_calls": 0, "prefill_rows": 0, "prefill_tokens": 0,
                         "prefill_positions": 0,
                         "cache_resizes": 0, "decode_chunks": 0, "decode_steps": 0}

    def decode_params(self, rows: int) -> Any:
        """The params a decode chunk of ``rows`` rows runs with (:attr:`wide_params` from
        :attr:`wide_rows` rows on, else :attr:`params`; with :attr:`decode_layout`
        ``"columns"``, their :func:`columns_params`).

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg)
            >>> p = b.decode_params(16)
            >>> p is b.params if b.decode_layout == "rows" else "wq_t" in p["layers"][0]
            True
        """
        params = self.params
        if self.wide_rows is not None and rows >= self.wide_rows:
            params = self.wide_params
        return self._resolved(params)[1]

    def _layout_of(self, params: Any) -> str:
        return self._resolved(params)[0]

    def _resolved(self, params: Any) -> tuple[str, Any]:
        # (layout, the tree a decode chunk reads) of a params tree, resolved on first use
        for p, layout, tree in self._layouts:
            if p is params:
                return layout, tree
        layout = resolve_decode_layout(self._layout_asked, params)
        tree = columns_params(params) if layout == "columns" else params
        self._layouts.append((params, layout, tree))
        return layout, tree

    def decode_inputs(self, rows: int) -> tuple[Any, jax.Array | None]:
        """``(params, embed_bits)`` a decode chunk of ``rows`` rows runs with: :meth:`decode_params`
        and its table's :func:`embedding_bits` (made on the first call, kept with the table).

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg)
            >>> b.decode_inputs(4)[1] is None  # fp32 table: rows gathered directly
            True
        """
        params = self.decode_params(rows)
        return params, embedding_bits(params)

    # ---------------------------------------------------------------- validation and shapes
    def check(self, seq: Sequence) -> None:
        """Raise :class:`SequenceError` (``.param``, ``.reason``) for a sequence that cannot run.

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch, Sequence
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg).check(
            ...     Sequence([99]))
            Traceback (most recent call last):
            ...
            langtorch.functional.errors.SequenceError: prompt: llama: token id 99 is outside the vocabulary [0, 16).
        """
        if len(seq.prompt) == 0 and seq.prefix is None:
            raise SequenceError("prompt", "expected at least one token, got none.")
        ids = np.asarray(list(seq.prompt))
        if ids.size and ids.dtype.kind not in "iu":  # 1.5 or True must not become a token id
            raise SequenceError("prompt", f"expected integer token ids, got {ids.dtype} values "
                                          f"(e.g. {ids.reshape(-1)[0]!r}).")
        try:
            llama.check_token_ids(ids.astype(np.int64), self.config.vocab_size)
        except ValueError as exc:
            raise SequenceError("prompt", str(exc)) from None
        mt = seq.max_tokens
        if isinstance(mt, bool) or not isinstance(mt, numbers.Real) or not math.isfinite(mt) \
                or int(mt) != mt or mt < 1:
            raise SequenceError("max_tokens", f"expected an integer >= 1, got {seq.max_tokens!r}.")
        if not (math.isfinite(seq.temperature) and seq.temperature >= 0):
            raise SequenceError("temperature", f"expected a finite number >= 0, got "
                                               f"{seq.temperature!r}.")
        if not (math.isfinite(seq.top_p) and 0 < seq.top_p <= 1):
            raise SequenceError("top_p", f"expected 0 < top_p <= 1, got {seq.top_p!r}.")
        try:
            SM.check_sampling(vocab_size=self.config.vocab_size,
                              frequency_penalty=seq.frequency_penalty,
                              presence_penalty=seq.presence_penalty,
                              repetition_penalty=seq.repetition_penalty, top_k=seq.top_k,
                              min_p=seq.min_p, logit_bias=seq.logit_bias,
                              logprobs=seq.top_logprobs is not None,
                              top_logprobs=seq.top_logprobs)
        except ValueError as exc:
            param = getattr(exc, "param", None) or "sampling"
            msg = str(exc)
            raise SequenceError(param, msg[len(param) + 2:] if msg.startswith(param + ": ")
                                else msg) from None
        if seq.prefix is not None and (np.ndim(seq.prefix) != 2 or
                                       np.shape(seq.prefix)[1] != self.config.hidden_size):
            raise SequenceError("prefix", f"expected a [P, {self.config.hidden_size}] soft "
                                          f"prompt, got shape {np.shape(seq.prefix)}.")
        total = seq.prompt_tokens + int(seq.max_tokens)
        if total > self.config.max_positions:
            raise SequenceError(
                "max_tokens", f"the prompt ({seq.prompt_tokens} tokens) plus max_tokens="
                f"{seq.max_tokens} is {total}, more than the model's context of "
                f"{self.config.max_positions} tokens; shorten the prompt or lower max_tokens.")

    @property
    def free(self) -> int:
        """How many more sequences fit now."""
        return self.max_slots - len(self.live)

    def _device_prefix(self, prefix: Any) -> jax.Array:
        if prefix is None:
            return self._zero_prefix
        hit = self._prefix_cache.get(id(prefix))
        if hit is None or hit[0] is not prefix:
            arr = jnp.asarray(np.asarray(prefix, np.float32), self._zero_prefix.dtype)
            if len(self._prefix_cache) > 64:
                self._prefix_cache.clear()
            hit = (prefix, arr)
            self._prefix_cache[id(prefix)] = hit
        return hit[1]

    def _decoding(self) -> list[Sequence]:
        """The live sequences that hold a decode row (the others are still being prefilled)."""
        return [s for s in self.live if s.slot >= 0]

    def _shape_for(self, need: int, joining: Seq[Sequence] = ()) -> None:
        """Size the cache for the decoding rows plus ``joining`` (rows not assigned yet), each
        sequence ``need`` positions at most; assign the joining ones their rows.

        The cache keeps its rows while the row and length buckets stay: a joining sequence
        takes a free row (its prefill is written into that row only) and a finished one leaves
        a free row. Only a bucket change rewrites the cache: growing, or compacting the live
        rows into the first ones when they fit a smaller row bucket. The row bucket counts
        every live sequence, those still prefilling included.
        """
        dec = self._decoding()
        joining = list(joining)
        # Rows for the prompts still prefilling too (they are live): a burst of prompts,
        # prefilled in several calls, grows the cache once, not once per call.
        rows = row_bucket(max(len(dec) + len(joining), len(self.live), self.min_rows),
                          SLOT_BUCKETS, cap=self.max_slots)
        rows = -(-rows // S.data_size(self.mesh)) * S.data_size(self.mesh)  # data axis divides
        length = bucket(max(need, 1), self.cache_buckets)
        length = min(length, self.config.max_positions)
        if self.cache is None:
            empty = decoder.init_kv_cache(self.config, rows, length, self.kv_dtype,
                                          per_layer=True, transposed_keys=True)
            self.cache = self._place({"k": empty["k"], "v": empty["v"]})
            self._state = {}
        elif (rows, length) != (self._rows, self._len):
            order = [s.slot for s in dec]
            idx = np.zeros((rows,), np.int32)
            idx[:len(order)] = order
            self.cache = _resize(self.cache, jnp.asarray(idx), rows=rows, length=length)
            self.cache = self._place(self.cache)
            self.counters["cache_resizes"] += 1
            st = self._state
            for key, a in st.items():
                new = np.zeros((rows, *a.shape[1:]), a.dtype)
                new[:len(order)] = a[order]
                st[key] = new
            for i, s in enumerate(dec):
                s.slot = i
        self._rows, self._len = rows, length
        used = {s.slot for s in dec}
        free = (r for r in range(rows) if r not in used)
        for s in joining:
            s.slot = next(free)
        if not self._state or self._state["tok"].shape[0] != rows:
            old = self._state
            self._state = {
                "tok": np.zeros(rows, np.int32), "lens": np.zeros(rows, np.int32),
                "active": np.zeros(rows, bool), "remaining": np.zeros(rows, np.int32),
                "t": np.zeros(rows, np.int32), "temperature": np.zeros(rows, np.float32),
                "top_p": np.ones(rows, np.float32), "seeds": np.zeros((rows, 3), np.uint32)}
            for key, a in old.items():
                k = min(a.shape[0], rows)
                self._state[key][:k] = a[:k]

    def _place(self, tree: Any) -> Any:
        """Split row-indexed arrays (the cache, per-row state) along the mesh's ``data`` axis."""
        if self.mesh is None:
            return tree
        return jax.tree.map(lambda a: jax.device_put(a, S.data_sharding(self.mesh, a.ndim)),
                            tree)

    # ---------------------------------------------------------------- sampling controls
    @staticmethod
    def _features(seqs: Seq[Sequence]) -> tuple:
        f = set()
        for s in seqs:
            if s.top_logprobs is not None:
                f.add("logprobs")
            if s.frequency_penalty or s.presence_penalty:
                f.add("penalty")
            if s.repetition_penalty != 1:
                f.add("repetition")
            if s.logit_bias:
                f.add("bias")
            if s.top_k > 0 or s.min_p > 0:
                f.add("filter")
            if s.matcher is not None:
                f.add("mask")
        return tuple(sorted(f))

    def _controls(self, pairs: list, rows: int, features: tuple, failed: list | None = None
                  ) -> dict:
        """The per-row arrays of :func:`decode_chunk`'s ``controls`` for ``(row, seq)`` pairs.
        With a ``failed`` list, a sequence whose grammar engine raises building its mask is
        finished with ``"error"`` and appended there (its row then allows every token);
        without one the exception propagates."""
        v = self.config.vocab_size
        ctl: dict[str, Any] = {}
        if "penalty" in features:
            counts = np.zeros((rows, v), np.int32)
            fp, pp = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
            for r, s in pairs:
                if s.tokens:
                    counts[r] = np.bincount(np.asarray(s.tokens, np.int64), minlength=v)[:v]
                fp[r], pp[r] = s.frequency_penalty, s.presence_penalty
            ctl.update(counts=counts, frequency_penalty=fp, presence_penalty=pp)
        if "repetition" in features:
            seen = np.zeros((rows, v), bool)
            rep = np.ones(rows, np.float32)
            for r, s in pairs:
                seen[r, np.asarray(list(s.prompt), np.int64)] = True
                seen[r, np.asarray(s.tokens, np.int64)] = True
                rep[r] = s.repetition_penalty
            ctl.update(seen=seen, repetition_penalty=rep)
        if "bias" in features:
            width = max(len(s.logit_bias or {}) for _, s in pairs)
            width = 1 << max(3, (width - 1).bit_length())  # a shape bucket: 8, 16, 32, ...
            biases: list = [None] * rows
            for r, s in pairs:
                biases[r] = s.logit_bias
            ids, vals = SM.logit_bias_arrays(biases, width)
            ctl.update(bias_ids=ids, bias_values=vals)
        if "filter" in features:
            top_k, min_p = np.zeros(rows, np.int32), np.zeros(rows, np.float32)
            for r, s in pairs:
                top_k[r], min_p[r] = max(0, s.top_k), s.min_p
            ctl.update(top_k=top_k, min_p=min_p)
        if "mask" in features:
            words = max(s.matcher.words for _, s in pairs if s.matcher is not None)
            bits = np.full((rows, words), -1, np.int32)
            for r, s in pairs:
                if s.matcher is not None:
                    row = np.zeros(s.matcher.words, np.int32)
                    try:
                        s.matcher.fill_bitmask(row)
                    except Exception as exc:
                        if failed is None:
                            raise
                        s.error = (f"the grammar engine failed building a mask: "
                                   f"{type(exc).__name__}: {exc}")
                        self._finish(s, "error")
                        failed.append(s)
                        continue
                    bits[r, :row.shape[0]] = row
                    bits[r, row.shape[0]:] = 0
            ctl["bitmask"] = bits
        return ctl

    def _took(self, s: Sequence, tok: int, lp: Any) -> bool:
        """Record a kept (non-EOS) token's logprobs and advance its grammar; False when the
        grammar refused it (the sequence is then finished with ``"error"``)."""
        if s.top_logprobs is not None and lp is not None:
            k = s.top_logprobs
            s.logprobs.append((int(tok), float(lp[0]), [int(i) for i in lp[1][:k]],
                               [float(x) for x in lp[2][:k]]))
        if s.matcher is not None and not s.matcher.advance(tok):
            s.error = (f"the grammar engine refused token {tok}: "
                       f"{s.matcher.error or 'not allowed by the constraint'}")
            self._finish(s, "error")
            return False
        return True

    # ---------------------------------------------------------------- admission
    def admit(self, seqs: Seq[Sequence], *, prefill: bool = True) -> list[Sequence]:
        """Queue sequences for prefill and (``prefill=True``) prefill them now; returns
        those already finished by their first token (EOS, or ``max_tokens == 1``). Sequences
        with the same prompt, prefix and adjacent in ``seqs`` (the choices of one request) share
        one prefill.

        Prompts are prefilled in chunks of :attr:`prefill_chunk` tokens, up to
        :attr:`prefill_rows` prompts per call; every waiting prompt advances by one chunk here
        and one per :meth:`step` (:meth:`prefill_step`), so a prompt shorter than a chunk is in
        its decode row when this returns. Whole blocks of a prompt
        found in the prefix cache are not computed again. ``prefill=False`` only queues (a
        caller admitting several requests one by one, then stepping, prefills them together).

        Raises :class:`SequenceError` when one fails :meth:`check`, ``ValueError`` when there
        are more than :attr:`free` sequences (the caller's bug); nothing is admitted then.
        """
        seqs = list(seqs)
        if len(seqs) > self.free:
            raise ValueError(f"SlotBatch.admit: {len(seqs)} sequences, {self.free} free slots.")
        for s in seqs:
            self.check(s)
        if not seqs:
            return []
        cached = self.prefix_cache.enabled
        for s in seqs:
            g = self._jobs[-1] if self._jobs else None
            if g and g.seqs[-1] in seqs and g.seqs[0].prompt is s.prompt \
                    and g.seqs[0].prefix is s.prefix:
                g.seqs.append(s)
            else:
                ids = np.asarray(list(s.prompt), np.int32).reshape(-1)
                soft = s.prefix is not None
                keys = block_hashes(ids, self.prefill_chunk) if cached and not soft else []
                self._jobs.append(_Prefill([s], ids, keys, soft=soft))
            s.slot = -1
        self.live.extend(seqs)
        if not prefill:
            return []
        return [s for s in self.prefill_step() if s.finished]

    # ---------------------------------------------------------------- prefill
    def _take_hits(self, job: _Prefill) -> None:
        """Advance ``job`` over the blocks the prefix cache holds (never its last token: its
        logits are computed)."""
        c = self.prefill_chunk
        if not job.keys or job.done % c:
            return
        usable = (job.n - 1) // c  # whole blocks before the one holding the last token
        first = job.done // c
        if first >= usable:
            return
        found = self.prefix_cache.match(job.keys[first:usable])
        job.blocks.extend(found)
        job.done += len(found) * c

    def _zero(self) -> jax.Array:
        if self._zero_block is None:
            c = self.config
            self._zero_block = jnp.zeros((2, c.num_layers, c.num_kv_heads, self.prefill_chunk,
                                          c.head_dim), self.kv_dtype)
        return self._zero_block

    def _past_blocks(self, done: int) -> int:
        """Blocks of past a call whose longest past is ``done`` tokens reads (a bucket)."""
        if done == 0:
            return 0
        return -(-bucket(done, self.cache_buckets) // self.prefill_chunk)

    def _prefill_round(self, skip: dict | None = None) -> list[Sequence]:
        """One prefill call for up to :attr:`prefill_rows` waiting prompts (each advances by a
        chunk), soft-prompt prompts prefilled whole; the prompts that are done join the decode
        rows. Returns the sequences that joined (with their first token). Jobs in ``skip`` (a
        dict ``id -> job``, which keeps them alive so that no new job reuses an id) are not
        chosen; the chosen ones are added to it."""
        if not self._jobs:
            return []
        skip = {} if skip is None else skip
        c = self.prefill_chunk
        for job in self._jobs:
            if not job.soft:
                self._take_hits(job)
        # One row per prompt; a prompt whose next block another chosen prompt computes now
        # waits a round and then finds it in the prefix cache (a shared system prompt is
        # computed once, not once per request of the batch). One call runs the chunks of one
        # width (that of the oldest waiting prompt; the others go in the next rounds), so a
        # prompt's width, like its past, depends on the prompt alone, not on who arrives with
        # it. Measured on SmolLM2's bf16 prefill (Zen 4): blocks at width 48 and 64 differ by
        # up to one bf16 ulp, calls of 1, 4 or 16 rows at one width give identical blocks; on
        # a tiny fp32 model rows, past and width each moved them by ~3e-6.
        chosen, pending, width = [], set(), None
        for job in self._jobs:
            if job.soft or job.done >= job.n or len(chosen) == self.prefill_rows \
                    or id(job) in skip:
                continue
            w = self._width(job)
            if width is None:
                width = w
            elif w != width:
                continue
            b = job.done // c
            key = job.keys[b] if b < len(job.keys) and b < (job.n - 1) // c else None
            if key is not None and key in pending:
                continue
            if key is not None:
                pending.add(key)
            chosen.append(job)
        if chosen:
            self._prefill_call(chosen)
            skip.update((id(job), job) for job in chosen)
        for job in self._jobs:
            if job.soft and job.logits is None:
                s0 = job.seqs[0]
                t = bucket(max(job.n, 1), self.length_buckets)
                ids = np.zeros((t,), np.int32)
                ids[:job.n] = job.ids
                k, v, job.logits = prefill(self.prefill_params, jnp.asarray(ids),
                                           self._device_prefix(s0.prefix),
                                           jnp.int32(s0.prompt_tokens), config=self.config,
                                           kv_dtype=self.kv_dtype)
                job.blocks = [(k, v)]
        ready = [j for j in self._jobs if j.logits is not None]
        self._jobs = [j for j in self._jobs if j.logits is None]
        return self._join(ready)

    def _width(self, job: _Prefill) -> int:
        """The width ``job``'s next chunk runs at: the narrowest that holds it (a short prompt's
        only chunk, a long one's last: fewer positions computed; its block is still
        :attr:`prefill_chunk` wide)."""
        return bucket(min(self.prefill_chunk, job.n - job.done), self._prefill_widths)

    def _prefill_call(self, jobs: list[_Prefill]) -> None:
        c = self.prefill_chunk
        rows = row_bucket(len(jobs), self._prefill_row_buckets, cap=self.prefill_rows)
        width = self._width(jobs[0])  # the same for every job of the call (_prefill_round)
        ids = np.zeros((rows, width), np.int32)
        start = np.zeros(rows, np.int32)
        length = np.ones(rows, np.int32)
        for i, job in enumerate(jobs):
            n = min(c, job.n - job.done)
            ids[i, :n] = job.ids[job.done:job.done + n]
            start[i], length[i] = job.done, n
        nb = self._past_blocks(max(j.done for j in jobs))
        past = []
        for i in range(rows):
            have = jobs[i].blocks if i < len(jobs) else []
            past.extend(have + [self._zero()] * (nb - len(have)))
        blocks, logits = prefill_blocks(self.prefill_params, jnp.asarray(ids),
                                        jnp.asarray(start), jnp.asarray(length), tuple(past),
                                        config=self.config, kv_dtype=self.kv_dtype, block=c)
        self.counters["prefill_calls"] += 1
        self.counters["prefill_rows"] += len(jobs)
        self.counters["prefill_tokens"] += int(length[:len(jobs)].sum())
        self.counters["prefill_positions"] += rows * width
        store = self.prefix_cache
        for i, job in enumerate(jobs):
            b = job.done // c
            job.blocks.append(blocks[i])
            if length[i] == c and b < len(job.keys):
                if b < (job.n - 1) // c:
                    store.count_miss()
                store.put(job.keys[b], blocks[i], parents=job.keys[:b])
            job.done += int(length[i])
            if job.done >= job.n:
                job.logits = logits[i]

    def _join(self, jobs: list[_Prefill]) -> list[Sequence]:
        """Give prefilled prompts' sequences decode rows, write their keys/values there and
        pick their first tokens."""
        joining = [s for j in jobs for s in j.seqs]
        if not joining:
            return []
        st = self._state
        need = max([int(st["lens"][x.slot]) + self.chunk for x in self._decoding()] +
                   [x.prompt_tokens + min(self.chunk, x.max_tokens) for x in joining])
        self._shape_for(need, joining)
        st = self._state
        for job in jobs:
            g = job.seqs
            slots = jnp.asarray(np.array([s.slot for s in g], np.int32))
            if job.soft:
                (k, v), = job.blocks
                self.cache = _insert(self.cache, k, v, slots)
            else:
                nb = max(self._past_blocks(job.n), len(job.blocks))
                blocks = tuple(job.blocks) + (self._zero(),) * (nb - len(job.blocks))
                self.cache = _insert_blocks(self.cache, blocks, slots)
            self.cache = self._place(self.cache)
            seeds = np.array([[*seed_words(s.seed), s.choice % (1 << 32)] for s in g],
                             np.uint32)
            features = self._features(g)
            try:
                ctl = self._controls(list(enumerate(g)), len(g), features) if features else None
            except Exception as exc:  # noqa: BLE001 - its grammar engine failed: it fails alone
                for s in g:
                    s.error = f"its first token's mask failed: {type(exc).__name__}: {exc}"
                    self._finish(s, "error")
                    st["active"][s.slot] = False
                continue
            first, lp = _first_tokens(
                job.logits, jnp.asarray(seeds),
                jnp.asarray([s.temperature for s in g], jnp.float32),
                jnp.asarray([s.top_p for s in g], jnp.float32), ctl, features=features)
            first = np.asarray(first)
            lp = None if lp is None else tuple(np.asarray(a) for a in lp)
            for j, (s, tok, seed) in enumerate(zip(g, first.tolist(), seeds)):
                r = s.slot
                st["tok"][r], st["lens"][r], st["t"][r] = tok, s.prompt_tokens, 1
                st["remaining"][r] = int(s.max_tokens) - 1
                st["temperature"][r], st["top_p"][r], st["seeds"][r] = s.temperature, s.top_p, seed
                s.completion_tokens = 1
                if tok in np.asarray(self.eos).tolist():
                    self._finish(s, "stop")
                else:
                    s.tokens.append(tok)
                    ok = self._took(s, tok, None if lp is None else (
                        lp[0][j], lp[1][j], lp[2][j]))
                    if ok and s.max_tokens <= 1:
                        self._finish(s, "length")
                st["active"][r] = not s.finished
        self.live = [s for s in self.live if not s.finished]
        return joining

    def warmup_prefill(self, prompt_tokens: int) -> None:
        """Compile the prefill programs that prompts of up to ``prompt_tokens`` tokens use: one
        per (prompt rows, past blocks, width) bucket triple.

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg,
            ...           prefill_rows=4).warmup_prefill(100)
        """
        for compile_one in self.prefill_warmups(prompt_tokens):
            compile_one()

    def prefill_warmups(self, prompt_tokens: int) -> list[Callable[[], None]]:
        """What :meth:`warmup_prefill` runs: one call per prefill program, each compiling and
        running it once on zeros; they are independent (a caller may run them on several
        threads: XLA compiles one program per thread).

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg,
            ...               prefill_rows=4)
            >>> len(b.prefill_warmups(20))  # rows 1 and 4, widths 16 and 32, no past
            4
        """
        c = self.prefill_chunk
        pasts = sorted({self._past_blocks(d) for d in range(0, max(int(prompt_tokens), 1), c)})
        top = bucket(min(max(int(prompt_tokens), 1), c), self._prefill_widths)
        zero = self._zero()

        def one(rows: int, nb: int, width: int) -> None:
            out = prefill_blocks(self.prefill_params, jnp.zeros((rows, width), jnp.int32),
                                 jnp.zeros((rows,), jnp.int32), jnp.ones((rows,), jnp.int32),
                                 (zero,) * (rows * nb), config=self.config,
                                 kv_dtype=self.kv_dtype, block=c)
            jax.block_until_ready(out[1])

        # Widths over `top` are run by no prompt of up to prompt_tokens tokens.
        return [partial(one, rows, nb, width) for rows in self._prefill_row_buckets
                for nb in pasts for width in self._prefill_widths if width <= top]

    def stats(self) -> dict[str, Any]:
        """Counters of this batch: ``live``, ``decoding`` and ``prefilling`` sequences,
        ``prefill_calls`` / ``prefill_rows`` / ``prefill_tokens`` (tokens computed, cache hits
        excluded) / ``prefill_positions`` (positions the calls computed, padding rows and
        columns included: ``prefill_tokens / prefill_positions`` is how full they ran),
        ``cache_resizes`` (whole-cache rewrites: bucket changes only),
        ``decode_chunks`` / ``decode_steps`` (jitted decode calls and the steps they ran) and
        ``prefix_cache`` (:meth:`~langtorch.functional.prefix_cache.PrefixCache.stats`).

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch, Sequence
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg,
            ...               prefill_chunk=4)
            >>> _ = b.run([Sequence([1, 2, 3, 4, 5, 6], max_tokens=2)])
            >>> _ = b.run([Sequence([1, 2, 3, 4, 7], max_tokens=2)])  # the first block is reused
            >>> st = b.stats(); st["prefill_tokens"], st["prefix_cache"]["hits"]
            (7, 1)
        """
        dec = len(self._decoding())
        return {"live": len(self.live), "decoding": dec, "prefilling": len(self.live) - dec,
                **self.counters, "prefix_cache": self.prefix_cache.stats()}

    def reset(self, reason: str = "error") -> list[Sequence]:
        """Drop every live sequence (finished with ``reason``) and the device cache; returns the
        dropped sequences. After a failed device call the cache may be gone (it is donated to
        the decode chunk), so the next admission starts from a fresh one.

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch, Sequence
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg)
            >>> s = Sequence([1], max_tokens=50); _ = b.admit([s])
            >>> [x.finish_reason for x in b.reset()], b.live, b.cache
            (['error'], [], None)
        """
        dropped = list(self.live)
        for s in dropped:
            if not s.finished:
                self._finish(s, reason)
        self.live = []
        self._jobs = []
        self.cache = None
        self._rows = self._len = 0
        self._state = {}
        return dropped

    def _finish(self, s: Sequence, reason: str) -> None:
        s.finished, s.finish_reason = True, reason

    def finish(self, seq: Sequence, reason: str = "stop", keep: int | None = None) -> None:
        """End a live sequence now (a stop string, a cancelled request): its slot is freed
        before the next chunk. ``keep`` cuts ``tokens`` to that many (and counts them).

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch, Sequence
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg)
            >>> s = Sequence([1], max_tokens=50); _ = b.admit([s]); b.finish(s, keep=1)
            >>> b.live, s.tokens == s.tokens[:1], s.completion_tokens
            ([], True, 1)
        """
        if keep is not None:
            del seq.tokens[keep:]
            del seq.logprobs[keep:]
            seq.completion_tokens = keep
        if not seq.finished:
            self._finish(seq, reason)
        if seq in self.live:
            if seq.slot >= 0:
                self._state["active"][seq.slot] = False
            else:  # still being prefilled: its prompt is dropped with its last sequence
                for job in self._jobs:
                    job.seqs = [s for s in job.seqs if s is not seq]
                self._jobs = [job for job in self._jobs if job.seqs]
            self.live = [s for s in self.live if s is not seq]

    def run(self, seqs: Seq[Sequence]) -> list[Sequence]:
        """Decode every sequence to its end, synchronously; returns ``seqs`` (finished).

        All are checked first (:class:`SequenceError`, nothing admitted); then each joins as
        soon as a slot frees and leaves when done (continuous batching). This is the batch's
        own loop for a caller that holds every sequence up front (``generate_with_prompt``);
        ``langtorch.models.Engine`` drives the same :meth:`admit` / :meth:`step` from a
        queue on a worker thread, for callers that come and go.

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch, Sequence
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg, max_slots=1)
            >>> [len(s.tokens) for s in b.run([Sequence([1], max_tokens=3), Sequence([2], max_tokens=2)])]
            [3, 2]
        """
        seqs = list(seqs)
        for s in seqs:
            self.check(s)
        waiting = list(seqs)
        while waiting or self.live:
            if waiting and self.free:
                take, waiting = waiting[:self.free], waiting[self.free:]
                self.admit(take)
            self.step()
        return seqs

    # ---------------------------------------------------------------- decoding
    def step(self) -> list[Sequence]:
        """Advance every prompt still waiting by one prefill chunk (see :meth:`admit` and
        :meth:`prefill_step`), then run one decode chunk for the sequences in decode rows; return the sequences that got tokens
        (each ``finished`` or not), joined ones included. Finished sequences leave
        :attr:`live`. The same as :meth:`prefill_step` then :meth:`decode_step`."""
        joined = self.prefill_step()
        touched = self.decode_step()
        seen = {id(s) for s in touched}
        return [s for s in joined if id(s) not in seen] + touched

    def prefill_step(self, on_join: Callable[[list[Sequence]], Any] | None = None
                     ) -> list[Sequence]:
        """The first half of :meth:`step`: every prompt still waiting advances by one chunk
        (:attr:`prefill_chunk` tokens computed; blocks found in the prefix cache are skipped on
        top of that; in calls of up to :attr:`prefill_rows` prompts), so a
        burst of short prompts all join before the next decode chunk, and a long prompt
        stalls the decoding rows for one chunk per step, not for its whole length. Returns
        the sequences that joined their decode rows, each with its first token (``finished``
        when that token ended it). A server streams those first tokens before the decode
        chunk (:meth:`decode_step`) runs, which is what its time to first token waits for.

        ``on_join``, if given, is called with each call's joined sequences as soon as that call
        is done (a burst of prompts takes several calls: the first ones need not wait for the
        last).

        Example:
            >>> import jax
            >>> from langtorch.functional.models import llama
            >>> from langtorch.functional.engine import SlotBatch, Sequence
            >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
            ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
            >>> b = SlotBatch(llama.random_params(jax.random.key(0), cfg), config=cfg)
            >>> _ = b.admit([Sequence([1, 2], max_tokens=3)], prefill=False)
            >>> [len(s.tokens) for s in b.prefill_step()], [len(s.tokens) for s in b.decode_step()]
            ([1], [3])
        """
        joined: list[Sequence] = []
        advanced: dict = {}
        while self._jobs:
            n = len(advanced)
            now = self._prefill_round(advanced)
            joined += now
            if now and on_join is not None:
                on_join(now)
            if len(advanced) == n:  # every waiting prompt advanced by a chunk this step
                break
        return joined

    def decode_step(self) -> list[Sequence]:
        """The second half of :meth:`step`: one decode chunk for the sequences in decode rows;
        returns those that got tokens (each ``finished`` or not). See :meth:`prefill_step`."""
        return self._decode_step()

    def _decode_step(self) -> list[Sequence]:
        dec = self._decoding()
        if not dec:
            return []
        st = self._state
        need = max(int(st["lens"][s.slot]) + min(self.chunk, int(st["remaining"][s.slot]))
                   for s in dec)
        self._shape_for(need)
        st = self._state
        dec = self._decoding()
        active = np.zeros(self._rows, bool)
        for s in dec:
            active[s.slot] = True
        features = self._features(dec)
        # A grammar's mask holds for one token: constrained batches step one token per chunk.
        run = 1 if "mask" in features else self.chunk
        # The program has room for at least MIN_DECODE_STEPS steps and runs `limit` of them:
        # XLA:CPU compiles a loop of one or two steps differently (its rows' logprobs differ
        # in the last bits from a longer loop's), so a short chunk runs the longer program.
        steps = max(run, MIN_DECODE_STEPS)
        # Per compiled program: a first call with new features (or steps) may compile.
        shape = (self._rows, self._len, steps, features)
        per_step = self._step_s.get(shape)
        limit = run
        if per_step and self.chunk_seconds is not None and per_step * run > self.chunk_seconds:
            limit = max(1, int(self.chunk_seconds / per_step))
        ctl, failed = None, []
        if features:
            ctl = self._place({k: jnp.asarray(a) for k, a in self._controls(
                [(s.slot, s) for s in dec], self._rows, features, failed).items()})
        for s in failed:  # its grammar engine raised: it fails alone, the others step
            active[s.slot] = st["active"][s.slot] = False
        dec = [s for s in dec if not s.finished]
        rows_in = self._place(tuple(jnp.asarray(a) for a in (
            st["tok"], st["lens"], active, st["remaining"], st["t"], st["temperature"],
            st["top_p"], st["seeds"])))
        started = time.perf_counter()
        params, bits = self.decode_inputs(self._rows)
        (self.cache, out, tok, lens, act, remaining, t, hit, lps) = decode_chunk(
            params, self.cache, *rows_in, self.eos, ctl,
            config=self.config, steps=steps, features=features,
            limit=jnp.int32(limit), embed_bits=bits)  # (warmup calls it with the same signature)
        out, hit, act = np.asarray(out), np.asarray(hit), np.asarray(act)
        ran = int((out >= 0).sum(axis=1).max()) if out.size else 0
        self.counters["decode_chunks"] += 1
        self.counters["decode_steps"] += ran
        if ran:
            took = (time.perf_counter() - started) / ran
            if shape not in self._step_s:
                self._step_s[shape] = None  # the first chunk at a shape may have compiled
            else:
                prev = self._step_s[shape]
                self._step_s[shape] = took if prev is None else 0.5 * (prev + took)
        lps = None if lps is None else tuple(np.asarray(a) for a in lps)
        st["tok"], st["lens"] = np.array(tok), np.array(lens)
        st["remaining"], st["t"] = np.array(remaining), np.array(t)
        st["active"] = act.copy()
        touched = []
        for s in dec:
            row = out[s.slot]
            new = row[row >= 0].tolist()
            if not new:
                continue
            s.completion_tokens += len(new)
            if hit[s.slot]:
                new = new[:-1]  # the EOS is counted, not returned
            s.tokens.extend(new)
            r = s.slot
            for j, tk in enumerate(new):
                if not self._took(s, tk, None if lps is None else (
                        lps[0][r, j], lps[1][r, j], lps[2][r, j])):
                    break
            if s.finished:  # a grammar failure
                st["active"][r] = False
            elif not act[s.slot]:
                self._finish(s, "stop" if hit[s.slot] else "length")
            touched.append(s)
        self.live = [s for s in self.live if not s.finished]
        return failed + touched
