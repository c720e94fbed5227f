"""Answering a request to a classifier adapter the way ``PromptTuner.predict`` answers.

An adapter saved from a label-mode ``PromptTuner`` carries an
:class:`~langtorch.models.AdapterClassifier`. A request to it (without an explicit
``response_format``, ``guided_*`` or ``tools``: those ask for something else and are decoded as
usual) is not decoded token by token: its input text is put into the tuner's template (and chat
template) exactly as ``predict`` does, every label word is scored by the one shared label
scorer :func:`langtorch.models.label_logits` with the tuner's weights dtype and reduction, and
the answer is the label of the highest score. Greedy constrained decoding (``guided_choice``)
would pick the label token by token and can disagree with that argmax; scoring cannot.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from langtorch.errors import BadRequestError
from langtorch.models import AdapterClassifier

__all__ = ["OPT_OUT_KEYS", "Classification", "Scorer", "classifier_digest", "input_ids",
           "opts_out", "logprob_entry"]

OPT_OUT_KEYS = ("response_format", "guided_regex", "guided_choice", "guided_json", "tools")
"""A request that names any of these (even ``response_format={"type": "text"}``) is decoded
as usual on a classifier adapter: the explicit request wins over the adapter's labels."""


def opts_out(request: Mapping[str, Any]) -> bool:
    """Whether ``request`` asks for something other than the adapter's label.

    Example:
        >>> opts_out({"response_format": {"type": "text"}}), opts_out({"temperature": 0})
        (True, False)
    """
    return any(request.get(k) not in (None, [], ()) for k in OPT_OUT_KEYS)


def classifier_digest(c: AdapterClassifier) -> str:
    """A short digest of a classifier (for cache namespaces: a label answer and a free-text
    answer of the same prompt must not share a cache entry).

    Example:
        >>> from langtorch.models import AdapterClassifier
        >>> len(classifier_digest(AdapterClassifier(("a", "b"), ("a", "b"), ((1,), (2,)))))
        12
    """
    return hashlib.sha256(json.dumps(c.to_json(), sort_keys=True).encode()).hexdigest()[:12]


def _bad(param: str, message: str, code: str | None = None) -> BadRequestError:
    return BadRequestError(f"LocalBackend: {message}", param=param, code=code)


_SHAPE = ("a classifier adapter reads one input text, as PromptTuner.predict does: send one "
          "user message{system} (or a completion `prompt`), or ask for free text with "
          "response_format={{'type': 'text'}}")


def input_ids(llm: Any, c: AdapterClassifier, messages: list, raw_prompt: str | None) -> list[int]:
    """The token ids ``predict`` scores for the request's input text.

    The input text is the completion ``prompt`` or the content of the one ``user`` message. It
    fills ``c.template``; with ``c.chat`` that is the user turn of the chat template, after the
    request's ``system`` message if it has one, else after ``c.system`` (the tuner's).

    Raises:
        BadRequestError: messages other than ``[user]`` (``[system, user]`` with ``chat``).
    """
    system = c.system
    if raw_prompt is not None:
        text = raw_prompt
    else:
        roles = [m["role"] for m in messages]
        allowed = (["user"], ["system", "user"]) if c.chat else (["user"],)
        if roles not in [list(a) for a in allowed]:
            hint = _SHAPE.format(system=" (after one system message)" if c.chat else "")
            raise _bad("messages", f"got messages with roles {roles}; {hint}.")
        if roles[0] == "system":
            system = str(messages[0]["content"])
        text = str(messages[-1]["content"])
    filled = c.template.replace("{}", text)
    if not c.chat:
        return [int(i) for i in llm.encode(filled)]
    turns = ([{"role": "system", "content": system}] if system else [])
    turns.append({"role": "user", "content": filled})
    return [int(i) for i in llm.encode(llm.apply_chat_template(turns))]


