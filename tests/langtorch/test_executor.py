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


@pytest.fixture(scope="module")
def server():
    with OpenAIServer(hang_seconds=3) as s:
        yield s


@pytest.fixture
def srv(server):
    server.reset()
    server.set_faults(None)
    server.responder = None
    server.latency = 0.0
    server.retry_after = 0.05
    return server


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


def test_concurrency_cap_and_order(srv):
    srv.latency = lambda body: 0.03 if int(body["messages"][0]["content"]) % 2 else 0.005
    qs = [str(i) for i in range(12)]
    result = complete(make(srv, max_concurrency=3), reqs(*qs), progress=False)
    assert srv.max_in_flight <= 3 and srv.chat_requests == 12
    assert texts(result) == [f"Echo: {q}" for q in qs]


def test_dedup_within_a_call(srv):
    result = complete(make(srv), reqs("a", "b", "a", "a", "b"), progress=False)
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
