"""The aiohttp application: OpenAI-compatible routes over a langtorch backend.

Every chat request goes to the one shared backend (the local continuous-batching engine): no
per-request model copy and no lock around generation, so requests from all connections are
decoded together. Admission control sits in front of it: at most ``max_concurrency`` requests
are handed to the engine at once, at most ``max_queue`` more wait for a place, and the rest are
answered 429 with ``Retry-After`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError

from langtorch.backends.base import Backend, Usage
from langtorch.errors import BackendError
from langtorch.functional.request import parse_tool_call
from langtorch.serve._protocol import (
    ApiError,
    ChatCall,
    chat_request,
    chunk_json,
    completion_json,
    completions_request,
    embeddings_json,
    embeddings_request,
    text_completion_json,
)

__all__ = ["Limits", "ServeState", "create_app"]

log = logging.getLogger("langtorch.serve")
access_log = logging.getLogger("langtorch.serve.access")
http_log = logging.getLogger("langtorch.serve.http")


class _NoRequestBytes(logging.Filter):
    """aiohttp's HTTP parser errors quote the offending request bytes (a header line, the
    request line with its query string): a malformed ``Authorization`` header would put the API
    key in the log. Keep the event, drop the bytes (one warning line, no traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "-"
            record.msg = "malformed HTTP request from %s (%s %s)"
            record.args = (remote, getattr(exc, "code", 400), type(exc).__name__)
            record.exc_info = record.exc_text = None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


http_log.addFilter(_NoRequestBytes())

STATE = web.AppKey("langtorch_serve", object)


def _request_key(name: str, kind: type) -> Any:
    # Typed request-storage keys (aiohttp >= 3.13); plain strings before that.
    factory = getattr(web, "RequestKey", None)
    return factory(name, kind) if factory is not None else name


MODEL_KEY = _request_key("langtorch_model", str)
USAGE_KEY = _request_key("langtorch_usage", object)
ERROR_KEY = _request_key("langtorch_error", str)
DISCONNECTED_KEY = _request_key("langtorch_disconnected", bool)


@dataclasses.dataclass
class Limits:
    """What one server accepts before it refuses (413/400/429) instead of queueing.

    Attributes:
        max_concurrency: chat requests handed to the engine at once (each decodes in its slots).
        max_queue: chat requests waiting for admission; one more is answered 429.
        max_body_bytes: largest request body (413 above it).
        max_prompt_tokens: longest prompt after the chat template (400, code
            ``context_length_exceeded``); ``None``: the engine's context check only.
        max_n: most choices per request.
        retry_after: seconds put in ``Retry-After`` of a 429 (and of a 503 while draining).
        max_embedding_concurrency: embeddings requests computed at once (they share
            ``max_queue``'s bound on waiting).

    Example:
        >>> from langtorch.serve import Limits
        >>> Limits(max_concurrency=8).max_queue
        256
    """

    max_concurrency: int = 64
    max_queue: int = 256
    max_body_bytes: int = 4 * 2**20
    max_prompt_tokens: int | None = None
    max_n: int = 16
    retry_after: float = 1.0
    max_embedding_concurrency: int = 4

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "max_body_bytes", "max_n", "max_embedding_concurrency"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Limits: expected {name} as an int >= 1, got {v!r}.")
        if not isinstance(self.max_queue, int) or self.max_queue < 0:
            raise ValueError(f"Limits: expected max_queue as an int >= 0, got {self.max_queue!r}.")
        if self.max_prompt_tokens is not None and (
                not isinstance(self.max_prompt_tokens, int) or self.max_prompt_tokens < 1):
            raise ValueError("Limits: expected max_prompt_tokens as an int >= 1 or None, got "
                             f"{self.max_prompt_tokens!r}.")
        if not self.retry_after > 0:
            raise ValueError(f"Limits: expected retry_after > 0, got {self.retry_after!r}.")


class _Admission:
    """A bounded waiting room in front of a semaphore."""

    def __init__(self, limit: int, queue: int, retry_after: float, what: str):
        self.limit, self.queue, self.retry_after, self.what = limit, queue, retry_after, what
        self.active = 0
        self.waiting = 0
        self._sem = asyncio.Semaphore(limit)

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[None]:
        if self.active >= self.limit and self.waiting >= self.queue:
            raise ApiError(429, f"The server is at capacity ({self.active} {self.what} running, "
                           f"{self.waiting} waiting); retry after {self.retry_after:g} s.",
                           code="rate_limit_exceeded",
                           headers={"Retry-After": f"{max(1, round(self.retry_after))}"})
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            self._sem.release()


@dataclasses.dataclass
class _Event:
    """A stream event for backends without ``stream_events`` (same fields as the engine's)."""

    index: int
    text: str
    finish_reason: str | None = None


async def _events(backend: Backend, request: Any) -> AsyncIterator[Any]:
    """Per-choice events (``index``, ``text``, ``finish_reason``) then one :class:`Usage`.

    The local engine streams tokens as it decodes them (``stream_events``); closing this
    iterator closes the engine's, which cancels the request and frees its slot. Another backend
    (e.g. an ``OpenAIBackend`` being proxied) is completed and replayed as one event per choice.
    """
    stream_events = getattr(backend, "stream_events", None)
    if stream_events is not None:
        async with contextlib.aclosing(stream_events(request)) as events:
            async for event in events:
                yield event
        return
    completion = await backend.complete(request)
    for i, choice in enumerate(completion.choices):
        yield _Event(i, choice.text)
        yield _Event(i, "", choice.finish_reason or "stop")
    yield completion.usage


def _backend_error(exc: BaseException, request: dict[str, Any] | None = None) -> ApiError:
    """A backend's refusal of one request as a 400: a
    :class:`~langtorch.errors.BadRequestError` (the local backend raises it for its own checks
    and for exactly the engine's typed request errors) or an upstream's 4xx. Anything else is a
    500: an upstream's failure, or a bug."""
    if isinstance(exc, BackendError) and exc.status in (400, 404, 413, 422):
        param = getattr(exc, "param", None)
        if param == "max_tokens" and request is not None and request.get("max_tokens") is None \
                and request.get("max_completion_tokens") is not None:
            param = "max_completion_tokens"  # the engine says max_tokens; the client sent this
        return ApiError(400, str(exc), param=param,
                        code=getattr(exc, "code", None) or "invalid_value")
    log.error("generation failed", exc_info=exc)
    if isinstance(exc, BackendError) and exc.status not in (None, 500):
        return ApiError(500, f"The model failed to answer ({type(exc).__name__}, upstream "
                        f"status {exc.status}); see the server log.", code="server_error")
    return ApiError(500, f"Internal error while answering ({type(exc).__name__}): a bug in the "
                    f"server or the model, not a problem with the request; see the server log.",
                    code="server_error")


class _EngineCollector:
    """The decode engine's own counters (``Engine.stats()``) at scrape time: the prefix cache's
    hits, misses, evictions and size, and the batched prefill's calls and tokens."""

    _COUNTERS = (
        ("langtorch_prefix_cache_hits", "Prompt blocks whose keys/values came from the prefix "
         "cache.", ("prefix_cache", "hits")),
        ("langtorch_prefix_cache_misses", "Prompt blocks looked up in the prefix cache, not "
         "found and computed.", ("prefix_cache", "misses")),
        ("langtorch_prefix_cache_evicted", "Blocks dropped from the prefix cache to make room.",
         ("prefix_cache", "evicted")),
        ("langtorch_prefix_cache_hit_tokens", "Prompt tokens not computed thanks to the prefix "
         "cache.", ("prefix_cache", "hit_tokens")),
        ("langtorch_prefill_calls", "Batched prefill calls (one chunk of up to prefill_rows "
         "prompts each).", ("prefill_calls",)),
        ("langtorch_prefill_tokens", "Prompt tokens computed by prefill.", ("prefill_tokens",)),
        ("langtorch_prefill_positions", "Positions prefill calls computed, padding included "
         "(prefill_tokens over this: how full the calls ran).", ("prefill_positions",)),
        ("langtorch_decode_chunks", "Jitted decode calls (each up to the engine's chunk of "
         "steps, fewer when steps are slow).", ("decode_chunks",)),
        ("langtorch_decode_steps", "Decode steps run (one token for every decoding row).",
         ("decode_steps",)),
    )

    def __init__(self, state: ServeState):
        self.state = state

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        backend = self.state.backend
        stats: dict = {}
        if getattr(backend, "_llm", None) is not None and hasattr(backend, "engine"):
            read = getattr(backend.engine, "stats", None)  # the model is loaded: its engine's
            stats = read() if callable(read) else {}

        def get(path):
            v: Any = stats
            for k in path:
                v = v.get(k, 0) if isinstance(v, dict) else 0
            return float(v or 0)

        for name, doc, path in self._COUNTERS:
            yield CounterMetricFamily(name, doc, value=get(path))
        yield GaugeMetricFamily("langtorch_prefix_cache_tokens", "Tokens held in the prefix "
                                "cache now.", value=get(("prefix_cache", "tokens")))
        yield GaugeMetricFamily("langtorch_prefix_cache_capacity_tokens", "The prefix cache's "
                                "capacity in tokens.",
                                value=get(("prefix_cache", "capacity_tokens")))
        yield GaugeMetricFamily("langtorch_prefilling_sequences", "Admitted sequences whose "
                                "prompt is still being prefilled.", value=get(("prefilling",)))


class _Metrics:
    """The server's Prometheus metrics (``GET /metrics``), in a registry of its own."""

    def __init__(self, state: ServeState):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("langtorch_requests", "HTTP requests answered, by route and "
                                "status.", ["route", "status"], registry=r)
        self.prompt_tokens = Counter("langtorch_prompt_tokens", "Prompt tokens of answered "
                                     "requests.", registry=r)
        self.completion_tokens = Counter("langtorch_completion_tokens", "Tokens generated.",
                                         registry=r)
        Gauge("langtorch_queue_depth", "Chat requests waiting for admission.",
              registry=r).set_function(lambda: state.chat_slots.waiting)
        Gauge("langtorch_running_requests", "Chat requests admitted to the engine.",
              registry=r).set_function(lambda: state.chat_slots.active)
        Gauge("langtorch_running_slots", "Sequences in the engine's decode slots.",
              registry=r).set_function(lambda: self._engine_stat(state)[0])
        Gauge("langtorch_kv_cache_usage_ratio", "Filled KV-cache positions over those "
              "allocated (0 when no cache is allocated).",
              registry=r).set_function(lambda: self._engine_stat(state)[1])
        r.register(_EngineCollector(state))
        self.ttft = Histogram("langtorch_time_to_first_token_seconds", "Seconds from admission "
                              "to a request's first token (streamed requests).", registry=r,
                              buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
        self.tpot = Histogram("langtorch_time_per_output_token_seconds", "Seconds per generated "
                              "token after the first (streamed), or per token of the whole "
                              "answer (not streamed).", registry=r,
                              buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))

    @staticmethod
    def _engine_stat(state: ServeState) -> tuple[int, float]:
        backend = state.backend
        if getattr(backend, "_llm", None) is None or not hasattr(backend, "engine"):
            return 0, 0.0  # the model is not loaded yet: nothing runs
        batch = backend.engine.batch
        live = list(batch.live)
        rows, length = getattr(batch, "_rows", 0), getattr(batch, "_len", 0)
        if not live or not rows or not length or batch.cache is None:
            return len(live), 0.0
        lens = batch._state.get("lens")
        used = sum(int(lens[x.slot]) for x in live if 0 <= x.slot < len(lens))
        return len(live), used / float(rows * length)

    def observe_usage(self, usage: Any) -> None:
        if usage is not None:
            self.prompt_tokens.inc(int(usage.prompt_tokens))
            self.completion_tokens.inc(int(usage.completion_tokens))


def _event_chunks(event: Any, calling: bool, held: dict[int, str],
                  chunk: Callable[[list[dict[str, Any]]], bytes]) -> list[bytes]:
    """The SSE chunks of one streamed event: its text delta (held in ``held`` while a tool call
    is decoded, sent whole when its choice ends) and, when its choice ends, the finish chunk."""
    out = []
    lp = getattr(event, "logprobs", None)
    lp = None if lp is None else {"content": list(lp), "refusal": None}
    if calling:
        held[event.index] = held.get(event.index, "") + event.text
    elif event.text or (lp and lp["content"]):
        out.append(chunk([{"index": event.index, "delta": {"content": event.text},
                           "logprobs": lp, "finish_reason": None}]))
    if event.finish_reason is not None:
        reason = event.finish_reason
        if calling:
            text = held.pop(event.index, "")
            tc = parse_tool_call(text, event.index) if reason == "stop" else None
            if tc is not None:
                reason = "tool_calls"
                out.append(chunk([{"index": event.index, "delta": {
                    "tool_calls": [{"index": 0, **tc}]}, "logprobs": lp,
                    "finish_reason": None}]))
            elif text:
                out.append(chunk([{"index": event.index,
                                   "delta": {"content": text}, "logprobs": lp,
                                   "finish_reason": None}]))
        out.append(chunk([{"index": event.index, "delta": {}, "logprobs": None,
                           "finish_reason": reason}]))
    return out


class ServeState:
    """The running server's models, limits and counters (``app[STATE]``).

    Attributes:
        chat_models: served chat model id -> adapter name (``None`` for the base model).
        chat_backends: served chat model id -> the backend that answers it.
        embedding_models: served embedding model ids.
        draining: set by a graceful shutdown; new requests get 503.
    """

    def __init__(self, backend: Backend, *, model_id: str, embedding_backend: Backend | None,
                 embedding_id: str | None, api_key: str | None, limits: Limits,
                 models: Mapping[str, Backend] | None = None):
        self.backend = backend
        self.embedding_backend = embedding_backend
        self.model_id = model_id
        self.limits = limits
        self._api_key = api_key.encode() if api_key else None
        self._api_digest = hashlib.sha256(self._api_key).digest() if self._api_key else b""
        self.created = int(time.time())
        self.chat_models: dict[str, str | None] = {}
        self.chat_backends: dict[str, Backend] = {}
        for ident, b in {model_id: backend, **(models or {})}.items():
            self.chat_models[ident] = None
            self.chat_backends[ident] = b
            for name in tuple(getattr(b, "adapter_names", ()) or ()):
                self.chat_models[f"{ident}:{name}"] = name
                self.chat_backends[f"{ident}:{name}"] = b
        self.embedding_models: tuple[str, ...] = (
            (embedding_id,) if embedding_backend is not None and embedding_id else ())
        self.chat_slots = _Admission(limits.max_concurrency, limits.max_queue, limits.retry_after,
                               "requests")
        self.embed_slots = _Admission(limits.max_embedding_concurrency, limits.max_queue,
                                limits.retry_after, "embedding requests")
        self.draining = False
        self.in_flight = 0
        self.metrics = _Metrics(self)

    # ------------------------------------------------------------------ helpers
    def check_key(self, request: web.Request) -> None:
        if self._api_key is None:
            return
        header = request.headers.get("Authorization", "")
        scheme, _, sent = header.partition(" ")
        # Header bytes that are not UTF-8 arrive as surrogates: compare them as sent (a wrong
        # key, not a 500). Digests make the comparison independent of the length as well.
        sent_digest = hashlib.sha256(sent.strip().encode("utf-8", "surrogateescape")).digest()
        ok = hmac.compare_digest(sent_digest, self._api_digest) and scheme.lower() == "bearer"
        if not ok:
            raise ApiError(401, "Incorrect or missing API key: send `Authorization: Bearer "
                           "<key>` with the key the server was started with.",
                           code="invalid_api_key", type="invalid_request_error")

    async def json_body(self, request: web.Request) -> Any:
        limit = self.limits.max_body_bytes
        too_large = ApiError(413, f"The request body is larger than this server's limit of "
                             f"{limit} bytes.", code="request_too_large")
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise too_large from None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: deep nesting
            raise ApiError(400, "The request body is not valid JSON.",
                           code="invalid_json") from None

    def backend_for(self, model: str) -> Backend:
        """The chat backend serving the model id ``model`` (a base model or one of its
        adapters)."""
        return self.chat_backends.get(model, self.backend)

    def prepare(self, call: Any) -> Any:
        """What the backend is given for a chat call: for a backend with ``prepare`` (the local
        one) the request checked, tokenised and fitted to the model's context once — run in a
        worker thread (see :meth:`chat`) — and refused over ``max_prompt_tokens``; for another
        backend the request mapping itself."""
        prepare = getattr(self.backend_for(call.model), "prepare", None)
        if prepare is None:
            return call.backend_request
        try:
            prepared = prepare(call.backend_request)
        except (asyncio.CancelledError, ApiError):
            raise
        except Exception as exc:  # noqa: BLE001 - answered as an HTTP error
            raise _backend_error(exc, call.backend_request) from None
        limit = self.limits.max_prompt_tokens
        n = len(getattr(prepared, "prompt_ids", ()))
        if limit is not None and n > limit:
            raise ApiError(400, f"The prompt has {n} tokens after the chat template; this "
                           f"server accepts at most {limit}.", param="messages",
                           code="context_length_exceeded")
        return prepared

    # ------------------------------------------------------------------ routes
    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self.json_body(request)
        call = chat_request(body, self.chat_models, max_n=self.limits.max_n)
        request[MODEL_KEY] = call.model
        # Tokenising a body-limit-sized prompt takes seconds: off the event loop, so that it
        # does not stall every other connection's stream; it happens once, here, and the
        # prepared request goes to the backend.
        prepared = await asyncio.to_thread(self.prepare, call)
        if call.stream:
            async with self.chat_slots():
                return await self._stream(request, call, prepared)
        completion = await self._complete(request, call, prepared)
        return web.json_response(completion_json(
            completion, id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()),
            model=call.model))

    async def _stream(self, request: web.Request, call: ChatCall,
                      prepared: Any) -> web.StreamResponse:
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        events = _events(self.backend_for(call.model), prepared)
        response: web.StreamResponse | None = None

        def chunk(choices: list[dict[str, Any]], usage: Any = None) -> bytes:
            payload = chunk_json(id=ident, created=created, model=call.model, choices=choices,
                                 include_usage=call.include_usage, usage=usage)
            return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"

        try:
            try:
                # The first event comes before the response starts: a request the engine
                # refuses is answered with a plain 400, not a broken stream.
                first = await events.__anext__()
            except StopAsyncIteration:
                first = None
            except (asyncio.CancelledError, ApiError):
                raise
            except Exception as exc:  # noqa: BLE001
                raise _backend_error(exc, call.backend_request) from None
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
            await response.prepare(request)
            await response.write(b"".join(
                chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                        "logprobs": None, "finish_reason": None}]) for i in range(call.n)))
            usage: Usage | None = None
            # A tool call is sent whole when its choice ends (the JSON the grammar produced).
            calling = bool(getattr(prepared, "tool_call", False))
            held: dict[int, str] = {}
            started = time.perf_counter()
            first_at: float | None = None
            last_at = started

            async def rest() -> AsyncIterator[Any]:
                if first is not None:
                    yield first
                async for event in events:
                    yield event

            try:
                async for event in rest():
                    if isinstance(event, Usage):
                        usage = event
                        continue
                    if event.text:
                        now = time.perf_counter()
                        if first_at is None:
                            first_at = now
                            self.metrics.ttft.observe(now - started)
                        last_at = now
                    out = _event_chunks(event, calling, held, chunk)
                    if out:
                        await response.write(b"".join(out))
            except (asyncio.CancelledError, ConnectionError):
                raise
            except Exception as exc:  # noqa: BLE001 - the stream has started: send an error event
                err = _backend_error(exc)
                await response.write(b"data: " + json.dumps(err.body()).encode() + b"\n\n")
                return response
            if usage is not None:
                request[USAGE_KEY] = usage
                if first_at is not None and usage.completion_tokens > 1:
                    self.metrics.tpot.observe((last_at - first_at)
                                              / (usage.completion_tokens - 1))
            if call.include_usage:
                await response.write(chunk([], usage or Usage()))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        except ConnectionError:
            # The client went away mid-stream: closing the events (finally) frees its slot.
            log.info("client disconnected mid-stream (%s)", call.model)
            request[DISCONNECTED_KEY] = True
            return response if response is not None else web.Response(status=499)
        finally:
            await events.aclose()

    async def _complete(self, request: web.Request, call: Any, prepared: Any) -> Any:
        """One non-streamed answer in a chat slot (chat and text completions): backend errors
        mapped to HTTP errors, usage recorded, time per output token observed."""
        async with self.chat_slots():
            started = time.perf_counter()
            try:
                completion = await self.backend_for(call.model).complete(prepared)
            except (asyncio.CancelledError, ApiError):
                raise
            except Exception as exc:  # noqa: BLE001 - answered as an HTTP error
                raise _backend_error(exc, call.backend_request) from None
        request[USAGE_KEY] = completion.usage
        if completion.usage.completion_tokens:
            self.metrics.tpot.observe((time.perf_counter() - started)
                                      / completion.usage.completion_tokens)
        return completion

    async def completions(self, request: web.Request) -> web.Response:
        body = await self.json_body(request)
        call = completions_request(body, self.chat_models, max_n=self.limits.max_n)
        request[MODEL_KEY] = call.model
        if call.stream:
            raise ApiError(400, "stream=true is not supported on /v1/completions; use "
                           "/v1/chat/completions to stream.", param="stream",
                           code="invalid_value")
        if getattr(self.backend_for(call.model), "prepare", None) is None:
            raise ApiError(404, "This server's backend answers chat requests only.",
                           code="not_found")
        adapter = self.chat_models[call.model]
        if adapter is not None:
            call.backend_request["adapter"] = adapter
        prepared = await asyncio.to_thread(self.prepare, call)
        completion = await self._complete(request, call, prepared)
        return web.json_response(text_completion_json(
            completion, call, id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time())))

    async def metrics_route(self, request: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def embeddings(self, request: web.Request) -> web.Response:
        if self.embedding_backend is None:
            raise ApiError(404, "This server does not serve embeddings (started with "
                           "--embedding-model none).", param="model", code="model_not_found")
        body = await self.json_body(request)
        call = embeddings_request(body, self.embedding_models)
        request[MODEL_KEY] = call.model
        async with self.embed_slots():
            try:
                result = await self.embedding_backend.embed(call.inputs)
            except (asyncio.CancelledError, ApiError):
                raise
            except Exception as exc:  # noqa: BLE001
                raise _backend_error(exc) from None
        dim = int(result.vectors.shape[1])
        if call.dimensions is not None and call.dimensions != dim:
            raise ApiError(400, f"{call.model} gives {dim}-dimensional vectors; it cannot "
                           f"shorten them to {call.dimensions}.", param="dimensions",
                           code="invalid_value")
        request[USAGE_KEY] = result.usage
        return web.json_response(embeddings_json(
            result.vectors, model=call.model, encoding_format=call.encoding_format,
            prompt_tokens=result.usage.prompt_tokens))

    def _model_json(self, ident: str) -> dict[str, Any]:
        return {"id": ident, "object": "model", "created": self.created, "owned_by": "langtorch"}

    async def models(self, request: web.Request) -> web.Response:
        ids = [*self.chat_models, *self.embedding_models]
        return web.json_response({"object": "list", "data": [self._model_json(i) for i in ids]})

    async def model(self, request: web.Request) -> web.Response:
        ident = request.match_info["model"]
        if ident not in self.chat_models and ident not in self.embedding_models:
            raise ApiError(404, f"The model {ident!r} does not exist here.", param="model",
                           code="model_not_found")
        return web.json_response(self._model_json(ident))

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({
            "status": "draining" if self.draining else "ok",
            "active": self.chat_slots.active, "queued": self.chat_slots.waiting,
            "embedding_active": self.embed_slots.active, "in_flight": self.in_flight,
            "models": [*self.chat_models, *self.embedding_models]})

    def _count(self, request: web.Request, status: int) -> None:
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "other"
        if name == "/metrics":
            return
        self.metrics.requests.labels(name, str(status)).inc()
        self.metrics.observe_usage(request.get(USAGE_KEY))

    # ------------------------------------------------------------------ middleware
    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.in_flight += 1
        try:
            if request.path not in ("/health", "/metrics"):
                if self.draining:
                    raise ApiError(503, "The server is shutting down.", code="server_shutting_down",
                                   headers={"Retry-After": f"{max(1, round(self.limits.retry_after))}"})
                self.check_key(request)
            response = await handler(request)
            self._count(request, response.status)
            return response
        except ApiError as e:
            request[ERROR_KEY] = e.code
            self._count(request, e.status)
            return web.json_response(e.body(), status=e.status, headers=e.headers)
        except web.HTTPException as e:  # routing: 404 / 405 in OpenAI's error format
            if e.status < 400:
                raise
            return web.json_response(
                ApiError(e.status, f"{request.method} {request.path}: {e.reason}.",
                         code="not_found" if e.status == 404 else "method_not_allowed").body(),
                status=e.status)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug answers 500 in OpenAI's format
            log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
            request[ERROR_KEY] = "server_error"
            return web.json_response(ApiError(500, "Internal server error; see the server log.",
                                              code="server_error").body(), status=500)
        finally:
            self.in_flight -= 1


class AccessLogger(AbstractAccessLogger):
    """One line per request: client, method, path, status, seconds, model, token counts.

    Never the prompt, the answer, the query string or any header (the API key stays out).
    """

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        usage = request.get(USAGE_KEY)
        tokens = (f" prompt_tokens={usage.prompt_tokens} completion_tokens="
                  f"{usage.completion_tokens}" if usage is not None else "")
        extra = " disconnected" if request.get(DISCONNECTED_KEY) else ""
        if request.get(ERROR_KEY):
            extra += f" error={request[ERROR_KEY]}"
        self.logger.info('%s "%s %s" %d %.3fs model=%s%s%s', request.remote, request.method,
                         request.path, response.status, time, request.get(MODEL_KEY, "-"),
                         tokens, extra)

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


def create_app(backend: Backend, *, model_id: str = "smollm2",
               embedding_backend: Backend | None = None, embedding_id: str | None = "minilm",
               api_key: str | None = None, limits: Limits | None = None,
               models: Mapping[str, Backend] | None = None) -> web.Application:
    """An aiohttp application serving ``backend`` with OpenAI's HTTP API.

    Routes: ``POST /v1/chat/completions`` (JSON or SSE stream; ``response_format``, ``tools``,
    ``logprobs`` and the sampling controls as the backend honours them), ``POST
    /v1/completions`` (a raw prompt; ``echo``, ``logprobs``), ``POST /v1/embeddings``,
    ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health`` and ``GET /metrics``
    (Prometheus text format; neither needs the key). Each adapter in
    ``backend.adapter_names`` is served as ``f"{model_id}:{name}"``.

    Args:
        backend: the chat backend (normally a :class:`~langtorch.backends.LocalBackend`).
        model_id: the id clients send as ``model``.
        embedding_backend: the backend whose ``embed`` answers ``/v1/embeddings``; ``None``: no
            embeddings.
        embedding_id: the embedding model's id.
        api_key: when set, every ``/v1`` request needs ``Authorization: Bearer <api_key>``.
        limits: :class:`Limits`.
        models: more chat backends, by the id clients send (``--model NAME=PATH``); each one's
            adapters are served as ``f"{id}:{name}"`` too. Every id is listed in
            ``/v1/models``.

    Example:
        >>> from langtorch.backends import LocalBackend
        >>> from langtorch.serve import create_app
        >>> app = create_app(LocalBackend(), api_key="secret")
        >>> sorted({r.resource.canonical for r in app.router.routes()})
        ['/health', '/metrics', '/v1/chat/completions', '/v1/completions', '/v1/embeddings', '/v1/models', '/v1/models/{model}']
    """
    if not isinstance(backend, Backend):
        raise TypeError(f"create_app: expected a langtorch Backend, got {type(backend).__name__}.")
    if not isinstance(model_id, str) or not model_id or ":" in model_id:
        raise ValueError(f"create_app: expected model_id as a non-empty string without ':', got "
                         f"{model_id!r}.")
    if api_key is not None and (not isinstance(api_key, str) or not api_key):
        raise ValueError("create_app: expected api_key as a non-empty string or None.")
    for ident, b in (models or {}).items():
        if not isinstance(ident, str) or not ident or ":" in ident or ident == model_id:
            raise ValueError(f"create_app: expected models= ids as distinct non-empty strings "
                             f"without ':' (and not {model_id!r}), got {ident!r}.")
        if not isinstance(b, Backend):
            raise TypeError(f"create_app: expected models[{ident!r}] as a langtorch Backend, "
                            f"got {type(b).__name__}.")
    limits = limits or Limits()
    state = ServeState(backend, model_id=model_id, embedding_backend=embedding_backend,
                       embedding_id=embedding_id, api_key=api_key, limits=limits, models=models)
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[state.middleware])
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", state.chat)
    app.router.add_post("/v1/completions", state.completions)
    app.router.add_post("/v1/embeddings", state.embeddings)
    app.router.add_get("/metrics", state.metrics_route)
    app.router.add_get("/v1/models", state.models)
    app.router.add_get("/v1/models/{model}", state.model)
    app.router.add_get("/health", state.health)
    return app


def state_of(app: web.Application) -> ServeState:
    """The :class:`ServeState` of an app made by :func:`create_app`."""
    return app[STATE]
