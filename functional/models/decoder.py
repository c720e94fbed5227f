"""One decoder-only transformer as pure functions, parameterised by a config that names every
architectural choice of the Llama / Mistral / Qwen2 / Qwen3 / Gemma 2 / Gemma 3 / Phi-3 families.

A family is a :class:`DecoderConfig` (built from its ``config.json`` or GGUF metadata by
:mod:`langtorch.functional.loaders`) plus a weight-name mapping; the maths below is shared:

* RMS norm ``w * x̂`` or Gemma's ``(1 + w) * x̂`` (``norm_offset``), optional q/k RMS norms per head
  (``qk_norm``), optional post-attention / post-feedforward norms (``post_norms``, Gemma);
* q/k/v biases (``qkv_bias``, Qwen2), output bias (``o_bias``);
* rotary embeddings in the "rotate half" layout with ``rope_theta``, ``rope_scaling``
  (``linear`` or ``llama3``) and a separate base for sliding layers (``rope_local_theta``,
  Gemma 3);
* grouped-query attention with ``head_dim`` free of ``hidden_size / num_heads``, a query scale
  (``query_scale``, Gemma's ``query_pre_attn_scalar ** -0.5``), attention logit soft-capping
  (``attn_softcap``), sliding-window layers (``sliding_window`` + the per-layer flags
  ``sliding_layers``);
* a gated MLP ``down(act(gate(x)) * up(x))`` with ``activation`` ``silu`` (SwiGLU) or
  ``gelu_tanh`` (GeGLU); embeddings scaled by ``embed_scale`` (Gemma: ``sqrt(hidden)``); final
  logit soft-capping (``final_softcap``); tied or untied output embeddings.

Fused projections (Phi-3's ``qkv_proj`` / ``gate_up_proj``) are split by the loader, so the
parameter pytree is the same for every family (weights stored ``[in, out]``)::

    {"embed": [V, H], "norm": [H],
     "layers": {"attn_norm": [L, H], "wq": [L, H, Nq*D], "wk": [L, H, Nkv*D],
                "wv": [L, H, Nkv*D], "wo": [L, Nq*D, H], "mlp_norm": [L, H],
                "w_gate": [L, H, F], "w_up": [L, H, F], "w_down": [L, F, H],
                # when the config asks for them:
                "bq": [L, Nq*D], "bk": [L, Nkv*D], "bv": [L, Nkv*D], "bo": [L, H],
                "q_norm": [L, D], "k_norm": [L, D],
                "post_attn_norm": [L, H], "post_mlp_norm": [L, H]}}
    (+ "lm_head": [H, V] when the output embedding is not tied)

Int8-quantized params (:func:`~langtorch.functional.models.quant.quantize_params`, what the
engine runs with ``quantization="int8"``) hold ``QuantizedMatrix`` weights and join ``wq, wk,
wv`` into ``"wqkv"`` and ``w_gate, w_up`` into ``"w_gate_up"`` (``quant.FUSED``); :func:`block`
reads either layout.

Per-layer weights are stacked on a leading ``[L, ...]`` axis and the layers run under
``lax.scan``; a sliding layer and a global one differ only by which rotary table and attention
bias they read, picked by the per-layer flag (an array scanned with the weights), so alternating
layers are not unrolled. ``layers`` may instead be a tuple of per-layer dicts
(:func:`unstack_layers`): the layers then run as an unrolled loop (faster single-stream decode on
CPU, longer compile).

KV cache (see :func:`init_kv_cache`), heads-major so that XLA writes it in place and attention
reads each KV head's keys as one contiguous ``[S, D]`` matrix (no transposed copies)::

    {"k": [L, B, Nkv, S, D], "v": [L, B, Nkv, S, D], "index": int32 scalar}

The engine's decode cache (per layer) stores the keys transposed in blocks of
:data:`KEY_BLOCK` slots, ``[B, Nkv, S / KEY_BLOCK, D, KEY_BLOCK]``
(``init_kv_cache(..., per_layer=True, transposed_keys=True)``; :func:`block`'s
``transposed_keys``; :func:`blocked_keys`). A one-token step's scores are then
``[g, D] x [D, KEY_BLOCK]`` products read contiguously along the slots (transposed keys were
1.2-2x faster than ``[S, D]`` keys at 16 rows before the blocks,
``tests/benchmarks/profile_attention.py``), and attention is computed block by block, the
blocks' sums combined in a fixed order: a row's attention keeps its bits across cache lengths
that are multiples of ``2 * KEY_BLOCK`` (see :func:`block`; a one-block cache rounds within
float tolerance, not bit for bit).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional.models import decoder
    >>> cfg = decoder.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=2, num_heads=4,
    ...                             num_kv_heads=2, head_dim=8, intermediate_size=24,
    ...                             norm_offset=1.0, activation="gelu_tanh", post_norms=True,
    ...                             sliding_window=2, sliding_layers=(True, False))
    >>> p = decoder.random_params(jax.random.key(0), cfg)
    >>> ids = jnp.array([[3, 4, 5]]); pos = jnp.arange(3)[None]; mask = jnp.ones_like(ids)
    >>> logits, _ = decoder.forward(p, ids, pos, mask, config=cfg)
    >>> logits.shape
    (1, 3, 32)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from langtorch.functional.errors import UnsupportedModelError
from langtorch.functional.models.matmul import dense, dense_f32, padded_rows_product
from langtorch.functional.models.quant import QuantizedMatrix, quantized_dot
from langtorch.functional.shapes import positions_from_mask

__all__ = [
    "ACTIVATIONS",
    "ROPE_TYPES",
    "COLUMN_MATRICES",
    "DecoderConfig",
    "arrange_columns",
    "attention_bias",
    "block",
    "block_columns",
    "column_problem",
    "check_config",
    "check_token_ids",
    "embed_tokens",
    "embedding_rows",
    "final_norm",
    "forward",
    "hidden_states",
    "init_kv_cache",
    "layer",
    "layer_biases",
    "lm_head",
    "positions_from_mask",
    "random_params",
    "rope",
    "rope_tables",
    "scale_embeddings",
    "stack_layers",
    "unstack_layers",
]

Params = dict[str, Any]

ACTIVATIONS = ("silu", "gelu_tanh")
"""MLP gate activations: ``silu`` (SwiGLU) and ``gelu_tanh`` (GeGLU, ``gelu_pytorch_tanh``)."""

ROPE_TYPES = ("default", "linear", "llama3")
"""``rope_scaling`` types implemented; any other is refused (:class:`UnsupportedModelError`)."""


class DecoderConfig(NamedTuple):
    """Static hyper-parameters of a decoder (hashable: usable as a jit static argument).

    The defaults are SmolLM2-135M's (a plain Llama); every other field names one architectural
    choice (see the module docstring).

    Attributes:
        rope_scaling: ``None`` or a tuple of ``(key, value)`` pairs with ``rope_type``
            (``"linear"``: ``factor``; ``"llama3"``: ``factor``, ``low_freq_factor``,
            ``high_freq_factor``, ``original_max_position_embeddings``). Applies to the global
            layers' table.
        rope_local_theta: base of the sliding layers' rotary table (Gemma 3); ``None`` = the
            global table.
        sliding_layers: one flag per layer (True = sliding-window attention); empty = none.
        query_scale: multiplies ``q·k``; ``None`` = ``head_dim ** -0.5``.

    Example:
        >>> from langtorch.functional.models.decoder import DecoderConfig
        >>> DecoderConfig().num_heads, DecoderConfig().activation
        (9, 'silu')
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
    architecture: str = "llama"
    norm_offset: float = 0.0
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    activation: str = "silu"
    embed_scale: float | None = None
    query_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int | None = None
    sliding_layers: tuple = ()
    rope_local_theta: float | None = None
    rope_scaling: tuple | None = None


