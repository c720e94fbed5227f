"""Client-side rate limiting: a token bucket that reserves ahead (no polling, FIFO-fair)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable

__all__ = ["Slots", "TokenBucket"]


class TokenBucket:
    """A token bucket refilled at ``per_minute / 60`` tokens per second, holding at most ``capacity``.

    :meth:`reserve` takes the tokens at once and returns how long the caller must wait before
    using them: the bucket may go negative, and the deficit is the queue. Callers therefore
    never poll, and are served in the order they reserved. :meth:`adjust` reconciles an estimate
    with the real amount afterwards (a refund when the estimate was high). The clock is injected
    so tests run without sleeping; the bucket is thread-safe and independent of any event loop.

    Args:
        per_minute: sustained rate.
        capacity: burst size; default one minute's worth (``per_minute``): a limit "per minute"
            allows that much at once, and a single request larger than one second's worth
            (a 4,000-token prompt under 10,000 tokens/minute) must not wait for a refill.
        clock: a monotonic clock in seconds.

    Example:
        >>> now = [0.0]
        >>> bucket = TokenBucket(60, capacity=1, clock=lambda: now[0])
        >>> bucket.reserve(1), bucket.reserve(1), bucket.reserve(1)
        (0.0, 1.0, 2.0)
        >>> now[0] = 10.0; bucket.reserve(1)
        0.0
    """

    def __init__(self, per_minute: float, *, capacity: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if per_minute <= 0:
            raise ValueError(f"a rate limit must be positive, got per_minute={per_minute}.")
        self.rate = per_minute / 60.0
        self.capacity = capacity if capacity is not None else max(1.0, float(per_minute))
        self.clock = clock
        self._tokens = self.capacity
        self._stamp = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def reserve(self, amount: float) -> float:
        """Take ``amount`` tokens; return the seconds to wait before they are really available."""
        with self._lock:
            self._refill()
            self._tokens -= amount
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def adjust(self, delta: float) -> None:
        """Take ``delta`` more tokens (negative: give some back), e.g. reported minus estimated usage."""
        with self._lock:
            self._refill()
            self._tokens = min(self.capacity, self._tokens - delta)

    @property
    def available(self) -> float:
        """Tokens available now (negative while callers are queued)."""
        with self._lock:
            self._refill()
            return self._tokens


class Slots:
    """A FIFO concurrency limit for one event loop: ``async with slots:`` holds one of ``n`` slots.

    ``asyncio.Semaphore`` scans its waiters on every acquire (Python 3.11), which turns a call of
    2,000 requests at concurrency 100 into millions of steps; here acquire and release are O(1):
    a released slot is handed straight to the oldest waiter.

    Example:
        >>> import asyncio
        >>> async def main():
        ...     slots, peak, now = Slots(2), [0], [0]
        ...     async def job():
        ...         async with slots:
        ...             now[0] += 1; peak[0] = max(peak[0], now[0])
        ...             await asyncio.sleep(0)
        ...             now[0] -= 1
        ...     await asyncio.gather(*(job() for _ in range(10)))
        ...     return peak[0]
        >>> asyncio.run(main())
        2
    """

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"a concurrency limit must be at least 1, got {n}.")
        self.limit = int(n)
        self._free = int(n)
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    async def acquire(self) -> None:
        """Wait for a slot (first come, first served)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we were cancelled: pass it on
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        """Give the slot to the oldest waiter, or back to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
