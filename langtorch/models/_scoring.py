"""The one jitted label scorer of a local decoder, shared by every tool that scores labels.

``PromptTuner`` (classification on a decoder), ``LocalClassifier`` and ``TokenSearch`` all score
a few labels after each row's prompt. They call this one ``jax.jit`` of
:func:`langtorch.functional.losses.decoder_label_scores`: the frozen weights are an argument and
the config a static argument, so all of them share one compile cache, one program per (config,
batch shape, label shape, dtype, reduction).
"""

from __future__ import annotations

import jax

from langtorch.functional import losses as L

__all__ = ["label_logits"]

label_logits = jax.jit(L.decoder_label_scores, static_argnames=("config", "pez", "reduction"))
"""``label_logits(prompt, frozen, batch, *, config, pez=False, reduction="sum") -> [B, K]``
float32: the jitted :func:`langtorch.functional.losses.decoder_label_scores` — each label's
score is the sum (``reduction="mean"``: the mean) of its tokens' log-probabilities after the
row's prompt; labels of one token each take the single-token fast path (see it for the
arguments, and :func:`langtorch.functional.losses.label_token_data` for ``frozen``'s labels).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional.losses import label_token_data
    >>> from langtorch.functional.models import llama
    >>> from langtorch.models import label_logits
    >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
    ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
    >>> frozen = {"model": llama.random_params(jax.random.key(0), cfg),
    ...           **label_token_data([[3], [5, 6]])}    # a one-token and a two-token label
    >>> batch = {"ids": jnp.ones((2, 4), jnp.int32), "mask": jnp.ones((2, 4), jnp.int32),
    ...          "index": jnp.array([3, 1])}
    >>> label_logits(jnp.zeros((0, 8)), frozen, batch, config=cfg).shape
    (2, 2)
"""
