"""Grad mode: whether ops record the provenance graph (``lt.no_grad``, ``lt.enable_grad``).

The flag lives in a :class:`contextvars.ContextVar`, so it is per thread and per asyncio task,
and follows a call into langtorch's private runtime loop (``run_sync`` copies the context).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["enable_grad", "is_grad_enabled", "no_grad", "set_grad_enabled"]

F = TypeVar("F", bound=Callable[..., Any])

_grad_enabled: contextvars.ContextVar[bool] = contextvars.ContextVar("langtorch_grad_enabled", default=True)


def is_grad_enabled() -> bool:
    """Whether ops record provenance in the current context (True unless under ``no_grad``).

    Example:
        >>> import langtorch as lt
        >>> with lt.no_grad():
        ...     lt.is_grad_enabled()
        False
    """
    return _grad_enabled.get()


class set_grad_enabled:  # noqa: N801 - the torch name
    """Turn provenance recording on or off within a ``with`` block (or as a decorator).

    Args:
        mode: ``True`` to record, ``False`` not to.

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Q: {}")
        >>> with lt.set_grad_enabled(False):
        ...     (p + "why?").grad_fn is None
        True
    """

    def __init__(self, mode: bool):
        if not isinstance(mode, bool):
            raise TypeError(f"set_grad_enabled expected a bool, got {type(mode).__name__}")
        self.mode = mode
        # Earlier values per context: one instance may be entered by several tasks at once.
        self._saved: contextvars.ContextVar[tuple[bool, ...]] = contextvars.ContextVar(
            "langtorch_grad_saved", default=())

    def __enter__(self) -> set_grad_enabled:
        self._saved.set(self._saved.get() + (_grad_enabled.get(),))
        _grad_enabled.set(self.mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        saved = self._saved.get()
        _grad_enabled.set(saved[-1])
        self._saved.set(saved[:-1])

    def __call__(self, fn: F) -> F:
        mode = self.mode
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with set_grad_enabled(mode):
                    return await fn(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(f"{type(self).__name__} cannot decorate the generator {fn.__qualname__}: "
                            "the mode would not hold between its steps; use a with block inside it")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class no_grad(set_grad_enabled):  # noqa: N801 - the torch name
    """Within the block no provenance is recorded: results have ``grad_fn is None`` and a
    later ``backward()`` through them says that ``no_grad`` cut the graph. Also a decorator.

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Summarize: {}")
        >>> with lt.no_grad():
        ...     out = p + "a text"
        >>> out.requires_grad
        False
    """

    def __init__(self) -> None:
        super().__init__(False)


class enable_grad(set_grad_enabled):  # noqa: N801 - the torch name
    """Turn recording back on inside a ``no_grad`` block. Also a decorator.

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Q: {}")
        >>> with lt.no_grad(), lt.enable_grad():
        ...     (p + "x").requires_grad
        True
    """

    def __init__(self) -> None:
        super().__init__(True)
