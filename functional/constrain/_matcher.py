"""Per-tokenizer grammar compilation (cached) and per-request token matchers."""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

import numpy as np

from langtorch.functional.constrain._request import Constraint
from langtorch.functional.constrain._vocab import TokenVocabulary
from langtorch.functional.errors import BadRequestError

__all__ = ["GrammarCompiler", "TokenMatcher", "bitmask_words", "unpack_bitmask"]


def bitmask_words(size: int) -> int:
    """int32 words of a packed token bitmask over ``size`` ids (bit ``i % 32`` of word ``i // 32``).

    Example:
        >>> from langtorch.functional.constrain import bitmask_words
        >>> bitmask_words(49152), bitmask_words(33)
        (1536, 2)
    """
    return (int(size) + 31) // 32


def unpack_bitmask(bits: np.ndarray, size: int) -> np.ndarray:
    """Packed int32 bitmask(s) ``[..., W]`` -> bool ``[..., size]`` (numpy).

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.constrain import unpack_bitmask
        >>> unpack_bitmask(np.array([0b101], np.int32), 3).tolist()
        [True, False, True]
    """
    bits = np.ascontiguousarray(bits, np.int32)
    flat = np.unpackbits(bits.view(np.uint8), axis=-1, bitorder="little")
    return flat[..., :size].astype(bool)


class _Wrapper:
    """The duck-typed tokenizer llguidance's ``TokenizerWrapper`` expects."""

    def __init__(self, vocab: TokenVocabulary):
        special = set(vocab.special_ids)
        # Special ids get a name no text can spell (llguidance marks them special as well), so a
        # grammar never allows them; EOS is allowed separately, where the grammar accepts.
        self.tokens = [b"<[special %d]>" % i if i in special else t
                       for i, t in enumerate(vocab.tokens)]
        self.eos_token_id = vocab.eos_ids[0]
        self.bos_token_id = None
        self.special_token_ids = sorted(special)
        self._encode = vocab.encode
        if vocab.encode is None:  # llguidance needs an encoder: longest match over the bytes
            self._ids = {}
            for i, t in enumerate(vocab.tokens):
                if i not in special:
                    self._ids.setdefault(t, i)
            self._longest = max((len(t) for t in self._ids), default=1)

    def __call__(self, text):
        if self._encode is not None:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "replace")
            return list(self._encode(text))
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                tid = self._ids.get(data[i:i + n])
                if tid is not None:
                    out.append(tid)
                    i += n
                    break
            else:
                i += 1  # a byte no token spells: it cannot be generated either
        return out


