"""Evaluation and prediction for :class:`~langtorch.tuning.PromptTuner`.

Which prompt the model sees (``"soft"``, ``"hard"``, ``"none"``), the label logits of a set of
rows, the validation loss and accuracy of :meth:`fit` and :meth:`evaluate`, and classification
for :meth:`predict` (generation goes through the model's decode engine, in ``_tuner.py``).

The jitted functions are module-level and take the frozen weights and the config as arguments,
so every tuner of a model shares their compiled programs; a decoder's label logits are
:func:`langtorch.models.label_logits`, the scorer ``LocalClassifier`` and ``TokenSearch`` use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional import losses as L
from langtorch.models import label_logits as shared_label_logits
from langtorch.tensor import TextTensor
from langtorch.tuning import _data as D
from langtorch.tuning._errors import PromptTuningError

if TYPE_CHECKING:
    from langtorch.tuning._tuner import PromptTuner

_encoder_label_logits = jax.jit(L.encoder_label_logits, static_argnames=("config", "scale", "pez"))
_lm_loss = jax.jit(L.decoder_lm_loss, static_argnames=("config", "pez"))


def prompt_for(t: PromptTuner, mode: str, prompt: Any = None) -> tuple[jax.Array, str]:
    """The prompt the model sees in ``mode`` (the PEZ projection of ``prompt``, default the
    tuner's own, for a PEZ tuner), and the text put before the template."""
    if mode == "soft":
        prompt = t.prompt if prompt is None else prompt
        return (L.straight_through_project(prompt, t._table) if t.pez else prompt), ""
    if mode == "hard":
        return jnp.zeros((0, t.hidden), jnp.float32), t.hard_prompt()
    if mode == "none":
        return jnp.zeros((0, t.hidden), jnp.float32), ""
    raise PromptTuningError(f"PromptTuner: expected prompt 'soft', 'hard' or 'none', got "
                            f"{mode!r}.")


def label_logits(t: PromptTuner, rows: list[tuple], prompt: Any) -> np.ndarray:
    """``[N, K]`` label scores of classification ``rows`` with ``prompt`` in front (a decoder:
    the label words' log-probabilities, see :func:`langtorch.models.label_logits`; an encoder:
    scaled cosine similarities); a softmax over them is the distribution over labels."""
    out = np.zeros((len(rows), len(t.labels)), np.float32)
    frozen = t.frozen
    cfg = t.model.config
    for idx, b in D.eval_batches(t, rows):
        b = {k: v for k, v in b.items() if k not in ("target", "weight")}
        if t.kind == "decoder":
            logits = shared_label_logits(prompt, frozen, b, config=cfg,
                                         reduction=t.label_reduction)
        else:
            logits = _encoder_label_logits(prompt, frozen, b, config=cfg, scale=t.scale)
        out[idx] = np.asarray(logits)[:len(idx)]
    return out


def evaluate_rows(t: PromptTuner, rows: list[tuple], prompt: Any = None) -> dict:
    """``{"loss", "accuracy"}`` (classification) or ``{"loss"}`` (generation: the mean loss
    per target token) of labelled ``rows``."""
    prompt = t.prompt if prompt is None else prompt
    if t.labels is not None:
        logits = label_logits(t, rows, prompt)
        target = np.array([e[2] for e in rows])
        logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        return {"loss": float(-logp[np.arange(len(target)), target].mean()),
                "accuracy": float((logits.argmax(1) == target).mean())}
    total, count = 0.0, 0.0
    for _, b in D.eval_batches(t, rows, 8):
        loss, aux = _lm_loss(prompt, t.frozen, b, config=t.model.config, pez=t.pez)
        total += float(loss) * float(aux["tokens"])
        count += float(aux["tokens"])
    return {"loss": total / max(count, 1.0)}


def classify(t: PromptTuner, xs: list[str], shape: tuple[int, ...], prompt: Any,
             prefix: str) -> TextTensor:
    """The labels of ``xs`` as a TextTensor of ``shape``, with ``metadata["confidence"]``."""
    logits = label_logits(t, D.examples(t, xs, None, prefix, prompt.shape[0]), prompt)
    probs = np.exp(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True))
    out = [t.labels[i] for i in logits.argmax(1)]
    conf = probs.max(1).reshape(shape)
    return TextTensor(np.array(out, dtype=object).reshape(shape).tolist() if shape
                      else out[0], metadata={"confidence": conf}, template=False)
