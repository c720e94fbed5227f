"""``LocalClassifier``: label-word scoring on a local decoder (SmolLM2) as a text module.

Each entry of the input is a full prompt. It becomes the user turn of the model's chat template
(or is used as is with ``chat_template=False``), and each label is scored by the
log-probability of its label word at the start of the assistant's answer: the sum (or mean) of
the word's token log-probabilities, teacher-forced, so ``"billing"`` (two tokens in SmolLM2's
vocabulary) is scored whole. The prediction is the label with the highest score. When every
label word is one token, one state per row gives all the scores (the single-token fast path).
This is the scoring :class:`langtorch.tuning.PromptTuner` uses
for its zero-shot baselines (same encoding, same bucket policy, the same jitted scorer
:func:`langtorch.models.label_logits`), so a prompt scores the same here and
in ``PromptTuner.evaluate(..., prompt="none")``.

As a module it makes prompt candidates cheap to compare with the text optimizers: put it
behind a :class:`~langtorch.TLayer` and ``lt.func.functional_call(layer, {"prompt": cands}, x)``
scores a ``[P] x [N]`` grid in one batched pass (rows sorted by length, padded to the shared
length buckets, a fixed batch), with no generation and no parsing. ``forward_passes`` counts the
rows the model scored, the unit benchmarks compare optimizers at.

Example:
    >>> import langtorch as lt
    >>> from langtorch.nn.classify import LocalClassifier
    >>> clf = LocalClassifier(["negative", "positive"])                       # doctest: +SKIP
    >>> layer = lt.TLayer("Is this review positive or negative? {}", clf)      # doctest: +SKIP
    >>> layer(lt.TextTensor(["I loved it.", "Cold soup, rude staff."])).tolist()  # doctest: +SKIP
    ['positive', 'negative']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.autograd import identity_index, record_node
from langtorch.functional import prompt_tuning as PT
from langtorch.functional.losses import label_token_data
from langtorch.models import label_logits, resolve_model
from langtorch.nn.modules import TModule
from langtorch.tensor import TextTensor

__all__ = ["LocalClassifier"]

_MIN_BATCH = 8  # the smallest batch a call's last, partial batch is padded to


def _batch_rows(n: int, batch_size: int) -> int:
    """Rows a batch of ``n <= batch_size`` real rows is padded to: the smallest ``8 * 2**k``
    that holds them, at most ``batch_size`` (a small call does not pay for a full batch)."""
    b = _MIN_BATCH
    while b < n:
        b *= 2
    return min(b, batch_size)



def distinct_labels(labels: Any, owner: str) -> list[str]:
    """``labels`` as a list of at least two distinct str (ValueError naming ``owner`` otherwise).

    Example:
        >>> distinct_labels(["neg", "pos"], "Me")
        ['neg', 'pos']
    """
    labels = [str(x) for x in labels]
    if len(labels) < 2:
        raise ValueError(f"{owner}: expected at least two labels, got {labels}.")
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ValueError(f"{owner}: labels must be distinct; repeated: {repeated}.")
    return labels

class LocalClassifier(TModule):
    """Classify each prompt by the local model's log-probability of one label word per label.

    Args:
        labels: the label set (distinct, non-empty strings); outputs are these strings.
        model: a local decoder as :func:`langtorch.models.resolve_model` accepts it (a
            :class:`langtorch.models.SmolLM2`, a :class:`~langtorch.backends.LocalBackend`, an
            ``lt.nn.LLM`` on one, or any object with Llama ``params``, ``config``, ``encode``,
            ``decode``, and ``apply_chat_template`` with ``chat_template``); default: the
            process-wide SmolLM2.
        label_words: the word the model should answer with for each label (default: the labels;
            with ``chat_template=False``, ``" " + label``). A word of several tokens is scored
            by all of them (``label_reduction``); the words must tokenize differently.
        chat_template: put each prompt into the model's chat template as the user turn and read
            the logits at the start of the assistant's answer (as PromptTuner's ``chat=True``).
        system: system prompt of the chat (default: the template's own, for SmolLM2 "You are a
            helpful AI assistant named SmolLM, ...").
        batch_size: rows per jitted call; a call's last batch is padded to the smallest of 8, 16,
            ... that holds it.
        dtype: ``"float32"`` or ``"bfloat16"`` weights for scoring.
        length_buckets: padded sequence lengths (the shared bucket policy of
            :mod:`langtorch.functional.prompt_tuning`).
        label_reduction: a multi-token label word's score: ``"sum"`` of its token
            log-probabilities (the word's log-probability) or their ``"mean"`` (does not favour
            shorter words). Single-token words score the same either way.

    Attributes:
        forward_passes: rows scored by the model so far (identical prompts within one call are
            scored once); reset it to 0 to meter a run.
        calls: number of jitted model calls so far.
        label_tokens: the token ids of each label word.
        label_ids: the ``[K]`` first-token ids of the label words.

    Shape:
        ``forward(prompts)``: any shape in, the same shape out. Metadata: ``label_logprobs`` and
        ``label_probs`` (per entry a float32 array ``[K]`` in label order, log-softmax / softmax
        over the ``K`` label scores only), ``confidence`` (the winning label's probability).
        :meth:`logits` gives the label scores ``[..., K]`` (log-probabilities over the whole
        vocabulary).

    Raises:
        ValueError: no labels, repeated labels, a label-word count that is not one per label, an
            empty label word, label words that tokenize the same (named), a ``label_reduction``
            other than ``"sum"``/``"mean"``, or a prompt (with its label tokens) longer than the
            model's context.
        TypeError: labels given as one string, or a ``model`` that is not a local decoder
            (the message lists what :func:`langtorch.models.resolve_model` accepts).

    Example:
        >>> import langtorch as lt
        >>> from langtorch.nn.classify import LocalClassifier
        >>> clf = LocalClassifier(["negative", "positive"])                      # doctest: +SKIP
        >>> out = clf(lt.TextTensor(["Is 'I loved it' positive or negative?"]))  # doctest: +SKIP
        >>> out.tolist(), out.metadata["label_probs"][0].round(2)              # doctest: +SKIP
        (['positive'], array([0.08, 0.92], dtype=float32))
        >>> layer = lt.TLayer("Sentiment (positive/negative) of: {}", clf)       # doctest: +SKIP
        >>> cands = lt.TextTensor(["Sentiment of: {}", "Is this review good or bad? {}"])  # doctest: +SKIP
        >>> lt.func.functional_call(layer, {"prompt": cands}, lt.TextTensor(["a", "b", "c"])).shape  # doctest: +SKIP
        (2, 3)
    """

    def __init__(self, labels: Sequence[str], *, model: Any = None,
                 label_words: Sequence[str] | None = None, chat_template: bool = True,
                 system: str | None = None, batch_size: int = 32, dtype: str = "float32",
                 length_buckets: Sequence[int] = PT.DEFAULT_LENGTH_BUCKETS,
                 label_reduction: str = "sum"):
        super().__init__()
        if isinstance(labels, str):
            raise TypeError(f"LocalClassifier: labels must be a sequence of str, got the string "
                            f"{labels!r}; write labels=[{labels!r}, ...]")
        labels = distinct_labels(labels, "LocalClassifier")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"LocalClassifier: batch_size must be a positive int, got {batch_size!r}.")
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"LocalClassifier: expected dtype 'float32' or 'bfloat16', got {dtype!r}.")
        if label_reduction not in ("sum", "mean"):
            raise ValueError(f"LocalClassifier: expected label_reduction 'sum' or 'mean', got "
                             f"{label_reduction!r}.")
        self.label_reduction = label_reduction
        self.labels = labels
        self.chat_template = bool(chat_template)
        self.system = system
        self.batch_size = batch_size
        self.dtype = dtype
        self.length_buckets = tuple(int(b) for b in length_buckets)
        self.model = resolve_model(model, decoder=True, chat=self.chat_template,
                                   owner="LocalClassifier")
        if label_words is None:
            label_words = labels if self.chat_template else [" " + x for x in labels]
        self.label_words = [str(w) for w in label_words]
        if len(self.label_words) != len(labels):
            raise ValueError(f"LocalClassifier: expected one label word per label ({len(labels)}), "
                             f"got {len(self.label_words)}: {self.label_words}.")
        self.label_tokens = self._label_tokens()
        self.label_ids = [t[0] for t in self.label_tokens]
        jd = jnp.float32 if dtype == "float32" else jnp.bfloat16
        self._params = jax.tree.map(lambda a: jnp.asarray(a, jd), self.model.params)
        self._frozen = {"model": self._params, **label_token_data(self.label_tokens)}
        # A multi-token label feeds its tokens after the first to the model after the prompt.
        self._extra = max(len(t) for t in self.label_tokens) - 1
        self._empty = jnp.zeros((0, int(self._params["embed"].shape[1])), jnp.float32)
        self.context = int(self.model.config.max_positions)
        self.pad_id = int(getattr(self.model, "pad_id", 0) or 0)
        self.forward_passes = 0
        self.calls = 0

    # ------------------------------------------------------------------ setup
    def _label_tokens(self) -> list[list[int]]:
        tokens: list[list[int]] = []
        for label, word in zip(self.labels, self.label_words):
            toks = [int(i) for i in self.model.encode(word)] if word else []
            if not toks:
                raise ValueError(f"LocalClassifier: the label word for {label!r} is empty ({word!r}); "
                                 "give a word the model can answer with.")
            if toks in tokens:
                k = tokens.index(toks)
                raise ValueError(
                    f"LocalClassifier: label words {self.label_words[k]!r} (label "
                    f"{self.labels[k]!r}) and {word!r} (label {label!r}) are the same tokens "
                    f"{toks}, so they cannot be told apart. Pass label_words=[...] that differ.")
            tokens.append(toks)
        return tokens

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str) -> list[int]:
        """Token ids of one prompt as scored (chat-templated when ``chat_template``); the label
        logits are read at the last id.

        Example:
            >>> from langtorch.nn.classify import LocalClassifier
            >>> clf = LocalClassifier(["no", "yes"])                  # doctest: +SKIP
            >>> clf.model.decode(clf.encode("Is water wet?"))[-30:]   # doctest: +SKIP
            'user\\nIs water wet?\\nassistant\\n'
        """
        if self.chat_template:
            msgs = [{"role": "system", "content": self.system}] if self.system else []
            msgs.append({"role": "user", "content": text})
            return list(self.model.encode(self.model.apply_chat_template(msgs)))
        return list(self.model.encode(text))

    # ------------------------------------------------------------------ scoring
    def logits(self, prompts: Any) -> np.ndarray:
        """Label scores ``[..., K]`` (float32) for prompts of any shape: each label word's
        log-probability after the prompt (the sum or mean of its tokens', ``label_reduction``).

        Example:
            >>> from langtorch.nn.classify import LocalClassifier
            >>> LocalClassifier(["no", "yes"]).logits(["Is water wet?"]).shape  # doctest: +SKIP
            (1, 2)
        """
        x = prompts if isinstance(prompts, TextTensor) else TextTensor(prompts, template=False)
        flat = [str(s) for s in np.asarray(x.texts).reshape(-1).tolist()]
        unique = list(dict.fromkeys(flat))
        rows = []
        for text in unique:
            ids = self.encode(text)
            if len(ids) + self._extra > self.context:
                extra = (f" (+ {self._extra} label tokens read after it)" if self._extra else "")
                raise ValueError(f"LocalClassifier: prompt {flat.index(text)} is {len(ids)} tokens"
                                 f"{extra}, more than the model's context of {self.context} (it "
                                 f"starts {text[:60]!r}); shorten it.")
            rows.append(ids)
        scores = self._score(rows)
        at = {t: i for i, t in enumerate(unique)}
        out = scores[[at[t] for t in flat]] if flat else scores
        return out.reshape(x.shape + (len(self.labels),))

    def _score(self, rows: list[list[int]]) -> np.ndarray:
        """Scores ``[R, K]`` of token rows: sorted by length, batched, padded to buckets."""
        k = len(self.labels)
        out = np.zeros((len(rows), k), np.float32)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            group = [rows[i] for i in idx]
            length = PT.bucket(max(len(r) for r in group), self.length_buckets)
            ids, mask = PT.pad_rows(group, self.pad_id, length=length,
                                    batch_size=_batch_rows(len(group), self.batch_size))
            index = np.zeros(ids.shape[0], np.int32)
            index[:len(group)] = [len(r) - 1 for r in group]
            batch = {"ids": ids, "mask": mask, "index": index}
            logits = np.asarray(label_logits(self._empty, self._frozen, batch,
                                             config=self.model.config,
                                             reduction=self.label_reduction))
            out[idx] = logits[:len(group)]
            self.forward_passes += len(group)
            self.calls += 1
        return out

    def forward(self, prompts: Any) -> TextTensor:
        x = prompts if isinstance(prompts, TextTensor) else TextTensor(prompts, template=False)
        logits = self.logits(x)
        logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        probs = np.exp(logp)
        best = logits.argmax(-1)
        names = np.asarray(self.labels, dtype=object)[best]
        out = TextTensor(names.tolist() if x.shape else str(names), template=False)
        out.metadata["label_logprobs"] = _per_entry(logp)
        out.metadata["label_probs"] = _per_entry(probs)
        out.metadata["confidence"] = probs.max(-1)
        record_node("classify", out, [(x, identity_index(x.shape), "input")],
                    attrs={"labels": list(self.labels), "label_words": list(self.label_words),
                           "model": getattr(self.model, "name", type(self.model).__name__)})
        return out

    def extra_repr(self) -> str:
        return (f"labels={self.labels}, label_words={self.label_words}, "
                f"label_reduction={self.label_reduction!r}, chat_template={self.chat_template}, model={getattr(self.model, 'name', '?')}")


def _per_entry(a: np.ndarray) -> np.ndarray:
    """An object array of the leading shape whose entries are the ``[K]`` rows of ``a``."""
    col = np.empty(a.shape[:-1], dtype=object)
    for i in np.ndindex(*a.shape[:-1]):
        col[i] = a[i].astype(np.float32)
    return col