def check_tokens(llm: Any, c: AdapterClassifier, where: str) -> None:
    """Refuse a classifier whose label words this model's tokenizer splits differently from
    the tuner's (an adapter of another model): its scores would be of other tokens.

    Raises:
        ValueError: naming the first label word that differs.
    """
    for label, word, toks in zip(c.labels, c.label_words, c.label_tokens):
        mine = tuple(int(i) for i in llm.encode(word))
        if mine != tuple(toks):
            raise ValueError(f"LocalBackend: {where}: its label word {word!r} (label {label!r}) "
                             f"was tokens {list(toks)} for the tuner and is {list(mine)} for this "
                             "model: the adapter was trained for another model's tokenizer.")


@dataclasses.dataclass(frozen=True)
class Classification:
    """A request a classifier adapter answers: the classifier and the ids it scores.

    Example:
        >>> from langtorch.models import AdapterClassifier
        >>> c = AdapterClassifier(("a", "b"), ("a", "b"), ((1,), (2,)))
        >>> Classification(c, (5, 6, 7)).extra_tokens
        0
    """

    classifier: AdapterClassifier
    ids: tuple[int, ...]

    @property
    def extra_tokens(self) -> int:
        """Label tokens read after the prompt (a multi-token label is teacher-forced)."""
        return max(len(t) for t in self.classifier.label_tokens) - 1


def logprob_entry(label: str, logprob: float, top: list[tuple[str, float]]) -> dict:
    """One OpenAI ``logprobs.content`` entry whose token is a whole label.

    Example:
        >>> logprob_entry("yes", -0.1, [("yes", -0.1)])["bytes"]
        [121, 101, 115]
    """
    def one(text: str, v: float) -> dict:
        return {"token": text, "logprob": float(v), "bytes": list(text.encode("utf-8"))}

    return {**one(label, logprob), "top_logprobs": [one(t, v) for t, v in top]}


class Scorer:
    """The label scores of classification requests for one model: the model's stacked weights
    in each dtype a classifier asks for (built on first use and kept: scoring reads the layout
    ``PromptTuner`` trains with, the same program family as ``predict``) and each classifier's
    label data.

    Example:
        >>> Scorer().cached_dtypes()
        []
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._params: dict[str, Any] = {}
        self._labels: dict[AdapterClassifier, dict] = {}

    def cached_dtypes(self) -> list[str]:
        """The dtypes whose weights are held."""
        return sorted(self._params)

    def _frozen(self, llm: Any, c: AdapterClassifier) -> dict:
        import jax
        import jax.numpy as jnp

        from langtorch.functional.losses import label_token_data

        with self._lock:
            params = self._params.get(c.dtype)
            if params is None:
                jd = jnp.float32 if c.dtype == "float32" else jnp.bfloat16
                # As PromptTuner's frozen weights: the model's params in the tuner's dtype.
                params = jax.tree.map(lambda a: jnp.asarray(a, jd), llm.params)
                self._params[c.dtype] = params
            labels = self._labels.get(c)
            if labels is None:
                labels = self._labels[c] = label_token_data([list(t) for t in c.label_tokens])
        return {"model": params, **labels}

    def scores(self, llm: Any, job: Classification, prefix: np.ndarray | None) -> np.ndarray:
        """``[K]`` float32 label scores of one request: each label word's log-probability (sum
        or mean of its tokens') after the prompt, as ``PromptTuner.predict`` computes them."""
        import jax.numpy as jnp

        from langtorch.functional import prompt_tuning as PT
        from langtorch.functional.losses import straight_through_project
        from langtorch.models import label_logits

        c = job.classifier
        frozen = self._frozen(llm, c)
        hidden = int(frozen["model"]["embed"].shape[1])
        prompt = (jnp.zeros((0, hidden), jnp.float32) if prefix is None
                  else jnp.asarray(prefix, jnp.float32))
        if c.pez:  # what PromptTuner's prompt_for("soft") gives a PEZ tuner
            prompt = straight_through_project(prompt, frozen["model"]["embed"])
        row = list(job.ids)
        ids, mask = PT.pad_rows([row], int(getattr(llm, "pad_id", 0) or 0),
                                length=PT.bucket(len(row), PT.DEFAULT_LENGTH_BUCKETS),
                                batch_size=1)
        batch = {"ids": ids, "mask": mask, "index": np.array([len(row) - 1], np.int32)}
        out = label_logits(prompt, frozen, batch, config=llm.config, reduction=c.reduction)
        return np.asarray(out, np.float32)[0]
