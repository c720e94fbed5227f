"""Request events: the runtime announces each request it answers; observers record what they need.

The runtime (``langtorch.runtime``) makes one :class:`RequestEvent` per request it answers — sent
to a backend, or served from the response cache — and tells every observer when the request
starts and when it ends. What watches requests is therefore not written into the executor:

* the tracer (``langtorch.tracing``) opens a ``request`` span at the start and closes it at the
  end, in the active trace;
* the request history (``langtorch.inspect_history``) appends a record at the end;
* a call's progress bar counts finished requests (an observer of that call only).

The tracer and the history register themselves when ``langtorch.tracing`` is imported (it is
below the runtime in the package order, so the runtime cannot call it the other way round without
knowing it). Add your own with :func:`add_request_observer`.

Example:
    >>> from langtorch.core import events
    >>> seen = []
    >>> class Log:
    ...     def request_started(self, event):
    ...         return event.body["model"]
    ...     def request_ended(self, event, state):
    ...         seen.append((state, event.error is None))
    >>> with events.observe_request(events.RequestEvent(None, {"model": "m"}), extra=[Log()]):
    ...     pass
    >>> seen
    [('m', True)]
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "RequestEvent",
    "RequestObserver",
    "add_request_observer",
    "observe_request",
    "remove_request_observer",
    "report_request",
    "request_observers",
]


@dataclasses.dataclass(eq=False)
class RequestEvent:
    """One request the runtime answers, as observers see it.

    The runtime fills ``attempts`` while the request runs and ``result`` or ``error`` before it
    ends; :func:`observe_request` sets ``latency``.

    Attributes:
        backend: the backend it goes to.
        body: the request body as sent (``model`` filled in).
        entries: the caller's entry numbers this request answers.
        stream: whether the answer is streamed.
        attempts: attempts sent so far (retries included; 0 for a cache hit).
        result: the :class:`~langtorch.core.Completion` (for a stream: the text received).
        error: the exception that ended the request.
        latency: seconds from start to end (0 for a cache hit).

    Example:
        >>> RequestEvent(None, {"model": "m"}, [3]).entries
        [3]
    """

    backend: Any
    body: Mapping[str, Any]
    entries: Sequence[int] = (0,)
    stream: bool = False
    attempts: int = 0
    result: Any = None
    error: BaseException | None = None
    latency: float | None = None

    @property
    def cached(self) -> bool:
        """Whether the response cache answered (nothing was sent)."""
        return bool(self.result is not None and getattr(self.result, "cached", False))


@runtime_checkable
class RequestObserver(Protocol):
    """What watches requests: ``request_started`` returns any state (e.g. an open span), which
    comes back to ``request_ended``. An observer should not raise; one that does is logged and
    skipped (the request and the other observers go on).

    Example:
        >>> class Count:
        ...     n = 0
        ...     def request_started(self, event): return None
        ...     def request_ended(self, event, state): Count.n += 1
        >>> isinstance(Count(), RequestObserver)
        True
    """

    def request_started(self, event: RequestEvent) -> Any: ...

    def request_ended(self, event: RequestEvent, state: Any) -> None: ...


_observers: tuple[RequestObserver, ...] = ()
_lock = threading.Lock()
log = logging.getLogger("langtorch.core.events")


def _notify(observer: RequestObserver, method: str, *args: Any) -> Any:
    """Call one observer; an observer that raises is logged and skipped: watching a request
    must not fail it (nor the other entries of its call), nor keep the other observers from
    seeing it."""
    try:
        return getattr(observer, method)(*args)
    except Exception:  # noqa: BLE001 - an observer's bug is reported, not the request's
        log.warning("request observer %r raised in %s; ignored", observer, method, exc_info=True)
        return None


def add_request_observer(observer: RequestObserver) -> RequestObserver:
    """Notify ``observer`` of every request the runtime answers, in every thread, from now on
    (adding the same observer twice has no effect). Returns it.

    Example:
        >>> class Quiet:
        ...     def request_started(self, event): return None
        ...     def request_ended(self, event, state): pass
        >>> q = add_request_observer(Quiet())
        >>> q in request_observers()
        True
        >>> remove_request_observer(q)
    """
    global _observers
    with _lock:
        if observer not in _observers:
            _observers = (*_observers, observer)
    return observer


def remove_request_observer(observer: RequestObserver) -> None:
    """Stop notifying ``observer`` (no error when it was not added).

    Example:
        >>> remove_request_observer(object())
    """
    global _observers
    with _lock:
        _observers = tuple(o for o in _observers if o is not observer)


def request_observers() -> tuple[RequestObserver, ...]:
    """The observers every request is reported to, in the order they were added.

    Example:
        >>> type(request_observers())
        <class 'tuple'>
    """
    return _observers


@contextlib.contextmanager
def observe_request(event: RequestEvent, *, extra: Iterable[RequestObserver] = ()) -> Iterator[RequestEvent]:
    """Report ``event`` to the observers: started on entering the block, ended on leaving it.

    An exception that leaves the block is the request's ``error`` unless the block already set
    a ``result`` or an ``error`` (a stream closed early ends with the text it received). The
    exception propagates. ``extra``: observers of this request only (e.g. a call's progress bar),
    after the registered ones. An observer that raises is logged (``langtorch.core.events``) and
    skipped; the request and the other observers go on.

    Example:
        >>> ended = []
        >>> class Spy:
        ...     def request_started(self, event): return "open"
        ...     def request_ended(self, event, state): ended.append((state, type(event.error).__name__))
        >>> try:
        ...     with observe_request(RequestEvent(None, {}), extra=[Spy()]):
        ...         raise TimeoutError
        ... except TimeoutError:
        ...     pass
        >>> ended
        [('open', 'TimeoutError')]
    """
    began = time.perf_counter()
    watching = [(o, _notify(o, "request_started", event)) for o in (*_observers, *extra)]
    try:
        yield event
    except BaseException as e:
        if event.result is None and event.error is None:
            event.error = e
        raise
    finally:
        if event.latency is None:
            event.latency = time.perf_counter() - began
        for observer, state in watching:
            _notify(observer, "request_ended", event, state)


def report_request(event: RequestEvent, *, extra: Iterable[RequestObserver] = ()) -> None:
    """Report a request that started and ended at once (a cache hit: ``event.result`` is set).

    Example:
        >>> class Spy:
        ...     def request_started(self, event): return None
        ...     def request_ended(self, event, state): print("ended", event.latency)
        >>> report_request(RequestEvent(None, {}, latency=0.0), extra=[Spy()])
        ended 0.0
    """
    with observe_request(event, extra=extra):
        pass
