"""The executor: many requests to one backend, concurrently, under limits, retries, cache and budget.

For one call (a list of requests, one per entry):

1. Identical requests (canonical JSON) with ``temperature=0`` are sent once and share the
   answer. Any other identical requests are *samples*: the ``k``-th copy of a request with
   ``n`` choices is sent on its own and gets sample indices ``k*n .. k*n+n-1`` (distinct
   answers, and a rerun returns the same per-entry samples from the cache).
2. Cached samples are looked up (:mod:`._cache`, keyed by the backend's ``cache_namespace`` as
   well); a request whose samples are all cached is not sent, and reports zero usage. A partly
   cached ``n > 1`` request asks only for the rest.
3. The rest run as tasks. Each attempt enters a concurrency slot (``max_concurrency``), then the
   request and token buckets, the cost cap and the active budgets (:mod:`._policies`: each an
   async context manager that reserves, then settles or refunds itself), and calls
   ``backend.complete`` under ``timeout``. A retryable failure (429, 5xx, timeout, dropped
   connection, malformed body) is retried after ``Retry-After`` when the server gave one, else
   after ``backoff_base * 2**attempt`` (capped at ``backoff_max``) with jitter in [50%, 100%] so
   that clients that failed together do not retry together. A ``Retry-After`` above
   ``max_retry_after`` ends the request instead. 400/401/403/404 are not retried; an
   authentication failure stops the whole call at once.
4. Every completed request is written to the cache as it completes (only answers that pass the
   caller's ``validate``), so an interrupted call keeps its finished work. Results come back in
   input order, with per-entry errors alongside.

Each request answered, sent or from the cache, is reported to the request observers
(:mod:`langtorch.core.events`): the tracer, the request history and the call's progress bar
record it there; the executor does not call them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from langtorch.backends.base import Backend, Choice, Completion, Usage
from langtorch.core.events import RequestEvent, observe_request, report_request
from langtorch.core.sync import run_sync
from langtorch.errors import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BatchError,
    BudgetExceededError,
    RateLimitError,
)
from langtorch.runtime import _budget
from langtorch.runtime._cache import ResponseCache, canonical_json, resolve_cache
from langtorch.runtime._limits import Slots, TokenBucket
from langtorch.runtime._policies import BudgetClaim, CostCap, RequestRate, Ticket, TokenRate
from langtorch.runtime._usage import (
    cost_of,
    estimate_completion_tokens,
    estimate_prompt_tokens,
    price_for,
)

__all__ = ["CallResult", "acomplete", "aembed", "astream", "complete", "embed", "raise_for_errors"]

log = logging.getLogger("langtorch.runtime")

T = TypeVar("T")

# Indirection so tests can record the waits (rate limits, backoff) instead of sleeping.
_sleep = asyncio.sleep


@dataclasses.dataclass
class CallResult:
    """What one executor call produced, entry by entry, in input order.

    Attributes:
        completions: one :class:`~langtorch.backends.Completion` per request, ``None`` where it
            failed.
        errors: request index -> the exception that ended it.
        usage: tokens this call spent (cache hits and de-duplicated copies count zero).
        cost: cost of ``usage`` at the backend's price (0 without a price).
        cache_hits: requests answered entirely from the cache.
        sent: distinct requests that went to the backend (at least one attempt).
        attempts: attempts in total, retries included.

    Example:
        >>> CallResult([None], {0: ValueError("x")}).ok
        False
    """

    completions: list[Completion | None]
    errors: dict[int, BaseException] = dataclasses.field(default_factory=dict)
    usage: Usage = Usage()
    cost: float = 0.0
    cache_hits: int = 0
    sent: int = 0
    attempts: int = 0

    @property
    def ok(self) -> bool:
        """Whether every request completed."""
        return not self.errors

    def __repr__(self) -> str:
        # Short: a call of thousands of entries must not print thousands of completions.
        failed = f", errors={len(self.errors)}" if self.errors else ""
        return (f"CallResult(requests={len(self.completions)}, sent={self.sent}, "
                f"cache_hits={self.cache_hits}, attempts={self.attempts}, "
                f"tokens={self.usage.prompt_tokens}+{self.usage.completion_tokens}, "
                f"cost={self.cost:.6g}{failed})")


class _BackendState:
    """Per-backend runtime state: buckets and budget (thread-safe), semaphores per event loop."""

    def __init__(self, backend: Backend):
        self.requests: TokenBucket | None = None
        self.tokens: TokenBucket | None = None
        self.cache: ResponseCache | None = None
        self._seen: tuple[Any, Any, Any] = (None, None, None)
        self.refresh(backend.options)
        options = backend.options
        self.lock = threading.Lock()
        # Estimated cost of the attempts in flight, held against max_cost (see CostCap).
        self.held_cost = [0.0]
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Slots] = (
            weakref.WeakKeyDictionary())
        if options.max_cost is not None and options.price is None:
            raise ValueError(
                f"max_cost={options.max_cost} needs a price to count against: pass price=(prompt, "
                "completion) per million tokens, or a {model: (prompt, completion)} table.")

    def refresh(self, options: Any) -> None:
        """Follow changes of ``backend.options`` made after the first call (limits, cache)."""
        rpm, tpm, cache = options.requests_per_minute, options.tokens_per_minute, options.cache
        seen_rpm, seen_tpm, seen_cache = self._seen
        if self.requests is None and rpm or rpm != seen_rpm:
            self.requests = TokenBucket(rpm) if rpm else None
        if self.tokens is None and tpm or tpm != seen_tpm:
            self.tokens = TokenBucket(tpm) if tpm else None
        if cache is not seen_cache and cache != seen_cache or (cache and self.cache is None):
            self.cache = resolve_cache(cache)
        self._seen = (rpm, tpm, cache)

    def semaphore(self, limit: int) -> Slots:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        limit = max(1, int(limit))
        if sem is None or sem.limit != limit:
            # A changed max_concurrency applies to requests that start from now on.
            sem = self._semaphores[loop] = Slots(limit)
        return sem


_states: weakref.WeakKeyDictionary[Backend, _BackendState] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def _state(backend: Backend) -> _BackendState:
    with _states_lock:
        state = _states.get(backend)
        if state is None:
            state = _states[backend] = _BackendState(backend)
        else:
            state.refresh(backend.options)
        return state


def _cache_for(backend: Backend, use_cache: bool) -> ResponseCache | None:
    return _state(backend).cache if use_cache else None


def _retry_delay(backend: Backend, attempt: int, error: BaseException) -> float:
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:
        # Honour the server's wait, plus a little jitter so the retries do not arrive together.
        return float(retry_after) * (1.0 + 0.1 * random.random())
    options = backend.options
    return min(options.backoff_max, options.backoff_base * 2.0**attempt) * random.uniform(0.5, 1.0)


class _Call:
    """Bookkeeping of one executor call (shared by its tasks)."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.state = _state(backend)
        self.usage = Usage()
        self.cost = 0.0
        self.attempts = 0
        self.sent = 0
        self.fatal: BaseException | None = None  # set on an authentication failure

    async def attempt(
        self,
        fn: Callable[[], Awaitable[T]],
        *,
        est_prompt: int,
        est_completion: int,
        model: str,
        what: str,
        usage_of: Callable[[T], Usage],
        whole_timeout: bool = True,
        event: RequestEvent | None = None,
    ) -> T:
        """Run ``fn`` under the limits, with timeout and retries; account its usage.

        ``whole_timeout=False``: ``fn`` applies ``options.timeout`` itself (a stream times each
        chunk, not the whole answer). ``event``: the request's event, whose ``attempts`` counts
        the attempts sent.
        """
        options = self.backend.options
        price = price_for(options.price, model)
        est_cost = cost_of(Usage(est_prompt, est_completion), price)
        first = True
        for attempt in range(options.max_retries + 1):
            if self.fatal is not None:
                raise self.fatal
            ticket = Ticket(est_prompt + est_completion, est_cost, what)
            try:
                return await self._once(fn, ticket, price, usage_of, whole_timeout, event, first)
            except BackendError as e:
                if not ticket.sent:
                    raise  # stopped before sending (the call's authentication failed)
                error: BackendError = e
            finally:
                first = first and not ticket.sent
            await _sleep(self._after_failure(error, what, attempt))
        raise AssertionError("unreachable")

    def _limits(self, ticket: Ticket) -> list[contextlib.AbstractAsyncContextManager[Any]]:
        """The limits an attempt enters after its concurrency slot, in order (see ._policies)."""
        state, options = self.state, self.backend.options
        sleep = _sleep  # looked up per attempt: tests replace it to record the waits
        limits: list[contextlib.AbstractAsyncContextManager[Any]] = []
        if state.requests is not None:
            limits.append(RequestRate(state.requests, ticket, sleep))
        if state.tokens is not None:
            limits.append(TokenRate(state.tokens, ticket, sleep))
        if options.max_cost is not None:
            limits.append(CostCap(options.max_cost, lambda: self.backend.cost, state.held_cost,
                                  state.lock, ticket))
        # Each active budget once (the same budget may be entered at several levels).
        limits += [BudgetClaim(b, ticket) for b in dict.fromkeys(_budget.active_budgets())]
        return limits

    async def _once(self, fn: Callable[[], Awaitable[T]], ticket: Ticket, price: Any,
                    usage_of: Callable[[T], Usage], whole_timeout: bool,
                    event: RequestEvent | None, first: bool) -> T:
        """One attempt: enter the slot and the limits, send, account; leaving settles them."""
        options = self.backend.options
        async with contextlib.AsyncExitStack() as limits:
            await limits.enter_async_context(self.state.semaphore(options.max_concurrency))
            if self.fatal is not None:
                raise self.fatal
            for limit in self._limits(ticket):
                await limits.enter_async_context(limit)
            ticket.sent = True
            self.sent += first
            self.attempts += 1
            if event is not None:
                event.attempts += 1
            result = await self._send(fn, ticket.what, whole_timeout)
            ticket.usage = usage_of(result)
            ticket.spent = cost_of(ticket.usage, price)
            self._account(ticket.usage, ticket.spent)
            return result

    async def _send(self, fn: Callable[[], Awaitable[T]], what: str, whole_timeout: bool) -> T:
        timeout = self.backend.options.timeout
        if timeout is None or not whole_timeout:
            return await fn()
        try:
            return await _with_timeout(fn(), timeout)
        except asyncio.TimeoutError:
            raise BackendTimeoutError(
                f"{what} got no answer within timeout={timeout} s; raise timeout= or check the "
                "server.") from None

    def _account(self, usage: Usage, cost: float) -> None:
        """Add an answered attempt to the backend's totals (before its cost cap lets go of the
        estimate, so the spend is never counted neither way) and the call's."""
        with self.state.lock:
            self.backend.usage = self.backend.usage + usage
            self.backend.cost += cost
        self.usage = self.usage + usage
        self.cost += cost

    def _after_failure(self, error: BackendError, what: str, attempt: int) -> float:
        """How long to wait before retrying after ``error``; raises it (or the error that
        replaces it) when the request must not be retried."""
        options = self.backend.options
        if isinstance(error, AuthenticationError):
            self.fatal = error
            raise error
        if not getattr(error, "retryable", False):
            # After retries, say so: the message would otherwise hide the earlier attempts.
            raise _exhausted(error, what, attempt + 1, options.max_retries) if attempt else error
        if attempt == options.max_retries:
            raise _exhausted(error, what, attempt + 1, options.max_retries)
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None and retry_after > options.max_retry_after:
            raise RateLimitError(
                f"{what} was not retried: the server asked to wait {retry_after:.0f} s "
                f"(Retry-After), more than max_retry_after={options.max_retry_after:g} s. Try "
                f"later, or raise max_retry_after. The server said: {error}",
                status=getattr(error, "status", None), body=getattr(error, "body", None),
                retry_after=retry_after, retryable=False) from None
        delay = _retry_delay(self.backend, attempt, error)
        log.info("retrying %s in %.3f s (retry %d of %d) after %s: %s", what, delay,
                 attempt + 1, options.max_retries, type(error).__name__, error)
        return delay