_DEFAULT = DecoderConfig()  # SmolLM2-135M: the default of every function below


def check_config(config: DecoderConfig) -> DecoderConfig:
    """Return ``config`` if every choice in it is implemented, else raise
    :class:`~langtorch.functional.errors.UnsupportedModelError` naming the setting.

    Example:
        >>> from langtorch.functional.models.decoder import DecoderConfig, check_config
        >>> check_config(DecoderConfig(rope_scaling=(("rope_type", "yarn"),)))
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.UnsupportedModelError: rope_scaling type 'yarn' is not implemented (supported: default, linear, llama3); this model's positions would be computed wrongly, so it is refused.
    """
    c = config
    if c.activation not in ACTIVATIONS:
        raise UnsupportedModelError(f"MLP activation {c.activation!r} is not implemented "
                                    f"(supported: {', '.join(ACTIVATIONS)}).")
    if c.rope_scaling is not None:
        kind = dict(c.rope_scaling).get("rope_type", "default")
        if kind not in ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope_scaling type {kind!r} is not implemented (supported: "
                f"{', '.join(ROPE_TYPES)}); this model's positions would be computed wrongly, "
                "so it is refused.")
    if c.sliding_layers and len(c.sliding_layers) != c.num_layers:
        raise UnsupportedModelError(f"expected one sliding flag per layer ({c.num_layers}), got "
                                    f"{len(c.sliding_layers)}.")
    if any(c.sliding_layers) and not c.sliding_window:
        raise UnsupportedModelError("sliding layers need a positive sliding_window.")
    if c.num_heads % c.num_kv_heads:
        raise UnsupportedModelError(f"num_heads ({c.num_heads}) must be a multiple of "
                                    f"num_kv_heads ({c.num_kv_heads}).")
    if c.head_dim % 2:
        raise UnsupportedModelError(f"head_dim must be even for rotary embeddings, got "
                                    f"{c.head_dim}.")
    return c


def _rms_norm(x, weight, eps, offset=0.0, axis=-1):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=axis, keepdims=True) + eps)
    if axis != -1 and axis != x.ndim - 1:  # the weight runs along `axis`
        weight = weight.reshape(weight.shape + (1,) * (x.ndim - 1 - axis % x.ndim))
    if offset:  # Gemma: (1 + w) * x̂, computed in fp32 then cast back
        return (y * (offset + weight.astype(jnp.float32))).astype(x.dtype)
    return weight * y.astype(x.dtype)


def _inv_freq(head_dim, theta, scaling):
    inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if not scaling:
        return inv
    s = dict(scaling)
    kind = s.get("rope_type", "default")
    if kind == "default":
        return inv
    factor = float(s["factor"])
    if kind == "linear":
        return inv / factor
    if kind == "llama3":
        low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old = float(s["original_max_position_embeddings"])
        low_wl, high_wl = old / low, old / high
        wavelen = 2 * math.pi / inv
        scaled = jnp.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return jnp.where(medium, smoothed, scaled)
    raise UnsupportedModelError(f"rope_scaling type {kind!r} is not implemented (supported: "
                                f"{', '.join(ROPE_TYPES)}).")


def _rope(positions, head_dim, theta, scaling=None):
    # fp32 angles whatever the model dtype: bf16 positions lose integer precision beyond 256.
    freqs = positions.astype(jnp.float32)[..., None] * _inv_freq(head_dim, theta, scaling)
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, D]
    return jnp.cos(emb), jnp.sin(emb)


def _apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


def rope(positions: jax.Array, config: DecoderConfig = _DEFAULT) -> tuple[jax.Array,
                                                                                 jax.Array]:
    """The global layers' rotary ``(cos, sin)`` tables ``[B, T, 1, D]`` (fp32).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> decoder.rope(jnp.arange(3)[None])[0].shape
        (1, 3, 1, 64)
    """
    return _rope(positions, config.head_dim, config.rope_theta, config.rope_scaling)


def rope_tables(positions: jax.Array, config: DecoderConfig) -> tuple[tuple, tuple]:
    """``((cos, sin) of the global layers, (cos, sin) of the sliding layers)``.

    The sliding layers use ``rope_local_theta`` when the config has one (Gemma 3), else the
    same table as the global layers.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> g, l = decoder.rope_tables(jnp.arange(2)[None], decoder.DecoderConfig())
        >>> g[0] is l[0]
        True
    """
    g = rope(positions, config)
    if config.rope_local_theta is None:
        return g, g
    return g, _rope(positions, config.head_dim, config.rope_local_theta)


def attention_bias(allowed: jax.Array) -> jax.Array:
    """Additive attention bias ``[B, 1, 1, T, S]`` from a boolean ``[B, T, S]`` key mask.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> decoder.attention_bias(jnp.ones((2, 3, 4), bool)).shape
        (2, 1, 1, 3, 4)
    """
    return jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)[:, None, None]


