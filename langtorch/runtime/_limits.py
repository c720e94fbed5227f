"""Client-side rate limiting: a token bucket that reserves ahead (no polling, FIFO-fair)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """A token bucket refilled at ``per_minute / 60`` tokens per second, holding at most ``capacity``.

    :meth:`reserve` takes the tokens at once and returns how long the caller must wait before
    using them: the bucket may go negative, and the deficit is the queue. Callers therefore
    never poll, and are served in the order they reserved. :meth:`adjust` reconciles an estimate
    with the real amount afterwards (a refund when the estimate was high). The clock is injected
    so tests run without sleeping; the bucket is thread-safe and independent of any event loop.

    Args:
        per_minute: sustained rate.
        capacity: burst size; default one second's worth (at least 1).
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
        self.capacity = capacity if capacity is not None else max(1.0, self.rate)
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
