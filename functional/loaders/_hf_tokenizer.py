"""A model's tokenizer with its BOS/EOS rules and chat template, from a Hugging Face directory
(``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``,
``generation_config.json``) or from GGUF metadata.

Example:
    >>> from langtorch.functional.loaders import load_hf_tokenizer
    >>> tok = load_hf_tokenizer("path/to/model")  # doctest: +SKIP
    >>> tok.decode(tok.encode("hello"))  # doctest: +SKIP
    'hello'
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from langtorch.functional.errors import ModelFormatError
from langtorch.functional.loaders._tokenizer import ChatTemplate

__all__ = ["Tokenizer", "load_hf_tokenizer", "tokenizer_from_gguf"]


class Tokenizer:
    """Text <-> ids for one model, with its chat template.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        bos_id: the BOS id (or None); ``add_bos`` prepends it in :meth:`encode`.
        eos_ids: every id that ends a generation (Llama 3 has several).
        chat_template: the model's :class:`ChatTemplate`, or None.
        name: the model's name (in error messages).

    Example:
        >>> from tokenizers import Tokenizer as T, models
        >>> from langtorch.functional.loaders import Tokenizer
        >>> t = Tokenizer(T(models.WordLevel({"<s>": 0, "hi": 1}, unk_token="<s>")), bos_id=0,
        ...               eos_ids=(0,), add_bos=True)
        >>> t.encode("hi")
        [0, 1]
    """

    def __init__(self, tokenizer: Any, *, bos_id: int | None = None,
                 eos_ids: Sequence[int] = (), add_bos: bool = False,
                 chat_template: ChatTemplate | None = None, name: str = "model"):
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template
        self.name = name

    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary including added tokens."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the BOS is prepended when the
        model's ``add_bos_token`` asks for it (special tokens in the text are matched whole).

        Example:
            >>> from tokenizers import Tokenizer as T, models
            >>> from langtorch.functional.loaders import Tokenizer
            >>> t = Tokenizer(T(models.WordLevel({"<s>": 0, "hi": 1}, unk_token="<s>")))
            >>> t.encode("hi", add_special_tokens=False)
            [1]
        """
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        if add_special_tokens and self.add_bos and self.bos_id is not None and \
                ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (special tokens skipped by default).

        Example:
            >>> from tokenizers import Tokenizer as T, models
            >>> from langtorch.functional.loaders import Tokenizer
            >>> Tokenizer(T(models.WordLevel({"<s>": 0, "hi": 1}, unk_token="<s>"))).decode([1])
            'hi'
        """
        return self.tokenizer.decode([int(i) for i in ids],
                                     skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text of chat ``messages`` rendered by the model's own template (in
        Jinja2's sandbox).

        Raises:
            ModelFormatError: the model has no chat template.
            TemplateError: the template failed (naming the model and the line).

        Example:
            >>> from tokenizers import Tokenizer as T, models
            >>> from langtorch.functional.loaders import ChatTemplate, Tokenizer
            >>> t = Tokenizer(T(models.WordLevel({"hi": 0}, unk_token="hi")),
            ...               chat_template=ChatTemplate("{{ messages[0]['content'] }}!"))
            >>> t.apply_chat_template([{"role": "user", "content": "hi"}])
            'hi!'
        """
        if self.chat_template is None:
            raise ModelFormatError(f"{self.name}: has no chat template (tokenizer_config.json "
                                   "chat_template / chat_template.jinja); pass token ids or "
                                   "plain text instead.")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                         **kwargs)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab={self.vocab_size})"


def _json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path}: could not read the JSON ({exc}).") from None


def _token_text(tok: Any) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def _ids(v: Any) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


