"""Batched generation for the Llama decoder over the decode engine (:mod:`.engine`).

:func:`generate_ids` feeds every prompt to one :class:`~langtorch.functional.engine.SlotBatch`:
up to ``max_batch`` sequences decode together in jitted chunks, and as soon as one finishes the
next waiting prompt takes its slot (continuous batching), so a short prompt is never held by a
long one. Each row samples with its own temperature, top-p and seed (see
:func:`langtorch.functional.engine.sample`); temperature 0 is greedy.

Compiles: one prefill per prompt-length bucket, one decode chunk per (live-slot bucket,
cache-length bucket) pair; nothing depends on ``max_new_tokens``.

Example:
    >>> import jax
    >>> from langtorch.functional.models import llama
    >>> from langtorch.functional.generate import generate_ids
    >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
    ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
    >>> p = llama.random_params(jax.random.key(0), cfg)
    >>> out = generate_ids(p, [[1, 2, 3], [4]], config=cfg, max_new_tokens=5, eos_ids=())
    >>> [len(t) for t in out.tokens], out.finish_reasons
    ([5, 5], ['length', 'length'])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from langtorch.functional import engine as E
from langtorch.functional.models import llama
from langtorch.functional.shapes import DEFAULT_LENGTH_BUCKETS, bucket

__all__ = [
    "GenerationResult",
    "DEFAULT_LENGTH_BUCKETS",
    "bucket",
    "generate_ids",
    "truncate_at_stop",
]


class GenerationResult(NamedTuple):
    """Output of :func:`generate_ids`, one entry per prompt in input order.

    Attributes:
        tokens: generated ids (EOS excluded).
        finish_reasons: ``"stop"`` (EOS) or ``"length"`` (``max_new_tokens`` reached).
        prompt_tokens: prompt lengths.
        completion_tokens: generated tokens counted for usage (EOS included, as servers do).

    Example:
        >>> from langtorch.functional.generate import GenerationResult
        >>> GenerationResult([[5]], ["stop"], [3], [2]).completion_tokens
        [2]
    """

    tokens: list[list[int]]
    finish_reasons: list[str]
    prompt_tokens: list[int]
    completion_tokens: list[int]


def _per_row(value: Any, n: int, dtype: Any, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim == 0:
        return np.full((n,), arr, dtype=dtype)
    if arr.shape != (n,):
        raise ValueError(f"generate_ids: expected {name} as a scalar or one value per prompt "
                         f"({n}), got shape {arr.shape}.")
    return arr


def generate_ids(
    params: Any,
    prompts: Sequence[Sequence[int]],
    *,
    config: llama.LlamaConfig = llama.SMOLLM2_135M,
    max_new_tokens: int | Sequence[int] = 64,
    temperature: float | Sequence[float] = 0.0,
    top_p: float | Sequence[float] = 1.0,
    seed: int | Sequence[int] = 0,
    eos_ids: Sequence[int] = (2,),
    pad_id: int = 0,
    max_batch: int = 32,
    chunk: int = 16,
    length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    prefix_embeds: Any = None,
    prefill_params: Any = None,
    kv_dtype: Any = None,
    cache_buckets: Sequence[int] = E.CACHE_BUCKETS,
) -> GenerationResult:
    """Generate continuations of token-id prompts with continuous batching.

    Args:
        params: Llama params (device arrays avoid a transfer per call); decode steps run in
            their dtype.
        prompts: one list of ids per prompt (non-empty, ids in ``[0, vocab_size)``).
        config: the model configuration.
        max_new_tokens: limit per prompt (scalar or one per prompt, >= 1).
        temperature: 0 = greedy (scalar or one per prompt, finite, >= 0).
        top_p: nucleus mass in ``(0, 1]`` (scalar or one per prompt).
        seed: sampling seed (scalar or one per prompt; any integer, 64 bits used).
        eos_ids: ids that end a continuation.
        pad_id: unused (kept for callers; prompts are right-padded internally and masked).
        max_batch: most sequences decoded together (engine slots).
        chunk: decode steps per jitted call.
        length_buckets: prompt-length buckets of the prefill.
        prefix_embeds: optional ``[P, H]`` soft prompt put before every prompt;
            ``prompt_tokens`` then counts the ``P`` virtual tokens too.
        prefill_params: params for the prefill (e.g. a bf16 copy); default ``params``.
        kv_dtype: KV cache dtype; default the params' dtype.
        cache_buckets: KV cache lengths (the cache grows and shrinks through them).

    Returns:
        A :class:`GenerationResult`.

    Raises:
        ValueError: naming the bad argument (and the prompt index).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.generate import generate_ids
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> r = generate_ids(p, [[1, 2]], config=cfg, max_new_tokens=3, eos_ids=())
        >>> r.prompt_tokens, r.completion_tokens
        ([2], [3])
    """
    del pad_id
    n = len(prompts)
    max_new = _per_row(max_new_tokens, n, np.int64, "max_new_tokens")
    temps = _per_row(temperature, n, np.float64, "temperature")
    tops = _per_row(top_p, n, np.float64, "top_p")
    seeds = _per_row(seed, n, object, "seed")
    if kv_dtype is None:
        kv_dtype = params["embed"].dtype
    batch = E.SlotBatch(params, config=config, prefill_params=prefill_params,
                        max_slots=max(1, min(int(max_batch), n or 1)), chunk=chunk,
                        kv_dtype=kv_dtype, eos_ids=eos_ids, length_buckets=length_buckets,
                        cache_buckets=cache_buckets)
    prefix = None if prefix_embeds is None else np.asarray(prefix_embeds, np.float32)
    seqs = []
    for i, p in enumerate(prompts):
        s = E.Sequence(list(p), max_tokens=int(max_new[i]), temperature=float(temps[i]),
                       top_p=float(tops[i]), seed=int(seeds[i]), prefix=prefix, tag=i)
        if len(s.prompt) == 0:
            raise ValueError(f"generate_ids: prompt {i} is empty; give at least one token.")
        try:
            batch.check(s)
        except ValueError as exc:
            name = str(exc).split(":", 1)[0]
            name = {"max_tokens": "max_new_tokens", "prompt": "prompts"}.get(name, name)
            raise ValueError(f"generate_ids: {name} (prompt {i}): "
                             f"{str(exc).split(': ', 1)[-1]}") from None
        seqs.append(s)
    waiting = list(seqs)
    while waiting or batch.live:
        if waiting and batch.free:
            take, waiting = waiting[:batch.free], waiting[batch.free:]
            batch.admit(take)
        batch.step()
    return GenerationResult([s.tokens for s in seqs], [s.finish_reason for s in seqs],
                            [s.prompt_tokens for s in seqs],
                            [s.completion_tokens for s in seqs])


def truncate_at_stop(
    tokens: Sequence[int], decode: Callable[[Sequence[int]], str], stop: Sequence[str]
) -> tuple[str, int, bool]:
    """Cut a continuation before the first stop string.

    Returns ``(text, tokens_used, stopped)``: the text before the earliest stop string, the number
    of tokens needed to produce it (the smallest prefix whose text contains the stop string), and
    whether a stop string was found.

    Example:
        >>> from langtorch.functional.generate import truncate_at_stop
        >>> vocab = {1: "Hel", 2: "lo", 3: " wor", 4: "ld"}
        >>> decode = lambda ids: "".join(vocab[i] for i in ids)
        >>> truncate_at_stop([1, 2, 3, 4], decode, [" w"])
        ('Hello', 3, True)
    """
    text = decode(tokens)
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    if cut < 0:
        return text, len(tokens), False
    lo, hi = 1, len(tokens)  # smallest prefix that already contains the stop string
    while lo < hi:
        mid = (lo + hi) // 2
        prefix = decode(tokens[:mid])
        if any(s and s in prefix for s in stop):
            hi = mid
        else:
            lo = mid + 1
    return text[:cut], lo, True
