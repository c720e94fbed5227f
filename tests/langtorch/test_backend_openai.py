"""OpenAIBackend: one attempt per call, typed errors, pass-through, key redaction."""

import asyncio
import logging
import os
import pickle
import subprocess
import sys
import traceback

import numpy as np
import pytest

from langtorch.backends import Backend, Completion, OpenAIBackend, Usage
from langtorch.errors import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    LangTorchError,
    RateLimitError,
)
from langtorch.runtime import run_sync
from langtorch.testing import OpenAIServer

KEY = "sk-secret-abcdefghijklmnop"


@pytest.fixture
def backend(srv):
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, timeout=0.5)


# The same backend takes two transports: the openai SDK's on a caller's loop (asyncio.run), and
# the shared aiohttp session on the runtime's private loop (run_sync, what sync calls use).
RUNNERS = {"sdk": asyncio.run, "fast": run_sync}


def req(text="hi", **kw):
    return {"messages": [{"role": "user", "content": text}], **kw}


@pytest.mark.parametrize("transport", sorted(RUNNERS))
def test_is_a_backend_and_completes(backend, srv, transport):
    assert isinstance(backend, Backend)
    c = RUNNERS[transport](backend.complete(req("x", n=2)))
    assert isinstance(c, Completion) and [ch.text for ch in c.choices] == ["Echo: x", "Echo: x [1]"]
    assert c.usage.prompt_tokens == 2 and c.model == "m" and c.choices[0].finish_reason == "stop"
    assert c.choices[0].message["role"] == "assistant"


@pytest.mark.parametrize("transport", sorted(RUNNERS))
def test_every_parameter_passes_through(backend, srv, transport):
    params = dict(temperature=0.3, seed=7, logprobs=True, top_logprobs=2, max_tokens=5,
                  stop=["\n"], user="u1", some_future_param={"x": 1}, model="other-model")
    c = RUNNERS[transport](backend.complete(req("p", **params)))
    body = srv.bodies[-1]
    assert {k: body[k] for k in params} == params and c.model == "other-model"


def test_environment_variables(srv, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", srv.url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    b = OpenAIBackend("m")
    assert b.base_url == srv.url and asyncio.run(b.complete(req())).text == "Echo: hi"
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(AuthenticationError, match="OPENAI_API_KEY"):
        OpenAIBackend("m")


@pytest.mark.parametrize("fault,error,status,retryable", [
    ("rate_limit", RateLimitError, 429, True),
    ("server_error", BackendError, 500, True),
    ("bad_gateway", BadResponseError, 502, True),
    ("malformed_json", BadResponseError, 200, True),
    ("hang", BackendTimeoutError, None, True),
    ("drop", BackendError, None, True),
    ("bad_request", BackendError, 400, False),
    ("not_found", BackendError, 404, False),
    ("unauthorized", AuthenticationError, 401, False),
    ("forbidden", AuthenticationError, 403, False),
])
@pytest.mark.parametrize("transport", sorted(RUNNERS))
def test_fault_becomes_typed_error(backend, srv, fault, error, status, retryable, transport):
    srv.set_faults([fault])
    with pytest.raises(error) as info:
        RUNNERS[transport](backend.complete(req()))
    e = info.value
    assert type(e) is error and e.status == status and e.retryable is retryable
    # the openai exception (which holds the request and its headers) is not chained
    assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)
    if fault == "rate_limit":
        assert e.retry_after == pytest.approx(srv.retry_after)
    if fault in ("bad_gateway", "malformed_json"):
        assert e.body and ("<html>" in e.body or e.body.startswith("{"))
    assert srv.requests == 1  # one attempt: retries belong to the runtime


@pytest.mark.parametrize("transport", sorted(RUNNERS))
def test_key_redacted_in_repr_errors_logs_and_pickle(srv, caplog, transport):
    with OpenAIServer(api_key="sk-the-right-one-123456") as s:
        b = OpenAIBackend("m", base_url=s.url, api_key=KEY)
        assert KEY not in repr(b) and KEY not in str(vars(b)) and "sk-***" in repr(b)
        caplog.set_level(logging.DEBUG)
        with pytest.raises(AuthenticationError) as info:
            RUNNERS[transport](b.complete(req()))
    # the server quoted the key it was sent in its 401 body
    e = info.value
    text = "".join(traceback.format_exception(e)) + str(e.body) + repr(e)
    assert KEY not in text and "***" in text and e.status == 401
    assert all(KEY not in r.getMessage() and KEY not in str(r.args) for r in caplog.records)
    assert KEY not in str(vars(b))  # also after use (the fast path's headers are hidden too)
    with pytest.raises(TypeError, match="API key"):
        pickle.dumps(b)


def test_fast_transport_sends_the_sdk_headers(srv):
    with OpenAIServer(api_key=KEY) as s:  # the server checks the bearer token
        b = OpenAIBackend("m", base_url=s.url, api_key=KEY, organization="org-1")
        assert run_sync(b.complete(req("h"))).text == "Echo: h"
        assert run_sync(b.embed(["a"])).vectors.shape == (1, 8)
    headers = b._fast_target()[1]
    assert headers["OpenAI-Organization"] == "org-1" and headers["User-Agent"].startswith("AsyncOpenAI")


