"""Setting up a :class:`~langtorch.tuning.PromptTuner`: the checked options, the frozen weights
as the losses see them, the label data, the initial prompt and the loss of the tuner's mode."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional import losses as L
from langtorch.functional import sharding as S
from langtorch.functional.soft_prompt import init_soft_prompt, init_soft_prompt_from_vocab
from langtorch.tuning._data import is_int
from langtorch.tuning._errors import PromptTuningError

if TYPE_CHECKING:
    from langtorch.tuning._tuner import PromptTuner


def check_options(*, n_tokens: int, labels: list[str] | None, kind: str,
                  steps_per_call: Any, dtype: str, label_reduction: Any = "sum") -> None:
    """Refuse options no tuner can run with (before any weight is copied)."""
    if label_reduction not in ("sum", "mean"):
        raise PromptTuningError(f"PromptTuner: expected label_reduction 'sum' or 'mean', got "
                                f"{label_reduction!r}.")
    if n_tokens < 0:
        raise PromptTuningError(f"PromptTuner: expected n_tokens >= 0, got {n_tokens}.")
    if labels is not None and (len(labels) < 2 or len(set(labels)) != len(labels)):
        raise PromptTuningError(f"PromptTuner: expected at least two distinct labels, got "
                                f"{labels}.")
    if kind == "encoder" and labels is None:
        raise PromptTuningError("PromptTuner: a MiniLM (encoder) model can only classify; "
                                "pass labels=[...].")
    if not is_int(steps_per_call) or steps_per_call < 1:
        raise PromptTuningError(f"PromptTuner: expected steps_per_call to be a positive "
                                f"integer, got {steps_per_call!r}.")
    if dtype not in ("float32", "bfloat16"):
        raise PromptTuningError(f"PromptTuner: expected dtype 'float32' or 'bfloat16', got "
                                f"{dtype!r}.")


def template_for(template: str | None, labels: list[str] | None, kind: str, chat: bool) -> str:
    """``template``, or the default of the mode; it must have exactly one ``{}``."""
    if template is None:
        template = "Input: {}\nLabel:" if (labels and kind == "decoder" and not chat) else "{}"
    if template.count("{}") != 1:
        raise PromptTuningError(f"PromptTuner: expected a template with exactly one '{{}}' "
                                f"placeholder, got {template!r}.")
    return template


def frozen_weights(params: Any, dtype: str, mesh: Any, shard_frozen: bool) -> Any:
    """The model's weights in ``dtype``, placed once on ``mesh`` (replicated, or split along
    its ``model`` axis with ``shard_frozen``) so every train call finds them in place."""
    jd = jnp.float32 if dtype == "float32" else jnp.bfloat16
    params = jax.tree.map(lambda a: jnp.asarray(a, jd), params)
    if mesh is not None:
        params = (S.shard_params if shard_frozen else S.replicate)(params, mesh, name="frozen")
    return params


def label_data(t: PromptTuner, label_words: Sequence[str] | None) -> tuple[Any, list | None]:
    """``(label data, label words)``: a decoder's label tokens as the scorer takes them
    (:func:`~langtorch.functional.losses.label_token_data`: ``{"label_ids": [K]}`` when every
    label word is one token, else ``[K, L]`` ids and a mask), an encoder's ``[K, H]`` label
    embeddings; ``(None, None)`` in generation mode."""
    if t.labels is None:
        return None, None
    if t.kind == "encoder":
        words = list(label_words) if label_words is not None else t.labels
        return jnp.asarray(np.asarray(t.model.embed_texts(words), np.float32)), words
    if label_words is None:
        label_words = t.labels if t.chat else [" " + x for x in t.labels]
    label_words = [str(w) for w in label_words]
    if len(label_words) != len(t.labels):
        raise PromptTuningError(f"PromptTuner: expected one label word per label "
                                f"({len(t.labels)}), got {len(label_words)}.")
    tokens: list[list[int]] = []
    for label, word in zip(t.labels, label_words):
        toks = [int(i) for i in t._encode(word)] if word else []
        if not toks:
            raise PromptTuningError(f"PromptTuner: the label word for {label!r} is empty "
                                    f"({word!r}); give a word the model can answer with.")
        if toks in tokens:
            other = label_words[tokens.index(toks)]
            raise PromptTuningError(
                f"PromptTuner: label words {other!r} and {word!r} are the same tokens {toks}; "
                "expected label words the model can tell apart.")
        tokens.append(toks)
    return (L.label_token_data(tokens), tokens), label_words


def init_prompt(t: PromptTuner) -> jax.Array:
    """The ``[P, H]`` float32 starting prompt of ``t.init`` (seeded by ``t.seed``)."""
    p, h = t.n_tokens, t.hidden
    if p == 0:
        return jnp.zeros((0, h), jnp.float32)
    key = jax.random.key(t.seed)
    table = t._table.astype(jnp.float32)
    if t.init == "vocab":
        # Sample among the first 5000 ids: common tokens, no byte-level or rare pieces.
        sub = table[: min(5000, table.shape[0])]
        return init_soft_prompt_from_vocab(key, sub, p)
    if t.init == "text":
        if not t.init_text:
            raise PromptTuningError("PromptTuner: init='text' needs init_text='...'.")
        ids = t._encode(t.init_text)
        if t.kind == "encoder":
            ids = ids[1:-1]  # drop [CLS]/[SEP]
        if not ids:
            raise PromptTuningError(f"PromptTuner: init_text {t.init_text!r} has no tokens.")
        ids = (ids * math.ceil(p / len(ids)))[:p]
        return jnp.take(table, jnp.asarray(ids), axis=0)
    if t.init == "random":
        rms = float(jnp.sqrt(jnp.mean(table[:5000] ** 2)))
        return init_soft_prompt(key, p, h, scale=rms)
    raise PromptTuningError(f"PromptTuner: expected init 'vocab', 'text' or 'random', got "
                            f"{t.init!r}.")


def loss_fn(t: PromptTuner) -> Callable:
    """The training loss of the tuner's mode: ``loss(prompt, frozen, batch)``."""
    cfg = t.model.config
    if t.kind == "encoder":
        return functools.partial(L.encoder_classification_loss, config=cfg, scale=t.scale,
                                 pez=t.pez)
    if t.labels is None:
        return functools.partial(L.decoder_lm_loss, config=cfg, pez=t.pez)
    return functools.partial(L.decoder_classification_loss, config=cfg, pez=t.pez,
                             reduction=t.label_reduction)
