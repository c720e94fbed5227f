"""Decoder families: a Hugging Face ``config.json`` or GGUF metadata -> :class:`DecoderConfig`, and
each family's weight names -> the decoder's parameter pytree.

Example:
    >>> from langtorch.functional.loaders import SUPPORTED_ARCHITECTURES
    >>> "gemma3" in SUPPORTED_ARCHITECTURES
    True
"""

from __future__ import annotations

import math
from typing import Any

from langtorch.functional.errors import UnsupportedModelError
from langtorch.functional.models.decoder import ROPE_TYPES, DecoderConfig, check_config

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_GGUF_ARCHITECTURES",
    "decoder_config_from_gguf",
    "decoder_config_from_hf",
    "gguf_layer_names",
    "hf_layer_names",
]

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
"""Hugging Face ``model_type`` values :func:`decoder_config_from_hf` accepts (``gemma3_text``
is ``gemma3``)."""

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
"""GGUF ``general.architecture`` values (llama.cpp writes Mistral as ``llama``)."""

_ACT = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_new": "gelu_tanh"}


def _unsupported_arch(found: str, supported: tuple[str, ...], where: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{where}: architecture {found!r} is not supported; supported: {', '.join(supported)}. "
        "Convert the model to one of these families or open an issue.")


def _rope_params(cfg: dict[str, Any], where: str, default_theta: float = 10000.0
                 ) -> tuple[float, tuple | None, float | None]:
    """(global theta, global scaling, local theta) from v4 (``rope_theta``/``rope_scaling``/
    ``rope_local_base_freq``) or v5 (``rope_parameters``) configs."""
    rp = cfg.get("rope_parameters")
    local = cfg.get("rope_local_base_freq")
    if isinstance(rp, dict) and ("full_attention" in rp or "sliding_attention" in rp):
        full = rp.get("full_attention") or {}
        slide = rp.get("sliding_attention") or {}
        if slide:
            if slide.get("rope_type", "default") != "default":
                raise UnsupportedModelError(
                    f"{where}: rope_parameters.sliding_attention type "
                    f"{slide.get('rope_type')!r} is not implemented (supported: default).")
            local = slide.get("rope_theta", local)
        rp = full
    if isinstance(rp, dict) and rp:
        theta = float(rp.get("rope_theta", cfg.get("rope_theta", default_theta)))
        scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
    else:
        theta = float(cfg.get("rope_theta", default_theta))
        scaling = dict(cfg.get("rope_scaling") or {})
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling and "rope_type" not in scaling:
        raise UnsupportedModelError(f"{where}: rope_scaling {scaling} names no rope_type; "
                                    "refused rather than guessed.")
    prf = scaling.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if prf is not None and float(prf) != 1.0:
        raise UnsupportedModelError(f"{where}: partial_rotary_factor {prf} is not implemented "
                                    "(only full rotary embeddings); refused.")
    kind = scaling.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"{where}: rope_scaling type {kind!r} is not implemented (supported: "
            f"{', '.join(ROPE_TYPES)}); this model's positions would be computed wrongly, so it "
            "is refused.")
    if kind == "default":
        return theta, None, (float(local) if local is not None else None)
    need = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                              "original_max_position_embeddings")}[kind]
    missing = [k for k in need if k not in scaling]
    if missing:
        raise UnsupportedModelError(f"{where}: rope_scaling of type {kind!r} lacks {missing}.")
    sc = (("rope_type", kind),) + tuple((k, float(scaling[k])) for k in need)
    return theta, sc, (float(local) if local is not None else None)


def _hf_model_type(cfg: dict[str, Any], where: str) -> str:
    """The family of a ``config.json`` (``gemma3_text`` is ``gemma3``); refuses the others."""
    mt = cfg.get("model_type")
    if mt == "gemma3_text":
        mt = "gemma3"
    if mt == "gemma3" and "text_config" in cfg:
        raise UnsupportedModelError(
            f"{where}: a multimodal Gemma 3 (Gemma3ForConditionalGeneration) is not supported; "
            "load a text-only Gemma 3 (model_type 'gemma3_text').")
    if mt not in SUPPORTED_ARCHITECTURES:
        raise _unsupported_arch(str(mt), SUPPORTED_ARCHITECTURES, where)
    return mt


