"""The runtime executor against the loopback server: limits, retries, dedup, order, budget."""

import asyncio
import logging

import pytest

import langtorch.runtime._executor as executor
from langtorch.backends import OpenAIBackend, Usage
from langtorch.errors import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BatchError,
    BudgetExceededError,
    RateLimitError,
)
from langtorch.runtime import CallResult, TokenBucket, acomplete, complete, raise_for_errors
from langtorch.testing import OpenAIServer

KEY = "sk-executor-test-0123456789"


@pytest.fixture
def sleeps(monkeypatch):
    """Record the executor's waits (backoff, Retry-After, rate limits) without sleeping."""
    waits = []

    async def fake_sleep(seconds):
        waits.append(seconds)

    monkeypatch.setattr(executor, "_sleep", fake_sleep)
    return waits


def make(srv, **kw):
    kw.setdefault("backoff_base", 0.001)
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, **kw)


def reqs(*texts, **kw):
    return [{"messages": [{"role": "user", "content": t}], **kw} for t in texts]


def texts(result):
    return [c.text if c is not None else None for c in result.completions]


@pytest.mark.parametrize("params", [{}, {"temperature": 1}, {"temperature": 0.7, "n": 2}])
def test_sampling_duplicates_get_distinct_samples(srv, tmp_path, params):
    """H2: without temperature=0, copies of a request are independent samples, not one answer."""
    counter = iter(range(1000))
    srv.responder = lambda body: [f"sample {next(counter)}" for _ in range(int(body.get("n") or 1))]
    backend = make(srv, cache=tmp_path / "c.sqlite")
    result = complete(backend, reqs("tell a joke", "tell a joke", "tell a joke", **params),
                      progress=False)
    answers = [tuple(ch.text for ch in c.choices) for c in result.completions]
    assert srv.chat_requests == 3 and len(set(answers)) == 3
    # cache semantics kept: a rerun returns the same per-entry samples, without sending
    again = complete(backend, reqs("tell a joke", "tell a joke", "tell a joke", **params),
                     progress=False)
    assert [tuple(ch.text for ch in c.choices) for c in again.completions] == answers
    assert srv.chat_requests == 3 and again.cache_hits == 3
    # one copy alone gets the first copy's samples
    one = complete(backend, reqs("tell a joke", **params), progress=False)
    assert tuple(ch.text for ch in one.completions[0].choices) == answers[0]


def test_concurrency_cap_and_order(srv):
    srv.latency = lambda body: 0.03 if int(body["messages"][0]["content"]) % 2 else 0.005
    qs = [str(i) for i in range(12)]
    result = complete(make(srv, max_concurrency=3), reqs(*qs), progress=False)
    assert srv.max_in_flight <= 3 and srv.chat_requests == 12
    assert texts(result) == [f"Echo: {q}" for q in qs]


def test_dedup_within_a_call(srv):
    result = complete(make(srv), reqs("a", "b", "a", "a", "b", temperature=0), progress=False)
    assert srv.chat_requests == 2 and result.sent == 2
    assert texts(result) == ["Echo: a", "Echo: b", "Echo: a", "Echo: a", "Echo: b"]
    # usage counted once: duplicates report zero so per-entry sums equal the call's total
    assert sum((c.usage for c in result.completions), Usage()) == result.usage
    assert result.completions[2].usage == Usage()


@pytest.mark.parametrize("fault", ["rate_limit", "server_error", "bad_gateway", "malformed_json",
                                   "drop", "hang"])
def test_retryable_faults_are_retried(srv, sleeps, fault):
    srv.set_faults([fault, fault, None])
    result = complete(make(srv, max_retries=3, timeout=0.3), reqs("x"), progress=False)
    assert texts(result) == ["Echo: x"] and srv.chat_requests == 3 and result.attempts == 3
    assert len(sleeps) == 2


@pytest.mark.parametrize("fault,error", [("bad_request", BackendError), ("not_found", BackendError),
                                         ("unauthorized", AuthenticationError),
                                         ("forbidden", AuthenticationError)])
def test_client_errors_are_not_retried(srv, sleeps, fault, error):
    srv.set_faults([fault])
    result = complete(make(srv, max_retries=3), reqs("x"), progress=False)
    assert type(result.errors[0]) is error and srv.chat_requests == 1 and not sleeps
    with pytest.raises(error):
        raise_for_errors(result)


