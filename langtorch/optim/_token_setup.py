"""What :class:`~langtorch.optim.TokenSearch` checks and derives before it searches: the
template and its slot, the labels and the (single) token of each label word, and the vocabulary
the slot may use (printable ASCII, no braces, no chat markup, tokens that re-tokenize to
themselves)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from langtorch.functional.errors import TemplateError
from langtorch.functional.template import parse_template

_INPUT = "input"


def parse_slot_template(template: Any, slot: str | None) -> tuple[Any, str]:
    if not isinstance(template, str):
        raise TypeError(f"TokenSearch: template must be a str, got {type(template).__name__}.")
    try:
        tpl = parse_template(template)
    except TemplateError as e:
        raise ValueError(f"TokenSearch: the template does not parse: {e}") from None
    names = list(tpl.names)
    if slot is None:
        others = [n for n in names if n != _INPUT]
        if len(others) != 1:
            raise ValueError(f"TokenSearch: pass slot='name' (the field the search fills); "
                             f"the template's fields are {names}.")
        slot = others[0]
    missing = [f for f in (slot, _INPUT) if f not in names]
    if missing:
        raise ValueError(f"TokenSearch: the template must have the fields {{{slot}}} (the slot) "
                         f"and {{{_INPUT}}} (each example's text); it has {names}, missing "
                         f"{missing}: {template!r}.")
    extra = [n for n in names if n not in (slot, _INPUT)]
    if extra:
        raise ValueError(f"TokenSearch: the template may only have the fields {{{slot}}} and "
                         f"{{{_INPUT}}}; fill {extra} first (it has {names}).")
    if tpl.fields.count(slot) != 1:
        raise ValueError(f"TokenSearch: the slot {{{slot}}} must appear once in the template, "
                         f"it appears {tpl.fields.count(slot)} times.")
    return tpl, slot


def check_labels(labels: Any) -> list[str]:
    if isinstance(labels, str) or labels is None:
        raise ValueError(f"TokenSearch: labels must be a sequence of at least two strings, got "
                         f"{labels!r}.")
    from langtorch.nn.classify import distinct_labels

    return distinct_labels(labels, "TokenSearch")


def first_tokens(model: Any, labels: list[str], label_words: list[str],
                 chat_template: bool = True) -> list[int]:
    """The token id of each label word: TokenSearch's loss reads one next-token logit per label,
    so each word must be one token (distinct ones). A multi-token word is refused with what to
    do instead, not silently scored by its first token."""
    if len(label_words) != len(labels):
        raise ValueError(f"TokenSearch: expected one label word per label ({len(labels)}), "
                         f"got {len(label_words)}: {label_words}.")
    tokens: list[list[int]] = []
    for label, word in zip(labels, label_words):
        toks = [int(i) for i in model.encode(word)] if word else []
        if not toks:
            raise ValueError(f"TokenSearch: the label word for {label!r} is empty ({word!r}).")
        firsts = [t[0] for t in tokens]
        if toks[0] in firsts:
            other = label_words[firsts.index(toks[0])]
            raise ValueError(f"TokenSearch: label words {other!r} and {word!r} start with the "
                             f"same token {model.decode([toks[0]])!r}; TokenSearch scores one "
                             "token per label, so pass label_words of one distinct token each.")
        tokens.append(toks)
    multi = [(label, word, toks) for label, word, toks in zip(labels, label_words, tokens)
             if len(toks) > 1]
    if multi:
        label, word, toks = multi[0]
        pieces = [model.decode([t]) for t in toks]
        # Without the chat template the answer follows the prompt's text, where a word with a
        # leading space is how the model writes it (and often one token); the chat template
        # starts the answer on a new turn, where a leading space is not what the model writes.
        hint = ("" if chat_template else
                f" A leading space often makes a word one token (' {word.lstrip()}').")
        raise ValueError(
            f"TokenSearch: label word {word!r} (label {label!r}) is {len(toks)} tokens "
            f"{pieces}; TokenSearch's loss reads one next-token logit per label, so it supports "
            f"single-token label words only ({len(multi)} label word(s) are longer). Pass "
            f"label_words=[...] of one token each.{hint} LocalClassifier and PromptTuner "
            "score multi-token labels (the sum of their tokens' log-probabilities).")
    return [t[0] for t in tokens]


def allowed_tokens(model: Any, v: int, allow_newlines: bool) -> np.ndarray:
    """``[V]`` bool: the tokens the search may put in the slot (see TokenSearch's docstring)."""
    texts = decode_each(model, v)
    special = {getattr(model, a, None) for a in ("eos_id", "pad_id", "bos_id")}
    # Chat markup (<|im_start|>, <|endoftext|>, ...) must never enter the slot: it would
    # inject turns. Exclude every token whose text is a special-token shape or occurs in the
    # markup the chat template adds around a message.
    markup = ""
    render = getattr(model, "apply_chat_template", None)
    if render is not None:
        try:
            markup = render([{"role": "system", "content": ""}, {"role": "user", "content": ""}])
        except Exception:  # noqa: BLE001 - a model without a usable template: no markup
            markup = ""
    special_shape = re.compile(r"^\s*<\|[^|]*\|>\s*$|^\s*</?s>\s*$")
    allowed = np.zeros(v, bool)
    for i, t in enumerate(texts):
        core = t.replace("\n", "") if allow_newlines else t
        is_markup = bool(special_shape.match(t)) or (len(t.strip()) > 2 and t.strip() in markup
                                                     and ("<" in t or "|" in t))
        ok = (bool(t.strip()) or (allow_newlines and "\n" in t)) and core.isascii() \
            and core.isprintable() and "{" not in t and "}" not in t and i not in special \
            and not is_markup
        allowed[i] = ok
    # Keep tokens that a tokenizer would produce for their own text: others never survive
    # the re-tokenization filter, so proposing them wastes candidates.
    idx = np.flatnonzero(allowed)
    back = encode_many(model, [texts[i] for i in idx])
    for i, ids in zip(idx, back):
        allowed[i] = list(ids) == [int(i)]
    if not allowed.any():
        raise ValueError("TokenSearch: the model's vocabulary has no allowed slot token "
                         "(printable ASCII without braces).")
    return allowed


def decode_each(model: Any, v: int) -> list[str]:
    tok, _ = _fast(model)
    if tok is not None:
        return list(tok.decode_batch([[i] for i in range(v)], skip_special_tokens=True))
    return [str(model.decode([i])) for i in range(v)]


def _fast(model: Any) -> tuple[Any, dict]:
    """The ``tokenizers.Tokenizer`` behind a SmolLM2 or a :class:`~langtorch.models.CausalLM`
    whose ``encode``/``decode`` are the class's own, with the ``encode_batch`` keywords that
    give the ids ``model.encode`` gives; ``(None, {})`` for any other model."""
    from langtorch.models import CausalLM, SmolLM2

    if isinstance(model, SmolLM2) and type(model).encode is SmolLM2.encode:
        return model.tokenizer, {}
    if isinstance(model, CausalLM) and type(model).encode is CausalLM.encode \
            and type(model).decode is CausalLM.decode:
        inner = getattr(model.tokenizer, "tokenizer", None)  # CausalLM.encode adds no BOS
        if callable(getattr(inner, "encode_batch", None)):
            return inner, {"add_special_tokens": False}
    return None, {}


def fast_tokenizer(model: Any) -> Any:
    """The Hugging Face tokenizer behind a SmolLM2 or a CausalLM (batch encode/decode), else
    None."""
    return _fast(model)[0]


def encode_many(model: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text (batched through the fast tokenizer when there is one)."""
    tok, kw = _fast(model)
    if tok is not None:
        return [e.ids for e in tok.encode_batch(texts, **kw)]
    return [list(model.encode(t)) for t in texts]


def filler(model: Any, allowed: np.ndarray) -> int:
    """The token an empty or disallowed slot position starts as: \" x\", \"x\" or \"!\" when one token."""
    for text in (" x", "x", "!"):
        ids = list(model.encode(text))
        if len(ids) == 1 and allowed[ids[0]]:
            return int(ids[0])
    return int(np.flatnonzero(allowed)[0])