def _hf_sliding(cfg: dict[str, Any], mt: str, n: int, window: Any,
                where: str) -> tuple[tuple[bool, ...], Any]:
    """``(sliding_layers, window)``: which layers attend in a sliding window, by the family's rule
    (``layer_types`` when the config lists them); ``((), None)`` when none does."""
    types = cfg.get("layer_types")
    if types is not None:
        unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
        if unknown:
            raise UnsupportedModelError(f"{where}: layer type(s) {unknown} not implemented.")
        sliding = tuple(t == "sliding_attention" for t in types)
    elif mt == "gemma2":
        sliding = tuple(bool((i + 1) % 2) for i in range(n))
    elif mt == "gemma3":
        pat = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        sliding = tuple(bool((i + 1) % pat) for i in range(n))
    elif mt in ("qwen2", "qwen3"):
        use = bool(cfg.get("use_sliding_window")) and window
        mwl = int(cfg.get("max_window_layers") or n)
        sliding = tuple(bool(use) and i >= mwl for i in range(n))
    else:  # llama (none), mistral / phi3 (every layer when sliding_window is set)
        sliding = tuple(bool(window) and mt != "llama" for _ in range(n))
    if not any(sliding) or not window:
        sliding, window = (), None
    return sliding, window


def decoder_config_from_hf(cfg: dict[str, Any], *, where: str = "config.json") -> DecoderConfig:
    """The :class:`DecoderConfig` of a Hugging Face ``config.json`` (a dict).

    Raises:
        UnsupportedModelError: an unknown ``model_type``, or a setting that changes the maths
            and is not implemented (an unknown ``rope_scaling`` type, ``mlp_bias``, partial
            rotary embeddings, an unknown activation).

    Example:
        >>> from langtorch.functional.loaders import decoder_config_from_hf
        >>> c = decoder_config_from_hf({"model_type": "qwen2", "vocab_size": 10,
        ...     "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        ...     "num_key_value_heads": 1, "intermediate_size": 16})
        >>> c.qkv_bias, c.head_dim
        (True, 4)
        >>> decoder_config_from_hf({"model_type": "gpt2"})
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.UnsupportedModelError: config.json: architecture 'gpt2' is not supported; supported: llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3. Convert the model to one of these families or open an issue.
    """
    mt = _hf_model_type(cfg, where)
    gemma = mt in ("gemma2", "gemma3")
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    # transformers' class defaults where config.json omits the key (Gemma / Qwen3 head_dim)
    head_dim = int(cfg.get("head_dim") or {"gemma2": 256, "gemma3": 256, "qwen3": 128}.get(
        mt, hidden // heads))
    n = int(cfg["num_hidden_layers"])
    act_name = cfg.get("hidden_activation") or cfg.get("hidden_act") or (
        "gelu_pytorch_tanh" if gemma else "silu")
    if act_name not in _ACT:
        raise UnsupportedModelError(f"{where}: activation {act_name!r} is not implemented "
                                    f"(supported: {', '.join(_ACT)}).")
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError(f"{where}: mlp_bias=True is not implemented; refused.")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError(f"{where}: use_bidirectional_attention is not implemented "
                                    "(a causal decoder only); refused.")
    theta, scaling, local_theta = _rope_params(cfg, where,
                                               1_000_000.0 if mt == "gemma3" else 10000.0)
    if mt == "gemma3" and local_theta is None:
        local_theta = 10000.0  # transformers' default rope_local_base_freq (unscaled table)
    # A key absent from config.json takes transformers' class default for that family.
    window = cfg.get("sliding_window", 4096 if gemma else None)
    if mt in ("qwen2", "qwen3") and not cfg.get("use_sliding_window"):
        window = None  # transformers drops sliding_window unless use_sliding_window
    sliding, window = _hf_sliding(cfg, mt, n, window, where)
    attn_bias = bool(cfg.get("attention_bias", False))
    qps = cfg.get("query_pre_attn_scalar", 256)
    tie_default = gemma
    config = DecoderConfig(
        vocab_size=int(cfg["vocab_size"]), hidden_size=hidden, num_layers=n, num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
        intermediate_size=int(cfg["intermediate_size"]), rope_theta=theta,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5 if mt == "phi3" else 1e-6)),
        max_positions=int(cfg.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", tie_default)),
        architecture=mt,
        norm_offset=1.0 if gemma else 0.0,
        qkv_bias=mt == "qwen2" or attn_bias, o_bias=attn_bias and mt != "qwen2",
        qk_norm=mt in ("qwen3", "gemma3"), post_norms=gemma, activation=_ACT[act_name],
        embed_scale=math.sqrt(hidden) if gemma else None,
        query_scale=float(qps) ** -0.5 if gemma and qps else None,
        # Gemma 3's attention never reads attn_logit_softcapping in transformers (nor llama.cpp)
        attn_softcap=cfg.get("attn_logit_softcapping", 50.0) if mt == "gemma2" else None,
        final_softcap=cfg.get("final_logit_softcapping", 30.0 if mt == "gemma2" else None)
        if gemma else None,
        sliding_window=int(window) if window else None, sliding_layers=sliding,
        rope_local_theta=local_theta if mt == "gemma3" else None, rope_scaling=scaling,
    )
    try:
        return check_config(config)
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{where}: {exc}") from None


def hf_layer_names(config: DecoderConfig) -> dict[str, str]:
    """Our per-layer param name -> the Hugging Face tensor name suffix (after
    ``model.layers.{i}.``). Phi-3's fused ``qkv_proj``/``gate_up_proj`` are split by the loader.

    Example:
        >>> from langtorch.functional.loaders._families import hf_layer_names
        >>> from langtorch.functional.models.decoder import DecoderConfig
        >>> hf_layer_names(DecoderConfig())["mlp_norm"]
        'post_attention_layernorm.weight'
    """
    c = config
    names = {"attn_norm": "input_layernorm.weight",
             "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight",
             "wv": "self_attn.v_proj.weight", "wo": "self_attn.o_proj.weight",
             "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
             "w_down": "mlp.down_proj.weight"}
    if c.post_norms:
        names.update(post_attn_norm="post_attention_layernorm.weight",
                     mlp_norm="pre_feedforward_layernorm.weight",
                     post_mlp_norm="post_feedforward_layernorm.weight")
    else:
        names["mlp_norm"] = "post_attention_layernorm.weight"
    if c.qkv_bias:
        names.update(bq="self_attn.q_proj.bias", bk="self_attn.k_proj.bias",
                     bv="self_attn.v_proj.bias")
    if c.o_bias:
        names["bo"] = "self_attn.o_proj.bias"
    if c.qk_norm:
        names.update(q_norm="self_attn.q_norm.weight", k_norm="self_attn.k_norm.weight")
    if c.architecture == "phi3":
        for k in ("wq", "wk", "wv", "w_gate", "w_up"):
            del names[k]
        names.update(wqkv="self_attn.qkv_proj.weight", w_gate_up="mlp.gate_up_proj.weight")
    return names


def _meta(m: dict[str, Any], arch: str, key: str, default: Any = None) -> Any:
    v = m.get(f"{arch}.{key}", default)
    return v


def _gguf_rope_scaling(m: dict[str, Any], arch: str, names: set[str], where: str) -> tuple | None:
    """The RoPE scaling of GGUF metadata (linear only; per-frequency factors refused)."""
    scaling = None
    kind = _meta(m, arch, "rope.scaling.type")
    if kind not in (None, "none"):
        factor = float(_meta(m, arch, "rope.scaling.factor", 1.0))
        if kind == "linear":
            scaling = (("rope_type", "linear"), ("factor", factor))
        else:
            raise UnsupportedModelError(
                f"{where}: rope scaling type {kind!r} is not implemented (supported: linear); "
                "refused.")
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(
            f"{where}: the file carries per-frequency RoPE factors (rope_freqs.weight, llama3 "
            "scaling); load the Hugging Face directory instead, whose config names the scaling.")
    return scaling


def _gguf_sliding(arch: str, n: int, window: Any) -> tuple[tuple[bool, ...], Any]:
    """``(sliding_layers, window)`` as llama.cpp reads each family; ``((), None)`` when none."""
    if arch == "gemma2":
        sliding = tuple(bool((i + 1) % 2) for i in range(n))
    elif arch == "gemma3":
        sliding = tuple(bool((i + 1) % 6) for i in range(n))
    elif arch in ("phi3",) and window:
        sliding = (True,) * n
    else:
        sliding = ()
    if not window or not any(sliding):
        sliding, window = (), None
    return sliding, window


def decoder_config_from_gguf(metadata: dict[str, Any], tensor_names: set[str] | None = None,
                             *, where: str = "GGUF") -> DecoderConfig:
    """The :class:`DecoderConfig` of a GGUF file's metadata (``{arch}.*`` keys).

    Mirrors llama.cpp's reading of each architecture (Gemma 3: sliding pattern 6, local RoPE
    base 10000; Gemma 2: alternate layers; Gemma query scale ``head_dim ** -0.5``).

    Example:
        >>> from langtorch.functional.loaders import decoder_config_from_gguf
        >>> meta = {"general.architecture": "llama", "llama.block_count": 2,
        ...         "llama.embedding_length": 64, "llama.attention.head_count": 4,
        ...         "llama.attention.head_count_kv": 2, "llama.feed_forward_length": 128,
        ...         "tokenizer.ggml.tokens": ["a"] * 10}
        >>> decoder_config_from_gguf(meta).head_dim
        16
    """
    arch = metadata.get("general.architecture", "llama")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise _unsupported_arch(str(arch), SUPPORTED_GGUF_ARCHITECTURES, where)
    m = metadata
    gemma = arch in ("gemma2", "gemma3")
    hidden = int(_meta(m, arch, "embedding_length"))
    heads = int(_meta(m, arch, "attention.head_count"))
    kv = _meta(m, arch, "attention.head_count_kv", heads)
    if isinstance(kv, (list, tuple)):
        if len(set(kv)) != 1:
            raise UnsupportedModelError(f"{where}: per-layer KV head counts are not supported.")
        kv = kv[0]
    n = int(_meta(m, arch, "block_count"))
    head_dim = int(_meta(m, arch, "attention.key_length", 0) or
                   _meta(m, arch, "rope.dimension_count", 0) or hidden // heads)
    rope_dims = _meta(m, arch, "rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        raise UnsupportedModelError(f"{where}: partial rotary embeddings ({rope_dims} of "
                                    f"{head_dim} dims) are not implemented; refused.")
    vocab = _meta(m, arch, "vocab_size") or len(m["tokenizer.ggml.tokens"])
    names = tensor_names or set()
    scaling = _gguf_rope_scaling(m, arch, names, where)
    window = _meta(m, arch, "attention.sliding_window")
    sliding, window = _gguf_sliding(arch, n, window)
    config = DecoderConfig(
        vocab_size=int(vocab), hidden_size=hidden, num_layers=n, num_heads=heads,
        num_kv_heads=int(kv), head_dim=head_dim,
        intermediate_size=int(_meta(m, arch, "feed_forward_length")),
        rope_theta=float(_meta(m, arch, "rope.freq_base", 10000.0)),
        rms_norm_eps=float(_meta(m, arch, "attention.layer_norm_rms_epsilon", 1e-6)),
        max_positions=int(_meta(m, arch, "context_length", 2048)),
        tie_embeddings="output.weight" not in names,
        architecture=arch, norm_offset=1.0 if gemma else 0.0,
        qkv_bias="blk.0.attn_q.bias" in names or "blk.0.attn_qkv.bias" in names,
        o_bias="blk.0.attn_output.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names, post_norms=gemma,
        activation="gelu_tanh" if gemma else "silu",
        embed_scale=math.sqrt(hidden) if gemma else None,
        query_scale=head_dim ** -0.5 if gemma else None,
        attn_softcap=_meta(m, arch, "attn_logit_softcapping") if arch == "gemma2" else None,
        final_softcap=_meta(m, arch, "final_logit_softcapping") if gemma else None,
        sliding_window=int(window) if window else None, sliding_layers=sliding,
        rope_local_theta=10000.0 if arch == "gemma3" else None, rope_scaling=scaling,
    )
    return check_config(config)


def gguf_layer_names(config: DecoderConfig) -> dict[str, str]:
    """Our per-layer param name -> the GGUF tensor name (after ``blk.{i}.``).

    Example:
        >>> from langtorch.functional.loaders._families import gguf_layer_names
        >>> from langtorch.functional.models.decoder import DecoderConfig
        >>> gguf_layer_names(DecoderConfig())["wq"]
        'attn_q.weight'
    """
    c = config
    names = {"attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
             "wv": "attn_v.weight", "wo": "attn_output.weight", "mlp_norm": "ffn_norm.weight",
             "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight", "w_down": "ffn_down.weight"}
    if c.post_norms:
        names.update(post_attn_norm="post_attention_norm.weight",
                     post_mlp_norm="post_ffw_norm.weight")
    if c.qkv_bias:
        names.update(bq="attn_q.bias", bk="attn_k.bias", bv="attn_v.bias")
    if c.o_bias:
        names["bo"] = "attn_output.bias"
    if c.qk_norm:
        names.update(q_norm="attn_q_norm.weight", k_norm="attn_k_norm.weight")
    if c.architecture == "phi3":
        for k in ("wq", "wk", "wv", "w_gate", "w_up"):
            del names[k]
        names.update(wqkv="attn_qkv.weight", w_gate_up="ffn_up.weight")
    return names
