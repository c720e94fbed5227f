"""Losses for prompt tuning: masked causal-LM, label-word classification, encoder similarity.

Label scores (:func:`decoder_label_scores`): a label is scored by the sum (or mean) of its
tokens' log-probabilities given the prompt, teacher-forced: each row is continued by each
label's tokens in one forward pass, and the log-probability of every label token is read at the
state before it. When every label is one token, one state per row gives all of them (the
single-token fast path, no extra rows).

Every loss here has the signature ``loss(prompt, frozen, batch) -> (scalar, metrics)`` once its
static options are bound with ``functools.partial`` — the shape that
:func:`langtorch.functional.prompt_tuning.make_train_step` differentiates (``argnums=0``: the
prompt only; ``frozen`` holds the model weights as a jit argument, never a closed-over constant).

Decoder layout (the one PEFT's ``PROMPT_TUNING`` uses, so logits match PEFT):
``[prompt (P) | tokens (T, right padded)]``; the mask gains ``P`` ones in front, positions are
``0 .. P+T-1`` (right padding keeps every real token's position equal to Hugging Face's default
``arange``), label positions of the prompt are ignored.

Encoder layout (MiniLM): ``[CLS] [prompt (P)] tokens [SEP] pad``; BERT positions run over the whole
row and mean pooling covers the prompt too, so the prompt can move the sentence embedding.

Example:
    >>> import jax.numpy as jnp
    >>> from langtorch.functional.losses import causal_lm_loss
    >>> logits = jnp.zeros((1, 3, 5)); labels = jnp.array([[-100, 2, 4]])
    >>> loss, n = causal_lm_loss(logits, labels)
    >>> round(float(loss), 4), int(n)   # log(5): uniform logits over 5 tokens, 2 targets
    (1.6094, 2)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional.models import bert, llama
from langtorch.functional.models.decoder import softcap_logits
from langtorch.functional.models.matmul import dense_f32
from langtorch.functional.soft_prompt import nearest_tokens, prepend_soft_prompt

__all__ = [
    "IGNORE_INDEX",
    "causal_lm_loss",
    "output_logits",
    "token_cross_entropy",
    "decoder_inputs",
    "decoder_hidden",
    "decoder_lm_loss",
    "decoder_classification_loss",
    "decoder_label_logits",
    "decoder_label_scores",
    "label_token_data",
    "encoder_inputs",
    "encoder_label_logits",
    "encoder_classification_loss",
    "straight_through_project",
]

IGNORE_INDEX = -100
"""Label value that contributes no loss (Hugging Face's convention)."""


def causal_lm_loss(logits: jax.Array, labels: jax.Array,
                   ignore_index: int = IGNORE_INDEX) -> tuple[jax.Array, jax.Array]:
    """Mean next-token cross-entropy over the labelled positions.

    ``logits[:, t]`` predicts ``labels[:, t + 1]`` (the shift happens here, as in Hugging Face).

    Args:
        logits: ``[B, T, V]``.
        labels: ``[B, T]`` token ids, ``ignore_index`` where no loss is wanted.
        ignore_index: the label value to skip.

    Returns:
        ``(mean loss, number of labelled tokens)``; the loss is 0 when nothing is labelled.

    Example:
        >>> import jax.numpy as jnp
        >>> float(causal_lm_loss(jnp.zeros((1, 2, 4)), jnp.array([[-100, -100]]))[0])
        0.0
    """
    logits = logits[:, :-1].astype(jnp.float32)
    target = labels[:, 1:]
    valid = target != ignore_index
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, jnp.where(valid, target, 0)[..., None], axis=-1)[..., 0]
    count = valid.sum()
    return jnp.where(valid, nll, 0.0).sum() / jnp.maximum(count, 1), count


