"""Tokenizer and chat template built from GGUF metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ChatTemplate", "bpe_tokenizer_from_gguf_metadata", "spm_tokenizer_from_gguf_metadata"]

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


# Limits of one render: a chat template is untrusted code, and Jinja's sandbox bounds a single
# range() (100000) but neither nested loops nor the size of ``'x' * n``.
_MAX_ITERATIONS = 1_000_000  # loop iterations over all for-loops of one render
_MAX_SEQUENCE = 1_000_000  # length of a string / list made by ``*``
_BUDGET = "__langtorch_loop_budget__"  # injected around every for-loop's iterable


def _sandbox_env(**kwargs):
    """Jinja's immutable sandbox, stricter: an unsafe attribute raises (instead of rendering
    as empty), ``*`` / ``**`` cannot build huge values, and every for-loop draws from a
    per-render iteration budget (``_BUDGET``, passed to ``render``)."""
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"access to attribute {attribute!r} of "
                                f"{type(obj).__name__!r} object is unsafe")

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and \
                            len(seq) * n > _MAX_SEQUENCE:
                        raise SecurityError(f"'*' would build a sequence of {len(seq) * n} "
                                            f"items; the sandbox allows {_MAX_SEQUENCE}")
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and \
                    abs(left) > 1 and right * max(abs(left).bit_length(), 1) > 4096:
                raise SecurityError(f"'{left} ** {right}' is too large for the sandbox")
            return super().call_binop(context, operator, left, right)

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):
                loop.iter = nodes.Call(nodes.Name(_BUDGET, "load", lineno=loop.lineno),
                                       [loop.iter], [], None, None, lineno=loop.lineno)
            return tree

    return _Env(**kwargs)


def _loop_budget():
    from jinja2.exceptions import SecurityError

    left = [_MAX_ITERATIONS]

    def budgeted(iterable):
        for item in iterable:
            left[0] -= 1
            if left[0] < 0:
                raise SecurityError(f"the template ran more than {_MAX_ITERATIONS} loop "
                                    "iterations (a loop bomb?); refused")
            yield item

    return budgeted


def _template_line(tb) -> int | None:
    # Jinja rewrites tracebacks so that template frames carry the template's own line numbers.
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


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

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 name: str = "model"):
        import jinja2
        from jinja2.ext import loopcontrols

        self.name = name

        env = _sandbox_env(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: (
            json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
                       sort_keys=sort_keys))
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            from langtorch.functional.errors import TemplateError

            raise TemplateError(f"{name}: its chat template does not parse (line {exc.lineno}: "
                                f"{exc.message}).", template=source) from None

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
        from langtorch.functional.errors import TemplateError

        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token,
                **{**kwargs, _BUDGET: _loop_budget()},
            )
        except Exception as exc:  # noqa: BLE001 - any failure inside the template is reported
            line = _template_line(exc.__traceback__)
            at = f" at line {line}" if line is not None else ""
            raise TemplateError(f"{self.name}: its chat template failed{at}: "
                                f"{type(exc).__name__}: {exc}", template=self.source) from exc

    def __repr__(self) -> str:
        return f"ChatTemplate({self.source[:40]!r}...)"


def _merges_from_vocab(tokens: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    # A SentencePiece BPE GGUF lists no merges: every split of a token into two vocabulary
    # pieces is a merge, ranked by the merged token's position in the file (best first).
    merges = []
    for merged in tokens:
        local = [(merged[:i], merged[i:]) for i in range(1, len(merged))
                 if merged[:i] in vocab and merged[i:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        rank = vocab[merged]
        merges.extend((rank, -len(lr[0]), -len(lr[1]), lr) for lr in local)
    merges.sort(key=lambda m: (m[0], m[1], m[2]))
    return [m[3] for m in merges]


def spm_tokenizer_from_gguf_metadata(metadata: Mapping[str, Any]):
    """A SentencePiece-style BPE ``tokenizers.Tokenizer`` (``tokenizer.ggml.model`` ``llama``:
    Gemma, Llama 2) from a GGUF's metadata.

    Spaces become ``▁``, unknown bytes fall back to ``<0xNN>`` tokens, merges are rebuilt from
    the vocabulary (the file has none) in file order, and tokens of spaces only are respelled as
    ``▁`` runs — the same construction as transformers' GGUF tokenizer for Gemma.

    Example:
        >>> from langtorch.functional.loaders._tokenizer import spm_tokenizer_from_gguf_metadata
        >>> meta = {"tokenizer.ggml.model": "llama",
        ...         "tokenizer.ggml.tokens": ["<unk>", "▁", "a", "b", "ab", "▁ab"],
        ...         "tokenizer.ggml.token_type": [2, 1, 1, 1, 1, 1]}
        >>> spm_tokenizer_from_gguf_metadata(meta).encode(" ab").ids
        [5]
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    raw = list(metadata["tokenizer.ggml.tokens"])
    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in raw]
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else ("<unk>" if "<unk>" in vocab else None)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges_from_vocab(tokens, vocab),
                               fuse_unk=True, unk_token=unk, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous",
                                             invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t == _CONTROL]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types) if t == _USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    return tok
