"""Tokenizer and chat template built from GGUF metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ChatTemplate", "bpe_tokenizer_from_gguf_metadata"]

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def bpe_tokenizer_from_gguf_metadata(metadata: Mapping[str, Any]):
    """A byte-level BPE ``tokenizers.Tokenizer`` from a GGUF's ``tokenizer.ggml.*`` metadata.

    Vocabulary and merges come from the file; control tokens (``<|im_start|>`` …) become special
    added tokens, so they are matched whole in the input and skipped when decoding with
    ``skip_special_tokens=True``.

    Example:
        >>> from langtorch.functional.loaders import bpe_tokenizer_from_gguf_metadata
        >>> meta = {"tokenizer.ggml.model": "gpt2",
        ...         "tokenizer.ggml.tokens": ["<s>", "a", "b", "ab", "Ġ", "Ġab"],
        ...         "tokenizer.ggml.merges": ["a b", "Ġ ab"],
        ...         "tokenizer.ggml.token_type": [3, 1, 1, 1, 1, 1]}
        >>> tok = bpe_tokenizer_from_gguf_metadata(meta)
        >>> tok.encode("ab ab<s>").ids
        [3, 5, 0]
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = metadata.get("tokenizer.ggml.model", "gpt2")
    if kind != "gpt2":
        raise ValueError(f"expected a byte-level BPE tokenizer (tokenizer.ggml.model 'gpt2'), "
                         f"got {kind!r}; only gpt2-style GGUF tokenizers are supported.")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t == _CONTROL]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types) if t == _USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    return tok


def _raise_exception(message):
    from langtorch.functional.errors import TemplateError

    raise TemplateError(f"chat template raised: {message}")


def _strftime_now(fmt):
    import datetime

    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A Hugging Face style Jinja chat template, rendered in a sandbox.

    The environment mirrors ``transformers``' (``trim_blocks``, ``lstrip_blocks``, loop
    controls, a ``tojson`` that keeps non-ASCII text, ``raise_exception``, ``strftime_now``) so
    the same template renders the same text.

    Args:
        source: the Jinja source (``tokenizer.chat_template`` in GGUF metadata).
        bos_token: text of the BOS token, exposed to the template.
        eos_token: text of the EOS token, exposed to the template.

    Example:
        >>> from langtorch.functional.loaders import ChatTemplate
        >>> t = ChatTemplate("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
        ...                  "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
        >>> t.render([{"role": "user", "content": "hi"}])
        '<user>hi<assistant>'
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = ""):
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: (
            json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
                       sort_keys=sort_keys))
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = env.from_string(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render a list of ``{"role", "content"}`` messages to the model's prompt text.

        Example:
            >>> from langtorch.functional.loaders import ChatTemplate
            >>> ChatTemplate("{{ messages[0]['content'] }}").render([{"role": "user",
            ...                                                       "content": "x"}])
            'x'
        """
        return self._template.render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token, eos_token=self.eos_token, **kwargs,
        )

    def __repr__(self) -> str:
        return f"ChatTemplate({self.source[:40]!r}...)"