def load_hf_tokenizer(directory: str, *, name: str = "model") -> Tokenizer:
    """The :class:`Tokenizer` of a Hugging Face directory.

    EOS ids are all of ``generation_config.json``'s ``eos_token_id`` (else ``config.json``'s,
    else the tokenizer's ``eos_token``); BOS follows ``add_bos_token`` (else whether
    ``tokenizer.json``'s post-processor adds it).

    Raises:
        ModelFormatError: no ``tokenizer.json``.

    Example:
        >>> from langtorch.functional.loaders import load_hf_tokenizer
        >>> load_hf_tokenizer("path/to/model").eos_ids  # doctest: +SKIP
        (128001, 128008, 128009)
    """
    from tokenizers import Tokenizer as HFTokenizer

    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        raise ModelFormatError(f"{path}: expected a tokenizer.json (the fast tokenizer) next to "
                               "the weights, found none.")
    tok = HFTokenizer.from_file(path)
    tc = _json(os.path.join(directory, "tokenizer_config.json"))
    gen = _json(os.path.join(directory, "generation_config.json"))
    cfg = _json(os.path.join(directory, "config.json"))
    bos_text = _token_text(tc.get("bos_token"))
    eos_text = _token_text(tc.get("eos_token"))
    bos_id = tok.token_to_id(bos_text) if bos_text else None
    if bos_id is None:
        b = _ids(gen.get("bos_token_id", cfg.get("bos_token_id")))
        bos_id = b[0] if b else None
    eos = _ids(gen.get("eos_token_id")) or _ids(cfg.get("eos_token_id"))
    if not eos and eos_text and tok.token_to_id(eos_text) is not None:
        eos = [tok.token_to_id(eos_text)]
    if "add_bos_token" in tc:
        add_bos = bool(tc["add_bos_token"])
    else:
        probe = tok.encode("a", add_special_tokens=True).ids
        add_bos = bos_id is not None and probe[:1] == [bos_id]
    source = tc.get("chat_template")
    jinja = os.path.join(directory, "chat_template.jinja")
    if source is None and os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            source = f.read()
    if isinstance(source, list):  # named templates: use "default"
        named = {t.get("name"): t.get("template") for t in source}
        source = named.get("default") or next(iter(named.values()), None)
    template = None
    if source:
        template = ChatTemplate(source, bos_token=bos_text or "", eos_token=eos_text or "",
                                name=name)
    return Tokenizer(tok, bos_id=bos_id, eos_ids=eos, add_bos=add_bos, chat_template=template,
                     name=name)


def tokenizer_from_gguf(metadata: Mapping[str, Any], *, name: str = "model") -> Tokenizer:
    """The :class:`Tokenizer` of a GGUF file's ``tokenizer.*`` metadata (byte-level BPE
    ``gpt2`` or SentencePiece ``llama`` vocabularies).

    Example:
        >>> from langtorch.functional.loaders import tokenizer_from_gguf
        >>> meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["<s>", "a"],
        ...         "tokenizer.ggml.merges": [], "tokenizer.ggml.token_type": [3, 1],
        ...         "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}
        >>> tokenizer_from_gguf(meta).encode("a", add_special_tokens=False)
        [1]
    """
    from langtorch.functional.loaders._tokenizer import (
        bpe_tokenizer_from_gguf_metadata,
        spm_tokenizer_from_gguf_metadata,
    )

    kind = metadata.get("tokenizer.ggml.model", "gpt2")
    if kind == "gpt2":
        tok = bpe_tokenizer_from_gguf_metadata(metadata)
    elif kind == "llama":
        tok = spm_tokenizer_from_gguf_metadata(metadata)
    else:
        raise ModelFormatError(f"{name}: GGUF tokenizer model {kind!r} is not supported "
                               "(supported: gpt2, llama).")
    tokens = metadata["tokenizer.ggml.tokens"]
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    eos_ids = _ids(eos)
    eot = metadata.get("tokenizer.ggml.eot_token_id")
    if eot is not None and int(eot) not in eos_ids:
        eos_ids.append(int(eot))
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    source = metadata.get("tokenizer.chat_template")
    template = None
    if source:
        template = ChatTemplate(
            source, bos_token=tokens[int(bos)] if bos is not None else "",
            eos_token=tokens[eos_ids[0]] if eos_ids else "", name=name)
    return Tokenizer(tok, bos_id=None if bos is None else int(bos), eos_ids=eos_ids,
                     add_bos=add_bos, chat_template=template, name=name)
