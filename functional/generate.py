"""Text-side helpers of generation over the decode engine (:mod:`.engine`).

The engine works on token ids; stop strings live on the decoded text. :func:`truncate_at_stop`
cuts a continuation before its first stop string and says how many tokens produced that text
(so usage counts only those). To decode token-id prompts, use
:meth:`langtorch.functional.engine.SlotBatch.run` (all prompts up front) or
``langtorch.models.engine_for(model)`` (requests that come and go).

Example:
    >>> from langtorch.functional.generate import truncate_at_stop
    >>> truncate_at_stop([1, 2], lambda ids: "".join("ab"[i - 1] for i in ids), ["b"])
    ('a', 2, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["truncate_at_stop"]


def truncate_at_stop(
    tokens: Sequence[int], decode: Callable[[Sequence[int]], str], stop: Sequence[str]
) -> tuple[str, int, bool]:
    """Cut a continuation before the first stop string.

    Returns ``(text, tokens_used, stopped)``: the text before the earliest stop string, the number
    of tokens needed to produce it (the smallest prefix whose text contains the stop string), and
    whether a stop string was found.

    Example:
        >>> from langtorch.functional.generate import truncate_at_stop
        >>> vocab = {1: "Hel", 2: "lo", 3: " wor", 4: "ld"}
        >>> decode = lambda ids: "".join(vocab[i] for i in ids)
        >>> truncate_at_stop([1, 2, 3, 4], decode, [" w"])
        ('Hello', 3, True)
    """
    text = decode(tokens)
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    if cut < 0:
        return text, len(tokens), False
    lo, hi = 1, len(tokens)  # smallest prefix that already contains the stop string
    while lo < hi:
        mid = (lo + hi) // 2
        prefix = decode(tokens[:mid])
        if any(s and s in prefix for s in stop):
            hi = mid
        else:
            lo = mid + 1
    return text[:cut], lo, True