def layer_biases(allowed: jax.Array, distance: jax.Array | None,
                 config: DecoderConfig) -> tuple[jax.Array, jax.Array]:
    """``(bias of the global layers, bias of the sliding layers)`` from the ``[B, T, S]`` key
    mask and the ``[B|1, T, S]`` distance ``query position - key position`` (a sliding layer
    sees only keys at distance ``< sliding_window``, as in transformers).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(num_layers=1, sliding_window=2, sliding_layers=(True,))
        >>> allowed = jnp.tril(jnp.ones((3, 3), bool))[None]
        >>> d = (jnp.arange(3)[:, None] - jnp.arange(3)[None])[None]
        >>> g, s = decoder.layer_biases(allowed, d, cfg)
        >>> (s[0, 0, 0] == 0).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    g = attention_bias(allowed)
    if not config.sliding_window or not any(config.sliding_layers):
        return g, g
    if distance is None:
        raise ValueError("layer_biases: a config with sliding layers needs the key distances.")
    return g, attention_bias(allowed & (distance < config.sliding_window))


KEY_BLOCK = 128
"""Cache slots per block of the decode cache's keys (:func:`blocked_keys`). Attention over the
decode cache computes each block's products alone and sums the blocks in a fixed order, so a
row's result does not depend on how many blocks (two or more) the cache has: on XLA:CPU a
``[g, D] x [D, S]`` score product rounds differently as ``S`` grows (SmolLM2's shapes: alike at
128-512 slots, different from 1,024 on, on an AMX Xeon), while one of ``[g, D] x [D, 128]`` per
block does not. A cache shorter than a block, or not a multiple of it, is one block (within
float tolerance of the others, not bit for bit)."""


def key_block(slots: int) -> int:
    """Slots per key block of a decode cache of ``slots`` slots: :data:`KEY_BLOCK` when it
    divides ``slots``, else ``slots`` (one block).

    Example:
        >>> from langtorch.functional.models import decoder
        >>> decoder.key_block(1024), decoder.key_block(64), decoder.key_block(200)
        (128, 64, 200)
    """
    return KEY_BLOCK if slots % KEY_BLOCK == 0 else slots


def blocked_keys(k: jax.Array, slots: int | None = None) -> jax.Array:
    """Keys ``[..., S, D]`` in the decode cache's layout ``[..., S / b, D, b]`` (``b`` =
    :func:`key_block` of ``slots``, default ``S``; ``S`` a multiple of ``b``).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> k = jnp.arange(2 * 256 * 4.0).reshape(2, 256, 4)
        >>> kb = decoder.blocked_keys(k)
        >>> kb.shape, bool(kb[1, 1, 3, 5] == k[1, 128 + 5, 3])
        ((2, 2, 4, 128), True)
    """
    s, d = k.shape[-2:]
    b = key_block(s if slots is None else slots)
    if s % b:
        raise ValueError(f"blocked_keys: {s} keys are not a whole number of {b}-slot blocks.")
    k = k.reshape(k.shape[:-2] + (s // b, b, d))
    return jnp.swapaxes(k, -1, -2)


def _halving_sum(x, axis):
    # Sum over `axis` by halving: pad with zeros to a power of two n, add the second half onto
    # the first, repeat. Zeros appended at the end (a longer cache's empty blocks) leave every
    # partial sum's bits as they were, so the result does not depend on the padded length.
    n = x.shape[axis]
    p = 1 << max(n - 1, 0).bit_length()
    if p != n:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, p - n)
        x = jnp.pad(x, pad)
    while p > 1:
        p //= 2
        x = jax.lax.slice_in_dim(x, 0, p, axis=axis) + jax.lax.slice_in_dim(x, p, 2 * p, axis=axis)
    return jnp.squeeze(x, axis)


def _exp_nonpositive(x):
    # exp(x) for float32 x <= 0 from IEEE multiplies, adds and an exponent bitcast only
    # (Cephes expf's two-part ln 2 reduction and degree-7 polynomial; < 1 ulp from x = -87 to
    # 0, measured on 1e6 points; 0 from -87 down). XLA:CPU's own exp rounds some elements
    # differently with the size of the fusion it sits in (scalar or vector code): a row's
    # attention weights then moved by an ulp when the cache grew, at 1-2 decode rows. NaN
    # stays NaN (a row with non-finite scores); x > 0 is not its domain (inf from ~88.7).
    x = jnp.maximum(x, jnp.float32(-87.0))
    n = jnp.floor(x * jnp.float32(1.44269504088896341) + jnp.float32(0.5))
    r = x - n * jnp.float32(0.693359375)
    r = r - n * jnp.float32(-2.12194440e-4)
    p = jnp.float32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
              5.0000001201e-1):
        p = p * r + jnp.float32(c)
    y = p * (r * r) + r + jnp.float32(1.0)
    two_n = jax.lax.bitcast_convert_type((n.astype(jnp.int32) + 127) << 23, jnp.float32)
    return jnp.where(x > jnp.float32(-87.0), y * two_n, jnp.where(jnp.isnan(x), x, 0.0))


def _bias(out, b):
    return out if b is None else out + b.astype(out.dtype)


def _proj(y, w, b):
    return _bias(dense(y, w), b)


def _proj_f32(y, w, b):
    return _bias(dense_f32(y, w), b)


def _attend(p, q, k, v, cos, sin, bias, kv, c, transposed_keys, dtype):
    # Attention of :func:`block` from the projections q [B, T, Nq*D], k, v [B, T, Nkv*D]
    # (q, k still float32): q/k norms, rotation, the cache (``kv``), grouped scores, softmax
    # and values. Returns (o [B, T, Nq, D] in ``dtype``, aux).
    b, t = q.shape[:2]
    g = c.num_heads // c.num_kv_heads
    eps, off = c.rms_norm_eps, c.norm_offset
    q = q.reshape(b, t, c.num_heads, c.head_dim)
    k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
    v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
    if c.qk_norm:
        q = _rms_norm(q, p["q_norm"], eps, off)
        k = _rms_norm(k, p["k_norm"], eps, off)
    q = _apply_rope(q, cos, sin).astype(dtype)
    k = _apply_rope(k, cos, sin).astype(dtype)
    # Heads-major ("[B, Nkv, T, D]", the cache layout): a cache row per KV head is one
    # contiguous [S, D] matrix, so the products below read it in place (no transposed copy of
    # the cache) and a decode step's write is one in-place dynamic-update-slice.
    keys, values, aux = kv(k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))
    # Attention runs in the cache's dtype (a bf16 cache is read as is; an fp32 cache is not
    # rounded to bf16 queries' dtype: the small operand is converted, never the cache),
    # accumulating in fp32.
    adt = keys.dtype
    # Grouped-query attention without repeating K/V: the g query heads of a KV head and the T
    # positions form the rows of one [g*T, D] x [D, S] product per (row, KV head) (per key
    # block with blocked keys: transposed_keys, or keys [B, Nkv, nb, kb, D] from kv).
    nkv, d = c.num_kv_heads, c.head_dim
    scale = c.query_scale if c.query_scale is not None else d ** -0.5
    qg = q.reshape(b, t, nkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, nkv, g * t, d)
    if transposed_keys or keys.ndim == 5:
        o = _attend_blocks(qg.astype(adt), keys, values, bias, c, scale, t, transposed_keys)
        return o.astype(dtype), aux
    s = jnp.einsum("bkqd,bksd->bkqs", qg.astype(adt), keys,
                   preferred_element_type=jnp.float32) * jnp.float32(scale)
    s = s.reshape(b, nkv, g, t, -1)
    if c.attn_softcap:
        s = jnp.tanh(s / c.attn_softcap) * c.attn_softcap
    probs = jax.nn.softmax(s + bias, axis=-1).astype(adt).reshape(b, nkv, g * t, -1)
    o = jnp.einsum("bkqs,bksd->bkqd", probs, values, preferred_element_type=jnp.float32)
    o = o.reshape(b, nkv, g, t, d).transpose(0, 3, 1, 2, 4)
    return o.astype(dtype), aux


def _attend_blocks(qg, keys, values, bias, c, scale, t, transposed):
    # _attend over keys in blocks: queries qg [B, Nkv, g*T, D] (the cache's dtype), keys
    # [B, Nkv, nb, D, kb] (transposed: the decode cache, blocked_keys) or [B, Nkv, nb, kb, D]
    # (chunked prefill's), values [B, Nkv, nb*kb, D], bias [B, 1, 1, T, nb*kb].
    # Each block's scores ([g*T, D] x [D, kb], the blocks a batch axis of the product: XLA
    # computed them alike at every nb >= 2 measured), the max over all blocks (exact), exp,
    # then each block's exp sums and value products, summed over the blocks by halving (the
    # exp from plain arithmetic, _exp_nonpositive, whose bits do not depend on the array's
    # size). A longer cache adds blocks of exact zeros (masked slots: exp gives 0), so neither
    # sum moves with the cache's length. Normalised after the value product (flash
    # attention's order).
    # Returns o [B, T, Nq, D] in float32.
    if transposed:
        b, nkv, nb, d, kb = keys.shape
    else:
        b, nkv, nb, kb, d = keys.shape
    g = c.num_heads // c.num_kv_heads
    qn = jnp.broadcast_to(qg[:, :, None], (b, nkv, nb, g * t, d))
    s = jnp.einsum("bknqd,bkndc->bknqc" if transposed else "bknqd,bkncd->bknqc", qn, keys,
                   preferred_element_type=jnp.float32) * jnp.float32(scale)
    s = s.reshape(b, nkv, nb, g, t, kb)
    if c.attn_softcap:
        s = jnp.tanh(s / c.attn_softcap) * c.attn_softcap
    # bias [B|1, 1, 1, T|1, nb*kb] -> [B|1, 1, nb, 1, T|1, kb]
    bb = bias.reshape(bias.shape[0], bias.shape[3], nb, kb).transpose(0, 2, 1, 3)
    s = s + bb[:, None, :, None]
    e = _exp_nonpositive(s - s.max(axis=(2, 5), keepdims=True)).reshape(b, nkv, nb, g * t, kb)
    den = jnp.einsum("bknqc,c->bknq", e, jnp.ones((kb,), jnp.float32))
    vb = values.reshape(b, nkv, nb, kb, d)
    o = jnp.einsum("bknqc,bkncd->bknqd", e.astype(values.dtype), vb,
                   preferred_element_type=jnp.float32)
    o = _halving_sum(o, 2) / _halving_sum(den, 2)[..., None]
    return o.reshape(b, nkv, g, t, d).transpose(0, 3, 1, 2, 4)


def block(
    p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array, bias: jax.Array, kv: Any, *,
    config: DecoderConfig = _DEFAULT, transposed_keys: bool = False,
) -> tuple[jax.Array, Any]:
    """One residual decoder block: ``x + attn(norm(x))``, then ``+ mlp(norm(x))`` (with the
    config's biases, q/k norms, soft-capping and post norms).

    Args:
        p: one layer's params.
        x: ``[B, T, H]`` hidden states.
        cos, sin: rotary tables for the ``T`` positions (see :func:`rope_tables`).
        bias: additive attention bias ``[B, 1, 1, T, S]`` over the ``S`` keys ``kv`` returns.
        kv: ``kv(k, v) -> (keys [B, Nkv, S, D], values, aux)`` receives this call's rotated
            keys/values heads-major, ``[B, Nkv, T, D]`` (the cache layout), stores them where
            the caller keeps its cache and returns what to attend over; ``aux`` (e.g. the
            updated cache) is returned. Keys returned in blocks, ``[B, Nkv, S / b, b, D]``,
            are attended block by block as the decode cache's are (see ``transposed_keys``;
            chunked prefill's layout).
        transposed_keys: ``kv`` returns the keys as ``[B, Nkv, S / b, D, b]`` (the decode
            cache's layout, :func:`blocked_keys`, ``b`` = :func:`key_block` of ``S``): the
            scores are then ``[g*T, D] x [D, b]`` products per block that read the keys
            contiguously, and a row's attention keeps its bits across every ``S`` of two
            blocks or more (the blocks past its keys add exact zeros to sums taken in a
            fixed order; one block rounds within float tolerance, not bit for bit).

    Returns:
        ``(x, aux)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = decoder.unstack_layers(decoder.random_params(jax.random.key(0), cfg))["layers"][0]
        >>> cos, sin = decoder.rope(jnp.arange(3)[None], cfg)
        >>> bias = decoder.attention_bias(jnp.tril(jnp.ones((3, 3), bool))[None])
        >>> y, _ = decoder.block(p, jnp.ones((1, 3, 8)), cos, sin, bias,
        ...                      lambda k, v: (k, v, None), config=cfg)
        >>> y.shape
        (1, 3, 8)
    """
    c = config
    b, t, _ = x.shape
    eps, off = c.rms_norm_eps, c.norm_offset
    y = _rms_norm(x, p["attn_norm"], eps, off)
    # q and k stay in their float32 accumulators through the q/k norms and the rotation and are
    # rounded once: in bf16, rounding after every op made the rotation's backward a chain of
    # bf16 round trips (profile_prompt_tuning.py). A no-op for float32 weights.
    if "wqkv" in p:  # joined (quantized params, quant.FUSED): one product, the same columns
        qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        qkv = dense_f32(y, p["wqkv"])
        q, k = _bias(qkv[..., :qd], p.get("bq")), _bias(qkv[..., qd:qd + kd], p.get("bk"))
        v = _bias(qkv[..., qd + kd:].astype(y.dtype), p.get("bv"))
    else:
        q = _proj_f32(y, p["wq"], p.get("bq"))
        k = _proj_f32(y, p["wk"], p.get("bk"))
        v = _proj(y, p["wv"], p.get("bv"))
    o, aux = _attend(p, q, k, v, cos, sin, bias, kv, c, transposed_keys, x.dtype)
    o = _proj(o.reshape(b, t, -1), p["wo"], p.get("bo"))
    if c.post_norms:
        o = _rms_norm(o, p["post_attn_norm"], eps, off)
    x = x + o
    y = _rms_norm(x, p["mlp_norm"], eps, off)
    # The gate product stays in its float32 accumulator through the activation and the up
    # product: one elementwise pass, rounded once to bf16 before w_down. Rounding each bf16 op
    # (XLA:CPU computes them in f32 and converts back) took five passes over [rows, F] forward
    # and as many backward (profile_prompt_tuning.py). A no-op for float32 weights.
    if "w_gate_up" in p:  # joined (quant.FUSED)
        gu = dense_f32(y, p["w_gate_up"])
        gate, up = gu[..., :c.intermediate_size], gu[..., c.intermediate_size:]
    else:
        gate, up = dense_f32(y, p["w_gate"]), dense_f32(y, p["w_up"])
    act = jax.nn.silu(gate) if c.activation == "silu" else jax.nn.gelu(gate, approximate=True)
    m = dense((act * up).astype(y.dtype), p["w_down"])
    if c.post_norms:
        m = _rms_norm(m, p["post_mlp_norm"], eps, off)
    return x + m, aux


def layer(p: Params, x: jax.Array, tables: tuple, biases: tuple, kv: Any, *,
          config: DecoderConfig, sliding: Any = False, transposed_keys: bool = False,
          columns: bool = False) -> tuple[jax.Array, Any]:
    """:func:`block` with the rotary table and bias of a global or sliding layer.

    Args:
        tables: ``(global, local)`` from :func:`rope_tables`.
        biases: ``(global, local)`` from :func:`layer_biases`.
        sliding: a Python bool (unrolled layers) or a traced bool scalar (``lax.scan``).
        transposed_keys: see :func:`block`.
        columns: run :func:`block_columns` (``x [H, R]``, params of :func:`arrange_columns`;
            needs ``transposed_keys=True``, the keys as the decode cache stores them).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = decoder.unstack_layers(decoder.random_params(jax.random.key(0), cfg))["layers"][0]
        >>> tabs = decoder.rope_tables(jnp.arange(2)[None], cfg)
        >>> bs = decoder.layer_biases(jnp.tril(jnp.ones((2, 2), bool))[None], None, cfg)
        >>> decoder.layer(p, jnp.ones((1, 2, 8)), tabs, bs, lambda k, v: (k, v, None),
        ...               config=cfg)[0].shape
        (1, 2, 8)
    """
    if columns and not transposed_keys:
        raise ValueError("layer: columns=True reads the keys as the decode cache stores them, "
                         "in blocks (decoder.blocked_keys); pass transposed_keys=True.")
    (gc, gs), (lc, ls) = tables
    gb, lb = biases
    if isinstance(sliding, (bool, int)):
        cos, sin, bias = (lc, ls, lb) if sliding else (gc, gs, gb)
    else:
        cos = gc if gc is lc else jnp.where(sliding, lc, gc)
        sin = gs if gs is ls else jnp.where(sliding, ls, gs)
        bias = gb if gb is lb else jnp.where(sliding, lb, gb)
    if columns:
        return block_columns(p, x, cos, sin, bias, kv, config=config)
    return block(p, x, cos, sin, bias, kv, config=config, transposed_keys=transposed_keys)


COLUMN_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
"""The layer matrices :func:`arrange_columns` stores transposed (as ``"<name>_t"``, ``[N, K]``)."""


def arrange_columns(params: Params) -> Params:
    """Params for :func:`block_columns`: every layer matrix stored transposed, ``[out, in]``,
    under ``"<name>_t"`` (``"wq_t"``, ...); norms, biases, the embedding and the output head
    are shared with ``params``. A copy of the layer matrices (their bytes again); ``layers``
    becomes a tuple of per-layer dicts.

    Raises ``ValueError`` for quantized params (their int8 products keep the ``[in, out]``
    layout).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=6)
        >>> cols = decoder.arrange_columns(decoder.random_params(jax.random.key(0), cfg))
        >>> cols["layers"][0]["w_gate_t"].shape, "w_gate" in cols["layers"][0]
        ((6, 8), False)
    """
    layers = unstack_layers(params)["layers"]
    problem = column_problem(params)
    if problem is not None:
        raise ValueError(f"arrange_columns: {problem}; column-major decoding is for float "
                         f"weights.")
    moved = _transposed([{k: lay[k] for k in COLUMN_MATRICES} for lay in layers])
    return {**params, "layers": tuple(
        {**{k: v for k, v in lay.items() if k not in COLUMN_MATRICES},
         **{k + "_t": v for k, v in mats.items()}} for lay, mats in zip(layers, moved))}


def column_problem(params: Params) -> str | None:
    """Why :func:`arrange_columns` cannot arrange ``params`` (a layer matrix that is quantized,
    joined, missing or not a float matrix), or ``None`` when it can.

    Example:
        >>> import jax
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=6)
        >>> p = decoder.unstack_layers(decoder.random_params(jax.random.key(0), cfg))
        >>> decoder.column_problem(p) is None
        True
        >>> lay = {k: v for k, v in p["layers"][0].items() if k != "w_up"}
        >>> decoder.column_problem({**p, "layers": (lay,)})
        'layers[0].w_up is missing, not a float matrix'
    """
    for i, lay in enumerate(unstack_layers(params)["layers"]):
        if any(k in lay for k in ("wqkv", "w_gate_up")):
            return f"layers[{i}] holds joined (quantized) projections"
        for k in COLUMN_MATRICES:
            w = lay.get(k)
            if isinstance(w, QuantizedMatrix) or getattr(w, "ndim", None) != 2 or \
                    not jnp.issubdtype(w.dtype, jnp.floating):
                kind = "missing" if w is None else "quantized" if isinstance(
                    w, QuantizedMatrix) else f"{getattr(w, 'dtype', type(w).__name__)} " \
                    f"{tuple(getattr(w, 'shape', ()))}"
                return f"layers[{i}].{k} is {kind}, not a float matrix"
    return None


@jax.jit
def _transposed(mats):
    # One program for every matrix (an eager transpose per matrix is a dispatch each).
    return jax.tree.map(lambda w: w.T, mats)


def _cols_f32(w_t, y):
    # [N, K] x [K, R] -> [N, R], float32 (16-bit operands accumulate in float32).
    return jnp.matmul(w_t, y, preferred_element_type=jnp.float32)


def _cols(w_t, y):
    return _cols_f32(w_t, y).astype(y.dtype)


def _col_bias(out, b):
    return out if b is None else out + b.astype(out.dtype)[:, None]


def block_columns(
    p: Params, x: jax.Array, cos: jax.Array, sin: jax.Array, bias: jax.Array, kv: Any, *,
    config: DecoderConfig = _DEFAULT,
) -> tuple[jax.Array, Any]:
    """:func:`block` for one token per row with the hidden states as columns: ``x [H, R]``
    (row ``r``'s state is column ``r``) and the weights of :func:`arrange_columns`.

    Every layer product is ``W [N, K] x y [K, R]``: the weight is the product's left operand,
    read row after row as stored, and the few columns of ``y`` are what the product packs.
    With the rows as the left operand (``y [R, K] x W [K, N]``, :func:`block`) XLA:CPU's
    YNNPACK products repack the weight on every call, which at 4-48 rows costs about as much
    as the product itself (``tests/benchmarks/profile_engine.py``). The same maths as
    :func:`block` (its norms, biases, q/k norms, soft-capping, post norms, grouped-query
    attention); the keys are read as the decode cache stores them (:func:`blocked_keys`,
    :func:`block`'s ``transposed_keys``).

    Args:
        p: one layer's params from :func:`arrange_columns`.
        x: ``[H, R]`` hidden states, one column per row.
        cos, sin: rotary tables ``[R, 1, 1, D]`` (:func:`rope_tables` of ``[R, 1]``
            positions).
        bias: additive attention bias ``[R, 1, 1, 1, S]``.
        kv: as :func:`block`'s: receives keys/values ``[R, Nkv, 1, D]`` and returns keys
            ``[R, Nkv, S / b, D, b]`` (:func:`blocked_keys`), values ``[R, Nkv, S, D]`` and
            ``aux``.

    Returns:
        ``(x [H, R], aux)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> params = decoder.random_params(jax.random.key(0), cfg)
        >>> p = decoder.unstack_layers(params)["layers"][0]
        >>> pc = decoder.arrange_columns(params)["layers"][0]
        >>> cos, sin = decoder.rope(jnp.zeros((3, 1), jnp.int32), cfg)
        >>> bias = decoder.attention_bias(jnp.ones((3, 1, 1), bool))
        >>> kvr = lambda k, v: (k, v, None)
        >>> kvc = lambda k, v: (decoder.blocked_keys(k), v, None)
        >>> x = jax.random.normal(jax.random.key(1), (3, 1, 8))
        >>> rows, _ = decoder.block(p, x, cos, sin, bias, kvr, config=cfg)
        >>> cols, _ = decoder.block_columns(pc, x[:, 0].T, cos, sin, bias, kvc, config=cfg)
        >>> bool(jnp.allclose(rows[:, 0], cols.T, atol=1e-5))
        True
    """
    c = config
    r = x.shape[1]
    eps, off = c.rms_norm_eps, c.norm_offset
    y = _rms_norm(x, p["attn_norm"], eps, off, axis=0)
    # The projections come out as columns; attention runs on rows ([R, 1, N], as in
    # :func:`block`): the transposes of these small arrays fuse into the q/k norms and the
    # rotation, and the scores and values read the cache as the row path does.
    q = _col_bias(_cols_f32(p["wq_t"], y), p.get("bq"))
    k = _col_bias(_cols_f32(p["wk_t"], y), p.get("bk"))
    v = _col_bias(_cols(p["wv_t"], y), p.get("bv"))
    # (Without the barrier XLA rewrites transpose(W x y) as y^T x W^T: a rows product again.)
    q, k, v = (a.T[:, None] for a in jax.lax.optimization_barrier((q, k, v)))
    o, aux = _attend(p, q, k, v, cos, sin, bias, kv, c, True, x.dtype)
    o = _col_bias(_cols(p["wo_t"], o.reshape(r, -1).T), p.get("bo"))
    if c.post_norms:
        o = _rms_norm(o, p["post_attn_norm"], eps, off, axis=0)
    x = x + o
    y = _rms_norm(x, p["mlp_norm"], eps, off, axis=0)
    gate, up = _cols_f32(p["w_gate_t"], y), _cols_f32(p["w_up_t"], y)
    act = jax.nn.silu(gate) if c.activation == "silu" else jax.nn.gelu(gate, approximate=True)
    m = _cols(p["w_down_t"], (act * up).astype(y.dtype))
    if c.post_norms:
        m = _rms_norm(m, p["post_mlp_norm"], eps, off, axis=0)
    return x + m, aux


def init_kv_cache(
    config: DecoderConfig, batch: int, max_len: int, dtype: Any = jnp.float32, *,
    per_layer: bool = False, transposed_keys: bool = False,
) -> dict[str, Any]:
    """An empty KV cache for ``batch`` rows of at most ``max_len`` tokens.

    Args:
        per_layer: one ``[B, Nkv, S, D]`` array per layer (tuples under ``"k"``/``"v"``), the
            layout used with per-layer params (:func:`unstack_layers`); default one stacked
            ``[L, B, Nkv, S, D]`` array.
        transposed_keys: with ``per_layer``, keys as ``[B, Nkv, S / b, D, b]``
            (:func:`blocked_keys`; values stay ``[B, Nkv, S, D]``): the layout of the engine's
            decode cache, whose score products read each block of keys contiguously (see
            :func:`block`).

    Example:
        >>> from langtorch.functional.models import decoder
        >>> c = decoder.init_kv_cache(decoder.DecoderConfig(), 2, 16)
        >>> c["k"].shape, int(c["index"])
        ((30, 2, 3, 16, 64), 0)
        >>> t = decoder.init_kv_cache(decoder.DecoderConfig(), 2, 16, per_layer=True,
        ...                           transposed_keys=True)
        >>> t["k"][0].shape, t["v"][0].shape
        ((2, 3, 1, 64, 16), (2, 3, 16, 64))
    """
    if transposed_keys and not per_layer:
        raise ValueError("init_kv_cache: transposed_keys=True is the engine's per-layer decode "
                         "cache layout; pass per_layer=True with it.")
    if per_layer:
        shape = (batch, config.num_kv_heads, max_len, config.head_dim)
        kb = key_block(max_len)
        kshape = (batch, config.num_kv_heads, max_len // kb, config.head_dim, kb) \
            if transposed_keys else shape
        zeros = tuple(jnp.zeros(kshape, dtype) for _ in range(config.num_layers))
        return {"k": zeros, "v": tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                "index": jnp.zeros((), jnp.int32)}
    shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
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
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = decoder.random_params(jax.random.key(0), cfg)
        >>> len(decoder.unstack_layers(p)["layers"])
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
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = decoder.random_params(jax.random.key(0), cfg)
        >>> decoder.stack_layers(decoder.unstack_layers(p))["layers"]["wq"].shape
        (2, 8, 8)
    """
    layers = params["layers"]
    if not isinstance(layers, (list, tuple)):
        return params
    def stack(*xs):  # (a quantized matrix stacks its int8 values and scales)
        return jax.tree.map(lambda *a: jnp.stack(a), *xs)

    return {**params, "layers": {k: stack(*[lay[k] for lay in layers]) for k in layers[0]}}


def _sliding_flags(config: DecoderConfig) -> tuple[bool, ...]:
    if config.sliding_layers and config.sliding_window:
        return tuple(bool(f) for f in config.sliding_layers)
    return (False,) * config.num_layers


def hidden_states(
    params: Params,
    ids: jax.Array | None,
    positions: jax.Array,
    mask: jax.Array,
    kv_cache: dict[str, jax.Array] | None = None,
    *,
    inputs_embeds: jax.Array | None = None,
    config: DecoderConfig = _DEFAULT,
) -> tuple[jax.Array, dict[str, jax.Array] | None]:
    """The final-normed hidden states ``[B, T, H]`` and the updated cache.

    Same arguments as :func:`forward`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = decoder.random_params(jax.random.key(0), cfg)
        >>> h, _ = decoder.hidden_states(p, jnp.array([[1, 2]]), jnp.array([[0, 1]]),
        ...                              jnp.ones((1, 2)), config=cfg)
        >>> h.shape
        (1, 2, 8)
    """
    c = config
    if inputs_embeds is None:
        if ids is None:
            raise ValueError("decoder.forward: expected `ids` or `inputs_embeds`, got neither.")
        x = embed_tokens(params, ids, config=c)
    else:
        x = scale_embeddings(inputs_embeds.astype(params["embed"].dtype), c)
    b, t, _ = x.shape
    tables = rope_tables(positions, c)
    if kv_cache is None:
        start = jnp.zeros((), jnp.int32)
        num_keys = t
    else:
        start = kv_cache["index"]
        num_keys = kv_cache["k"][0].shape[2] if isinstance(kv_cache["k"], (list, tuple)) \
            else kv_cache["k"].shape[3]
    # Query t sits at slot start+t and sees slots <= its own that the row's mask marks valid.
    q_slot = start + jnp.arange(t)
    distance = (q_slot[:, None] - jnp.arange(num_keys)[None, :])[None]
    allowed = (distance >= 0) & (mask[:, None, :] > 0)
    biases = layer_biases(allowed, distance, c)
    flags = _sliding_flags(c)

    def no_cache(k, v):
        return k, v, None

    layers = params["layers"]
    if isinstance(layers, (list, tuple)):
        # Per-layer params: an unrolled loop that reads weights and cache slices in place.
        new_k, new_v = [], []
        for i, p in enumerate(layers):
            def write(k, v, i=i):
                ck, cv = kv_cache["k"][i], kv_cache["v"][i]
                k = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, 0, start, 0))
                v = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, 0, start, 0))
                return k, v, (k, v)

            x, kv = layer(p, x, tables, biases, no_cache if kv_cache is None else write,
                          config=c, sliding=flags[i])
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        new_cache = None if kv_cache is None else {
            "k": tuple(new_k), "v": tuple(new_v), "index": start + t}
    elif kv_cache is None:
        def step(h, xs):
            p, sliding = xs
            return layer(p, h, tables, biases, no_cache, config=c, sliding=sliding)[0], None

        x, _ = jax.lax.scan(step, x, (layers, jnp.asarray(flags, bool)))
        new_cache = None
    else:
        # The whole cache rides in the carry and is updated in place layer by layer; emitting
        # per-layer caches as scan outputs would copy the full cache on every decode step.
        def step(carry, xs):
            h, ck, cv = carry
            p, i, sliding = xs

            def write(k, v):
                ck2 = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype),
                                                   (i, 0, 0, start, 0))
                cv2 = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype),
                                                   (i, 0, 0, start, 0))
                return (jax.lax.dynamic_index_in_dim(ck2, i, keepdims=False),
                        jax.lax.dynamic_index_in_dim(cv2, i, keepdims=False), (ck2, cv2))

            h, (ck, cv) = layer(p, h, tables, biases, write, config=c, sliding=sliding)
            return (h, ck, cv), None

        (x, ck, cv), _ = jax.lax.scan(
            step, (x, kv_cache["k"], kv_cache["v"]),
            (layers, jnp.arange(c.num_layers), jnp.asarray(flags, bool)))
        new_cache = {"k": ck, "v": cv, "index": start + t}
    return final_norm(params, x, config=c), new_cache


