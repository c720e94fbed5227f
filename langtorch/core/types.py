"""The value types that cross every layer: what a model answered and what it cost.

:class:`Usage` (token counts), :class:`Choice` (one generated answer), :class:`Completion` (one
response: its choices, usage and model) and :class:`Embeddings` (vectors for many inputs). They sit
in the core so that the tracer, the runtime, the backends and the modules share them without
importing one another; ``langtorch.backends`` re-exports them.

Example:
    >>> from langtorch.core.types import Choice, Completion, Usage
    >>> Completion(choices=(Choice("hi"),), usage=Usage(3, 1)).usage.total_tokens
    4
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["Choice", "Completion", "Embeddings", "Usage"]


@dataclasses.dataclass(frozen=True)
class Usage:
    """Token counts of one response (or a sum of responses).

    Attributes:
        prompt_tokens: tokens read.
        completion_tokens: tokens generated.

    Example:
        >>> Usage(10, 5) + Usage(1, 2)
        Usage(prompt_tokens=11, completion_tokens=7)
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """``prompt_tokens + completion_tokens``."""
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


@dataclasses.dataclass(frozen=True)
class Choice:
    """One generated answer.

    Attributes:
        text: the assistant message's text content (``""`` when it only calls tools).
        finish_reason: ``"stop"``, ``"length"``, ``"tool_calls"``, ... as the server said.
        message: the full assistant message as a dict (``tool_calls``, ``refusal``, ...); ``None``
            means ``{"role": "assistant", "content": text}``.
        logprobs: the choice's ``logprobs`` object as a dict, when requested.

    Example:
        >>> Choice("Paris").finish_reason
        'stop'
    """

    text: str
    finish_reason: str | None = "stop"
    message: Mapping[str, Any] | None = None
    logprobs: Any = None


@dataclasses.dataclass(frozen=True)
class Completion:
    """The answer to one chat-completions request: ``n`` choices, usage and the model's name.

    Attributes:
        choices: one :class:`Choice` per sample (``len(choices) == request.get("n", 1)``).
        usage: token counts of the whole request; zero when it came from the cache.
        model: the model name the server reported.
        cached: whether the runtime served it from the response cache.

    Example:
        >>> c = Completion((Choice("a"), Choice("b")), Usage(4, 2), "m")
        >>> c.text, [ch.text for ch in c.choices]
        ('a', ['a', 'b'])
    """

    choices: tuple[Choice, ...]
    usage: Usage = Usage()
    model: str = ""
    cached: bool = False

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.choices[0].text


@dataclasses.dataclass(frozen=True)
class Embeddings:
    """Vectors for a list of inputs.

    Attributes:
        vectors: float32 array of shape ``[len(inputs), dim]``, in input order.
        usage: token counts (``completion_tokens`` is 0).
        model: the model name.

    Example:
        >>> import numpy as np
        >>> Embeddings(np.zeros((2, 3), np.float32)).vectors.shape
        (2, 3)
    """

    vectors: np.ndarray
    usage: Usage = Usage()
    model: str = ""
