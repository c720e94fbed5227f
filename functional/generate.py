"""Batched autoregressive generation for the Llama decoder: one jitted KV-cache decode loop.

Prompts are sorted by length, grouped into batches, left-padded to a few shape buckets, prefilled
in one call and decoded inside a single ``lax.while_loop`` that stops when every row has met an
EOS token or its ``max_new_tokens``. Each row samples with its own temperature, top-p and seed
(the key of step ``t`` is ``fold_in(key(seed), t)``), so a row's sample does not depend on what
else shares its batch. Temperature 0 is greedy.

Compiles: one per distinct ``(batch bucket, prompt-length bucket, step bucket)``; as every batch
but the last is full, 200 prompts with one ``max_new_tokens`` compile at most
``ceil(200 / max_batch)`` = 7 times.

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
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional.models import llama
from langtorch.functional.shapes import DEFAULT_LENGTH_BUCKETS, bucket

__all__ = [
    "GenerationResult",
    "DEFAULT_LENGTH_BUCKETS",
    "DEFAULT_STEP_BUCKETS",
    "DEFAULT_BATCH_BUCKETS",
    "bucket",
    "decode_loop",
    "sample_logits",
    "generate_ids",
    "truncate_at_stop",
]

DEFAULT_STEP_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


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


def sample_logits(logits: jax.Array, keys: jax.Array, temperature: jax.Array,
                  top_p: jax.Array) -> jax.Array:
    """Pick one token per row: greedy where ``temperature == 0``, else nucleus sampling.

    Args:
        logits: ``[B, V]`` float32.
        keys: ``[B]`` typed PRNG keys (one per row).
        temperature: ``[B]``.
        top_p: ``[B]`` in ``(0, 1]``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.generate import sample_logits
        >>> logits = jnp.array([[0.0, 5.0, 1.0]])
        >>> keys = jax.random.split(jax.random.key(0), 1)
        >>> sample_logits(logits, keys, jnp.zeros(1), jnp.ones(1)).tolist()
        [1]
    """
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def sampled(_):
        scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]

        def nucleus(s):
            # Keep the smallest set of top tokens whose probability mass reaches top_p.
            sorted_logits = jnp.sort(s, axis=-1)[:, ::-1]
            probs = jax.nn.softmax(sorted_logits, axis=-1)
            before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each token
            keep = before < top_p[:, None]
            cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
            return jnp.where(s >= cutoff, s, -jnp.inf)

        scaled = jax.lax.cond(jnp.any(top_p < 1.0), nucleus, lambda s: s, scaled)
        draw = jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, scaled)
        return jnp.where(temperature > 0, draw.astype(jnp.int32), greedy)

    # Sorting the vocabulary every step is costly; skip it when the whole batch is greedy.
    return jax.lax.cond(jnp.any(temperature > 0), sampled, lambda _: greedy, None)


@partial(jax.jit, static_argnames=("config", "max_steps"), donate_argnames=())
def decode_loop(
    params: Any,
    ids: jax.Array,
    mask: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    seeds: jax.Array,
    max_new: jax.Array,
    eos_ids: jax.Array,
    prefix_embeds: jax.Array | None = None,
    *,
    config: llama.LlamaConfig,
    max_steps: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Prefill left-padded prompts and decode up to ``max_steps`` tokens in one jitted loop.

    Args:
        params: Llama params (on device).
        ids: ``[B, T]`` left-padded prompt ids.
        mask: ``[B, T]`` 1 for prompt tokens, 0 for padding.
        temperature, top_p: ``[B]`` float32 sampling settings per row.
        seeds: ``[B]`` uint32 per-row seeds.
        max_new: ``[B]`` int32 per-row token limits (``<= max_steps``).
        eos_ids: ``[E]`` int32 token ids that end a row (may be empty).
        prefix_embeds: optional ``[P, H]`` soft prompt put before every row's prompt tokens
            (it takes positions ``0..P-1``; the row's left padding sits between it and the
            prompt, masked, which attention and positions ignore).
        config: the model configuration.
        max_steps: static upper bound of new tokens (a shape bucket).

    Returns:
        ``(tokens [B, max_steps] int32, lengths [B] int32, hit_eos [B] bool)``; a row's tokens
        past its length are padding. ``lengths`` counts the EOS token when there was one.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> from langtorch.functional.generate import decode_loop
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> toks, n, eos = decode_loop(p, jnp.array([[1, 2]]), jnp.ones((1, 2), jnp.int32),
        ...     jnp.zeros(1), jnp.ones(1), jnp.zeros(1, jnp.uint32), jnp.array([3]),
        ...     jnp.zeros((0,), jnp.int32), config=cfg, max_steps=4)
        >>> toks.shape, n.tolist()
        ((1, 4), [3])
    """
    dtype = params["embed"].dtype
    embeds = None
    if prefix_embeds is not None:
        p = prefix_embeds.shape[0]
        b = ids.shape[0]
        tok = jnp.take(params["embed"], ids, axis=0)
        soft = jnp.broadcast_to(prefix_embeds.astype(dtype), (b, p, tok.shape[-1]))
        embeds = jnp.concatenate([soft, tok], axis=1)
        mask = jnp.concatenate([jnp.ones((b, p), mask.dtype), mask], axis=1)
        ids = None
    b, t = mask.shape
    total = t + max_steps
    per_layer = isinstance(params["layers"], (list, tuple))
    cache = llama.init_kv_cache(config, b, total, dtype, per_layer=per_layer)
    full_mask = jnp.zeros((b, total), jnp.int32).at[:, :t].set(mask.astype(jnp.int32))
    positions = llama.positions_from_mask(mask)
    hidden, cache = llama.hidden_states(params, ids, positions, full_mask, cache,
                                        inputs_embeds=embeds, config=config)
    logits = llama.lm_head(params, hidden[:, -1:])[:, 0]
    base_keys = jax.vmap(jax.random.key)(seeds)
    next_pos = jnp.sum(mask.astype(jnp.int32), axis=1)

    def pick(logits, step):
        keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(base_keys, step)
        return sample_logits(logits, keys, temperature, top_p)

    def is_eos(tok):
        return jnp.any(tok[:, None] == eos_ids[None, :], axis=-1)

    tok0 = pick(logits, 0)
    tokens = jnp.zeros((b, max_steps), jnp.int32).at[:, 0].set(tok0)
    lengths = jnp.ones((b,), jnp.int32)
    hit = is_eos(tok0)
    done = hit | (lengths >= max_new)

    def cond(state):
        step, _, _, _, _, done, _, _ = state
        return (step < max_steps) & ~jnp.all(done)

    def body(state):
        step, tokens, lengths, hit, cache, done, full_mask, last = state
        full_mask = full_mask.at[:, t + step - 1].set(1)
        pos = (next_pos + step - 1)[:, None]
        h, cache = llama.hidden_states(params, last[:, None], pos, full_mask, cache, config=config)
        new = pick(llama.lm_head(params, h)[:, 0], step)
        tokens = tokens.at[:, step].set(jnp.where(done, 0, new))
        lengths = lengths + (~done).astype(jnp.int32)
        new_hit = ~done & is_eos(new)
        hit = hit | new_hit
        done = done | new_hit | (lengths >= max_new)
        return step + 1, tokens, lengths, hit, cache, done, full_mask, new

    state = (jnp.int32(1), tokens, lengths, hit, cache, done, full_mask, tok0)
    _, tokens, lengths, hit, _, _, _, _ = jax.lax.while_loop(cond, body, state)
    return tokens, lengths, hit