def test_retries_exhausted_raise_typed_error_with_body(srv, sleeps):
    srv.set_faults(["bad_gateway"] * 10)
    result = complete(make(srv, max_retries=2), reqs("x"), progress=False)
    e = result.errors[0]
    assert isinstance(e, BackendError) and e.status == 502 and "502 Bad Gateway" in e.body
    assert srv.chat_requests == 3
    srv.set_faults(["rate_limit"] * 10)
    with pytest.raises(RateLimitError):
        raise_for_errors(complete(make(srv, max_retries=1), reqs("y"), progress=False))


def test_timeout_after_retries(srv, sleeps):
    srv.set_faults(["hang", "hang"])
    result = complete(make(srv, max_retries=1, timeout=0.2), reqs("x"), progress=False)
    assert isinstance(result.errors[0], BackendTimeoutError) and srv.chat_requests == 2


def test_backoff_exponential_with_jitter_and_retry_after_honoured(srv, sleeps):
    srv.set_faults(["server_error"] * 4)
    complete(make(srv, max_retries=4, backoff_base=1.0, backoff_max=100), reqs("x"), progress=False)
    assert len(sleeps) == 4
    for attempt, wait in enumerate(sleeps):
        assert 0.5 * 2**attempt <= wait <= 2**attempt
    sleeps.clear()
    srv.retry_after = 7.0
    srv.set_faults(["rate_limit"])
    complete(make(srv, backoff_base=0.001), reqs("y"), progress=False)
    assert len(sleeps) == 1 and 7.0 <= sleeps[0] <= 7.7


def test_authentication_failure_stops_the_call_at_once(srv, sleeps):
    srv.set_faults(["unauthorized"] * 100)
    result = complete(make(srv, max_concurrency=1), reqs(*"abcdef"), progress=False)
    assert srv.chat_requests == 1 and len(result.errors) == 6
    assert all(isinstance(e, AuthenticationError) for e in result.errors.values())


def test_partial_failure_keeps_completed_and_reports_entries(srv):
    srv.set_faults(lambda n, body: "bad_request" if body["messages"][0]["content"] == "bad" else None)
    result = complete(make(srv), reqs("a", "bad", "c"), progress=False)
    assert texts(result) == ["Echo: a", None, "Echo: c"] and list(result.errors) == [1]
    with pytest.raises(BatchError) as info:
        raise_for_errors(result, results=texts(result))
    assert info.value.results == ["Echo: a", None, "Echo: c"] and list(info.value.errors) == [1]


def test_request_rate_limit_with_injected_clock(srv, monkeypatch):
    now = [0.0]

    async def fake_sleep(seconds):
        now[0] += seconds

    monkeypatch.setattr(executor, "_sleep", fake_sleep)
    backend = make(srv, requests_per_minute=60, max_concurrency=1)
    executor._state(backend).requests = TokenBucket(60, capacity=1, clock=lambda: now[0])
    complete(backend, reqs(*"abcde"), progress=False)
    # one request a second: the fifth may start only at t = 4 s (fake time, no real sleeping)
    assert now[0] == pytest.approx(4.0) and srv.chat_requests == 5


def test_token_bucket_reserves_and_reconciles():
    now = [0.0]
    bucket = TokenBucket(600, capacity=100, clock=lambda: now[0])  # 10 tokens/s
    assert bucket.reserve(60) == 0.0 and bucket.reserve(60) == pytest.approx(2.0)
    bucket.adjust(-30)  # the first call used 30 tokens, not 60: refund
    assert bucket.available == pytest.approx(10.0)
    now[0] = 100.0
    assert bucket.available == 100.0  # refills up to capacity only
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_token_rate_limit_estimate_and_reconcile(srv, monkeypatch):
    now = [0.0]

    async def fake_sleep(seconds):
        now[0] += seconds

    monkeypatch.setattr(executor, "_sleep", fake_sleep)
    backend = make(srv, tokens_per_minute=6000, max_concurrency=1)
    bucket = executor._state(backend).tokens = TokenBucket(6000, capacity=1000, clock=lambda: now[0])
    result = complete(backend, reqs("one two", max_tokens=50), progress=False)
    # after reconciling, the bucket is charged the reported usage, not the estimate
    assert bucket.available == pytest.approx(1000 - result.usage.total_tokens)


