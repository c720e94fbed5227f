"""A real OpenAI-compatible HTTP server on 127.0.0.1 for offline tests (aiohttp, own thread)."""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import hashlib
import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from aiohttp import web

from langtorch.errors import BadRequestError
from langtorch.functional.request import SamplingParams, content_text
from langtorch.testing._script import ScriptError

MAX_N = 128  # OpenAI's limits on choices and stop sequences
MAX_STOP = 4

__all__ = ["FAULTS", "OpenAIServer", "Reply", "default_responder", "tool_results"]

class FaultKinds(dict):
    """The fault kinds :class:`OpenAIServer` can inject, mapped to what the client sees.

    Example:
        >>> from langtorch.testing import FAULTS
        >>> FAULTS["rate_limit"]
        '429 with a Retry-After header (seconds = server.retry_after)'
    """


FAULTS = FaultKinds({
    "rate_limit": "429 with a Retry-After header (seconds = server.retry_after)",
    "server_error": "500 with a JSON error body",
    "unavailable": "503 with a Retry-After header (seconds = server.retry_after)",
    "insufficient_quota": "429 whose error code is insufficient_quota (out of credit; no Retry-After)",
    "bad_gateway": "502 with an HTML body, as a proxy in front of a dead server answers",
    "malformed_json": "200 whose application/json body is cut short",
    "hang": "no answer for server.hang_seconds (longer than a client's timeout)",
    "drop": "the connection is closed without any response",
    "bad_request": "400 with a JSON error body",
    "unauthorized": "401 with a JSON error body",
    "forbidden": "403 with a JSON error body",
    "not_found": "404 with a JSON error body",
})

_STATUS = {
    "server_error": 500,
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
}


@dataclasses.dataclass
class Reply:
    """What a responder may return for full control of one choice.

    Attributes:
        content: the assistant text (``None`` with tool calls only). A dict or list is sent as
            its JSON text.
        tool_calls: ``[{"name": ..., "arguments": dict | str}, ...]`` (several: parallel tool
            calls); a call may set its ``"id"`` (default ``call_<choice>_<position>``).
        finish_reason: defaults to ``"tool_calls"`` when there are tool calls, else ``"stop"``.

    Example:
        >>> Reply(tool_calls=[{"name": "add", "arguments": {"a": 1}}]).finish_reason is None
        True
    """

    content: Any = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None


def _last_user_text(body: Mapping[str, Any]) -> str:
    """The last user turn's text, or after tool calls the trailing tool results' texts (joined
    with `` | `` in call order)."""
    messages = body.get("messages") or []
    results = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        results.append(content_text(message.get("content")))
    if results:
        return " | ".join(reversed(results))
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def tool_results(body: Mapping[str, Any]) -> dict[str, str]:
    """The tool results that end a request's messages: ``{tool_call_id: content}`` (empty when
    the last message is not a tool result). For responders that answer after tool calls.

    Example:
        >>> tool_results({"messages": [{"role": "user", "content": "q"},
        ...                            {"role": "assistant", "tool_calls": []},
        ...                            {"role": "tool", "tool_call_id": "a", "content": "42"}]})
        {'a': '42'}
    """
    out: dict[str, str] = {}
    for message in reversed(body.get("messages") or []):
        if message.get("role") != "tool":
            break
        out[str(message.get("tool_call_id"))] = content_text(message.get("content"))
    return dict(reversed(list(out.items())))


