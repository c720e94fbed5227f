"""A BERT encoder as pure functions over a parameter pytree (all-MiniLM-L6-v2 by default).

The per-layer weights are stacked on a leading ``[L, ...]`` axis and the layers run under
``lax.scan``: compile time stays that of one layer instead of growing with the depth.

Parameter pytree (weights stored ``[in, out]`` so that a layer is ``x @ w + b``)::

    {"embeddings": {"word": [V, H], "position": [P, H], "token_type": [T, H],
                    "ln_scale": [H], "ln_bias": [H]},
     "layers": {"q_w": [L, H, H], "q_b": [L, H], "k_w", "k_b", "v_w", "v_b",
                "o_w": [L, H, H], "o_b": [L, H], "attn_ln_scale": [L, H], "attn_ln_bias",
                "ffn_in_w": [L, H, F], "ffn_in_b": [L, F], "ffn_out_w": [L, F, H],
                "ffn_out_b": [L, H], "ffn_ln_scale": [L, H], "ffn_ln_bias": [L, H]}}

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional.models import bert
    >>> cfg = bert.BertConfig(vocab_size=50, hidden_size=8, num_layers=2, num_heads=2,
    ...                       intermediate_size=16, max_positions=16)
    >>> params = bert.random_params(jax.random.key(0), cfg)
    >>> ids = jnp.array([[1, 5, 7, 2]]); mask = jnp.ones_like(ids)
    >>> bert.encode(params, ids, mask, config=cfg).shape
    (1, 4, 8)
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from langtorch.functional.models.matmul import dense_f32

__all__ = ["BertConfig", "MINILM_L6", "encode", "random_params"]

Params = dict[str, Any]


class BertConfig(NamedTuple):
    """Static hyper-parameters of a BERT encoder (hashable, so usable as a jit static argument).

    Example:
        >>> from langtorch.functional.models.bert import MINILM_L6
        >>> MINILM_L6.hidden_size, MINILM_L6.num_layers
        (384, 6)
    """

    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


MINILM_L6 = BertConfig()
"""The configuration of sentence-transformers/all-MiniLM-L6-v2."""


def _layer_norm(x, scale, bias, eps):
    # Statistics in fp32 whatever the activation dtype: bf16 variance loses too much precision.
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + eps)
    return (y * scale + bias).astype(x.dtype)


def _erf(x):
    # Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, below fp32 resolution of gelu's output):
    # XLA:CPU's erf kernel is ~3.5x slower than this exp-based form and gelu runs on the
    # largest activation of the layer. Still the exact-erf gelu, not the tanh approximation
    # (which is off by ~1e-3).
    a = jnp.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
            + 0.254829592) * t
    return jnp.sign(x) * (1.0 - poly * jnp.exp(-a * a))


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x * 0.7071067811865476))


def _mm(x, w):
    # ``x [..., K] @ w [K, N]`` -> float32. Activations stay float32 between layers whatever the
    # weights' dtype: bf16 weights take a bf16 copy of ``x`` and accumulate in f32 (the fast
    # bf16 dot on CPU). Elementwise work (bias adds, layer norm, GELU, softmax) then runs on f32
    # and XLA:CPU inserts no bf16<->f32 converts between fused ops (it upcasts elementwise bf16
    # ops: measured ~half the bf16 encoder time was converts).
    if w.dtype in (jnp.bfloat16, jnp.float16):
        return dense_f32(x.astype(w.dtype), w)
    return x @ w


def _qkv(config: BertConfig, x, p):
    """Queries (pre-scaled), keys and values ``[B, T, heads, head_dim]`` (float32)."""
    b, t, h = x.shape
    nh = config.num_heads
    hd = h // nh
    q = (_mm(x, p["q_w"]) + p["q_b"]) * (1.0 / float(hd) ** 0.5)
    k = _mm(x, p["k_w"]) + p["k_b"]
    v = _mm(x, p["v_w"]) + p["v_b"]
    return q.reshape(b, t, nh, hd), k.reshape(b, t, nh, hd), v.reshape(b, t, nh, hd)


def _attention(q, k, v, bias_mask, dtype):
    """Softmax attention ``[B, T, H]`` (float32); the two products take operands in ``dtype``."""
    b, t, nh, hd = q.shape
    scores = jnp.einsum("bqhd,bkhd->bhqk", q.astype(dtype), k.astype(dtype),
                        preferred_element_type=jnp.float32) + bias_mask
    # Softmax with the normalisation deferred until after the value product: it divides a
    # [B, T, heads, d] tensor instead of the [B, heads, T, T] one (measured ~3x faster on CPU).
    e = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    ctx = jnp.einsum("bhqk,bkhd->bqhd", e.astype(dtype), v.astype(dtype),
                     preferred_element_type=jnp.float32)
    return (ctx / jnp.sum(e, axis=-1).transpose(0, 2, 1)[..., None]).reshape(b, t, nh * hd)


def _attn_out(config: BertConfig, x, ctx, p):
    """Output projection, residual and layer norm after attention."""
    return _layer_norm(x + _mm(ctx, p["o_w"]) + p["o_b"], p["attn_ln_scale"], p["attn_ln_bias"],
                       config.layer_norm_eps)


def _ffn(config: BertConfig, x, p):
    """The feed-forward block (GELU), residual and layer norm."""
    ff = _gelu(_mm(x, p["ffn_in_w"]) + p["ffn_in_b"])
    return _layer_norm(x + _mm(ff, p["ffn_out_w"]) + p["ffn_out_b"], p["ffn_ln_scale"],
                       p["ffn_ln_bias"], config.layer_norm_eps)


def _layer(config: BertConfig, bias_mask, x, p):
    # x: float32 [B, T, H]. Weight products through `_mm`: bf16 weights multiply a bf16 copy of
    # x with f32 accumulation (XLA:CPU's bf16 x bf16 -> bf16 dot is no faster than fp32; with
    # an f32 result it uses the bf16 dot units).
    q, k, v = _qkv(config, x, p)
    x = _attn_out(config, x, _attention(q, k, v, bias_mask, p["q_w"].dtype), p)
    return _ffn(config, x, p)


def encode(
    params: Params,
    ids: jax.Array | None,
    mask: jax.Array,
    *,
    inputs_embeds: jax.Array | None = None,
    token_type_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    config: BertConfig = MINILM_L6,
    dtype: Any = None,
) -> jax.Array:
    """Run the encoder and return the last hidden states ``[B, T, H]``.

    Args:
        params: the parameter pytree (see the module docstring).
        ids: int token ids ``[B, T]``; may be None when ``inputs_embeds`` is given.
        mask: ``[B, T]`` attention mask, 1 for real tokens and 0 for padding.
        inputs_embeds: optional ``[B, T, H]`` word embeddings used instead of looking up ``ids``
            (soft prompts); position and token-type embeddings are still added.
        token_type_ids: optional ``[B, T]`` BERT token types (default all 0).
        positions: optional ``[B, T]`` position ids (default ``0..T-1``); packed rows restart
            them at each sequence.
        segment_ids: optional ``[B, T]`` ids of the sequence each token belongs to, for rows that
            pack several sequences: a token attends only to tokens with the same id. Without
            it, every token attends to every unmasked token of its row.
        config: static hyper-parameters.
        dtype: the returned hidden states' dtype (default: the parameters' dtype). Inside, the
            activations are float32 whatever the weights' dtype (bf16 weights: the weight
            products run in bf16 with f32 accumulation, everything elementwise in f32), so
            ``dtype=jnp.float32`` returns them without a bf16 rounding.

    Returns:
        The hidden states.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import bert
        >>> cfg = bert.BertConfig(vocab_size=20, hidden_size=4, num_layers=1, num_heads=1,
        ...                       intermediate_size=8, max_positions=8)
        >>> p = bert.random_params(jax.random.key(1), cfg)
        >>> bert.encode(p, jnp.array([[3, 4, 0]]), jnp.array([[1, 1, 0]]), config=cfg).shape
        (1, 3, 4)
    """
    return _encode(params, ids, mask, inputs_embeds=inputs_embeds,
                   token_type_ids=token_type_ids, positions=positions, segment_ids=segment_ids,
                   config=config, dtype=dtype, frozen=False)


def _scan_layers(config: BertConfig, bias_mask, x, layers):
    # x: float32 [B, T, H] through every layer of the [L, ...] weight stacks under lax.scan.
    def step(h, p):
        return _layer(config, bias_mask, h, p), None

    return jax.lax.scan(step, x, layers)[0]


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scan_frozen(config: BertConfig, bias_mask, x, layers):
    # `_scan_layers` for inference. XLA:CPU upcasts a bf16 dynamic-slice to f32, so a scan over
    # bf16 weight stacks converts every stack to f32 on each call and each layer's slice back
    # to bf16: a round trip of all the weights per batch (32 of the 76 converts in MiniLM's
    # optimized HLO). Here low-precision stacks are scanned as their uint16 bit patterns (a
    # bitcast each way, no converts). A bitcast has a zero gradient, so the backward pass
    # differentiates the plain scan instead (reverse mode only).
    low = {k: v.dtype in (jnp.bfloat16, jnp.float16) for k, v in layers.items()}
    xs = {k: jax.lax.bitcast_convert_type(v, jnp.uint16) if low[k] else v
          for k, v in layers.items()}

    def step(h, p):
        p = {k: jax.lax.bitcast_convert_type(v, layers[k].dtype) if low[k] else v
             for k, v in p.items()}
        return _layer(config, bias_mask, h, p), None

    return jax.lax.scan(step, x, xs)[0]


def _scan_frozen_fwd(config, bias_mask, x, layers):
    return _scan_frozen(config, bias_mask, x, layers), (bias_mask, x, layers)


def _scan_frozen_bwd(config, res, g):
    return jax.vjp(partial(_scan_layers, config), *res)[1](g)


_scan_frozen.defvjp(_scan_frozen_fwd, _scan_frozen_bwd)


def _encode(params, ids, mask, *, inputs_embeds=None, token_type_ids=None, positions=None,
            segment_ids=None, config=MINILM_L6, dtype=None, frozen=False):
    # `encode`; frozen=True (inference, e.g. embedding.embed_packed) scans low-precision weight
    # stacks without converts (see _scan_frozen; reverse-mode gradients stay exact).
    emb = params["embeddings"]
    if inputs_embeds is None:
        if ids is None:
            raise ValueError("bert.encode: expected `ids` or `inputs_embeds`, got neither.")
        x = jnp.take(emb["word"], ids, axis=0).astype(jnp.float32)
    else:
        x = inputs_embeds.astype(jnp.float32)
    t = x.shape[1]
    if token_type_ids is None:
        x = x + emb["token_type"][0]
    else:
        x = x + jnp.take(emb["token_type"], token_type_ids, axis=0)
    if positions is None:
        x = x + emb["position"][:t]
    else:
        x = x + jnp.take(emb["position"], positions, axis=0)
    x = _layer_norm(x, emb["ln_scale"], emb["ln_bias"], config.layer_norm_eps)
    # Additive key mask, broadcast over heads (and queries); finite so fully-masked rows stay
    # NaN-free.
    allowed = (mask > 0)[:, None, None, :]
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    bias_mask = jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)

    layers = params["layers"]
    frozen = frozen and any(v.dtype in (jnp.bfloat16, jnp.float16) for v in layers.values())
    x = (_scan_frozen if frozen else _scan_layers)(config, bias_mask, x, layers)
    return x.astype(emb["word"].dtype if dtype is None else dtype)


def random_params(key: jax.Array, config: BertConfig = MINILM_L6, dtype=jnp.float32) -> Params:
    """Random parameters with the right structure (for tests and shape checks).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import bert
        >>> cfg = bert.BertConfig(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2,
        ...                       intermediate_size=16, max_positions=8)
        >>> bert.random_params(jax.random.key(0), cfg)["layers"]["q_w"].shape
        (2, 8, 8)
    """
    c = config
    h, f, n = c.hidden_size, c.intermediate_size, c.num_layers
    shapes = {
        "q_w": (n, h, h), "k_w": (n, h, h), "v_w": (n, h, h), "o_w": (n, h, h),
        "ffn_in_w": (n, h, f), "ffn_out_w": (n, f, h),
    }
    keys = jax.random.split(key, len(shapes) + 3)
    layers = {k: 0.05 * jax.random.normal(kk, s, dtype) for (k, s), kk in zip(shapes.items(), keys)}
    for name, dim in [("q_b", h), ("k_b", h), ("v_b", h), ("o_b", h), ("ffn_in_b", f),
                      ("ffn_out_b", h), ("attn_ln_bias", h), ("ffn_ln_bias", h)]:
        layers[name] = jnp.zeros((n, dim), dtype)
    layers["attn_ln_scale"] = jnp.ones((n, h), dtype)
    layers["ffn_ln_scale"] = jnp.ones((n, h), dtype)
    embeddings = {
        "word": 0.05 * jax.random.normal(keys[-3], (c.vocab_size, h), dtype),
        "position": 0.05 * jax.random.normal(keys[-2], (c.max_positions, h), dtype),
        "token_type": 0.05 * jax.random.normal(keys[-1], (c.type_vocab_size, h), dtype),
        "ln_scale": jnp.ones((h,), dtype),
        "ln_bias": jnp.zeros((h,), dtype),
    }
    return {"embeddings": embeddings, "layers": layers}
