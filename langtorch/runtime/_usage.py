"""Token estimates before a call, and cost from a price table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langtorch.backends.base import Usage

__all__ = ["cost_of", "estimate_completion_tokens", "estimate_prompt_tokens", "price_for"]

# Used when a request sets no max_tokens: a typical short answer. The reconcile step corrects the
# token bucket from the reported usage afterwards.
DEFAULT_COMPLETION_ESTIMATE = 256


def estimate_prompt_tokens(request: Mapping[str, Any]) -> int:
    """A quick upper-leaning guess of a request's prompt tokens (about 4 characters a token).

    Example:
        >>> estimate_prompt_tokens({"messages": [{"role": "user", "content": "x" * 40}]})
        14
    """
    chars = 0
    for message in request.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            chars += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, Mapping))
        elif content:
            chars += len(str(content))
        chars += 4 * 4  # role and framing tokens
    for key in ("tools", "response_format"):
        if key in request:
            chars += len(str(request[key]))
    return max(1, chars // 4)


def estimate_completion_tokens(request: Mapping[str, Any]) -> int:
    """``max_completion_tokens``/``max_tokens`` when set (an upper bound), else a typical answer, times n.

    Example:
        >>> estimate_completion_tokens({"max_tokens": 10, "n": 3})
        30
    """
    limit = request.get("max_completion_tokens") or request.get("max_tokens")
    per_sample = int(limit) if limit else DEFAULT_COMPLETION_ESTIMATE
    return per_sample * int(request.get("n") or 1)


def price_for(price: Any, model: str) -> tuple[float, float] | None:
    """The ``(prompt, completion)`` price per million tokens for ``model``, or ``None``.

    ``price`` is a pair, or a mapping from model name to a pair (exact name first, then the
    longest key that the name starts with, so ``"gpt-4o"`` covers ``"gpt-4o-2024-08-06"``).

    Example:
        >>> price_for({"gpt-4o": (2.5, 10.0)}, "gpt-4o-2024-08-06")
        (2.5, 10.0)
    """
    if price is None:
        return None
    if isinstance(price, Mapping):
        if model in price:
            return tuple(price[model])  # type: ignore[return-value]
        prefixes = sorted((k for k in price if model.startswith(k)), key=len, reverse=True)
        return tuple(price[prefixes[0]]) if prefixes else None  # type: ignore[return-value]
    prompt, completion = price
    return float(prompt), float(completion)


def cost_of(usage: Usage, price: tuple[float, float] | None) -> float:
    """Cost of ``usage`` at ``price`` (per million tokens); 0 without a price.

    Example:
        >>> cost_of(Usage(1_000_000, 500_000), (1.0, 4.0))
        3.0
    """
    if price is None:
        return 0.0
    return (usage.prompt_tokens * price[0] + usage.completion_tokens * price[1]) / 1e6