def _exhausted(error: BaseException, what: str, attempts: int, max_retries: int) -> BaseException:
    """The last error of a request whose retries ran out (or that was retried, then got an
    error not worth retrying), its message saying so: how many attempts were made and what the
    last one got (its HTTP status, when it had one). The error keeps its type and attributes;
    ``error.attempts`` is set."""
    status = getattr(error, "status", None)
    last = f"HTTP {status}" if status is not None else type(error).__name__
    final = "" if attempts > max_retries else ", not retryable"
    error.args = (f"{what} failed after {attempts} attempt{'s' if attempts != 1 else ''} "
                  f"(max_retries={max_retries}); the last one got {last}{final}: {error}",
                  ) + tuple(error.args[1:])
    error.attempts = attempts
    return error


def _deterministic(body: Mapping[str, Any]) -> bool:
    """Only ``temperature=0`` makes copies of a request interchangeable (servers default to 1)."""
    t = body.get("temperature")
    return t is not None and not isinstance(t, bool) and float(t) == 0.0


async def _with_timeout(coro: Awaitable[T], seconds: float) -> T:
    if sys.version_info >= (3, 11):
        # No extra task per request (asyncio.wait_for wraps the coroutine in one before 3.12).
        async with asyncio.timeout(seconds):
            return await coro
    return await asyncio.wait_for(coro, seconds)