def test_usage_and_cost_totals_and_budget(srv):
    backend = make(srv, price=(1e6, 2e6), max_cost=40.0, max_concurrency=1)  # 1 / 2 per token
    first = complete(backend, reqs("a", max_tokens=2), progress=False)
    u = first.usage
    assert first.cost == u.prompt_tokens + 2 * u.completion_tokens == backend.cost
    second = complete(backend, reqs(*[f"q{i}" for i in range(20)], max_tokens=2), progress=False)
    assert backend.usage == first.usage + second.usage and backend.cost <= 40.0
    assert second.errors and all(isinstance(e, BudgetExceededError) for e in second.errors.values())
    sent_before = srv.chat_requests
    with pytest.raises(BudgetExceededError) as info:
        raise_for_errors(second, results=texts(second))
    assert info.value.budget == 40.0 and info.value.results[0] == "Echo: q0"
    assert srv.chat_requests == sent_before  # nothing more was sent
    with pytest.raises(ValueError, match="needs a price"):
        complete(make(srv, max_cost=1.0), reqs("x"), progress=False)


def test_sync_call_inside_running_event_loop(srv):
    backend = make(srv)

    async def notebook_cell():
        assert asyncio.get_running_loop().is_running()
        sync = complete(backend, reqs("in-loop"), progress=False)  # no nest_asyncio needed
        asynchronous = await acomplete(backend, reqs("awaited"), progress=False)
        return texts(sync) + texts(asynchronous)

    assert asyncio.run(notebook_cell()) == ["Echo: in-loop", "Echo: awaited"]


def test_retry_logs_are_redacted(srv, sleeps, caplog):
    caplog.set_level(logging.DEBUG)
    srv.set_faults(["server_error"])
    complete(make(srv), reqs("x"), progress=False)
    assert any("retrying" in r.getMessage() for r in caplog.records)
    assert all(KEY not in r.getMessage() for r in caplog.records)


def test_progress_bar_runs(srv, capsys):
    complete(make(srv), reqs("a", "b", "c"), progress=True)
    assert "m" in capsys.readouterr().err


def test_call_result_defaults():
    assert CallResult([]).ok and CallResult([None], {0: ValueError()}).ok is False


def test_any_backend_exception_is_a_per_entry_error():
    from langtorch.backends import Backend, Choice, Completion

    class Picky(Backend):
        async def complete(self, request):
            text = request["messages"][0]["content"]
            if text == "bad":
                raise ValueError("cannot handle 'bad'")
            return Completion((Choice(text.upper()),))

    result = complete(Picky("p", max_retries=3), reqs("a", "bad", "c"), progress=False)
    assert texts(result) == ["A", None, "C"] and isinstance(result.errors[1], ValueError)
    assert result.attempts == 3  # not retried: only BackendErrors marked retryable are