def _example_for_schema(schema: Any) -> Any:
    """A small instance of a JSON schema (enough for structured-output round trips)."""
    if not isinstance(schema, Mapping):
        return {}
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema and schema[key]:
            return _example_for_schema(schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        return {k: _example_for_schema(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [_example_for_schema(schema.get("items", {}))]
    return {"string": "echo", "integer": 1, "number": 0.5, "boolean": True, "null": None}.get(
        kind, "echo"
    )


def default_responder(body: Mapping[str, Any]) -> list[Reply]:
    """The server's default answers: deterministic, echo-like, one :class:`Reply` per choice.

    * plain requests: choice ``i`` is ``"Echo: <last user text>"``, with ``" [i]"`` appended for
      ``i > 0`` so samples differ;
    * ``response_format`` with a JSON schema: a small instance of the schema (JSON text);
      ``{"type": "json_object"}``: ``{"echo": <last user text>}``;
    * ``tools`` (unless ``tool_choice`` is ``"none"`` or the last message is a tool result): a
      call of the chosen (or first) tool with arguments built from its parameter schema;
    * after tool results: ``"Echo: <results>"`` (the trailing tool messages joined by ``" | "``).

    Example:
        >>> body = {"messages": [{"role": "user", "content": "hi"}], "n": 2}
        >>> [r.content for r in default_responder(body)]
        ['Echo: hi', 'Echo: hi [1]']
    """
    n = int(body.get("n") or 1)
    text = _last_user_text(body)
    messages = body.get("messages") or []
    tools = body.get("tools") or []
    tool_choice = body.get("tool_choice", "auto")
    last_role = messages[-1].get("role") if messages else None
    if tools and tool_choice != "none" and last_role != "tool":
        tool = tools[0]
        if isinstance(tool_choice, Mapping):
            wanted = tool_choice.get("function", {}).get("name")
            tool = next((t for t in tools if t.get("function", {}).get("name") == wanted), tool)
        fn = tool.get("function", {})
        args = _example_for_schema(fn.get("parameters", {}))
        return [Reply(tool_calls=[{"name": fn.get("name", "tool"), "arguments": args}])] * n
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema", {}).get("schema", {})
        return [Reply(_example_for_schema(schema))] * n
    if response_format.get("type") == "json_object":
        return [Reply({"echo": text})] * n
    return [Reply(f"Echo: {text}" + (f" [{i}]" if i else "")) for i in range(n)]


def _count_tokens(text: str) -> int:
    # A whitespace word count: deterministic and good enough for usage accounting tests.
    return len(text.split())


class OpenAIServer:
    """An OpenAI-compatible HTTP server on 127.0.0.1, for tests that must not touch the network.

    Serves ``POST /v1/chat/completions`` (``n``, SSE ``stream`` with ``stream_options``,
    ``tools``, ``response_format``, ``usage``) and ``POST /v1/embeddings`` (float and base64
    encodings), plus ``GET /v1/models``. It runs aiohttp on its own event loop in a daemon thread,
    so synchronous and asynchronous tests can both use it. Point any OpenAI client at
    :attr:`url`.

    Args:
        responder: how to answer a chat request. A callable ``body -> answer`` or a mapping from
            the last user message to an answer (unknown messages fall back to
            :func:`default_responder`). An answer is a ``str``, a dict/list (sent as JSON
            text), a :class:`Reply`, or a list of those (one per choice when ``n > 1``; a single
            answer is repeated ``n`` times). ``None`` uses :func:`default_responder`.
        latency: seconds to wait before answering, or a callable ``body -> seconds``.
        faults: injected faults (kinds in :data:`FAULTS`): a sequence (request ``i`` gets
            ``faults[i]``, counting from the last :meth:`set_faults`; ``None`` = normal; requests
            past the end are normal), a mapping
            ``kind -> probability`` (drawn with ``seed``), or a callable
            ``(request_number, body) -> kind | None``.
        retry_after: the ``Retry-After`` value (seconds) sent with injected 429s and 503s.
        hang_seconds: how long a ``"hang"`` fault stalls.
        api_key: when set, requests must carry ``Authorization: Bearer <api_key>``; others get
            401 whose body quotes the key they sent (as a careless server would, so that tests
            can check that clients redact it).
        model: the model name reported when a request names none.
        embedding_dim: length of embedding vectors (a request's ``dimensions`` overrides).
        seed: seed for probabilistic faults.

    Attributes:
        requests: HTTP requests received on the API routes (faulted ones included).
        chat_requests, embedding_requests: per endpoint.
        max_in_flight: most requests being handled at the same time.
        faults_served: ``collections.Counter`` of injected faults.
        bodies: the JSON bodies received, in arrival order.

    Example:
        >>> import openai
        >>> with OpenAIServer(latency=0.0) as server:
        ...     client = openai.OpenAI(base_url=server.url, api_key="sk-test")
        ...     r = client.chat.completions.create(
        ...         model="m", messages=[{"role": "user", "content": "hi"}])
        >>> r.choices[0].message.content, server.requests
        ('Echo: hi', 1)
    """

    def __init__(
        self,
        responder: Callable[[dict], Any] | Mapping[str, Any] | None = None,
        *,
        latency: float | Callable[[dict], float] = 0.0,
        faults: Sequence[str | None] | Mapping[str, float] | Callable | None = None,
        retry_after: float = 0.05,
        hang_seconds: float = 30.0,
        api_key: str | None = None,
        model: str = "test-model",
        embedding_dim: int = 8,
        seed: int = 0,
    ):
        self.responder = responder
        self.latency = latency
        self.retry_after = retry_after
        self.hang_seconds = hang_seconds
        self.api_key = api_key
        self.model = model
        self.embedding_dim = embedding_dim
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.set_faults(faults)
        self.reset()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # ---------------------------------------------------------------- state
    def reset(self) -> None:
        """Zero the counters and forget received bodies (faults stay as set).

        ``in_flight`` is a live gauge and is not zeroed: requests still being handled (a hang
        fault outliving its client, say) count down when they finish. ``max_in_flight`` counts
        only requests that arrive after the reset.

        Example:
            >>> s = OpenAIServer(); s.requests = 3; s.reset(); s.requests
            0
        """
        with self._lock:
            self.requests = 0
            self.chat_requests = 0
            self.embedding_requests = 0
            self.in_flight = getattr(self, "in_flight", 0)
            self.max_in_flight = 0
            # Requests are counted towards max_in_flight only within the epoch they started in.
            self._epoch = getattr(self, "_epoch", 0) + 1
            self._epoch_in_flight = 0
            self.faults_served: collections.Counter[str] = collections.Counter()
            self.bodies: list[dict[str, Any]] = []

    def set_faults(self, faults: Sequence[str | None] | Mapping[str, float] | Callable | None) -> None:
        """Replace the fault schedule (see the class docstring); request numbering restarts.

        Example:
            >>> s = OpenAIServer(); s.set_faults(["rate_limit", None]); s._fault_for(0, {})
            'rate_limit'
        """
        if isinstance(faults, Mapping):
            unknown = set(faults) - set(FAULTS)
        elif isinstance(faults, Sequence) and not isinstance(faults, str):
            unknown = {f for f in faults if f is not None} - set(FAULTS)
        elif faults is None or callable(faults):
            unknown = set()
        else:
            raise TypeError(
                f"faults expected a sequence, a mapping kind->probability or a callable, got "
                f"{type(faults).__name__}."
            )
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {sorted(FAULTS)}.")
        self._faults = list(faults) if isinstance(faults, Sequence) else faults
        self._fault_counter = 0

    def _fault_for(self, number: int, body: Mapping[str, Any]) -> str | None:
        faults = self._faults
        if faults is None:
            return None
        if isinstance(faults, list):
            return faults[number] if number < len(faults) else None
        if isinstance(faults, Mapping):
            draw = self._rng.random()
            for kind, p in faults.items():
                if draw < p:
                    return kind
                draw -= p
            return None
        return faults(number, body)

    @property
    def url(self) -> str:
        """Base URL to give a client, e.g. ``http://127.0.0.1:54321/v1``."""
        if self.port is None:
            raise RuntimeError("OpenAIServer is not running; use `with OpenAIServer() as s:` or start().")
        return f"http://127.0.0.1:{self.port}/v1"

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> OpenAIServer:
        """Start serving on a free port in a daemon thread; returns ``self``."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as e:  # reported to start()'s caller
                failure.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            # Handlers still sleeping (hang faults, latency) are cancelled, not left dangling.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="langtorch-openai-server", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread = None
            raise RuntimeError(f"OpenAIServer could not start: {failure[0]!r}") from failure[0]
        return self

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop the server and join its thread (pending hangs are cancelled)."""
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None
        self.port = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.url if self.port is not None else "stopped"
        return f"OpenAIServer({where}, requests={self.requests}, max_in_flight={self.max_in_flight})"

    # ---------------------------------------------------------------- handlers
    async def _enter(self, request: web.Request) -> tuple[int, dict[str, Any] | None, str | None]:
        with self._lock:
            number = self.requests
            self.requests += 1
            self.in_flight += 1
            self._epoch_in_flight += 1
            request["langtorch_epoch"] = self._epoch
            self.max_in_flight = max(self.max_in_flight, self._epoch_in_flight)
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        with self._lock:
            if body is not None:
                self.bodies.append(body)
            fault = self._fault_for(self._fault_counter, body or {})
            self._fault_counter += 1
            if fault is not None:
                self.faults_served[fault] += 1
        return number, body, fault

    def _leave(self, request: web.Request) -> None:
        with self._lock:
            self.in_flight -= 1
            if request.get("langtorch_epoch") == self._epoch:
                self._epoch_in_flight -= 1

    def _auth_failure(self, request: web.Request) -> web.Response | None:
        if self.api_key is None:
            return None
        header = request.headers.get("Authorization", "")
        if header == f"Bearer {self.api_key}":
            return None
        sent = header.removeprefix("Bearer ")
        return _error(401, f"Incorrect API key provided: {sent}.", "invalid_api_key")

    async def _fault_response(self, request: web.Request, fault: str) -> web.StreamResponse | None:
        if fault == "rate_limit":
            return _error(
                429, "Rate limit reached; retry later.", "rate_limit_exceeded",
                headers={"Retry-After": f"{self.retry_after:g}"},
            )
        if fault == "unavailable":
            return _error(503, "The server is overloaded; retry later.", "service_unavailable",
                          headers={"Retry-After": f"{self.retry_after:g}"})
        if fault == "insufficient_quota":
            return _error(429, "You exceeded your current quota, please check your plan and "
                          "billing details.", "insufficient_quota")
        if fault in _STATUS:
            return _error(_STATUS[fault], f"injected fault: {fault}", fault)
        if fault == "bad_gateway":
            html = "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"
            return web.Response(status=502, text=html, content_type="text/html")
        if fault == "malformed_json":
            return web.Response(status=200, text='{"id": "chatcmpl-x", "choices": [{"ind',
                                content_type="application/json")
        if fault == "hang":
            await asyncio.sleep(self.hang_seconds)
            return None  # then answer normally
        if fault == "drop":
            request.transport.close()
            # Nothing more can be sent; the client sees the connection closed mid-request.
            raise asyncio.CancelledError
        raise AssertionError(fault)

    async def _delay(self, body: dict[str, Any]) -> None:
        latency = self.latency(body) if callable(self.latency) else self.latency
        if latency > 0:
            await asyncio.sleep(latency)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        _, body, fault = await self._enter(request)
        try:
            with self._lock:
                self.chat_requests += 1
            denied = self._auth_failure(request)
            if denied is not None:
                return denied
            if body is None or not isinstance(body.get("messages"), list):
                return _error(400, "expected a JSON body with a 'messages' list", "invalid_request")
            try:  # OpenAI's ranges, read by the same type LocalBackend and `langtorch serve` use
                SamplingParams.from_request(body, max_n=MAX_N, max_stop=MAX_STOP)
            except BadRequestError as e:
                return _error(400, str(e), "invalid_request_error", param=e.param)
            await self._delay(body)
            if fault is not None:
                response = await self._fault_response(request, fault)
                if response is not None:
                    return response
            try:
                replies = self._replies(body)
            except ScriptError as e:  # a strict Script with no matching rule
                return _error(400, f"scripted server: {e}", "script_error")
            if body.get("stream"):
                return await self._stream(request, body, replies)
            return web.json_response(self._chat_json(body, replies))
        finally:
            self._leave(request)

    def _replies(self, body: dict[str, Any]) -> list[Reply]:
        n = int(body.get("n") or 1)
        responder = self.responder
        if responder is None:
            answer: Any = default_responder(body)
        elif isinstance(responder, Mapping):
            key = _last_user_text(body)
            answer = responder[key] if key in responder else default_responder(body)
        else:
            answer = responder(body)
        if isinstance(answer, list) and answer and all(isinstance(a, (str, Reply)) for a in answer):
            answers = list(answer)
        else:
            answers = [answer]
        if len(answers) == 1:
            answers = answers * n
        replies = [a if isinstance(a, Reply) else Reply(a) for a in answers[:n]]
        return replies

    def _message(self, reply: Reply, i: int) -> tuple[dict[str, Any], str]:
        content = reply.content
        if content is not None and not isinstance(content, str):
            content = json.dumps(content)
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": str(call.get("id") or f"call_{i}_{j}"),
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": call["arguments"]
                        if isinstance(call["arguments"], str)
                        else json.dumps(call["arguments"]),
                    },
                }
                for j, call in enumerate(reply.tool_calls)
            ]
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        return message, finish

    def _usage(self, body: dict[str, Any], replies: list[Reply]) -> dict[str, int]:
        prompt = sum(_count_tokens(content_text(m.get("content"))) + 1 for m in body["messages"])
        completion = 0
        for i, reply in enumerate(replies):
            message, _ = self._message(reply, i)
            completion += max(1, _count_tokens(message["content"] or "")) + sum(
                _count_tokens(c["function"]["arguments"]) for c in message.get("tool_calls", [])
            )
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def _chat_json(self, body: dict[str, Any], replies: list[Reply]) -> dict[str, Any]:
        choices = []
        for i, reply in enumerate(replies):
            message, finish = self._message(reply, i)
            choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
        return {
            "id": "chatcmpl-" + hashlib.sha1(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": choices,
            "usage": self._usage(body, replies),
        }

    async def _stream(self, request: web.Request, body: dict[str, Any], replies: list[Reply]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        base = {"id": "chatcmpl-stream", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body.get("model") or self.model}

        async def send(payload: dict[str, Any]) -> None:
            await response.write(b"data: " + json.dumps({**base, **payload}).encode() + b"\n\n")

        for i, reply in enumerate(replies):
            message, finish = self._message(reply, i)
            await send({"choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
            words = (message["content"] or "").split(" ")
            for k, word in enumerate(words):
                piece = word if k == 0 else " " + word
                await send({"choices": [{"index": i, "delta": {"content": piece}, "finish_reason": None}]})
            for j, call in enumerate(message.get("tool_calls", [])):
                delta = {"tool_calls": [{"index": j, **call}]}
                await send({"choices": [{"index": i, "delta": delta, "finish_reason": None}]})
            await send({"choices": [{"index": i, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({"choices": [], "usage": self._usage(body, replies)})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        _, body, fault = await self._enter(request)
        try:
            with self._lock:
                self.embedding_requests += 1
            denied = self._auth_failure(request)
            if denied is not None:
                return denied
            if body is None or "input" not in body:
                return _error(400, "expected a JSON body with an 'input' field", "invalid_request")
            await self._delay(body)
            if fault is not None:
                response = await self._fault_response(request, fault)
                if response is not None:
                    return response
            inputs = body["input"]
            inputs = [inputs] if isinstance(inputs, str) else list(inputs)
            dim = int(body.get("dimensions") or self.embedding_dim)
            data = []
            for i, text in enumerate(inputs):
                vector = _vector(text if isinstance(text, str) else json.dumps(text), dim)
                if body.get("encoding_format") == "base64":
                    encoded: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode()
                else:
                    encoded = vector.tolist()
                data.append({"object": "embedding", "index": i, "embedding": encoded})
            tokens = sum(_count_tokens(t) if isinstance(t, str) else len(t) for t in inputs)
            return web.json_response({
                "object": "list", "data": data, "model": body.get("model") or self.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            })
        finally:
            self._leave(request)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model",
                                                              "created": 0, "owned_by": "langtorch"}]})


def _vector(text: str, dim: int) -> np.ndarray:
    """A deterministic unit vector per text (seeded by its sha256)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def _error(status: int, message: str, code: str, headers: Mapping[str, str] | None = None,
           param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": code, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)
