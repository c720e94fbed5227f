"""Errors raised by the torch <-> JAX bridge (subclasses of the shared hierarchy)."""

from __future__ import annotations

from langtorch.functional.errors import LangTorchError

__all__ = ["InteropError", "DtypeNarrowingError", "DoubleBackwardError"]


class InteropError(LangTorchError, RuntimeError):
    """A tensor or function cannot cross the torch <-> JAX boundary as asked.

    Example:
        >>> from langtorch.interop import InteropError
        >>> issubclass(InteropError, RuntimeError)
        True
    """


class DtypeNarrowingError(InteropError, TypeError):
    """A 64-bit tensor would be silently narrowed to 32 bits by JAX (x64 disabled).

    Example:
        >>> import torch
        >>> from langtorch.interop import to_jax, DtypeNarrowingError
        >>> try:
        ...     to_jax(torch.zeros(2, dtype=torch.int64))
        ... except DtypeNarrowingError as e:
        ...     print("JAX_ENABLE_X64" in str(e))
        True
    """


class DoubleBackwardError(InteropError):
    """Second-order gradients through a bridged JAX function are not supported.

    Example:
        >>> from langtorch.interop import DoubleBackwardError
        >>> issubclass(DoubleBackwardError, RuntimeError)
        True
    """
