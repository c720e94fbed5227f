"""The limits on one attempt, each an async context manager that owns its undo.

An attempt passes, in order: the concurrency slot (``max_concurrency``), the request bucket
(``requests_per_minute``), the token bucket (``tokens_per_minute``), the backend's cost cap
(``max_cost``) and every active :class:`~langtorch.runtime.Budget`. Entering a limit reserves
(waiting for a bucket, or refusing with :class:`~langtorch.errors.BudgetExceededError`);
leaving it settles the reservation against what the attempt used, or refunds it when the attempt
was not sent. The executor enters them with one :class:`contextlib.AsyncExitStack`, so a refusal
at any step unwinds exactly the limits entered before it — no exit path keeps its own list of
things to give back.

What each limit does on leaving, by how the attempt ended:

============== ================= ================== ===================== ==================
limit          not sent          answered           failed (BackendError) other exception
============== ================= ================== ===================== ==================
request bucket refund 1          keep               keep (the server saw  keep
                                                    the request)
token bucket   refund estimate   charge usage       refund estimate       keep
cost cap       release estimate  release (the cost  release               release
                                 is on the backend)
budget         release           settle to usage    settle to 0           settle to 0
============== ================= ================== ===================== ==================

A new limit is one more class here with ``__aenter__`` / ``__aexit__`` reading :class:`Ticket`,
and one line in ``_Call._limits`` (``runtime/_executor.py``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from langtorch.core.types import Usage
from langtorch.errors import BackendError, BudgetExceededError
from langtorch.runtime._budget import Budget
from langtorch.runtime._limits import TokenBucket

__all__ = ["BudgetClaim", "CostCap", "RequestRate", "Ticket", "TokenRate"]

Sleep = Callable[[float], Awaitable[Any]]


@dataclasses.dataclass
class Ticket:
    """One attempt as the limits see it: its estimate, whether it went out, what it used.

    Example:
        >>> t = Ticket(tokens=30, cost=0.0, what="request 0")
        >>> t.sent, t.usage
        (False, None)
    """

    tokens: int
    cost: float
    what: str
    sent: bool = False
    usage: Usage | None = None  # the reported usage, once the attempt answered
    spent: float = 0.0  # the cost of ``usage``

    @property
    def used_tokens(self) -> int:
        return 0 if self.usage is None else self.usage.total_tokens


class _Reservation:
    """Take ``amount`` from a token bucket on entering, waiting until it is there; a
    cancellation while waiting gives it back."""

    def __init__(self, bucket: TokenBucket, amount: float, ticket: Ticket, sleep: Sleep):
        self.bucket, self.amount, self.ticket, self.sleep = bucket, amount, ticket, sleep

    async def __aenter__(self) -> None:
        wait = self.bucket.reserve(self.amount)
        if wait > 0:
            try:
                await self.sleep(wait)
            except BaseException:
                self.bucket.adjust(-self.amount)
                raise


class RequestRate(_Reservation):
    """One request from the request bucket; refunded when the attempt was not sent.

    Example:
        >>> import asyncio
        >>> from langtorch.runtime import TokenBucket
        >>> bucket = TokenBucket(60, capacity=1.0, clock=lambda: 0.0)
        >>> async def refused():
        ...     async with RequestRate(bucket, Ticket(1, 0.0, "x"), asyncio.sleep):
        ...         raise RuntimeError("refused before sending")
        >>> try:
        ...     asyncio.run(refused())
        ... except RuntimeError:
        ...     pass
        >>> bucket.available
        1.0
    """

    def __init__(self, bucket: TokenBucket, ticket: Ticket, sleep: Sleep):
        super().__init__(bucket, 1, ticket, sleep)

    async def __aexit__(self, *exc: Any) -> None:
        if not self.ticket.sent:
            self.bucket.adjust(-1)


class TokenRate(_Reservation):
    """The attempt's estimated tokens from the token bucket; charged the reported usage when it
    answered, refunded when it was not sent or failed (nothing was consumed).

    Example:
        >>> import asyncio
        >>> from langtorch.runtime import TokenBucket
        >>> bucket = TokenBucket(6000, capacity=1000, clock=lambda: 0.0)
        >>> async def answered():
        ...     ticket = Ticket(300, 0.0, "x")
        ...     async with TokenRate(bucket, ticket, asyncio.sleep):
        ...         ticket.sent, ticket.usage = True, Usage(40, 10)
        >>> asyncio.run(answered()); bucket.available
        950.0
    """

    def __init__(self, bucket: TokenBucket, ticket: Ticket, sleep: Sleep):
        super().__init__(bucket, ticket.tokens, ticket, sleep)

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.ticket.usage is not None:
            self.bucket.adjust(self.ticket.used_tokens - self.amount)
        elif not self.ticket.sent or isinstance(exc, BackendError):
            self.bucket.adjust(-self.amount)


class CostCap:
    """The backend's ``max_cost``: the attempt's estimated cost is held while it runs, so
    concurrent attempts cannot together pass the cap; an attempt that could pass it is refused.

    ``spent`` reads the backend's cost so far; ``held`` is the backend's running total of
    estimates in flight (a one-element list shared by its attempts, guarded by ``lock``).

    Example:
        >>> import asyncio
        >>> async def two(cap_of):
        ...     async with cap_of(6.0):
        ...         async with cap_of(6.0):
        ...             pass
        >>> held, lock = [0.0], threading.Lock()
        >>> try:
        ...     asyncio.run(two(lambda c: CostCap(10.0, lambda: 0.0, held, lock, Ticket(1, c, "x"))))
        ... except BudgetExceededError as e:
        ...     print(str(e)[:33], held)
        x was not sent: it could cost up  [0.0]
    """

    def __init__(self, limit: float, spent: Callable[[], float], held: list[float],
                 lock: threading.Lock, ticket: Ticket):
        self.limit, self.spent, self.held, self.lock, self.ticket = limit, spent, held, lock, ticket

    async def __aenter__(self) -> None:
        cost = self.ticket.cost
        with self.lock:
            spent = self.spent()
            if spent + self.held[0] + cost > self.limit:
                raise BudgetExceededError(
                    f"{self.ticket.what} was not sent: it could cost up to {cost:.6g}, and with "
                    f"{spent:.6g} spent (+{self.held[0]:.6g} in flight) that exceeds "
                    f"max_cost={self.limit:g}. Raise max_cost, set max_tokens lower, or start a "
                    "new backend.", spent=spent, budget=self.limit)
            self.held[0] += cost

    async def __aexit__(self, *exc: Any) -> None:
        with self.lock:
            self.held[0] -= self.ticket.cost


class BudgetClaim:
    """One attempt claimed from a :class:`~langtorch.runtime.Budget` (``with budget:``);
    released when the attempt was not sent, else settled to what it used (0 when it failed).

    Example:
        >>> import asyncio
        >>> from langtorch.runtime import Budget
        >>> budget = Budget(max_calls=5)
        >>> async def answered():
        ...     ticket = Ticket(100, 0.0, "x")
        ...     async with BudgetClaim(budget, ticket):
        ...         ticket.sent, ticket.usage = True, Usage(7, 3)
        >>> asyncio.run(answered()); budget.calls, budget.tokens
        (1, 10)
    """

    def __init__(self, budget: Budget, ticket: Ticket):
        self.budget, self.ticket = budget, ticket

    async def __aenter__(self) -> None:
        self.budget.reserve(self.ticket.tokens, self.ticket.cost, self.ticket.what)

    async def __aexit__(self, *exc: Any) -> None:
        t = self.ticket
        if not t.sent:
            self.budget.release(t.tokens, t.cost)
        else:
            self.budget.settle(t.tokens, t.cost, t.used_tokens, t.spent)
