"""What a tuned prompt becomes outside the tuner: a hard prompt (real tokens, as text or as a
template for any backend) and a PEFT ``PROMPT_TUNING`` adapter (the files are
:func:`langtorch.tuning.save_peft_adapter` / :func:`~langtorch.tuning.load_peft_adapter`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np

from langtorch.functional import prompt_tuning as PT
from langtorch.models import AdapterClassifier
from langtorch.tensor import TextTensor
from langtorch.tuning._errors import AdapterError, PromptTuningError
from langtorch.tuning._files import load_peft_adapter, save_peft_adapter

if TYPE_CHECKING:
    from langtorch.tuning._tuner import PromptTuner


def hard_prompt_ids(t: PromptTuner) -> list[int]:
    """Ids of the vocabulary tokens nearest to each virtual token (PEZ projection)."""
    if t.n_tokens == 0:
        return []
    return [int(i) for i in np.asarray(PT.nearest_tokens(t.prompt, t._table))]


def hard_template(t: PromptTuner, separator: str | None) -> TextTensor:
    """The hard prompt + ``separator`` + the template, as a template TextTensor."""
    if separator is not None and not isinstance(separator, str):
        raise PromptTuningError(f"PromptTuner.hard_template: expected separator to be a "
                                f"str, got {type(separator).__name__}.")
    sep = t.HARD_SEPARATOR if separator is None else separator
    hard = t.hard_prompt()
    if not hard:
        return TextTensor(t.template)
    hard = (hard + sep).replace("{", "{{").replace("}", "}}")
    return TextTensor(hard + t.template)


def classifier(t: PromptTuner) -> AdapterClassifier | None:
    """How ``predict`` classifies (a decoder in label mode), as an adapter records it; ``None``
    in generation mode and for an encoder (its labels are embeddings, not words to answer)."""
    if t.labels is None or t.kind != "decoder":
        return None
    return AdapterClassifier(
        labels=tuple(t.labels), label_words=tuple(t.label_words),
        label_tokens=tuple(tuple(int(i) for i in toks) for toks in t.label_tokens),
        template=t.template, chat=t.chat, system=t.system, reduction=t.label_reduction,
        dtype=t.dtype, pez=t.pez)


def save_adapter(t: PromptTuner, directory: str | Path) -> Path:
    """Write the tuner's prompt as a PEFT adapter for its model (with its label set)."""
    if t.n_tokens == 0:
        raise PromptTuningError("PromptTuner: n_tokens=0: there is no prompt to save.")
    cfg = t.model.config
    task = "FEATURE_EXTRACTION" if t.kind == "encoder" else "CAUSAL_LM"
    return save_peft_adapter(
        directory, np.asarray(t.prompt), task_type=task,
        base_model=getattr(t.model, "name", None),
        num_layers=int(cfg.num_layers), num_heads=int(cfg.num_heads),
        init_text=t.init_text if t.init == "text" else None, classifier=classifier(t))


def load_adapter(t: PromptTuner, directory: str | Path) -> None:
    """Make the adapter's prompt the tuner's (``prompt`` and ``n_tokens``)."""
    prompt, config = load_peft_adapter(directory)
    if prompt.shape[1] != t.hidden:
        raise AdapterError(f"adapter {directory}: prompt width {prompt.shape[1]} does not "
                           f"match the model's embedding width {t.hidden}; it was "
                           f"trained for another model ({config.get('base_model_name_or_path')}).")
    t.prompt = jnp.asarray(prompt, jnp.float32)
    t.n_tokens = int(prompt.shape[0])
