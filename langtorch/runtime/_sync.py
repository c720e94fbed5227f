"""Run a coroutine to completion from synchronous code, even inside a running event loop.

Jupyter runs an event loop in the main thread, so ``asyncio.run`` fails there, and patching the
loop (``nest_asyncio``) breaks other libraries. Instead every synchronous call runs on a private
loop in a daemon worker thread that lives for the process. One persistent loop also keeps HTTP
connection pools warm between calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["is_private_loop", "run_sync"]

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="langtorch-runtime-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()


_runner: _LoopThread | None = None
_runner_lock = threading.Lock()


def _get_runner() -> _LoopThread:
    global _runner
    with _runner_lock:
        if _runner is None or not _runner.thread.is_alive():
            _runner = _LoopThread()
        return _runner


def is_private_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` is langtorch's private runtime loop (it lives until the process exits).

    Example:
        >>> import asyncio
        >>> is_private_loop(asyncio.new_event_loop())
        False
    """
    return _runner is not None and loop is _runner.loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on langtorch's private event loop thread and return its result.

    Works with or without a running loop in the calling thread (Jupyter, async frameworks). A
    ``KeyboardInterrupt`` while waiting cancels the coroutine (its completed work, e.g. cached
    answers, is kept) and is re-raised.

    Example:
        >>> import asyncio
        >>> async def twice(x):
        ...     await asyncio.sleep(0)
        ...     return 2 * x
        >>> run_sync(twice(21))
        42
        >>> async def inside_a_loop():
        ...     return run_sync(twice(1))   # a sync call from async code still works
        >>> asyncio.run(inside_a_loop())
        2
    """
    runner = _get_runner()
    if threading.current_thread() is runner.thread:
        # Called from code already running on the private loop (a sync call nested in an async
        # one): blocking this loop would deadlock, so use a fresh loop in a fresh thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()
    future = asyncio.run_coroutine_threadsafe(coro, runner.loop)
    try:
        return future.result()
    except KeyboardInterrupt:
        future.cancel()
        try:
            future.result(timeout=5)
        except BaseException:  # noqa: BLE001 - we are already unwinding for Ctrl-C
            pass
        raise