def test_stream_and_embed(backend, srv):
    async def collect():
        return [d async for d in backend.stream(req("s t"))]

    *deltas, usage = asyncio.run(collect())
    assert "".join(deltas) == "Echo: s t" and usage == Usage(3, 3)
    e = asyncio.run(backend.embed(["a", "b"], dimensions=3))
    assert e.vectors.shape == (2, 3) and e.vectors.dtype == np.float32 and e.usage.prompt_tokens == 2
    srv.set_faults(["server_error"])
    with pytest.raises(BackendError):
        asyncio.run(backend.embed(["a"]))


def test_connection_refused_is_retryable_backend_error():
    b = OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", api_key=KEY, timeout=2)
    with pytest.raises(BackendError, match="connection") as info:
        asyncio.run(b.complete(req()))
    assert info.value.retryable and isinstance(info.value, LangTorchError)


def _chain_and_locals(e):
    """Every string a traceback printer with capture_locals would show, along the whole chain."""
    parts, seen = [], e
    while seen is not None:
        tb = traceback.TracebackException(type(seen), seen, seen.__traceback__, capture_locals=True)
        parts.append("".join(tb.format()))
        seen = seen.__cause__ or seen.__context__
    return "".join(parts)


@pytest.mark.parametrize("transport", sorted(RUNNERS))
def test_key_not_in_traceback_locals_or_context(transport):
    """H3: no frame of the traceback holds the key (headers) and no chained SDK exception does."""
    with OpenAIServer(api_key="sk-the-right-one-123456") as s:
        b = OpenAIBackend("m", base_url=s.url, api_key=KEY)
        with pytest.raises(AuthenticationError) as info:
            RUNNERS[transport](b.complete(req()))

        async def stream():
            return [d async for d in b.stream(req())]

        with pytest.raises(AuthenticationError) as streamed:
            asyncio.run(stream())
    for e in (info.value, streamed.value):
        assert e.__context__ is None and e.__cause__ is None
        assert KEY not in _chain_and_locals(e)


@pytest.mark.parametrize("transport", sorted(RUNNERS))
def test_numpy_parameters_are_sent_and_bad_ones_are_type_errors(backend, srv, transport):
    """M7: numpy scalars serialise; an unserialisable value is the caller's TypeError, not sent."""
    c = RUNNERS[transport](backend.complete(req("n", max_tokens=np.int64(5), temperature=np.float32(0.5))))
    assert c.text == "Echo: n" and srv.bodies[-1]["max_tokens"] == 5
    with pytest.raises(TypeError, match="cannot be sent as JSON"):
        RUNNERS[transport](backend.complete(req("n", max_tokens=object())))
    assert srv.chat_requests == 1


def test_unserialisable_parameter_is_not_retried(srv):
    from langtorch.runtime import complete

    b = OpenAIBackend("m", base_url=srv.url, api_key=KEY, backoff_base=0.001)
    result = complete(b, [req("x", stop=object())], progress=False)
    assert isinstance(result.errors[0], TypeError) and result.attempts == 1 and srv.requests == 0


@pytest.mark.parametrize("transport", sorted(RUNNERS))
def test_lone_surrogate_in_answer_is_replaced(backend, srv, transport):
    """M11: a server that cut an emoji in half does not crash the batch."""
    srv.responder = lambda body: "half \ud83d and whole \U0001f600"
    c = RUNNERS[transport](backend.complete(req()))
    assert c.text == "half \ufffd and whole \U0001f600"
    c.text.encode("utf-8")
    assert c.choices[0].message["content"] == c.text


def test_base_url_credentials_are_not_shown():
    """LOW: userinfo and query strings of base_url stay out of reprs and error messages."""
    b = OpenAIBackend("m", base_url="http://user:hunter2@127.0.0.1:9/v1?api-key=tok123", api_key=KEY,
                      timeout=2)
    with pytest.raises(BackendError) as info:
        asyncio.run(b.complete(req()))
    shown = repr(b) + str(info.value) + b.cache_namespace
    assert "hunter2" not in shown and "tok123" not in shown and "127.0.0.1:9/v1" in shown


_FORK_SCRIPT = """
import os, sys, warnings
from langtorch.backends import OpenAIBackend
from langtorch.runtime import run_sync

def req(text):
    return {"messages": [{"role": "user", "content": text}]}

b = OpenAIBackend("m", base_url=sys.argv[1], api_key="sk-fork-test", timeout=5)
assert run_sync(b.complete(req("parent"))).text == "Echo: parent"
read, write = os.pipe()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pid = os.fork()
if pid == 0:
    code = 1
    try:
        os.close(read)
        os.write(write, run_sync(b.complete(req("child"))).text.encode())
        code = 0
    finally:
        os._exit(code)
os.close(write)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), os.read(read, 100).decode())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_requests_work_in_a_forked_child(srv):
    """M6: the shared aiohttp session of the parent's loop is not reused after fork.

    Runs in a fresh interpreter (no JAX threads of other tests around at fork time) under a
    timeout, so a failure cannot hang the suite.
    """
    proc = subprocess.run([sys.executable, "-c", _FORK_SCRIPT, srv.url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["0", "Echo:", "child"]
