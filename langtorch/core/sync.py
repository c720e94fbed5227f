"""Run a coroutine to completion from synchronous code, even inside a running event loop.

Jupyter runs an event loop in the main thread, so ``asyncio.run`` fails there, and patching the
loop (``nest_asyncio``) breaks other libraries. Instead every synchronous call runs on a private
loop in a daemon worker thread that lives for the process. One persistent loop also keeps HTTP
connection pools warm between calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["is_private_loop", "nested_sync_calls", "run_sync"]

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
# Set in the fresh threads that run a nested sync call: a sync call nested in *that* must not
# go back to the private loop, which is blocked waiting for it.
_local = threading.local()
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
    ``KeyboardInterrupt`` while waiting cancels the coroutine, waits (at most 5 s) until it has
    unwound (its completed work, e.g. cached answers, is then on disk) and is re-raised.

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
    if threading.current_thread() is runner.thread or getattr(_local, "nested", False):
        # Called from code already running on the private loop (a sync call nested in an async
        # one), or from a thread serving such a call: blocking that loop would deadlock, so use
        # a fresh loop in a fresh thread.
        # The caller's context (trace, call path, grad mode) goes along into the fresh thread.
        ctx = contextvars.copy_context()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(ctx.run, _run_nested, coro).result()
    # run_coroutine_threadsafe schedules the task from a callback that runs in a copy of this
    # thread's context, so traces, call paths and grad mode follow the call onto the loop.
    finished = threading.Event()

    async def tracked() -> T:
        try:
            return await coro
        finally:
            finished.set()  # cleanup (cache flush, connection release) is done

    future = asyncio.run_coroutine_threadsafe(tracked(), runner.loop)
    try:
        return future.result()
    except KeyboardInterrupt:
        # Cancel, then wait (bounded) until the coroutine has unwound: its finally blocks write
        # the completed answers to the cache. The concurrent future reports "cancelled" at once,
        # long before that, so it cannot be what we wait on.
        runner.loop.call_soon_threadsafe(future.cancel)
        future.cancel()
        finished.wait(_INTERRUPT_GRACE_SECONDS)
        raise


_INTERRUPT_GRACE_SECONDS = 5.0


def _run_nested(coro: Coroutine[Any, Any, T]) -> T:
    _local.nested = True
    try:
        return asyncio.run(coro)
    finally:
        _local.nested = False


@contextlib.contextmanager
def nested_sync_calls() -> Iterator[None]:
    """Within this block (in the current thread), a sync langtorch call runs on a fresh event loop
    in a new thread instead of the runtime's private loop.

    For code that runs *for* the private loop in a worker thread and may itself make sync calls:
    a sync tool that calls an LLM (a sub-agent). On the runtime's loop those calls would queue
    behind the worker threads their callers hold — with more callers than workers, a deadlock.

    Example:
        >>> from langtorch.core.sync import nested_sync_calls, run_sync
        >>> async def one():
        ...     return 1
        >>> with nested_sync_calls():
        ...     run_sync(one())
        1
    """
    before = getattr(_local, "nested", False)
    _local.nested = True
    try:
        yield
    finally:
        _local.nested = before
