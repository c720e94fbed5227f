"""A tokenizer seen as the grammar engine needs it: the bytes of every token id."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["TokenVocabulary"]

_CONTROL, _USER_DEFINED, _BYTE = 3, 4, 6  # llama.cpp token types


@functools.lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable-character -> byte map (the inverse of ``bytes_to_unicode``)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _byte_level_bytes(piece: str) -> bytes:
    table = _byte_level_decoder()
    if all(ch in table for ch in piece):
        return bytes(table[ch] for ch in piece)
    return piece.encode("utf-8")  # an added token stored as plain text


def _sentencepiece_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return bytes([int(piece[3:5], 16)])
        except ValueError:
            pass
    return piece.replace("\u2581", " ").encode("utf-8")


@dataclasses.dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """The bytes of each token id, the EOS ids and the special ids of one tokenizer.

    A grammar engine needs exactly this to turn "which texts are allowed" into "which token ids
    are allowed"; every tokenizer kind the loaders produce (GGUF ``gpt2`` byte-level BPE, GGUF
    ``llama`` SentencePiece with byte fallback, a ``tokenizers.Tokenizer``) reduces to it.

    Attributes:
        tokens: the bytes each id decodes to (``b""`` for special ids).
        eos_ids: ids that end a sequence (allowed only where the grammar accepts).
        special_ids: control ids (``<|im_start|>`` ...), EOS ids and empty tokens: never text
            a grammar allows.
        size: the width of the model's logits (>= ``len(tokens)``; ids beyond the tokenizer are
            never allowed).
        encode: text -> ids with the model's own tokenizer, or None (the engine then tokenises
            greedily where it needs to, e.g. for forced text).
        name: identifies the tokenizer in the compiled-grammar cache (a digest of the tokens).

    Example:
        >>> from langtorch.functional.constrain import TokenVocabulary
        >>> v = TokenVocabulary.from_gguf_metadata({
        ...     "tokenizer.ggml.model": "gpt2",
        ...     "tokenizer.ggml.tokens": ["<eos>", "a", "\u0120b", "{"],
        ...     "tokenizer.ggml.token_type": [3, 1, 1, 1],
        ...     "tokenizer.ggml.eos_token_id": 0})
        >>> v.tokens, v.eos_ids, v.special_ids, v.size
        ((b'', b'a', b' b', b'{'), (0,), (0,), 4)
    """

    tokens: tuple[bytes, ...]
    eos_ids: tuple[int, ...]
    special_ids: tuple[int, ...] = ()
    size: int = 0
    encode: Callable[[str], list[int]] | None = dataclasses.field(default=None, repr=False)
    name: str = ""

    def __post_init__(self):
        n = len(self.tokens)
        size = self.size or n
        if size < n:
            raise ValueError(f"TokenVocabulary: expected size >= {n} (the number of tokens), "
                             f"got {size}.")
        if not self.eos_ids:
            raise ValueError("TokenVocabulary: expected at least one EOS id, got none; pass the "
                             "model's end-of-sequence token id(s).")
        bad = [i for i in (*self.eos_ids, *self.special_ids) if not 0 <= i < n]
        if bad:
            raise ValueError(f"TokenVocabulary: ids {bad[:5]} are outside [0, {n}).")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "eos_ids", tuple(int(i) for i in self.eos_ids))
        # EOS and empty tokens are never text a grammar can allow (EOS comes where it accepts).
        specials = (set(int(i) for i in self.special_ids) | set(self.eos_ids)
                    | {i for i, t in enumerate(self.tokens) if not t})
        object.__setattr__(self, "special_ids", tuple(sorted(specials)))
        if not self.name:
            h = hashlib.sha256()
            for t in self.tokens:
                h.update(len(t).to_bytes(4, "little") + t)
            h.update(repr((self.eos_ids, self.special_ids, size)).encode())
            object.__setattr__(self, "name", h.hexdigest()[:24])

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], *, size: int | None = None,
                           eos_ids: Sequence[int] | None = None,
                           encode: Callable[[str], list[int]] | None = None) -> TokenVocabulary:
        """From a GGUF's ``tokenizer.ggml.*`` metadata (``gpt2`` or ``llama`` tokenizers).

        Example:
            >>> from langtorch.functional.constrain import TokenVocabulary
            >>> v = TokenVocabulary.from_gguf_metadata({
            ...     "tokenizer.ggml.model": "llama",
            ...     "tokenizer.ggml.tokens": ["</s>", "<0x41>", "\u2581hi"],
            ...     "tokenizer.ggml.token_type": [3, 6, 1],
            ...     "tokenizer.ggml.eos_token_id": 0})
            >>> v.tokens
            (b'', b'A', b' hi')
        """
        kind = metadata.get("tokenizer.ggml.model", "gpt2")
        pieces = list(metadata["tokenizer.ggml.tokens"])
        types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(pieces)))
        if kind == "gpt2":
            to_bytes = _byte_level_bytes
        elif kind == "llama":
            to_bytes = _sentencepiece_bytes
        else:
            raise ValueError(f"TokenVocabulary: expected a 'gpt2' or 'llama' GGUF tokenizer, got "
                             f"{kind!r}.")
        tokens, special = [], []
        for i, (p, ty) in enumerate(zip(pieces, types)):
            if ty == _CONTROL:
                tokens.append(b"")
                special.append(i)
            elif ty == _USER_DEFINED:
                tokens.append(p.encode("utf-8"))
            else:
                tokens.append(to_bytes(p))
        if eos_ids is None:
            eos_ids = [int(metadata.get("tokenizer.ggml.eos_token_id", 2))]
        return cls(tuple(tokens), tuple(eos_ids), tuple(special), size or len(tokens), encode)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, eos_ids: Sequence[int], size: int | None = None
                       ) -> TokenVocabulary:
        """From a ``tokenizers.Tokenizer`` with a byte-level or SentencePiece-style decoder.

        Added tokens marked special become special ids; ``encode`` is the tokenizer's own.

        Example:
            >>> from tokenizers import Tokenizer, decoders, models, pre_tokenizers
            >>> from langtorch.functional.constrain import TokenVocabulary
            >>> tok = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2, "\u0120": 3}, [("a", "b")]))
            >>> tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            >>> tok.decoder = decoders.ByteLevel()
            >>> _ = tok.add_special_tokens(["<eos>"])
            >>> v = TokenVocabulary.from_tokenizer(tok, eos_ids=[4])
            >>> v.tokens, v.special_ids
            ((b'a', b'b', b'ab', b' ', b''), (4,))
        """
        spec = json.loads(tokenizer.to_str())
        dec = spec.get("decoder") or {}
        kinds = {d.get("type") for d in ([dec] + list(dec.get("decoders") or []))}
        if "ByteLevel" in kinds:
            to_bytes = _byte_level_bytes
        elif kinds & {"Metaspace", "ByteFallback", "Replace"}:
            to_bytes = _sentencepiece_bytes
        else:
            raise ValueError(
                f"TokenVocabulary.from_tokenizer: expected a byte-level (GPT-2 style) or "
                f"SentencePiece-style (Metaspace/ByteFallback) decoder, got {sorted(kinds - {None})}"
                f"; build the vocabulary with TokenVocabulary(tokens=...) from the token bytes.")
        n = tokenizer.get_vocab_size(with_added_tokens=True)
        added = {int(k): v for k, v in tokenizer.get_added_tokens_decoder().items()}
        tokens, special = [], []
        for i in range(n):
            if i in added:
                if added[i].special:
                    tokens.append(b"")
                    special.append(i)
                else:
                    tokens.append(added[i].content.encode("utf-8"))
                continue
            piece = tokenizer.id_to_token(i)
            tokens.append(b"" if piece is None else to_bytes(piece))

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False).ids

        return cls(tuple(tokens), tuple(eos_ids), tuple(special), size or n, encode)