def scale_embeddings(x: jax.Array, config: DecoderConfig) -> jax.Array:
    """Multiply input embeddings by the config's ``embed_scale`` (Gemma: ``sqrt(hidden)``,
    rounded to the embeddings' dtype as transformers does); identity otherwise.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(embed_scale=2.0)
        >>> decoder.scale_embeddings(jnp.ones(2), cfg).tolist()
        [2.0, 2.0]
    """
    if config.embed_scale is None:
        return x
    return x * jnp.asarray(config.embed_scale, x.dtype)


def embed_tokens(params: Params, ids: Any, *, config: DecoderConfig = _DEFAULT
                 ) -> jax.Array:
    """Token embeddings ``[..., H]`` (scaled per the config); concrete ids outside
    ``[0, vocab_size)`` raise.

    Inside ``jit`` the ids cannot be checked (a traced value), so callers validate them on the
    host: :mod:`langtorch.functional.engine` does for every request.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=3, hidden_size=2)
        >>> decoder.embed_tokens({"embed": jnp.eye(3, 2)}, jnp.array([[2]]), config=cfg).shape
        (1, 1, 2)
        >>> decoder.embed_tokens({"embed": jnp.eye(3, 2)}, jnp.array([[3]]), config=cfg)
        Traceback (most recent call last):
        ...
        ValueError: llama: token id 3 is outside the vocabulary [0, 3).
    """
    if not isinstance(ids, jax.core.Tracer):
        check_token_ids(ids, config.vocab_size)
    return scale_embeddings(embedding_rows(params["embed"], ids), config)


