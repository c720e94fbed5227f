"""The one jitted label-word scorer of a local decoder, shared by every tool that scores labels.

``PromptTuner`` (classification on a decoder), ``LocalClassifier`` and ``TokenSearch`` all read
the next-token logits of a few label words at each row's answer position. They call this one
``jax.jit`` of :func:`langtorch.functional.losses.decoder_label_logits`: the frozen weights are an
argument and the config a static argument, so all of them share one compile cache, one program
per (config, batch shape, dtype).
"""

from __future__ import annotations

import jax

from langtorch.functional import losses as L

__all__ = ["label_logits"]

label_logits = jax.jit(L.decoder_label_logits, static_argnames=("config", "pez"))
"""``label_logits(prompt, frozen, batch, *, config, pez=False) -> [B, K]`` float32: the jitted
:func:`langtorch.functional.losses.decoder_label_logits` (see it for the arguments).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional.models import llama
    >>> from langtorch.models import label_logits
    >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
    ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
    >>> frozen = {"model": llama.random_params(jax.random.key(0), cfg),
    ...           "label_ids": jnp.array([3, 5])}
    >>> batch = {"ids": jnp.ones((2, 4), jnp.int32), "mask": jnp.ones((2, 4), jnp.int32),
    ...          "index": jnp.array([3, 1])}
    >>> label_logits(jnp.zeros((0, 8)), frozen, batch, config=cfg).shape
    (2, 2)
"""