# Options of the openai client's methods, not fields of a chat request: sent as given they would
# go into the JSON body, the cache rows and reprs (extra_headers often carries a token).
_CLIENT_OPTIONS = ("extra_headers", "extra_query", "timeout")


def _body(backend: Backend, request: Mapping[str, Any]) -> dict[str, Any]:
    """The request as sent: ``model`` defaulted, ``extra_body`` merged in, client options refused."""
    body = {"model": backend.model, **request}
    wrong = [k for k in _CLIENT_OPTIONS if k in body]
    if wrong:
        raise ValueError(
            f"{', '.join(wrong)} given as request parameters: these are openai-client options, "
            "and would be sent in the JSON body (and stored in the cache). Set headers once with "
            "OpenAIBackend(..., default_headers={...}) and the timeout with "
            "OpenAIBackend(..., timeout=...); put extra body fields in the request itself or in "
            "extra_body={...}.")
    extra = body.pop("extra_body", None)
    if extra:
        body.update(extra)
    return body


def _check_budget_rule(backend: Backend, requests: Sequence[Mapping[str, Any]]) -> None:
    """With ``max_cost``, every request must bound its answer: its worst case is then known."""
    if backend.options.max_cost is None:
        return
    for i, r in enumerate(requests):
        if not (r.get("max_tokens") or r.get("max_completion_tokens")):
            raise ValueError(
                f"request {i} has no max_tokens, but the backend has max_cost="
                f"{backend.options.max_cost:g}: without a bound on the answer's length the budget "
                "cannot be guaranteed. Set max_tokens (or max_completion_tokens), e.g. "
                "LLM(backend, max_tokens=256).")