class TokenMatcher:
    """One request's grammar state: which tokens may come next, and the tokens taken so far.

    Made by :meth:`GrammarCompiler.matcher`. Not thread-safe; the engine owns one per
    constrained sequence (a choice of ``n > 1`` gets its own).

    Example:
        >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
        ...                                             constraint_from_request)
        >>> v = TokenVocabulary([b"", b"y", b"e", b"s", b"n", b"o", b"yes"], eos_ids=[0])
        >>> m = GrammarCompiler(v).matcher(constraint_from_request(guided_choice=["yes", "no"]))
        >>> m.allowed_mask().nonzero()[0].tolist()   # y, n, yes
        [1, 4, 6]
        >>> m.advance(6), m.is_accepting(), m.allowed_mask().nonzero()[0].tolist()  # only EOS
        (True, True, [0])
    """

    def __init__(self, inner, vocab: TokenVocabulary, constraint: Constraint):
        self._m = inner
        self.vocab = vocab
        self.constraint = constraint
        self.words = bitmask_words(vocab.size)

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Write the packed mask of allowed next tokens into ``out`` (int32 ``[W]``, C-contiguous).

        Example:
            >>> import numpy as np
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a", b"b"], eos_ids=[0])
            >>> m = GrammarCompiler(v).matcher(constraint_from_request(guided_regex="b+"))
            >>> out = np.zeros(1, np.int32); m.fill_bitmask(out); int(out[0])
            4
        """
        if out.dtype != np.int32 or out.shape != (self.words,) or not out.flags.c_contiguous:
            raise ValueError(f"TokenMatcher.fill_bitmask: expected a C-contiguous int32 array of "
                             f"shape ({self.words},), got {out.dtype} {out.shape}.")
        self._m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def allowed_mask(self) -> np.ndarray:
        """bool ``[vocab.size]``: the tokens allowed next (EOS where the grammar accepts).

        Example:
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a", b"b"], eos_ids=[0])
            >>> GrammarCompiler(v).matcher(constraint_from_request(guided_regex="a")
            ...                           ).allowed_mask().tolist()
            [False, True, False]
        """
        out = np.zeros(self.words, np.int32)
        self.fill_bitmask(out)
        return unpack_bitmask(out, self.vocab.size)

    def advance(self, token_id: int) -> bool:
        """Take a sampled token; False when the grammar forbids it (the matcher is then in
        error for good: :attr:`error` says why, and the engine fails this request alone).

        Example:
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a", b"b"], eos_ids=[0])
            >>> m = GrammarCompiler(v).matcher(constraint_from_request(guided_regex="a"))
            >>> m.advance(2), bool(m.error)
            (False, True)
        """
        return bool(self._m.consume_token(int(token_id)))

    def is_finished(self) -> bool:
        """True when no token but EOS can follow (the output is complete) or after an error.

        Example:
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a"], eos_ids=[0])
            >>> m = GrammarCompiler(v).matcher(constraint_from_request(guided_regex="a"))
            >>> m.is_finished(), m.advance(1), m.is_finished()
            (False, True, True)
        """
        return bool(self._m.is_stopped())

    def is_accepting(self) -> bool:
        """True when the text so far is a complete match (EOS would be allowed now).

        Example:
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a"], eos_ids=[0])
            >>> m = GrammarCompiler(v).matcher(constraint_from_request(guided_regex="a+"))
            >>> m.is_accepting(), m.advance(1), m.is_accepting(), m.is_finished()
            (False, True, True, False)
        """
        return bool(self._m.is_accepting())

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` tokens (e.g. speculative tokens that were not kept).

        Example:
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a"], eos_ids=[0])
            >>> m = GrammarCompiler(v).matcher(constraint_from_request(guided_regex="aa"))
            >>> _ = m.advance(1); m.rollback(1); m.advance(1), m.advance(1), m.is_accepting()
            (True, True, True)
        """
        if not self._m.rollback(int(n)):
            raise ValueError(f"TokenMatcher.rollback: cannot undo {n} tokens "
                             f"({self._m.get_error() or 'more than were taken'}).")

    @property
    def error(self) -> str:
        """The grammar engine's error message, or ``""``.

        Example:
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a"], eos_ids=[0])
            >>> GrammarCompiler(v).matcher(constraint_from_request(guided_regex="a")).error
            ''
        """
        return self._m.get_error()