def straight_through_project(prompt: jax.Array, table: jax.Array) -> jax.Array:
    """PEZ projection: the nearest vocabulary rows forward, the identity backward.

    Forward returns ``table[nearest(prompt)]``; the gradient flows to ``prompt`` unchanged
    (straight-through estimator, Wen et al. 2023 "Hard Prompts Made Easy"), so training keeps a
    continuous prompt whose projection is what the model sees.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> table = jnp.eye(3)
        >>> straight_through_project(jnp.array([[0.9, 0.2, 0.0]]), table).tolist()
        [[1.0, 0.0, 0.0]]
        >>> jax.grad(lambda p: straight_through_project(p, table).sum())(jnp.ones((1, 3))).tolist()
        [[1.0, 1.0, 1.0]]
    """
    hard = jnp.take(table, nearest_tokens(prompt, table), axis=0).astype(prompt.dtype)
    return prompt + jax.lax.stop_gradient(hard - prompt)


# ------------------------------------------------------------------------------------ decoder


def decoder_inputs(prompt: jax.Array, embed: jax.Array, ids: jax.Array, mask: jax.Array,
                   *, pez: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(inputs_embeds [B, P+T, H], mask [B, P+T], positions [B, P+T])`` in PEFT's layout.

    Args:
        prompt: ``[P, H]`` soft prompt.
        embed: the ``[V, H]`` input embedding table.
        ids: ``[B, T]`` right-padded token ids.
        mask: ``[B, T]`` 1 for real tokens.
        pez: feed the straight-through projection of the prompt (hard-prompt training).

    Example:
        >>> import jax.numpy as jnp
        >>> e, m, pos = decoder_inputs(jnp.ones((2, 4)), jnp.zeros((9, 4)),
        ...                            jnp.array([[1, 2, 0]]), jnp.array([[1, 1, 0]]))
        >>> e.shape, m.tolist(), pos.tolist()
        ((1, 5, 4), [[1, 1, 1, 1, 0]], [[0, 1, 2, 3, 4]])
    """
    if pez:
        prompt = straight_through_project(prompt, embed)
    embeds, full_mask = prepend_soft_prompt(prompt, jnp.take(embed, ids, axis=0), mask)
    b, n = full_mask.shape
    positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
    return embeds, full_mask, positions


def decoder_hidden(prompt: jax.Array, params: Any, ids: jax.Array, mask: jax.Array, *,
                   config: llama.LlamaConfig, pez: bool = False) -> jax.Array:
    """Final hidden states ``[B, P+T, H]`` of the Llama decoder with the prompt in front.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> decoder_hidden(jnp.zeros((3, 8)), p, jnp.ones((2, 4), jnp.int32),
        ...                jnp.ones((2, 4), jnp.int32), config=cfg).shape
        (2, 7, 8)
    """
    embeds, full_mask, positions = decoder_inputs(prompt, params["embed"], ids, mask, pez=pez)
    h, _ = llama.hidden_states(_unrolled(params), None, positions, full_mask,
                               inputs_embeds=embeds, config=config)
    return h


def _unrolled(params: Any) -> Any:
    """Stacked bf16/fp16 layers as per-layer dicts, so that the decoder runs them unrolled.

    Under ``lax.scan`` XLA:CPU upcasts the dynamic slices of stacked low-precision arrays: every
    call converted all stacked layer weights to float32 (and, under ``grad``, every stacked
    residual before the backward loop), then each layer's slice back — 2x the time of the
    unrolled layers at 6 layers (profile_prompt_tuning.py). float32 layers keep the scan (no
    converts; a shorter compile)."""
    layers = params["layers"]
    if isinstance(layers, (list, tuple)):
        return params
    if all(jnp.dtype(a.dtype).itemsize >= 4 or not jnp.issubdtype(a.dtype, jnp.floating)
           for a in jax.tree.leaves(layers)):
        return params
    return llama.unstack_layers(params)


def _label_head(params: Any, label_ids: jax.Array) -> jax.Array:
    """``[H, K]``: only the output rows of the label words (the full ``[H, V]`` head is 49k wide)."""
    if "lm_head" in params:
        return jnp.take(params["lm_head"], label_ids, axis=1)
    return jnp.take(params["embed"], label_ids, axis=0).T


def decoder_label_logits(prompt: jax.Array, frozen: Any, batch: dict, *,
                         config: llama.LlamaConfig, pez: bool = False) -> jax.Array:
    """Logits ``[B, K]`` of the ``K`` label words at each row's answer position.

    Only one hidden state per row is projected, and only onto the label words' rows of the
    output head: ``B*K`` logits instead of ``B*(P+T)*V``.

    Args:
        prompt: ``[P, H]``.
        frozen: ``{"model": llama params, "label_ids": [K] int32}``.
        batch: ``{"ids": [B, T], "mask": [B, T], "index": [B]}``; ``index`` is the position (in
            ``ids``) of the last prompt token, whose next-token distribution gives the label.
        config: the decoder's static configuration.
        pez: use the straight-through projection of the prompt.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> frozen = {"model": llama.random_params(jax.random.key(0), cfg),
        ...           "label_ids": jnp.array([3, 5])}
        >>> batch = {"ids": jnp.ones((2, 4), jnp.int32), "mask": jnp.ones((2, 4), jnp.int32),
        ...          "index": jnp.array([3, 1])}
        >>> decoder_label_logits(jnp.zeros((2, 8)), frozen, batch, config=cfg).shape
        (2, 2)
    """
    params = frozen["model"]
    h = decoder_hidden(prompt, params, batch["ids"], batch["mask"], config=config, pez=pez)
    p = prompt.shape[0]
    at = jnp.take_along_axis(h, (batch["index"] + p)[:, None, None], axis=1)[:, 0]  # [B, H]
    head = _label_head(params, frozen["label_ids"]).astype(at.dtype)
    return softcap_logits(jnp.matmul(at, head, preferred_element_type=jnp.float32), config)


def label_token_data(tokens: Any) -> dict:
    """The frozen label data of :func:`decoder_label_scores` for the token ids of each label.

    ``{"label_ids": [K] int32}`` when every label is one token (the fast path), else
    ``{"label_ids": [K, L] int32, "label_mask": [K, L] int32}``, each label's tokens left
    aligned and ``L`` the longest label.

    Args:
        tokens: ``K`` non-empty sequences of token ids.

    Example:
        >>> label_token_data([[7], [9]])["label_ids"].tolist()
        [7, 9]
        >>> d = label_token_data([[7, 8], [9]])
        >>> d["label_ids"].tolist(), d["label_mask"].tolist()
        ([[7, 8], [9, 0]], [[1, 1], [1, 0]])
    """
    rows = [[int(i) for i in t] for t in tokens]
    if not rows or any(not r for r in rows):
        raise ValueError(f"label_token_data: expected a non-empty token list per label, got "
                         f"{rows}.")
    if all(len(r) == 1 for r in rows):
        return {"label_ids": jnp.asarray([r[0] for r in rows], jnp.int32)}
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for k, r in enumerate(rows):
        ids[k, :len(r)], mask[k, :len(r)] = r, 1
    return {"label_ids": jnp.asarray(ids), "label_mask": jnp.asarray(mask)}


def _label_continuations(batch: dict, label_ids: jax.Array,
                         label_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(ids, mask)`` ``[B*K, T+L-1]``: row ``b`` continued by label ``k``'s tokens right after
    its last prompt token (``batch["index"]``), right padded. The last label token is never an
    input: only the states before each label token are read."""
    ids, mask, index = batch["ids"], batch["mask"], batch["index"]
    b, t = ids.shape
    k, width = label_ids.shape
    n = t + width - 1
    rel = jnp.arange(n)[None, :] - index[:, None] - 1            # [B, N]: offset into the label
    in_row = rel < 0
    col = jnp.clip(rel, 0, width - 1)
    feed = (rel >= 0) & (rel < width - 1)                         # label tokens that are inputs
    tok = jnp.take(label_ids, col, axis=1)                        # [K, B, N]
    ok = (jnp.take(label_mask, col, axis=1) > 0) & feed[None]
    pad = ((0, 0), (0, n - t))
    row_ids, row_mask = jnp.pad(ids, pad)[None], jnp.pad(mask, pad)[None]
    all_ids = jnp.where(in_row[None], row_ids, jnp.where(ok, tok, 0))
    all_mask = jnp.where(in_row[None], row_mask, ok.astype(row_mask.dtype))
    # [K, B, N] -> [B, K, N] -> [B*K, N]: the K continuations of a row are neighbours.
    return (jnp.swapaxes(all_ids, 0, 1).reshape(b * k, n).astype(jnp.int32),
            jnp.swapaxes(all_mask, 0, 1).reshape(b * k, n))


def decoder_label_scores(prompt: jax.Array, frozen: Any, batch: dict, *,
                         config: llama.LlamaConfig, pez: bool = False,
                         reduction: str = "sum") -> jax.Array:
    """Label scores ``[B, K]`` float32: the sum (or mean) of each label's token
    log-probabilities (over the whole vocabulary) after each row's prompt.

    With ``frozen["label_ids"]`` of shape ``[K]`` (every label one token, see
    :func:`label_token_data`) one hidden state per row is read: the score is
    ``log_softmax(logits)[label]`` at the answer position. With ``[K, L]`` ids and
    ``frozen["label_mask"]``, each row is continued by every label's tokens (teacher forcing,
    ``B*K`` rows of ``T+L-1`` tokens in one forward pass) and label token ``j`` is scored at the
    state before it. A softmax over the ``K`` scores is the model's distribution over the labels.

    Args:
        prompt: ``[P, H]``.
        frozen: ``{"model": llama params, "label_ids": [K] | [K, L] int32}`` (+ ``"label_mask"``
            ``[K, L]`` with ``[K, L]`` ids).
        batch: ``{"ids": [B, T] right padded, "mask": [B, T], "index": [B]}``; ``index`` is the
            position of each row's last prompt token.
        config: the decoder's static configuration.
        pez: use the straight-through projection of the prompt.
        reduction: ``"sum"`` (the label's log-probability) or ``"mean"`` (per token, which does
            not favour short labels). Equal for single-token labels.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> frozen = {"model": llama.random_params(jax.random.key(0), cfg),
        ...           **label_token_data([[3, 4], [5]])}
        >>> batch = {"ids": jnp.ones((2, 4), jnp.int32), "mask": jnp.ones((2, 4), jnp.int32),
        ...          "index": jnp.array([3, 1])}
        >>> s = decoder_label_scores(jnp.zeros((2, 8)), frozen, batch, config=cfg)
        >>> s.shape, bool((s < 0).all())
        ((2, 2), True)
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"decoder_label_scores: expected reduction 'sum' or 'mean', got "
                         f"{reduction!r}.")
    params, label_ids = frozen["model"], frozen["label_ids"]
    p = prompt.shape[0]
    if label_ids.ndim == 1:  # every label one token: one state per row
        h = decoder_hidden(prompt, params, batch["ids"], batch["mask"], config=config, pez=pez)
        at = jnp.take_along_axis(h, (batch["index"] + p)[:, None, None], axis=1)[:, 0]
        logits = output_logits(params, at, config)                               # [B, V]
        return jnp.take(logits, label_ids, axis=1) - jax.nn.logsumexp(logits, -1, keepdims=True)
    label_mask = frozen["label_mask"]
    k, width = label_ids.shape
    b = batch["ids"].shape[0]
    ids, mask = _label_continuations(batch, label_ids, label_mask)
    h = decoder_hidden(prompt, params, ids, mask, config=config, pez=pez)     # [B*K, P+N, H]
    # The state at position index + j (after the prompt) predicts label token j.
    at = p + batch["index"][:, None] + jnp.arange(width)[None, :]              # [B, L]
    at = jnp.repeat(at, k, axis=0)                                             # [B*K, L]
    states = jnp.take_along_axis(h, at[..., None], axis=1)                     # [B*K, L, H]
    logits = output_logits(params, states, config)                             # [B*K, L, V]
    target = jnp.broadcast_to(label_ids[None], (b, k, width)).reshape(b * k, width)
    picked = jnp.take_along_axis(logits, target[..., None], axis=-1)[..., 0]
    logp = (picked - jax.nn.logsumexp(logits, axis=-1)).reshape(b, k, width)
    weight = label_mask.astype(jnp.float32)[None]
    total = (logp * weight).sum(-1)
    if reduction == "mean":
        total = total / jnp.maximum(weight.sum(-1), 1.0)
    return total


def _weighted_ce(logits: jax.Array, batch: dict) -> tuple[jax.Array, dict]:
    target = batch["target"]
    weight = batch.get("weight", jnp.ones(target.shape, jnp.float32)).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, target[:, None], axis=-1)[:, 0]
    total = jnp.maximum(weight.sum(), 1e-9)
    loss = (nll * weight).sum() / total
    correct = (jnp.argmax(logits, -1) == target).astype(jnp.float32)
    return loss, {"accuracy": (correct * weight).sum() / total, "count": weight.sum()}


def decoder_classification_loss(prompt: jax.Array, frozen: Any, batch: dict, *,
                                config: llama.LlamaConfig, pez: bool = False,
                                reduction: str = "sum"):
    """Cross-entropy over the labels: a softmax over the label scores of
    :func:`decoder_label_scores` (``reduction`` as there; with single-token labels the raw
    label-word logits of :func:`decoder_label_logits`, which give the same softmax);
    ``batch["target"] [B]`` is the class index and the optional ``batch["weight"] [B]`` zeroes
    padding rows.

    Returns:
        ``(loss, {"accuracy", "count"})``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> frozen = {"model": llama.random_params(jax.random.key(0), cfg),
        ...           "label_ids": jnp.array([3, 5])}
        >>> batch = {"ids": jnp.ones((2, 4), jnp.int32), "mask": jnp.ones((2, 4), jnp.int32),
        ...          "index": jnp.array([3, 3]), "target": jnp.array([0, 1])}
        >>> loss, m = decoder_classification_loss(jnp.zeros((2, 8)), frozen, batch, config=cfg)
        >>> bool(loss > 0), float(m["count"])
        (True, 2.0)
    """
    if frozen["label_ids"].ndim == 1:  # the softmax over labels ignores the vocabulary norm
        logits = decoder_label_logits(prompt, frozen, batch, config=config, pez=pez)
    else:
        logits = decoder_label_scores(prompt, frozen, batch, config=config, pez=pez,
                                      reduction=reduction)
    return _weighted_ce(logits, batch)


def decoder_lm_loss(prompt: jax.Array, frozen: Any, batch: dict, *,
                    config: llama.LlamaConfig, pez: bool = False):
    """Masked causal-LM loss with the prompt in front (PEFT's prompt-tuning objective).

    Args:
        prompt: ``[P, H]``.
        frozen: ``{"model": llama params}``.
        batch: ``{"ids": [B, T], "mask": [B, T], "labels": [B, T]}``, labels ``-100`` where no
            loss is wanted (the instruction part, padding); optionally ``"label_positions"``
            and ``"label_valid"`` ``[B, K]`` (from
            :func:`langtorch.functional.prompt_tuning.label_positions`): the label columns, so
            that only ``B*K`` hidden states go through the output head instead of ``B*T``.
        config: static decoder configuration.
        pez: use the straight-through projection of the prompt.

    Returns:
        ``(loss, {"tokens": number of labelled tokens})``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> frozen = {"model": llama.random_params(jax.random.key(0), cfg)}
        >>> ids = jnp.array([[1, 2, 3]])
        >>> batch = {"ids": ids, "mask": jnp.ones_like(ids), "labels": jnp.array([[-100, 2, 3]])}
        >>> int(decoder_lm_loss(jnp.zeros((2, 8)), frozen, batch, config=cfg)[1]["tokens"])
        2
    """
    params = frozen["model"]
    h = decoder_hidden(prompt, params, batch["ids"], batch["mask"], config=config, pez=pez)
    p = prompt.shape[0]
    target = jnp.asarray(batch["labels"])
    t = target.shape[1]
    # Hidden state j predicts token j + 1, so the states p-1 .. p+T-2 predict labels 0 .. T-1
    # (the prompt's other states predict nothing labelled and never reach the head).
    if p > 0:
        h = h[:, p - 1:p + t - 1]
    else:  # no state predicts token 0
        h = jnp.pad(h[:, :t - 1], ((0, 0), (1, 0), (0, 0)))
        target = target.at[:, 0].set(IGNORE_INDEX)
    if "label_positions" in batch:
        # Only the labelled states reach the 49k-wide head: [B, K] label columns.
        pos = batch["label_positions"]
        h = jnp.take_along_axis(h, pos[..., None], axis=1)
        target = jnp.where(batch["label_valid"] > 0, jnp.take_along_axis(target, pos, axis=1),
                           IGNORE_INDEX)
    loss, count = token_cross_entropy(params, h, target, config=config)
    return loss, {"tokens": count.astype(jnp.float32)}


def output_logits(params: Any, hidden: jax.Array, config: Any = None) -> jax.Array:
    """Vocabulary logits ``[..., V]`` in float32 from hidden states ``[..., H]`` (the tied
    embedding when the model has no ``lm_head``), accumulated in float32 for bf16 weights, whose
    backward products stay bf16 x bf16 -> f32 (:func:`~langtorch.functional.models.matmul.dense_f32`);
    soft-capped when ``config`` has ``final_softcap`` (Gemma 2).

    Example:
        >>> import jax.numpy as jnp
        >>> output_logits({"embed": jnp.eye(3)}, jnp.ones((1, 1, 3))).tolist()
        [[[1.0, 1.0, 1.0]]]
    """
    if "lm_head" in params:
        return softcap_logits(dense_f32(hidden, params["lm_head"].astype(hidden.dtype)), config)
    return softcap_logits(dense_f32(hidden, params["embed"].astype(hidden.dtype).T), config)


def token_cross_entropy(params: Any, hidden: jax.Array, target: jax.Array,
                        ignore_index: int = IGNORE_INDEX, *, config: Any = None
                        ) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy of ``target [B, K]`` under the logits of ``hidden [B, K, H]`` (no
    shift: ``hidden[:, k]`` predicts ``target[:, k]``); ``(loss, count)``, loss 0 if empty.
    ``config`` (the decoder's) soft-caps the logits as the model does (Gemma 2).

    Example:
        >>> import jax.numpy as jnp
        >>> loss, n = token_cross_entropy({"embed": jnp.zeros((5, 2))}, jnp.ones((1, 2, 2)),
        ...                               jnp.array([[3, -100]]))
        >>> round(float(loss), 4), int(n)     # uniform over 5 tokens
        (1.6094, 1)
    """
    logits = output_logits(params, hidden, config)
    valid = target != ignore_index
    nll = _nll(logits, jnp.where(valid, target, 0).astype(jnp.int32))
    count = valid.sum()
    return jnp.where(valid, nll, 0.0).sum() / jnp.maximum(count, 1), count


# The negative log-likelihood of one target per row of float32 logits [..., V], with a VJP that
# writes the logits' cotangent in one elementwise pass, softmax(logits) - onehot(target), scaled
# by the incoming cotangent. Autodiff of logsumexp - take_along_axis instead keeps the exp of
# the logits from the forward pass and scatters the one-hot into a zero [..., V] array: four
# more passes over the B*T*49k logits (profile_prompt_tuning.py: the LM head's backward).
@jax.custom_vjp
def _nll(logits: jax.Array, target: jax.Array) -> jax.Array:
    return _nll_fwd(logits, target)[0]


def _nll_fwd(logits, target):
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, target[..., None], axis=-1)[..., 0]
    return lse - picked, (logits, target, lse)


def _nll_bwd(res, g):
    logits, target, lse = res
    onehot = jnp.arange(logits.shape[-1], dtype=jnp.int32) == target[..., None]
    d = (jnp.exp(logits - lse[..., None]) - onehot.astype(logits.dtype)) * g[..., None]
    return d.astype(logits.dtype), None


_nll.defvjp(_nll_fwd, _nll_bwd)


# ------------------------------------------------------------------------------------ encoder


def encoder_inputs(prompt: jax.Array, word: jax.Array, ids: jax.Array, mask: jax.Array, *,
                   pez: bool = False) -> tuple[jax.Array, jax.Array]:
    """``(inputs_embeds [B, P+T, H], mask [B, P+T])`` with the prompt right after ``[CLS]``.

    ``ids`` start with ``[CLS]`` (as a WordPiece tokenizer emits them); keeping ``[CLS]`` first
    keeps the input shaped like BERT's pre-training data.

    Example:
        >>> import jax.numpy as jnp
        >>> e, m = encoder_inputs(jnp.ones((2, 3)), jnp.zeros((5, 3)),
        ...                       jnp.array([[1, 4, 2]]), jnp.array([[1, 1, 1]]))
        >>> e[0, :, 0].tolist(), m.tolist()
        ([0.0, 1.0, 1.0, 0.0, 0.0], [[1, 1, 1, 1, 1]])
    """
    if pez:
        prompt = straight_through_project(prompt, word)
    tok = jnp.take(word, ids, axis=0)
    rest, rest_mask = prepend_soft_prompt(prompt, tok[:, 1:], mask[:, 1:])
    return (jnp.concatenate([tok[:, :1], rest], axis=1),
            jnp.concatenate([mask[:, :1], rest_mask], axis=1))


def encoder_label_logits(prompt: jax.Array, frozen: Any, batch: dict, *,
                         config: bert.BertConfig, scale: float = 20.0,
                         pez: bool = False) -> jax.Array:
    """Scaled cosine similarities ``[B, K]`` between each prompted sentence embedding and the
    ``K`` frozen label embeddings (MiniLM: mean pooling, L2 normalisation).

    Args:
        prompt: ``[P, H]``.
        frozen: ``{"model": bert params, "label_vectors": [K, H] unit vectors}`` (e.g. the
            embeddings of the label names, or class centroids).
        batch: ``{"ids": [B, T] (starting with [CLS]), "mask": [B, T]}``.
        config: the encoder's static configuration.
        scale: inverse temperature of the softmax over labels.
        pez: use the straight-through projection of the prompt.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import bert
        >>> cfg = bert.BertConfig(vocab_size=20, hidden_size=4, num_layers=1, num_heads=1,
        ...                       intermediate_size=8, max_positions=16)
        >>> frozen = {"model": bert.random_params(jax.random.key(0), cfg),
        ...           "label_vectors": jnp.eye(4)[:2]}
        >>> b = {"ids": jnp.array([[1, 5, 2]]), "mask": jnp.ones((1, 3), jnp.int32)}
        >>> encoder_label_logits(jnp.zeros((2, 4)), frozen, b, config=cfg).shape
        (1, 2)
    """
    params = frozen["model"]
    embeds, mask = encoder_inputs(prompt, params["embeddings"]["word"], batch["ids"],
                                  batch["mask"], pez=pez)
    h = bert.encode(params, None, mask, inputs_embeds=embeds, config=config).astype(jnp.float32)
    m = mask.astype(jnp.float32)[..., None]
    pooled = (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
    pooled = pooled * jax.lax.rsqrt(jnp.maximum(jnp.sum(pooled**2, -1, keepdims=True), 1e-12))
    return scale * pooled @ frozen["label_vectors"].astype(jnp.float32).T


def encoder_classification_loss(prompt: jax.Array, frozen: Any, batch: dict, *,
                                config: bert.BertConfig, scale: float = 20.0,
                                pez: bool = False):
    """Cross-entropy over :func:`encoder_label_logits` (``batch["target"]``, optional
    ``batch["weight"]``).

    Returns:
        ``(loss, {"accuracy", "count"})``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import bert
        >>> cfg = bert.BertConfig(vocab_size=20, hidden_size=4, num_layers=1, num_heads=1,
        ...                       intermediate_size=8, max_positions=16)
        >>> frozen = {"model": bert.random_params(jax.random.key(0), cfg),
        ...           "label_vectors": jnp.eye(4)[:2]}
        >>> b = {"ids": jnp.array([[1, 5, 2]]), "mask": jnp.ones((1, 3), jnp.int32),
        ...      "target": jnp.array([1])}
        >>> float(encoder_classification_loss(jnp.zeros((2, 4)), frozen, b, config=cfg)[1]["count"])
        1.0
    """
    logits = encoder_label_logits(prompt, frozen, batch, config=config, scale=scale, pez=pez)
    return _weighted_ce(logits, batch)