def _interactive() -> bool:
    if "ipykernel" in sys.modules:
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Progress:
    """A call's progress bar, as an observer of that call's requests: one step per request
    sent (cache hits are not counted: they never wait)."""

    def __init__(self, total: int, progress: bool | None, desc: str):
        self.bar = None
        if (_interactive() if progress is None else progress) and total >= 2:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="req", leave=False)

    def request_started(self, event: RequestEvent) -> None:
        return None

    def request_ended(self, event: RequestEvent, state: None) -> None:
        if self.bar is not None and not event.cached:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# One unit of work: (entries sharing the answer, body, first sample index, number of samples).
_Unit = tuple[list[int], dict[str, Any], int, int]


def _units(bodies: list[dict[str, Any]]) -> list[_Unit]:
    """Group identical requests. Copies of a ``temperature=0`` request share one answer; copies
    of a sampled one must not: copy ``k`` of a request with ``n`` choices gets samples
    ``k*n .. k*n+n-1`` (distinct answers, and a rerun finds the same per-entry samples)."""
    groups: dict[str, list[int]] = {}
    for i, body in enumerate(bodies):
        groups.setdefault(canonical_json(body), []).append(i)
    units: list[_Unit] = []
    for indices in groups.values():
        body = bodies[indices[0]]
        n = int(body.get("n") or 1)
        if _deterministic(body):
            units.append((indices, body, 0, n))
        else:
            units.extend(([i], body, k * n, n) for k, i in enumerate(indices))
    return units