def embedding_rows(table: Any, ids: jax.Array) -> jax.Array:
    """Rows ``table[ids]`` of a ``[V, H]`` embedding table in its dtype; a quantized table
    (:class:`~langtorch.functional.models.quant.QuantizedMatrix`) gives its rows dequantized.
    Unscaled, unchecked (see :func:`embed_tokens`).

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder, quant
        >>> t = jnp.array([[1.0, 2.0], [3.0, -4.0]])
        >>> decoder.embedding_rows(t, jnp.array([1])).tolist()
        [[3.0, -4.0]]
        >>> q = quant.quantize(t, axis=-1)  # one scale per row: 4 / 127, so 3.0 -> 95 steps
        >>> q.q[1].tolist(), round(float(decoder.embedding_rows(q, jnp.array([1]))[0, 0]), 3)
        ([95, -127], 2.992)
    """
    if isinstance(table, QuantizedMatrix):
        if table.transposed or table.scale.shape[-1] != 1:
            raise ValueError("embedding_rows: a quantized table needs one scale per row "
                             "(quant.quantize(table, axis=-1)), stored as is; got "
                             f"{table!r} with scales {tuple(table.scale.shape)}.")
        rows = jnp.take(table.q, ids, axis=0).astype(jnp.float32) * jnp.take(
            table.scale, ids, axis=0)
        return rows.astype(table.dtype)
    if table.dtype in (jnp.bfloat16, jnp.float16):
        # XLA:CPU gathers 16-bit floats by converting the table to f32 first, and inside a
        # decode loop hoists that convert of the whole [V, H] table out of the loop: tens of ms
        # per call (SmolLM2's bf16 table: ~48 ms). Gathering the bits as uint16 is exact.
        return _rows16(table, ids)
    return jnp.take(table, ids, axis=0)


