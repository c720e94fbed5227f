"""A Llama decoder as pure functions over a parameter pytree (SmolLM2-135M-Instruct by default).

RMSNorm, rotary position embeddings (the "rotate half" layout of Hugging Face checkpoints),
grouped-query attention, SwiGLU MLP, tied input/output embeddings. Per-layer weights are stacked
on a leading ``[L, ...]`` axis and the layers run under ``lax.scan`` so that compile time does not
grow with the depth.

Parameter pytree (weights stored ``[in, out]``)::

    {"embed": [V, H], "norm": [H],
     "layers": {"attn_norm": [L, H], "wq": [L, H, Nq*D], "wk": [L, H, Nkv*D],
                "wv": [L, H, Nkv*D], "wo": [L, Nq*D, H], "mlp_norm": [L, H],
                "w_gate": [L, H, F], "w_up": [L, H, F], "w_down": [L, F, H]}}
    (+ "lm_head": [H, V] when the output embedding is not tied)

``layers`` may instead be a tuple of per-layer dicts (:func:`unstack_layers`): the layers then
run as an unrolled loop, which decodes faster on CPU at the price of a longer compile.

KV cache (see :func:`init_kv_cache`)::

    {"k": [L, B, S, Nkv, D], "v": [L, B, S, Nkv, D], "index": int32 scalar}

New tokens are written at cache slots ``index .. index+T-1``; every row of the batch shares the
slot index, so batches are *left*-padded and ``mask`` marks the valid slots of each row.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional.models import llama
    >>> cfg = llama.LlamaConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=4,
    ...                         num_kv_heads=2, head_dim=4, intermediate_size=24)
    >>> p = llama.random_params(jax.random.key(0), cfg)
    >>> ids = jnp.array([[3, 4, 5]]); pos = jnp.arange(3)[None]; mask = jnp.ones_like(ids)
    >>> logits, _ = llama.forward(p, ids, pos, mask, config=cfg)
    >>> logits.shape
    (1, 3, 32)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from langtorch.functional.models.matmul import dense
from langtorch.functional.shapes import positions_from_mask

__all__ = [
    "LlamaConfig",
    "SMOLLM2_135M",
    "attention_bias",
    "block",
    "check_token_ids",
    "embed_tokens",
    "final_norm",
    "forward",
    "hidden_states",
    "rope",
    "lm_head",
    "init_kv_cache",
    "positions_from_mask",
    "random_params",
    "stack_layers",
    "unstack_layers",
]

Params = dict[str, Any]


class LlamaConfig(NamedTuple):
    """Static hyper-parameters of a Llama decoder (hashable: usable as a jit static argument).

    Example:
        >>> from langtorch.functional.models.llama import SMOLLM2_135M
        >>> SMOLLM2_135M.num_heads, SMOLLM2_135M.num_kv_heads, SMOLLM2_135M.rope_theta
        (9, 3, 100000.0)
    """

    vocab_size: int = 49152
    hidden_size: int = 576
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    intermediate_size: int = 1536
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5
    max_positions: int = 8192
    tie_embeddings: bool = True


SMOLLM2_135M = LlamaConfig()
"""The configuration of HuggingFaceTB/SmolLM2-135M-Instruct."""


def _rms_norm(x, weight, eps):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
    return weight * y.astype(x.dtype)


def _rope(positions, head_dim, theta):
    # fp32 angles whatever the model dtype: bf16 positions lose integer precision beyond 256.
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, D]
    return jnp.cos(emb), jnp.sin(emb)


def _apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def init_kv_cache(
    config: LlamaConfig, batch: int, max_len: int, dtype: Any = jnp.float32, *,
    per_layer: bool = False,
) -> dict[str, Any]:
    """An empty KV cache for ``batch`` rows of at most ``max_len`` tokens.

    Args:
        per_layer: one ``[B, S, Nkv, D]`` array per layer (tuples under ``"k"``/``"v"``), the
            layout used with per-layer params (:func:`unstack_layers`); default one stacked array.

    Example:
        >>> from langtorch.functional.models import llama
        >>> c = llama.init_kv_cache(llama.SMOLLM2_135M, 2, 16)
        >>> c["k"].shape, int(c["index"])
        ((30, 2, 16, 3, 64), 0)
    """
    if per_layer:
        shape = (batch, max_len, config.num_kv_heads, config.head_dim)
        zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
        return {"k": zeros, "v": tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                "index": jnp.zeros((), jnp.int32)}
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
            "index": jnp.zeros((), jnp.int32)}


def unstack_layers(params: Params) -> Params:
    """Params with ``layers`` as a tuple of per-layer dicts instead of stacked arrays.

    With this layout :func:`forward` runs the layers as an unrolled Python loop: longer to
    compile (~2x), but a decode step reads each weight in place, whereas ``lax.scan`` over
    stacked weights copies every layer's slice each step (measured ~2x slower single-stream
    decode on CPU, where a step is memory-bound).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> len(llama.unstack_layers(p)["layers"])
        2
    """
    layers = params["layers"]
    if isinstance(layers, (list, tuple)):
        return params
    n = next(iter(layers.values())).shape[0]
    return {**params, "layers": tuple({k: v[i] for k, v in layers.items()} for i in range(n))}


def stack_layers(params: Params) -> Params:
    """Inverse of :func:`unstack_layers` (stacked ``[L, ...]`` arrays, for ``lax.scan``).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> llama.stack_layers(llama.unstack_layers(p))["layers"]["wq"].shape
        (2, 8, 8)
    """
    layers = params["layers"]
    if not isinstance(layers, (list, tuple)):
        return params
    return {**params, "layers": {k: jnp.stack([lay[k] for lay in layers]) for k in layers[0]}}


def hidden_states(
    params: Params,
    ids: jax.Array | None,
    positions: jax.Array,
    mask: jax.Array,
    kv_cache: dict[str, jax.Array] | None = None,
    *,
    inputs_embeds: jax.Array | None = None,
    config: LlamaConfig = SMOLLM2_135M,
) -> tuple[jax.Array, dict[str, jax.Array] | None]:
    """The final-normed hidden states ``[B, T, H]`` and the updated cache.

    Same arguments as :func:`forward`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> h, _ = llama.hidden_states(p, jnp.array([[1, 2]]), jnp.array([[0, 1]]),
        ...                            jnp.ones((1, 2)), config=cfg)
        >>> h.shape
        (1, 2, 8)
    """
    c = config
    if inputs_embeds is None:
        if ids is None:
            raise ValueError("llama.forward: expected `ids` or `inputs_embeds`, got neither.")
        x = embed_tokens(params, ids, config=c)
    else:
        x = inputs_embeds.astype(params["embed"].dtype)
    b, t, _ = x.shape
    cos, sin = _rope(positions, c.head_dim, c.rope_theta)
    if kv_cache is None:
        start = jnp.zeros((), jnp.int32)
        num_keys = t
    else:
        start = kv_cache["index"]
        num_keys = kv_cache["k"][0].shape[1] if isinstance(kv_cache["k"], (list, tuple)) \
            else kv_cache["k"].shape[2]
    # Query t sits at slot start+t and sees slots <= its own that the row's mask marks valid.
    q_slot = start + jnp.arange(t)
    allowed = (jnp.arange(num_keys)[None, :] <= q_slot[:, None])[None] & (mask[:, None, :] > 0)
    bias = attention_bias(allowed)

    def no_cache(k, v):
        return k, v, None

    layers = params["layers"]
    if isinstance(layers, (list, tuple)):
        # Per-layer params: an unrolled loop that reads weights and cache slices in place.
        new_k, new_v = [], []
        for i, p in enumerate(layers):
            def write(k, v, i=i):
                ck, cv = kv_cache["k"][i], kv_cache["v"][i]
                k = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, start, 0, 0))
                v = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, start, 0, 0))
                return k, v, (k, v)

            x, kv = block(p, x, cos, sin, bias, no_cache if kv_cache is None else write,
                          config=c)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        new_cache = None if kv_cache is None else {
            "k": tuple(new_k), "v": tuple(new_v), "index": start + t}
    elif kv_cache is None:
        def step(h, p):
            return block(p, h, cos, sin, bias, no_cache, config=c)[0], None

        x, _ = jax.lax.scan(step, x, layers)
        new_cache = None
    else:
        # The whole cache rides in the carry and is updated in place layer by layer; emitting
        # per-layer caches as scan outputs would copy the full cache on every decode step.
        def step(carry, xs):
            h, ck, cv = carry
            p, i = xs

            def write(k, v):
                ck2 = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype),
                                                   (i, 0, start, 0, 0))
                cv2 = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype),
                                                   (i, 0, start, 0, 0))
                return (jax.lax.dynamic_index_in_dim(ck2, i, keepdims=False),
                        jax.lax.dynamic_index_in_dim(cv2, i, keepdims=False), (ck2, cv2))

            h, (ck, cv) = block(p, h, cos, sin, bias, write, config=c)
            return (h, ck, cv), None

        (x, ck, cv), _ = jax.lax.scan(
            step, (x, kv_cache["k"], kv_cache["v"]), (layers, jnp.arange(c.num_layers))
        )
        new_cache = {"k": ck, "v": cv, "index": start + t}
    return _rms_norm(x, params["norm"], c.rms_norm_eps), new_cache


def embed_tokens(params: Params, ids: Any, *, config: LlamaConfig = SMOLLM2_135M) -> jax.Array:
    """Token embeddings ``[..., H]``; concrete ids outside ``[0, vocab_size)`` raise.

    Inside ``jit`` the ids cannot be checked (a traced value), so callers validate them on the
    host: :mod:`langtorch.functional.engine` does for every request.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=3, hidden_size=2)
        >>> llama.embed_tokens({"embed": jnp.eye(3, 2)}, jnp.array([[2]]), config=cfg).shape
        (1, 1, 2)
        >>> llama.embed_tokens({"embed": jnp.eye(3, 2)}, jnp.array([[3]]), config=cfg)
        Traceback (most recent call last):
        ...
        ValueError: llama: token id 3 is outside the vocabulary [0, 3).
    """
    if not isinstance(ids, jax.core.Tracer):
        check_token_ids(ids, config.vocab_size)
    return jnp.take(params["embed"], ids, axis=0)


def check_token_ids(ids: Any, vocab_size: int) -> None:
    """Raise ``ValueError`` naming the first id outside ``[0, vocab_size)`` (``jnp.take`` would
    silently return NaN rows for it).

    Example:
        >>> from langtorch.functional.models import llama
        >>> llama.check_token_ids([[0, 5]], 8)
    """
    import numpy as np

    a = np.asarray(ids)
    if a.size == 0:
        return
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"llama: expected integer token ids, got dtype {a.dtype}.")
    bad = (a < 0) | (a >= vocab_size)
    if bad.any():
        raise ValueError(f"llama: token id {int(a[bad].reshape(-1)[0])} is outside the "
                         f"vocabulary [0, {vocab_size}).")


def attention_bias(allowed: jax.Array) -> jax.Array:
    """Additive attention bias ``[B, 1, 1, T, S]`` from a boolean ``[B, T, S]`` key mask.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> llama.attention_bias(jnp.ones((2, 3, 4), bool)).shape
        (2, 1, 1, 3, 4)
    """
    return jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)[:, None, None]


def block(
    p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array, bias: jax.Array, kv: Any, *,
    config: LlamaConfig = SMOLLM2_135M,
) -> tuple[jax.Array, Any]:
    """One residual decoder block: ``x + attn(norm(x))``, then ``+ mlp(norm(x))``.

    Args:
        p: one layer's params.
        x: ``[B, T, H]`` hidden states.
        cos, sin: rotary tables for the ``T`` positions (see :func:`rope`).
        bias: additive attention bias ``[B, 1, 1, T, S]`` over the ``S`` keys ``kv`` returns.
        kv: ``kv(k, v) -> (keys [B, S, Nkv, D], values, aux)`` receives this call's rotated
            keys/values ``[B, T, Nkv, D]``, stores them where the caller keeps its cache and
            returns what to attend over; ``aux`` (e.g. the updated cache) is returned.

    Returns:
        ``(x, aux)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.unstack_layers(llama.random_params(jax.random.key(0), cfg))["layers"][0]
        >>> cos, sin = llama.rope(jnp.arange(3)[None], cfg)
        >>> bias = llama.attention_bias(jnp.tril(jnp.ones((3, 3), bool))[None])
        >>> y, _ = llama.block(p, jnp.ones((1, 3, 8)), cos, sin, bias,
        ...                    lambda k, v: (k, v, None), config=cfg)
        >>> y.shape
        (1, 3, 8)
    """
    c = config
    b, t, _ = x.shape
    g = c.num_heads // c.num_kv_heads
    y = _rms_norm(x, p["attn_norm"], c.rms_norm_eps)
    q = _apply_rope(dense(y, p["wq"]).reshape(b, t, c.num_heads, c.head_dim), cos, sin)
    k = _apply_rope(dense(y, p["wk"]).reshape(b, t, c.num_kv_heads, c.head_dim), cos, sin)
    v = dense(y, p["wv"]).reshape(b, t, c.num_kv_heads, c.head_dim)
    keys, values, aux = kv(k, v)
    # Attention runs in the cache's dtype when it is narrower (a bf16 cache is read as is, not
    # converted whole every step), accumulating in fp32.
    adt = keys.dtype if jnp.finfo(keys.dtype).bits < jnp.finfo(q.dtype).bits else q.dtype
    keys, values = keys.astype(adt), values.astype(adt)
    # Grouped-query attention without repeating K/V: queries grouped per KV head.
    scale = 1.0 / jnp.sqrt(jnp.asarray(c.head_dim, jnp.float32))
    qg = q.reshape(b, t, c.num_kv_heads, g, c.head_dim).astype(adt)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, keys,
                   preferred_element_type=jnp.float32) * scale
    probs = jax.nn.softmax(s + bias, axis=-1).astype(adt)
    o = jnp.einsum("bkgts,bskd->btkgd", probs, values, preferred_element_type=jnp.float32)
    o = o.astype(x.dtype).reshape(b, t, c.num_heads * c.head_dim)
    x = x + dense(o, p["wo"])
    y = _rms_norm(x, p["mlp_norm"], c.rms_norm_eps)
    return x + dense(jax.nn.silu(dense(y, p["w_gate"])) * dense(y, p["w_up"]), p["w_down"]), aux


def rope(positions: jax.Array, config: LlamaConfig = SMOLLM2_135M) -> tuple[jax.Array, jax.Array]:
    """Rotary ``(cos, sin)`` tables ``[B, T, 1, D]`` (fp32) for position ids ``[B, T]``.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> llama.rope(jnp.arange(3)[None])[0].shape
        (1, 3, 1, 64)
    """
    return _rope(positions, config.head_dim, config.rope_theta)


def final_norm(params: Params, x: jax.Array, *, config: LlamaConfig = SMOLLM2_135M) -> jax.Array:
    """The final RMS norm applied to the last block's output.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> llama.final_norm({"norm": jnp.ones(2)}, 3 * jnp.ones((1, 2))).round(3).tolist()
        [[1.0, 1.0]]
    """
    return _rms_norm(x, params["norm"], config.rms_norm_eps)


def lm_head(params: Params, hidden: jax.Array) -> jax.Array:
    """Project hidden states to vocabulary logits (fp32), with the tied embedding if no head.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> p = {"embed": jnp.eye(3)}
        >>> llama.lm_head(p, jnp.ones((1, 1, 3))).tolist()
        [[[1.0, 1.0, 1.0]]]
    """
    if "lm_head" in params:
        out = hidden @ params["lm_head"]
    else:
        out = jnp.einsum("bth,vh->btv", hidden, params["embed"])
    return out.astype(jnp.float32)


def forward(
    params: Params,
    ids: jax.Array | None,
    positions: jax.Array,
    mask: jax.Array,
    kv_cache: dict[str, jax.Array] | None = None,
    *,
    inputs_embeds: jax.Array | None = None,
    config: LlamaConfig = SMOLLM2_135M,
) -> tuple[jax.Array, dict[str, jax.Array] | None]:
    """Run the decoder and return ``(logits [B, T, V] fp32, updated kv_cache or None)``.

    Args:
        params: the parameter pytree (see the module docstring).
        ids: int token ids ``[B, T]``; may be None when ``inputs_embeds`` is given.
        positions: ``[B, T]`` rotary positions of the new tokens (see
            :func:`positions_from_mask` for left-padded batches).
        mask: without a cache, ``[B, T]`` (1 = real token); with a cache, ``[B, S]`` over all
            cache slots *after* this call's tokens are written.
        kv_cache: optional cache from :func:`init_kv_cache`; the new keys/values are written
            at its ``index`` and the returned cache's index advances by ``T``.
        inputs_embeds: optional ``[B, T, H]`` embeddings used instead of ``ids`` (soft prompts).
        config: static hyper-parameters.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> cache = llama.init_kv_cache(cfg, 1, 4)
        >>> mask = jnp.array([[1, 1, 0, 0]])
        >>> logits, cache = llama.forward(p, jnp.array([[1, 2]]), jnp.array([[0, 1]]), mask,
        ...                               cache, config=cfg)
        >>> logits.shape, int(cache["index"])
        ((1, 2, 8), 2)
    """
    h, cache = hidden_states(params, ids, positions, mask, kv_cache,
                             inputs_embeds=inputs_embeds, config=config)
    return lm_head(params, h), cache


def random_params(key: jax.Array, config: LlamaConfig = SMOLLM2_135M, dtype=jnp.float32) -> Params:
    """Random parameters with the right structure (for tests and shape checks).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> llama.random_params(jax.random.key(0), cfg)["layers"]["wk"].shape
        (2, 8, 4)
    """
    c = config
    n, h, f = c.num_layers, c.hidden_size, c.intermediate_size
    qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {"wq": (n, h, qd), "wk": (n, h, kd), "wv": (n, h, kd), "wo": (n, qd, h),
              "w_gate": (n, h, f), "w_up": (n, h, f), "w_down": (n, f, h)}
    keys = jax.random.split(key, len(shapes) + 2)
    layers = {k: 0.05 * jax.random.normal(kk, s, dtype) for (k, s), kk in zip(shapes.items(), keys)}
    layers["attn_norm"] = jnp.ones((n, h), dtype)
    layers["mlp_norm"] = jnp.ones((n, h), dtype)
    params = {"embed": 0.05 * jax.random.normal(keys[-2], (c.vocab_size, h), dtype),
              "norm": jnp.ones((h,), dtype), "layers": layers}
    if not c.tie_embeddings:
        params["lm_head"] = 0.05 * jax.random.normal(keys[-1], (h, c.vocab_size), dtype)
    return params