async def acomplete(
    backend: Backend,
    requests: Sequence[Mapping[str, Any]],
    *,
    use_cache: bool = True,
    progress: bool | None = None,
    validate: Callable[[Choice], bool] | None = None,
    entries: Sequence[int] | None = None,
) -> CallResult:
    """Send chat-completions requests concurrently; answers in input order, errors per entry.

    Args:
        backend: the :class:`~langtorch.backends.Backend` (its ``options`` set the limits).
        requests: chat-completions bodies (``model`` defaults to the backend's).
        use_cache: ``False`` skips the backend's cache for this call (no reads, no writes).
        progress: show a tqdm bar; ``None`` = when interactive (a terminal or Jupyter).
        validate: ``choice -> bool``; choices it rejects are returned but not cached (e.g. an
            answer that does not parse as the requested JSON), so a rerun asks again.
        entries: for traces, the caller's entry number of each request (default: its position),
            recorded as the ``entries`` of its ``request`` span (the follow-up requests of a
            tool loop name the entries they continue).

    Returns:
        A :class:`CallResult`; failures are in ``.errors`` (see :func:`raise_for_errors`).

    Raises:
        ValueError: the backend has ``max_cost`` and a request sets no ``max_tokens``.

    Example:
        >>> import asyncio
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> reqs = [{"messages": [{"role": "user", "content": q}], "temperature": 0} for q in "aba"]
        >>> with OpenAIServer() as server:
        ...     b = OpenAIBackend("m", base_url=server.url, api_key="sk-test1234")
        ...     r = asyncio.run(acomplete(b, reqs))
        ...     sent = server.requests
        >>> [c.text for c in r.completions], sent
        (['Echo: a', 'Echo: b', 'Echo: a'], 2)
    """
    bodies = [_body(backend, r) for r in requests]
    _check_budget_rule(backend, bodies)
    run = _Run(backend, len(bodies), _cache_for(backend, use_cache), validate, entries)
    pending = [(unit, found) for unit in _units(bodies)
               if (found := run.from_cache(unit)) is not None]
    progress_bar = _Progress(len(pending), progress, f"{backend.model}")
    try:
        await asyncio.gather(*(run.send(unit, found, progress_bar) for unit, found in pending))
    finally:
        progress_bar.close()
        if run.cache is not None:
            # The call returns (or unwinds) with its answers on disk; waiting for the disk in a
            # worker thread keeps the event loop free.
            await asyncio.to_thread(run.cache.flush)
    call = run.call
    return CallResult(run.completions, dict(sorted(run.errors.items())), call.usage, call.cost,
                      run.cache_hits, call.sent, call.attempts)