@jax.custom_jvp
def _rows16(table, ids):
    # table[ids] of a 16-bit float table, gathered as its uint16 bits (see embedding_rows).
    bits = jnp.take(jax.lax.bitcast_convert_type(table, jnp.uint16), ids, axis=0)
    return jax.lax.bitcast_convert_type(bits, table.dtype)


@_rows16.defjvp
def _rows16_jvp(primals, tangents):
    # A bitcast has no derivative: the gather's own (rows of the table's tangent).
    table, ids = primals
    return _rows16(table, ids), jnp.take(tangents[0], ids, axis=0)


def check_token_ids(ids: Any, vocab_size: int) -> None:
    """Raise ``ValueError`` naming the first id outside ``[0, vocab_size)`` (``jnp.take`` would
    silently return NaN rows for it).

    Example:
        >>> from langtorch.functional.models import decoder
        >>> decoder.check_token_ids([[0, 5]], 8)
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


def final_norm(params: Params, x: jax.Array, *, config: DecoderConfig = _DEFAULT
               ) -> jax.Array:
    """The final RMS norm applied to the last block's output.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> decoder.final_norm({"norm": jnp.ones(2)}, 3 * jnp.ones((1, 2))).round(3).tolist()
        [[1.0, 1.0]]
    """
    return _rms_norm(x, params["norm"], config.rms_norm_eps, config.norm_offset)


def lm_head(params: Params, hidden: jax.Array, config: DecoderConfig | None = None) -> jax.Array:
    """Project hidden states to vocabulary logits (fp32), with the tied embedding if no head,
    soft-capped when the config has ``final_softcap``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> p = {"embed": jnp.eye(3)}
        >>> decoder.lm_head(p, jnp.ones((1, 1, 3))).tolist()
        [[[1.0, 1.0, 1.0]]]
    """
    # fp32 accumulation *and* result: a bf16 x bf16 product with a bf16 result takes XLA:CPU's
    # slow path (measured at 16 rows x SmolLM2's tied [V, H] head: 265 ms vs 27 ms); the
    # logits are fp32 anyway. For fp32 weights this is the same product.
    # A quantized head (QuantizedMatrix): an int8 x int8 -> int32 product (quant.quantized_dot).
    if "lm_head" in params:
        w = params["lm_head"]
        if isinstance(w, QuantizedMatrix):
            out = quantized_dot(hidden, w)
        else:
            out = padded_rows_product(hidden, w, jnp.float32)
    elif isinstance(params["embed"], QuantizedMatrix):
        out = quantized_dot(hidden, params["embed"], transpose=True)
    else:
        out = padded_rows_product(hidden, params["embed"], jnp.float32, transposed=True)
    return softcap_logits(out.astype(jnp.float32), config)


def softcap_logits(logits: jax.Array, config: DecoderConfig | None) -> jax.Array:
    """Gemma 2's final-logit soft-capping, ``cap * tanh(logits / cap)``, when the config has
    ``final_softcap``; identity otherwise. Element-wise, so it applies to any subset of the
    vocabulary's logits (the label words of a classifier) as to all of them.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(final_softcap=1.0)
        >>> decoder.softcap_logits(jnp.array([0.0, 100.0]), cfg).tolist()
        [0.0, 1.0]
        >>> decoder.softcap_logits(jnp.array([100.0]), None).tolist()
        [100.0]
    """
    if config is None or not config.final_softcap:
        return logits
    return jnp.tanh(logits / config.final_softcap) * config.final_softcap


def forward(
    params: Params,
    ids: jax.Array | None,
    positions: jax.Array,
    mask: jax.Array,
    kv_cache: dict[str, jax.Array] | None = None,
    *,
    inputs_embeds: jax.Array | None = None,
    config: DecoderConfig = _DEFAULT,
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
        inputs_embeds: optional ``[B, T, H]`` embeddings used instead of ``ids`` (soft prompts;
            scaled by ``embed_scale`` like token embeddings, as transformers does).
        config: static hyper-parameters.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = decoder.random_params(jax.random.key(0), cfg)
        >>> cache = decoder.init_kv_cache(cfg, 1, 4)
        >>> mask = jnp.array([[1, 1, 0, 0]])
        >>> logits, cache = decoder.forward(p, jnp.array([[1, 2]]), jnp.array([[0, 1]]), mask,
        ...                                 cache, config=cfg)
        >>> logits.shape, int(cache["index"])
        ((1, 2, 8), 2)
    """
    h, cache = hidden_states(params, ids, positions, mask, kv_cache,
                             inputs_embeds=inputs_embeds, config=config)
    return lm_head(params, h, config), cache


