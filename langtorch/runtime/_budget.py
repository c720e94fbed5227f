"""Call budgets: stop before a block of work exceeds a number of calls, tokens or cost.

A :class:`Budget` is active inside ``with budget:`` (a context variable: per thread and task,
and it follows calls onto langtorch's runtime loop). Before each attempt the executor checks
every active budget; an attempt that could exceed one is not sent and ends its entry with a
:class:`~langtorch.errors.BudgetExceededError`. Cache hits cost nothing and are not counted.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any

from langtorch.errors import BudgetExceededError

__all__ = ["Budget", "active_budgets"]

_active: contextvars.ContextVar[tuple[Budget, ...]] = contextvars.ContextVar("langtorch_budgets", default=())


def active_budgets() -> tuple[Budget, ...]:
    """The budgets active in this context (innermost last)."""
    return _active.get()


class Budget:
    """A meter of calls (attempts sent, retries included), tokens and cost, with optional limits.

    Args:
        max_calls: most attempts that may be sent.
        max_tokens: most tokens (prompt + completion; estimated before an attempt, counted from
            the reported usage after).
        max_cost: most cost (at each backend's price; backends without a price count 0).

    Attributes:
        calls, tokens, cost: what was spent inside the budget so far.

    Example:
        >>> import langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> budget = lt.optim.Budget(max_calls=2)
        >>> with OpenAIServer() as server:
        ...     llm = lt.nn.LLM(OpenAIBackend("m", base_url=server.url, api_key="sk-test1234"))
        ...     with budget:
        ...         try:
        ...             llm(lt.TextTensor(["a", "b", "c"]))
        ...         except lt.errors.BudgetExceededError as e:
        ...             print(sorted(e.errors))
        [(2,)]
        >>> budget.calls
        2
    """

    def __init__(self, max_calls: int | None = None, max_tokens: int | None = None,
                 max_cost: float | None = None):
        for name, v in (("max_calls", max_calls), ("max_tokens", max_tokens)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"{name} must be a non-negative int or None, got {v!r}")
        if max_cost is not None and (isinstance(max_cost, bool) or not isinstance(max_cost, (int, float)) or max_cost < 0):
            raise ValueError(f"max_cost must be a non-negative number or None, got {max_cost!r}")
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_cost = None if max_cost is None else float(max_cost)
        self.calls = 0
        self.tokens = 0
        self.cost = 0.0
        self._reserved_tokens = 0
        self._reserved_cost = 0.0
        self._lock = threading.Lock()

    @property
    def exhausted(self) -> bool:
        """Whether no further call fits (calls at the limit)."""
        return self.max_calls is not None and self.calls >= self.max_calls

    def remaining_calls(self) -> int | None:
        """Calls left (``None`` without a call limit)."""
        return None if self.max_calls is None else max(0, self.max_calls - self.calls)

    def __enter__(self) -> Budget:
        # Entering twice in one context is a no-op inside (counted once per attempt).
        _active.set(_active.get() + (self,))
        return self

    def __exit__(self, *exc: Any) -> None:
        active = list(_active.get())
        for i in range(len(active) - 1, -1, -1):  # remove this budget's innermost entry
            if active[i] is self:
                del active[i]
                break
        _active.set(tuple(active))

    # ------------------------------------------------------------------ executor interface
    def reserve(self, est_tokens: int, est_cost: float, what: str) -> None:
        """Claim one attempt (raises BudgetExceededError, claiming nothing, when it does not fit)."""
        with self._lock:
            if self.max_calls is not None and self.calls + 1 > self.max_calls:
                raise BudgetExceededError(
                    f"{what} was not sent: the budget allows {self.max_calls} calls and all are "
                    "used. Raise max_calls, or evaluate on fewer entries.",
                    spent=self.cost, budget=self.max_cost or 0.0)
            if self.max_tokens is not None and self.tokens + self._reserved_tokens + est_tokens > self.max_tokens:
                raise BudgetExceededError(
                    f"{what} was not sent: it could use up to {est_tokens} tokens, and with "
                    f"{self.tokens} used (+{self._reserved_tokens} in flight) that exceeds "
                    f"max_tokens={self.max_tokens}.", spent=self.cost, budget=self.max_cost or 0.0)
            if self.max_cost is not None and self.cost + self._reserved_cost + est_cost > self.max_cost:
                raise BudgetExceededError(
                    f"{what} was not sent: it could cost up to {est_cost:.6g}, and with "
                    f"{self.cost:.6g} spent that exceeds max_cost={self.max_cost:g}.",
                    spent=self.cost, budget=self.max_cost)
            self.calls += 1
            self._reserved_tokens += est_tokens
            self._reserved_cost += est_cost

    def release(self, est_tokens: int, est_cost: float) -> None:
        """Undo a :meth:`reserve` whose attempt was not sent."""
        with self._lock:
            self.calls -= 1
            self._reserved_tokens -= est_tokens
            self._reserved_cost -= est_cost

    def settle(self, est_tokens: int, est_cost: float, tokens: int, cost: float) -> None:
        """Replace an attempt's estimate by what it used (0 when it failed)."""
        with self._lock:
            self._reserved_tokens -= est_tokens
            self._reserved_cost -= est_cost
            self.tokens += tokens
            self.cost += cost

    def state_dict(self) -> dict[str, Any]:
        """The counters and limits as plain data."""
        return {"max_calls": self.max_calls, "max_tokens": self.max_tokens, "max_cost": self.max_cost,
                "calls": self.calls, "tokens": self.tokens, "cost": self.cost}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counters (what was spent). The limits given to this
        budget stand; a saved limit only tightens one that is unset or looser."""
        def tighter(mine: Any, saved: Any) -> Any:
            if saved is None:
                return mine
            return saved if mine is None else min(mine, saved)

        self.max_calls = tighter(self.max_calls, state.get("max_calls"))
        self.max_tokens = tighter(self.max_tokens, state.get("max_tokens"))
        self.max_cost = tighter(self.max_cost, state.get("max_cost"))
        self.calls, self.tokens = int(state.get("calls", 0)), int(state.get("tokens", 0))
        self.cost = float(state.get("cost", 0.0))

    def __repr__(self) -> str:
        def lim(v: Any) -> str:
            return "∞" if v is None else str(v)

        return (f"Budget(calls={self.calls}/{lim(self.max_calls)}, tokens={self.tokens}/"
                f"{lim(self.max_tokens)}, cost={self.cost:.6g}/{lim(self.max_cost)})")