class _Run:
    """The state of one :func:`acomplete` call: its answers and errors by entry, and how each
    unit of work is answered — from the cache, or sent (then cached)."""

    def __init__(self, backend: Backend, size: int, cache: ResponseCache | None,
                 validate: Callable[[Choice], bool] | None, entries: Sequence[int] | None):
        self.backend, self.cache, self.validate, self.entries = backend, cache, validate, entries
        self.call = _Call(backend)
        self.completions: list[Completion | None] = [None] * size
        self.errors: dict[int, BaseException] = {}
        self.cache_hits = 0

    def label(self, indices: list[int]) -> list[int]:
        """The caller's entry numbers of these requests (for traces and messages)."""
        return list(indices) if self.entries is None else [int(self.entries[i]) for i in indices]

    def from_cache(self, unit: _Unit) -> dict[int, Choice] | None:
        """Answer ``unit`` from the cache when all its samples are there (returns None); else
        the samples found, by sample index, for :meth:`send` to complete."""
        indices, body, start, n = unit
        if self.cache is None:
            return {}
        found = self.cache.get_samples(body, n, start=start, namespace=self.backend.cache_namespace)
        if len(found) != n:
            return found
        self.cache_hits += 1
        done = Completion(tuple(found[i] for i in range(start, start + n)), Usage(),
                          body["model"], cached=True)
        for i in indices:
            self.completions[i] = done
        report_request(RequestEvent(self.backend, body, self.label(indices), result=done, latency=0.0))
        return None

    async def send(self, unit: _Unit, found: dict[int, Choice], progress: _Progress) -> None:
        """Ask the backend for the samples of ``unit`` not in ``found``; record the answer (or
        the error, for every entry of the unit)."""
        indices, body, start, n = unit
        missing = [i for i in range(start, start + n) if i not in found]
        send = dict(body)
        if len(missing) != n or "n" in send:
            send["n"] = len(missing)
            if send["n"] == 1 and "n" not in body:
                send.pop("n")
        backend = self.backend
        event = RequestEvent(backend, send, self.label(indices))
        try:
            with observe_request(event, extra=[progress]):
                event.result = result = await self.call.attempt(
                    lambda: backend.complete(send),
                    est_prompt=estimate_prompt_tokens(send),
                    est_completion=estimate_completion_tokens(send),
                    model=str(send.get("model")),
                    what=f"request {event.entries[0]} to {backend.model!r}",
                    usage_of=lambda c: c.usage, event=event)
        except Exception as e:  # noqa: BLE001 - any failure is this entry's, not the call's
            for i in indices:
                self.errors[i] = e
            return
        new = dict(zip(missing, result.choices))
        if self.cache is not None:
            # Queued as each request completes and committed within milliseconds by the cache's
            # writer thread: a killed process keeps what it finished. Answers the caller cannot
            # use (validate says no, e.g. unparsable JSON) are not kept: a rerun asks again.
            keep = {i: c for i, c in new.items() if self.validate is None or self.validate(c)}
            if keep:
                self.cache.put_soon(body, keep, model=result.model, namespace=backend.cache_namespace)
        choices = tuple({**found, **new}[i] for i in range(start, start + n))
        first = dataclasses.replace(result, choices=choices)
        self.completions[indices[0]] = first
        for i in indices[1:]:
            self.completions[i] = dataclasses.replace(first, usage=Usage())


def complete(backend: Backend, requests: Sequence[Mapping[str, Any]], **kwargs: Any) -> CallResult:
    """Synchronous :func:`acomplete` (works inside a running event loop too).

    Example:
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> with OpenAIServer() as server:
        ...     b = OpenAIBackend("m", base_url=server.url, api_key="sk-test1234")
        ...     complete(b, [{"messages": [{"role": "user", "content": "x"}], "n": 2}]).completions[0].choices[1].text
        'Echo: x [1]'
    """
    return run_sync(acomplete(backend, requests, **kwargs))