def test_slots_fifo_and_cancellation_do_not_leak():
    from langtorch.runtime import Slots

    async def main():
        slots = Slots(1)
        order = []
        await slots.acquire()
        waiters = [asyncio.ensure_future(slots.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        waiters[0].cancel()  # cancelled while waiting: removed from the queue
        await asyncio.sleep(0)
        slots.release()  # goes to waiters[1], the oldest live one
        await asyncio.sleep(0)
        order.append([w.done() and not w.cancelled() for w in waiters])
        slots.release()
        await asyncio.sleep(0)
        order.append([w.done() and not w.cancelled() for w in waiters])
        slots.release()
        await asyncio.wait_for(slots.acquire(), 1)  # the slot came back to the pool
        return order

    assert asyncio.run(main()) == [[False, True, False], [False, True, True]]


class _Staller:
    """A backend whose stream sends chunks with given pauses (seconds before each chunk)."""

    def __new__(cls, pauses, **kw):
        from langtorch.backends import Backend, Choice, Completion

        class Staller(Backend):
            calls = 0

            async def complete(self, request):
                return Completion((Choice("x"),))

            async def stream(self, request):
                type(self).calls += 1
                for i, pause in enumerate(pauses):
                    await asyncio.sleep(pause)
                    yield f"part{i} "

        return Staller("s", **kw)


def test_stream_stalling_after_output_is_not_retried():
    """H1: a stream that times out after partial output must not be retried (text repeated)."""
    from langtorch.runtime import astream

    backend = _Staller([0.0, 0.4], timeout=0.2, max_retries=2, backoff_base=0.001)
    got = []

    async def consume():
        async for d in astream(backend, {"messages": []}):
            got.append(d)

    with pytest.raises(BackendTimeoutError, match="after part of the answer"):
        asyncio.run(consume())
    assert got == ["part0 "] and type(backend).calls == 1


def test_stream_longer_than_timeout_is_fine_when_chunks_keep_coming():
    from langtorch.runtime import astream

    backend = _Staller([0.1] * 4, timeout=0.25, max_retries=0)

    async def consume():
        return [d async for d in astream(backend, {"messages": []})]

    assert asyncio.run(consume()) == ["part0 ", "part1 ", "part2 ", "part3 "]


def test_stream_without_a_first_chunk_is_retried():
    from langtorch.runtime import astream

    backend = _Staller([0.4], timeout=0.1, max_retries=1, backoff_base=0.001)

    async def consume():
        return [d async for d in astream(backend, {"messages": []})]

    with pytest.raises(BackendTimeoutError, match="before its first chunk"):
        asyncio.run(consume())
    assert type(backend).calls == 2


def test_retry_after_above_the_cap_is_not_slept(srv, sleeps):
    """M8: Retry-After: 3600 ends the request with RateLimitError instead of sleeping an hour."""
    srv.retry_after = 3600
    srv.set_faults(["rate_limit"])
    result = complete(make(srv), reqs("x"), progress=False)
    e = result.errors[0]
    assert isinstance(e, RateLimitError) and "max_retry_after=60" in str(e) and e.retry_after == 3600
    assert sleeps == [] and srv.chat_requests == 1
    srv.set_faults(["rate_limit"])
    ok = complete(make(srv, max_retry_after=7200), reqs("x"), progress=False)
    assert ok.ok and 3600 <= sleeps[0] <= 3960


def test_insufficient_quota_is_not_retried_and_503_retry_after_is_honoured(srv, sleeps):
    srv.set_faults(["insufficient_quota"])
    result = complete(make(srv), reqs("x"), progress=False)
    assert isinstance(result.errors[0], RateLimitError) and "quota" in str(result.errors[0])
    assert result.attempts == 1 and sleeps == []
    srv.retry_after = 7
    srv.set_faults(["unavailable"])
    result = complete(make(srv), reqs("y"), progress=False)
    assert result.ok and result.attempts == 2 and 7 <= sleeps[0] <= 7.7


def test_budget_needs_max_tokens_and_price_at_construction(srv):
    """M9: without max_tokens the worst case is unbounded: refuse before sending anything."""
    backend = make(srv, price=(1.0, 2.0), max_cost=1.0)
    with pytest.raises(ValueError, match="max_tokens"):
        complete(backend, reqs("x"), progress=False)
    assert srv.chat_requests == 0
    assert complete(backend, reqs("x", max_completion_tokens=3), progress=False).ok
    with pytest.raises(ValueError, match="needs a price"):
        make(srv, max_cost=1.0)


def test_token_bucket_bursts_a_minute_worth():
    """M10: one large first request under tokens_per_minute does not wait for a refill."""
    assert TokenBucket(10000).reserve(4196) == 0.0
    assert TokenBucket(60).capacity == 60


def test_cache_is_scoped_to_the_server(tmp_path):
    """M4: two servers serving the same model name never share cached answers."""
    import numpy as np

    path = tmp_path / "shared.sqlite"
    with OpenAIServer(responder=lambda b: "from A", embedding_dim=2) as a, \
            OpenAIServer(responder=lambda b: "from B", embedding_dim=3) as b:
        ba = OpenAIBackend("m", base_url=a.url, api_key=KEY, cache=path)
        bb = OpenAIBackend("m", base_url=b.url, api_key=KEY, cache=path)
        assert texts(complete(ba, reqs("q", temperature=0), progress=False)) == ["from A"]
        assert texts(complete(bb, reqs("q", temperature=0), progress=False)) == ["from B"]
        assert executor.embed(ba, ["t"])[0].shape == (1, 2)
        assert executor.embed(bb, ["t"])[0].shape == (1, 3)
        assert b.chat_requests == 1 and b.embedding_requests == 1
        again = complete(bb, reqs("q", temperature=0), progress=False)
        assert again.cache_hits == 1 and texts(again) == ["from B"]
        assert np.asarray(executor.embed(bb, ["t"])[0]).shape == (1, 3) and b.embedding_requests == 1


def test_ctrl_c_waits_for_cleanup():
    """M5: after KeyboardInterrupt in a sync call, the coroutine has unwound (cache flushed)."""
    import signal
    import threading

    from langtorch.runtime import run_sync

    cleaned = []

    async def work():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)  # slow cleanup, like a cache flush
            cleaned.append(True)
            raise

    main = threading.main_thread().ident  # a real SIGINT, as Ctrl-C sends (interrupts the wait)
    threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        run_sync(work())
    assert cleaned == [True]


def test_doubly_nested_sync_call_does_not_deadlock():
    """LOW: run_sync inside async code inside run_sync inside async code."""
    from langtorch.runtime import run_sync

    async def inner():
        return 1

    async def middle():
        return run_sync(inner()) + 1

    async def outer():
        return run_sync(middle()) + 1

    assert run_sync(outer()) == 3


def test_option_changes_after_the_first_call_are_followed(srv, tmp_path, sleeps):
    """LOW: backend.options changed later (cache, rate limits) take effect."""
    backend = make(srv)
    complete(backend, reqs("a"), progress=False)
    backend.options.cache = tmp_path / "c.sqlite"
    complete(backend, reqs("a"), progress=False)
    assert complete(backend, reqs("a"), progress=False).cache_hits == 1
    backend.options.requests_per_minute = 60
    backend.options.cache = None
    complete(backend, reqs(*"abcdefgh"), progress=False)
    assert executor._state(backend).requests is not None and executor._state(backend).cache is None
    srv.latency = 0.02
    backend.options.max_concurrency = 2
    srv.reset()
    complete(backend, reqs(*"ijklmn"), progress=False)
    assert srv.max_in_flight <= 2


def test_retries_exhausted_message_names_attempts_and_last_status(srv, sleeps):
    """Issue 14: the error after the last retry says how many attempts were made and what the
    last one got (it used to be the bare last error)."""
    srv.set_faults(["server_error", "server_error", "unavailable"])
    e = complete(make(srv, max_retries=2), reqs("x"), progress=False).errors[0]
    assert srv.chat_requests == 3 and e.attempts == 3 and e.status == 503
    assert "failed after 3 attempts (max_retries=2)" in str(e) and "last one got HTTP 503" in str(e)
    srv.set_faults(["hang"])
    e = complete(make(srv, max_retries=0, timeout=0.2), reqs("y"), progress=False).errors[0]
    assert isinstance(e, BackendTimeoutError) and "after 1 attempt (max_retries=0)" in str(e)
    assert "last one got BackendTimeoutError" in str(e)
    srv.set_faults(["bad_request"])  # not retryable: no "after N attempts"
    e = complete(make(srv, max_retries=2), reqs("z"), progress=False).errors[0]
    assert "attempts" not in str(e) and not hasattr(e, "attempts")
    # retried, then an error not worth retrying: the message still counts the attempts
    srv.set_faults(["server_error", "bad_request"])
    before = srv.chat_requests
    e = complete(make(srv, max_retries=3), reqs("w"), progress=False).errors[0]
    assert srv.chat_requests - before == 2 and e.attempts == 2 and e.status == 400
    assert "failed after 2 attempts (max_retries=3); the last one got HTTP 400, not retryable" in str(e)


def test_every_entry_failed_raises_batch_error_without_results(srv, sleeps):
    """Issue 14: a multi-entry call whose entries all failed raised the first entry's error;
    it raises BatchError with every entry's error and no results (one entry: its own error)."""
    srv.set_faults(["bad_request"] * 3)
    result = complete(make(srv, max_retries=0), reqs("a", "b", "c"), progress=False)
    with pytest.raises(BatchError, match="all 3 entries failed") as info:
        raise_for_errors(result, results=["", "", ""])
    assert info.value.results is None and sorted(info.value.errors) == [0, 1, 2]
    assert all(isinstance(e, BackendError) and e.status == 400 for e in info.value.errors.values())
    srv.set_faults(["bad_request"])
    with pytest.raises(BackendError) as single:
        raise_for_errors(complete(make(srv, max_retries=0), reqs("d"), progress=False))
    assert not isinstance(single.value, BatchError) and single.value.status == 400


@pytest.mark.parametrize("refusal", ["max_cost", "budget"])
def test_refused_attempt_gives_back_its_request_bucket_slot(srv, monkeypatch, refusal):
    """Issue 18: an attempt refused before sending (by max_cost or by a Budget) gave back its
    token-bucket reservation but kept its request-bucket slot, so the next request waited for a
    request that was never sent."""
    from langtorch.runtime import Budget

    now = [0.0]

    async def fake_sleep(seconds):
        now[0] += seconds

    monkeypatch.setattr(executor, "_sleep", fake_sleep)
    kw = {"price": (1e6, 2e6), "max_cost": 40.0} if refusal == "max_cost" else {}
    backend = make(srv, requests_per_minute=60, tokens_per_minute=6000, max_concurrency=1, **kw)
    requests = executor._state(backend).requests = TokenBucket(60, capacity=1, clock=lambda: now[0])
    tokens = executor._state(backend).tokens = TokenBucket(6000, capacity=1000, clock=lambda: now[0])
    if refusal == "max_cost":
        refused = complete(backend, reqs("a", max_tokens=100), progress=False)  # could cost > 40
    else:
        with Budget(max_calls=0):
            refused = complete(backend, reqs("a", max_tokens=100), progress=False)
    assert isinstance(refused.errors[0], BudgetExceededError) and srv.chat_requests == 0
    assert requests.available == pytest.approx(1.0) and tokens.available == pytest.approx(1000)
    ok = complete(backend, reqs("b", max_tokens=2), progress=False)
    assert ok.ok and now[0] == 0.0  # the slot was free: no wait for a request never sent


def test_request_observers_see_every_request_start_and_end(srv, tmp_path, sleeps):
    """The runtime reports each request (sent or from the cache) to the registered observers:
    what tracing, the history and progress bars are built on."""
    from langtorch.core import add_request_observer, remove_request_observer

    seen = []

    class Spy:
        def request_started(self, event):
            return len(seen)

        def request_ended(self, event, state):
            seen.append((state, event.entries, event.attempts, event.cached,
                         type(event.error).__name__ if event.error else event.result.text))

    spy = add_request_observer(Spy())
    try:
        backend = make(srv, cache=tmp_path / "c.sqlite", max_retries=2)
        srv.set_faults(["server_error"])  # the first attempt fails, the retry answers
        complete(backend, reqs("a"), progress=False)
        complete(backend, reqs("a", "b"), progress=False)  # "a" from the cache
        srv.set_faults(["bad_request"])
        complete(backend, reqs("c"), progress=False)
    finally:
        remove_request_observer(spy)
    assert seen == [(0, [0], 2, False, "Echo: a"), (1, [0], 0, True, "Echo: a"),
                    (2, [1], 1, False, "Echo: b"), (3, [0], 1, False, "BackendError")]


def test_an_observer_that_raises_breaks_no_request(srv, tmp_path, caplog):
    """A request observer that raises (on start or on end) is logged and skipped: the batch
    completes, the answers are cached, and the other observers still see every start and end.
    (Before: every entry of the call failed with the observer's error, a cache hit raised out
    of the whole call, and observers after the bad one never saw the end.)"""
    from langtorch.core import add_request_observer, remove_request_observer

    class BadStart:
        def request_started(self, event):
            raise RuntimeError("observer bug at start")

        def request_ended(self, event, state):
            pass

    class BadEnd:
        def request_started(self, event):
            return None

        def request_ended(self, event, state):
            raise RuntimeError("observer bug at end")

    ended = []

    class Spy:
        def request_started(self, event):
            return "open"

        def request_ended(self, event, state):
            ended.append((state, event.cached))

    observers = [add_request_observer(o) for o in (BadStart(), BadEnd(), Spy())]
    try:
        backend = make(srv, cache=tmp_path / "c.sqlite")
        with caplog.at_level(logging.WARNING, logger="langtorch.core.events"):
            first = complete(backend, reqs("a", "b"), progress=False)
            again = complete(backend, reqs("a", "b"), progress=False)  # cache hits
    finally:
        for o in observers:
            remove_request_observer(o)
    assert first.ok and texts(first) == ["Echo: a", "Echo: b"]
    assert again.ok and again.cache_hits == 2 and srv.chat_requests == 2
    assert sorted(ended) == [("open", False), ("open", False), ("open", True), ("open", True)]
    assert "observer bug at start" in caplog.text and "observer bug at end" in caplog.text
