"""langtorch.backends — model backends behind one interface (:class:`Backend`).

* :class:`Backend` and its value types (``Capabilities``, ``Completion``, ``Choice``, ``Usage``, ``Embeddings``,
  ``RuntimeOptions``) in ``langtorch.backends.base``.
* ``OpenAIBackend``: any OpenAI-compatible server through the official ``openai`` client.
* ``LocalBackend``: a local model in JAX (``langtorch.backends.local``), imported on first use;
  ``StreamEvent``: its per-choice streaming deltas.

Example:
    >>> from langtorch.backends import Backend, Completion
    >>> issubclass(Backend, object)
    True
"""

from __future__ import annotations

from typing import Any

from langtorch.backends.base import (
    Backend,
    Capabilities,
    Choice,
    Completion,
    Embeddings,
    RuntimeOptions,
    Usage,
)

__all__ = [
    "Backend",
    "Capabilities",
    "Choice",
    "Completion",
    "Embeddings",
    "LocalBackend",
    "OpenAIBackend",
    "RuntimeOptions",
    "StreamEvent",
    "Usage",
]


def __getattr__(name: str) -> Any:
    # Imported lazily: the openai client and the JAX model are heavy, and a user of one backend
    # should not pay for the other.
    if name == "OpenAIBackend":
        from langtorch.backends._openai import OpenAIBackend

        return OpenAIBackend
    if name in ("LocalBackend", "StreamEvent"):
        from langtorch.backends import local

        return getattr(local, name)
    raise AttributeError(f"module 'langtorch.backends' has no attribute {name!r}")