def raise_for_errors(result: CallResult, results: Any = None) -> None:
    """Raise for a call's failed entries; return quietly when all completed.

    * one entry, failed: its own typed error; an ``AuthenticationError`` (which stops the whole
      call) is raised as itself too;
    * several entries, all failed: :class:`~langtorch.errors.BatchError` with ``errors`` and
      ``results=None``;
    * a budget stop: :class:`~langtorch.errors.BudgetExceededError` with ``.results`` and
      ``.errors`` attached;
    * otherwise :class:`~langtorch.errors.BatchError` with ``results`` (the partial output the
      caller built) and ``errors`` keyed by entry index.

    Example:
        >>> raise_for_errors(CallResult([None, None], {}))  # nothing failed: no error
    """
    if not result.errors:
        return
    errors = result.errors
    first = next(iter(errors.values()))
    if len(errors) == len(result.completions) == 1 or isinstance(first, AuthenticationError):
        # One entry: its own typed error. Refused credentials stop the whole call: that error.
        raise first
    budget = next((e for e in errors.values() if isinstance(e, BudgetExceededError)), None)
    summary = ", ".join(f"{i}: {type(e).__name__}" for i, e in list(errors.items())[:5])
    more = "" if len(errors) <= 5 else f", ... ({len(errors) - 5} more)"
    if budget is not None:
        exc = BudgetExceededError(
            f"{len(errors)} of {len(result.completions)} entries were not completed ({summary}{more}): "
            f"{budget} Completed entries are in .results.", spent=budget.spent, budget=budget.budget)
        exc.results, exc.errors = results, dict(errors)
        raise exc
    if len(errors) == len(result.completions):
        # Every entry failed: nothing to return (``results`` is None); the errors per entry.
        raise BatchError(
            f"all {len(errors)} entries failed ({summary}{more}); exceptions per entry are in "
            f".errors (no .results). First error: {first}", results=None, errors=errors)
    raise BatchError(
        f"{len(errors)} of {len(result.completions)} entries failed ({summary}{more}); completed "
        f"entries are in .results, exceptions per entry in .errors. First error: {first}",
        results=results, errors=errors)


async def astream(backend: Backend, request: Mapping[str, Any]):
    """Yield text deltas of one request as they arrive, under the backend's limits.

    Failures before the first delta are retried like any request; after it, raised. The usage
    the backend reports counts towards the backend's totals and budget. Streams are not cached.

    Example:
        >>> import asyncio
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> async def main(b):
        ...     return "".join([d async for d in astream(b, {"messages": [{"role": "user", "content": "hey"}]})])
        >>> with OpenAIServer() as server:
        ...     asyncio.run(main(OpenAIBackend("m", base_url=server.url, api_key="sk-test1234")))
        'Echo: hey'
    """
    body = _body(backend, request)
    _check_budget_rule(backend, [body])
    call = _Call(backend)
    pump = _StreamPump(backend, body)

    async def produce() -> None:
        try:
            await call.attempt(pump.guarded, est_prompt=estimate_prompt_tokens(body),
                               est_completion=estimate_completion_tokens(body),
                               model=str(body["model"]), what=f"stream from {backend.model!r}",
                               usage_of=lambda usage: usage, whole_timeout=False, event=event)
            await pump.queue.put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            await pump.queue.put(_Failure(e))

    event = RequestEvent(backend, body, [0], stream=True)
    with observe_request(event):
        task = asyncio.ensure_future(produce())
        received: list[str] = []
        try:
            while True:
                item = await pump.queue.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    event.error = item.error
                    raise item.error
                received.append(item)
                yield item
        finally:
            task.cancel()
            if event.error is None:
                # Also when the consumer stopped early: the request ends with what it received.
                event.result = Completion((Choice("".join(received)),), pump.usage,
                                          str(body.get("model")))