def _per_row(value: Any, n: int, dtype: Any) -> np.ndarray:
    arr = np.asarray(value, dtype=dtype)
    if arr.ndim == 0:
        return np.full((n,), arr, dtype=dtype)
    if arr.shape != (n,):
        raise ValueError(f"expected a scalar or one value per prompt ({n}), got shape {arr.shape}.")
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
    length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    step_buckets: Sequence[int] = DEFAULT_STEP_BUCKETS,
    batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
    loop_fn: Callable[..., Any] | None = None,
    prefix_embeds: Any = None,
) -> GenerationResult:
    """Generate continuations of token-id prompts, batched by length into a few shape buckets.

    Args:
        params: Llama params (device arrays avoid a transfer per batch).
        prompts: one list of ids per prompt (non-empty).
        config: the model configuration.
        max_new_tokens: limit per prompt (scalar or one per prompt).
        temperature: 0 = greedy (scalar or one per prompt).
        top_p: nucleus mass (scalar or one per prompt).
        seed: sampling seed (scalar or one per prompt).
        eos_ids: ids that end a continuation.
        pad_id: id used for left padding (masked, its value does not matter).
        max_batch: most prompts decoded together.
        length_buckets, step_buckets, batch_buckets: the padded shapes.
        loop_fn: replaces :func:`decode_loop` (same signature).
        prefix_embeds: optional ``[P, H]`` soft prompt prepended to every prompt (see
            :func:`decode_loop`); ``prompt_tokens`` then counts the ``P`` virtual tokens too.

    Returns:
        A :class:`GenerationResult`.

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
    loop_fn = loop_fn or decode_loop
    n = len(prompts)
    max_new = _per_row(max_new_tokens, n, np.int32)
    temps = _per_row(temperature, n, np.float32)
    tops = _per_row(top_p, n, np.float32)
    seeds = _per_row(seed, n, np.int64).astype(np.uint32)
    if np.any(max_new < 1):
        raise ValueError(f"generate_ids: expected max_new_tokens >= 1, got {max_new.min()}.")
    if np.any((tops <= 0) | (tops > 1)):
        raise ValueError("generate_ids: expected 0 < top_p <= 1.")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"generate_ids: prompt {i} is empty; give at least one token.")
    eos = jnp.asarray(np.asarray(list(eos_ids), np.int32).reshape(-1))
    tokens: list[list[int]] = [[] for _ in range(n)]
    reasons = ["length"] * n
    completion = [0] * n
    order = sorted(range(n), key=lambda i: len(prompts[i]))
    for start in range(0, n, max_batch):
        rows = order[start:start + max_batch]
        b = bucket(len(rows), batch_buckets)
        t = bucket(max(len(prompts[i]) for i in rows), length_buckets)
        steps = bucket(int(max(max_new[rows])), step_buckets)
        p_len = 0 if prefix_embeds is None else int(np.shape(prefix_embeds)[0])
        if p_len + t + steps > config.max_positions:
            raise ValueError(f"generate_ids: prompt ({t} padded) + {steps} new tokens exceeds the "
                             f"model's context of {config.max_positions}; shorten the prompt.")
        ids = np.full((b, t), pad_id, np.int32)
        mask = np.zeros((b, t), np.int32)
        for r, i in enumerate(rows):
            p = prompts[i]
            ids[r, t - len(p):] = p
            mask[r, t - len(p):] = 1
        mask[len(rows):, -1] = 1  # filler rows: one fake token so softmax has a valid key

        def fill(a, fill_value, rows=rows, b=b):
            out = np.full((b,), fill_value, a.dtype)
            out[:len(rows)] = a[rows]
            return out

        extra = () if prefix_embeds is None else (jnp.asarray(prefix_embeds),)
        out_tokens, lengths, hit = loop_fn(
            params, ids, mask, fill(temps, 0.0), fill(tops, 1.0), fill(seeds, 0),
            fill(max_new, 1), eos, *extra, config=config, max_steps=steps)
        out_tokens, lengths, hit = np.asarray(out_tokens), np.asarray(lengths), np.asarray(hit)
        for r, i in enumerate(rows):
            length = int(lengths[r])
            completion[i] = length
            if hit[r]:
                reasons[i] = "stop"
                length -= 1  # the EOS is counted in usage but not returned
            tokens[i] = out_tokens[r, :length].tolist()
    p_len = 0 if prefix_embeds is None else int(np.shape(prefix_embeds)[0])
    return GenerationResult(tokens, reasons, [p_len + len(p) for p in prompts], completion)


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