class GrammarCompiler:
    """Compiles constraints for one tokenizer; compiled grammars are cached by constraint.

    The cache key is ``(vocab.name, constraint.key)``: one compiler per tokenizer, and the
    same schema compiles once (a new request deep-copies the compiled matcher, ~µs). LRU with
    ``cache_size`` entries; thread-safe.

    Args:
        vocab: the tokenizer's :class:`TokenVocabulary`.
        cache_size: most compiled grammars kept.
        threads: threads :meth:`fill_bitmasks` uses (llguidance's executor); default: its own
            choice (80% of the CPUs, at most 32).

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
        ...                                             constraint_from_request)
        >>> v = TokenVocabulary([b"", b"{", b"}", b'"', b"a", b":", b"1", b", "], eos_ids=[0])
        >>> gc = GrammarCompiler(v)
        >>> c = constraint_from_request({"type": "json_object"})
        >>> ms = [gc.matcher(c), gc.matcher(c)]
        >>> out = np.zeros((2, gc.words), np.int32)
        >>> gc.fill_bitmasks([(ms[0], 0), (ms[1], 1)], out)
        >>> np.flatnonzero(gc.unpack(out)[1]).tolist()   # only "{" may start an object
        [1]
    """

    def __init__(self, vocab: TokenVocabulary, *, cache_size: int = 128,
                 threads: int | None = None):
        import llguidance

        self._llg = llguidance
        self.vocab = vocab
        self.words = bitmask_words(vocab.size)
        self.tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_Wrapper(vocab)), n_vocab=vocab.size,
            eos_token=list(vocab.eos_ids))
        self.cache_size = int(cache_size)
        self._cache: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._threads = threads
        self._executor = None

    def _compiled(self, constraint: Constraint):
        with self._lock:
            hit = self._cache.get(constraint.key)
            if hit is not None:
                self._cache.move_to_end(constraint.key)
                return hit
        m = self._llg.LLMatcher(self.tokenizer, constraint.grammar, log_level=0)
        if m.is_error():
            raise BadRequestError(f"the {constraint.kind} constraint does not compile for this "
                                  f"model's tokenizer: {m.get_error()}",
                                  param="response_format")
        with self._lock:
            self._cache[constraint.key] = m
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return m

    def matcher(self, constraint: Constraint) -> TokenMatcher:
        """A fresh matcher for one sequence (one choice) under ``constraint``.

        Raises:
            BadRequestError: the grammar does not compile for this tokenizer.

        Example:
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a"], eos_ids=[0])
            >>> gc = GrammarCompiler(v); c = constraint_from_request(guided_regex="a")
            >>> gc.matcher(c) is not gc.matcher(c), gc.cached_keys() == [c.key]
            (True, True)
        """
        return TokenMatcher(self._compiled(constraint).deep_copy(), self.vocab, constraint)

    def cached_keys(self) -> list[str]:
        """The keys of the cached compiled grammars, least recently used first.

        Example:
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> gc = GrammarCompiler(TokenVocabulary([b"", b"a"], eos_ids=[0]), cache_size=1)
            >>> a, b = (constraint_from_request(guided_regex=r) for r in ("a", "aa"))
            >>> _ = gc.matcher(a); _ = gc.matcher(b); gc.cached_keys() == [b.key]
            True
        """
        with self._lock:
            return list(self._cache)

    def fill_bitmasks(self, matchers: Sequence[tuple[TokenMatcher, int]],
                      out: np.ndarray) -> None:
        """Compute many matchers' masks in parallel into rows of ``out`` (int32 ``[B, W]``).

        Rows not named keep their contents (set them to -1 for "all allowed").

        Example:
            >>> import numpy as np
            >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
            ...                                             constraint_from_request)
            >>> v = TokenVocabulary([b"", b"a", b"b"], eos_ids=[0])
            >>> gc = GrammarCompiler(v)
            >>> out = np.full((2, gc.words), -1, np.int32)
            >>> gc.fill_bitmasks([(gc.matcher(constraint_from_request(guided_regex="b")), 1)], out)
            >>> gc.unpack(out).tolist()
            [[True, True, True], [False, False, True]]
        """
        if out.dtype != np.int32 or out.ndim != 2 or out.shape[1] != self.words or \
                not out.flags.c_contiguous:
            raise ValueError(f"GrammarCompiler.fill_bitmasks: expected a C-contiguous int32 "
                             f"array [B, {self.words}], got {out.dtype} {out.shape}.")
        rows = [int(r) for _, r in matchers]
        if any(not 0 <= r < out.shape[0] for r in rows) or len(set(rows)) != len(rows):
            raise ValueError(f"GrammarCompiler.fill_bitmasks: expected distinct rows in "
                             f"[0, {out.shape[0]}), got {rows}.")
        if not matchers:
            return
        if self._executor is None:
            self._executor = self._llg.LLExecutor(self._threads)
        self._executor.unsafe_compute_mask_ptr([(m._m, r) for m, r in matchers],
                                               out.ctypes.data, self.words * 4, out.shape[0])

    def unpack(self, bits: np.ndarray) -> np.ndarray:
        """Packed masks ``[..., W]`` -> bool ``[..., vocab.size]``.

        Example:
            >>> import numpy as np
            >>> from langtorch.functional.constrain import GrammarCompiler, TokenVocabulary
            >>> GrammarCompiler(TokenVocabulary([b"", b"a"], eos_ids=[0])).unpack(
            ...     np.array([2], np.int32)).tolist()
            [False, True]
        """
        return unpack_bitmask(bits, self.vocab.size)