def random_params(key: jax.Array, config: DecoderConfig = _DEFAULT,
                  dtype=jnp.float32) -> Params:
    """Random parameters with the structure the config asks for (tests and shape checks).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import decoder
        >>> cfg = decoder.DecoderConfig(vocab_size=16, hidden_size=8, num_layers=2, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8,
        ...                             qkv_bias=True)
        >>> sorted(decoder.random_params(jax.random.key(0), cfg)["layers"])[:3]
        ['attn_norm', 'bk', 'bq']
    """
    c = config
    n, h, f = c.num_layers, c.hidden_size, c.intermediate_size
    qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {"wq": (n, h, qd), "wk": (n, h, kd), "wv": (n, h, kd), "wo": (n, qd, h),
              "w_gate": (n, h, f), "w_up": (n, h, f), "w_down": (n, f, h)}
    if c.qkv_bias:
        shapes.update(bq=(n, qd), bk=(n, kd), bv=(n, kd))
    if c.o_bias:
        shapes["bo"] = (n, h)
    keys = jax.random.split(key, len(shapes) + 2)
    layers = {k: 0.05 * jax.random.normal(kk, s, dtype) for (k, s), kk in zip(shapes.items(), keys)}
    norm_init = 0.0 if c.norm_offset else 1.0
    norms = ["attn_norm", "mlp_norm"] + (["post_attn_norm", "post_mlp_norm"] if c.post_norms
                                         else [])
    for name in norms:
        layers[name] = jnp.full((n, h), norm_init, dtype)
    if c.qk_norm:
        layers["q_norm"] = jnp.full((n, c.head_dim), norm_init, dtype)
        layers["k_norm"] = jnp.full((n, c.head_dim), norm_init, dtype)
    params = {"embed": 0.05 * jax.random.normal(keys[-2], (c.vocab_size, h), dtype),
              "norm": jnp.full((h,), norm_init, dtype), "layers": layers}
    if not c.tie_embeddings:
        params["lm_head"] = 0.05 * jax.random.normal(keys[-1], (h, c.vocab_size), dtype)
    return params
