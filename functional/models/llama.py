"""A Llama decoder (SmolLM2-135M-Instruct by default): the generic
:mod:`langtorch.functional.models.decoder` with its default (plain Llama) configuration.

Every function here *is* the decoder's (one copy of the maths); :class:`LlamaConfig` is
:class:`~langtorch.functional.models.decoder.DecoderConfig`, whose defaults are SmolLM2-135M's.
See the decoder module for the parameter pytree and KV cache layouts.

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

from langtorch.functional.models.decoder import (
    DecoderConfig,
    attention_bias,
    block,
    check_token_ids,
    embed_tokens,
    final_norm,
    forward,
    hidden_states,
    init_kv_cache,
    lm_head,
    positions_from_mask,
    random_params,
    rope,
    stack_layers,
    unstack_layers,
)

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

LlamaConfig = DecoderConfig
"""Alias of :class:`~langtorch.functional.models.decoder.DecoderConfig` (defaults: SmolLM2)."""

SMOLLM2_135M = DecoderConfig()
"""The configuration of HuggingFaceTB/SmolLM2-135M-Instruct.

Example:
    >>> from langtorch.functional.models.llama import SMOLLM2_135M
    >>> SMOLLM2_135M.num_heads, SMOLLM2_135M.num_kv_heads, SMOLLM2_135M.rope_theta
    (9, 3, 100000.0)
"""