class _StreamPump:
    """Moves one stream's deltas from the backend into a queue (the consumer reads it), under
    the per-chunk timeout; keeps the usage the backend reported last."""

    def __init__(self, backend: Backend, body: dict[str, Any]):
        self.backend, self.body = backend, body
        self.queue: asyncio.Queue = asyncio.Queue()
        self.started = False  # a delta went out
        self.usage = Usage()

    async def guarded(self) -> Usage:
        """:meth:`pump`, its failure made final once part of the answer is out (a retry would
        repeat it)."""
        try:
            return await self.pump()
        except BackendError as e:
            if self.started:
                e.retryable = False
            raise

    async def pump(self) -> Usage:
        usage = Usage()
        timeout = self.backend.options.timeout
        stream = self.backend.stream(self.body).__aiter__()
        try:
            while True:
                # The timeout is per chunk (the first one, then between chunks), not for the
                # whole answer: a long answer that keeps coming is fine; a stall is not.
                try:
                    if timeout is None:
                        delta = await stream.__anext__()
                    else:
                        delta = await _with_timeout(stream.__anext__(), timeout)
                except StopAsyncIteration:
                    return usage
                except asyncio.TimeoutError:
                    raise BackendTimeoutError(
                        f"stream from {self.backend.model!r} sent nothing for timeout={timeout} s "
                        f"({'after part of the answer' if self.started else 'before its first chunk'}); "
                        "raise timeout= or check the server.") from None
                if isinstance(delta, Usage):
                    usage = self.usage = delta  # accounted by the attempt, not passed on
                    continue
                self.started = True
                await self.queue.put(delta)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


_END = object()


@dataclasses.dataclass
class _Failure:
    error: BaseException


async def aembed(backend: Backend, texts: Sequence[str], *, use_cache: bool = True,
                 **params: Any) -> tuple[np.ndarray, Usage]:
    """Embed ``texts`` in batches of ``options.embed_batch_size`` (distinct texts only), concurrently.

    With the backend's cache on, vectors are cached per text (key: sha256 of the model, the
    parameters and the text); only uncached texts are sent. A failed batch raises its typed
    error after the others finish (their vectors are cached).

    Returns:
        ``(vectors [len(texts), dim] float32, usage)``.

    Example:
        >>> import asyncio
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> with OpenAIServer(embedding_dim=3) as server:
        ...     b = OpenAIBackend("e", base_url=server.url, api_key="sk-test1234")
        ...     v, u = asyncio.run(aembed(b, ["a", "b", "a"]))
        >>> v.shape, bool((v[0] == v[2]).all())
        ((3, 3), True)
    """
    call = _Call(backend)
    cache = _cache_for(backend, use_cache)
    unique = list(dict.fromkeys(texts))
    by_text: dict[str, np.ndarray] = {}
    keys: dict[str, str] = {}
    if cache is not None:
        keys = {t: cache.embedding_key(backend.model, t, params, backend.cache_namespace)
                for t in unique}
        found = cache.get_vectors(list(keys.values()))
        by_text = {t: found[k] for t, k in keys.items() if k in found}
    missing = [t for t in unique if t not in by_text]
    size = max(1, int(backend.options.embed_batch_size))
    chunks = [missing[i:i + size] for i in range(0, len(missing), size)]

    async def run(chunk: list[str]) -> None:
        result = await call.attempt(
            lambda: backend.embed(chunk, **params),
            est_prompt=sum(len(t) for t in chunk) // 4 + 1, est_completion=0,
            model=backend.model, what=f"embeddings of {len(chunk)} texts from {backend.model!r}",
            usage_of=lambda e: e.usage)
        by_text.update(zip(chunk, result.vectors))
        if cache is not None:
            await asyncio.to_thread(cache.put_vectors,
                                    {keys[t]: v for t, v in zip(chunk, result.vectors)},
                                    model=result.model)

    outcomes = await asyncio.gather(*(run(c) for c in chunks), return_exceptions=True)
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures:
        raise failures[0]
    if not texts:
        return np.zeros((0, 0), np.float32), Usage()
    vectors = np.stack([by_text[t] for t in texts]).astype(np.float32)
    return vectors, call.usage


def embed(backend: Backend, texts: Sequence[str], **params: Any) -> tuple[np.ndarray, Usage]:
    """Synchronous :func:`aembed`.

    Example:
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> with OpenAIServer(embedding_dim=5) as server:
        ...     b = OpenAIBackend("e", base_url=server.url, api_key="sk-test1234")
        ...     embed(b, ["x"])[0].shape
        (1, 5)
    """
    return run_sync(aembed(backend, texts, **params))
