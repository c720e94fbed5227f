"""OpenAIBackend: any OpenAI-compatible server through the official ``openai.AsyncOpenAI`` client."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import email.utils
import json
import os
import sys
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import openai

from langtorch.backends.base import Backend, Capabilities, Choice, Completion, Embeddings, Usage
from langtorch.core.redact import mask_key, redact
from langtorch.core.sync import is_private_loop
from langtorch.errors import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    RateLimitError,
)

__all__ = ["OpenAIBackend"]

# The HTTP library the installed openai client is built on (httpx, or httpx2 in openai >= 3).
_httpx = sys.modules[openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0]]

# Statuses worth retrying, as the OpenAI client itself treats them; the rest (400, 401, 403, 404,
# 422, ...) will fail the same way again.
_RETRYABLE_STATUS = {408, 409, 429}


class OpenAIBackend(Backend):
    """Chat completions and embeddings from any OpenAI-compatible server (OpenAI, vLLM, Ollama, ...).

    Requests go out as given (every chat-completions parameter passes through, even ones the
    installed ``openai`` package does not know), on one ``openai.AsyncOpenAI`` client per event
    loop with the client's own retries switched off: the langtorch runtime retries instead (with
    backoff and jitter, honouring ``Retry-After``), under the limits set here.

    Args:
        model: model name sent with each request.
        base_url: server URL, e.g. ``http://localhost:8000/v1``; default ``$OPENAI_BASE_URL``, then
            the OpenAI API.
        api_key: default ``$OPENAI_API_KEY``. Never shown in reprs, logs, errors or caches.
        max_concurrency: requests in flight at once.
        requests_per_minute: client-side request rate limit.
        tokens_per_minute: client-side token rate limit (estimated, reconciled from usage).
        timeout: seconds per attempt.
        max_retries: retries of retryable failures (429, 5xx, timeouts, bad bodies).
        cache: ``None`` (off), ``True`` (default file), a path or a ``ResponseCache``.
        price: ``(prompt, completion)`` cost per million tokens, or ``{model: (prompt, completion)}``.
        max_cost: budget for this backend's session (needs ``price``).
        capabilities: what the server honours, when it is less than the OpenAI API's full set
            (the default: structured output, tools, logprobs, ``n`` > 1, streaming,
            embeddings): e.g. ``{"logprobs": False}`` for a server without them. Losses,
            optimizers and ``lt.nn.LLM`` check it before sending anything.
        **options: other :class:`~langtorch.backends.RuntimeOptions` fields (``backoff_base``,
            ``backoff_max``, ``embed_batch_size``) and ``organization``/``default_headers``
            passed to the client.

    Example:
        >>> from langtorch.testing import OpenAIServer
        >>> from langtorch.runtime import complete
        >>> with OpenAIServer() as server:
        ...     backend = OpenAIBackend("m", base_url=server.url, api_key="sk-test1234")
        ...     result = complete(backend, [{"messages": [{"role": "user", "content": "hi"}]}])
        >>> result.completions[0].text, backend
        ('Echo: hi', OpenAIBackend(model='m', base_url='http://127.0.0.1:...', api_key='sk-***'))
    """

    # The OpenAI API's set; a server that lacks some of it is declared with capabilities=.
    default_capabilities = Capabilities.all()

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 16,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        timeout: float | None = 60.0,
        max_retries: int = 4,
        cache: Any = None,
        price: Any = None,
        max_cost: float | None = None,
        **options: Any,
    ):
        client_kwargs = {k: options.pop(k) for k in ("organization", "project", "default_headers")
                         if k in options}
        self.fast_transport = bool(options.pop("fast_transport", True))
        self._fast: Any = None
        super().__init__(
            model,
            max_concurrency=max_concurrency,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            timeout=timeout,
            max_retries=max_retries,
            cache=cache,
            price=price,
            max_cost=max_cost,
            **options,
        )
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        # What reprs, messages and cache keys show: no user:password@, no query (tokens).
        self._display_url = display_url(self.base_url)
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if not key:
            raise AuthenticationError(
                "OpenAIBackend expected an API key, got none: pass api_key=... or set "
                "OPENAI_API_KEY (local servers that ignore keys accept any string, e.g. 'none').",
                retryable=False,
            )
        # Kept in a closure rather than an attribute so that vars(backend), pickling and
        # debuggers that dump attributes do not show it.
        self._key = lambda: key
        self._client_kwargs = client_kwargs
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )

    def redaction_secrets(self) -> tuple[str, ...]:
        """The API key, for redaction (see :meth:`Backend.redaction_secrets`)."""
        key = self._key()
        return (key,) if key else ()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(model={self.model!r}, base_url={self._display_url!r}, "
                f"api_key={mask_key(self._key())!r})")

    @property
    def cache_namespace(self) -> str:
        """The backend type and server (no credentials) that cache keys are scoped to.

        Example:
            >>> OpenAIBackend("m", base_url="http://u:pw@host:1/v1?k=s", api_key="x").cache_namespace
            'OpenAIBackend:http://host:1/v1'
        """
        return f"{type(self).__name__}:{self._display_url}"

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "OpenAIBackend cannot be pickled: it holds an API key. Rebuild it in the other process "
            "(OpenAIBackend(model, base_url=...) reads OPENAI_API_KEY)."
        )

    def _client(self) -> openai.AsyncOpenAI:
        # An AsyncOpenAI's connection pool belongs to the event loop it was first used on, so keep
        # one client per loop (the runtime's private loop, a user's loop in acall).
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = openai.AsyncOpenAI(
                api_key=self._key(),
                base_url=self.base_url,
                max_retries=0,
                timeout=self.options.timeout,
                **self._client_kwargs,
            )
            self._clients[loop] = client
        return client

    # -------------------------------------------------------------- errors
    def _error(self, exc: BaseException, what: str) -> BackendError:
        """Translate an openai/httpx exception into langtorch's typed, key-free errors."""
        key = self._key()
        where = f"{what} at {self._display_url}"
        if isinstance(exc, openai.APIStatusError):
            return self._status_error(exc.status_code, _excerpt(exc.response),
                                      exc.response.headers, str(exc), what)
        if isinstance(exc, (openai.APITimeoutError, asyncio.TimeoutError, _httpx.TimeoutException)):
            return BackendTimeoutError(
                f"{where} got no answer within timeout={self.options.timeout} s; raise timeout= "
                "or check the server.")
        if isinstance(exc, (openai.APIConnectionError, _httpx.TransportError, _aiohttp_errors())):
            cause = exc.__cause__ or exc.__context__ or exc
            return BackendError(
                f"{where} failed: the connection was refused or dropped ({type(cause).__name__}). "
                "Check that the server is up and base_url is right.")
        return BadResponseError(f"{where} failed: {redact(str(exc), key)}")

    def _status_error(self, status: int, body: str | None, headers: Any, message: str,
                      what: str) -> BackendError:
        key = self._key()
        where = f"{what} at {self._display_url}"
        body = redact(body, key)
        message = redact(message, key).rstrip(". ")
        if status in (401, 403):
            return AuthenticationError(
                f"{where} was refused (HTTP {status}): {message}. Check api_key / "
                "OPENAI_API_KEY and the model's access rights.", status=status, body=body)
        if status == 429:
            if "insufficient_quota" in (body or ""):
                # Out of credit, not too fast: waiting will not help.
                return RateLimitError(
                    f"{where} was refused (HTTP 429, insufficient_quota): {message}. Add credit "
                    "or raise the account's quota; retrying will not help.", status=status,
                    body=body, retryable=False)
            return RateLimitError(
                f"{where} was rate limited (HTTP 429): {message}. Lower max_concurrency or "
                "set requests_per_minute/tokens_per_minute.", status=status, body=body,
                retry_after=_retry_after(headers))
        if body and body.lstrip()[:1] == "<":
            return BadResponseError(
                f"{where} answered HTTP {status} with an HTML page instead of JSON (a proxy "
                "or gateway error); excerpt in .body.", status=status, body=body,
                retryable=status >= 500 or status in _RETRYABLE_STATUS)
        error = BackendError(
            f"{where} failed with HTTP {status}: {message}.", status=status, body=body,
            retryable=status >= 500 or status in _RETRYABLE_STATUS)
        # A 503 (or any retryable status) may say when to come back: the runtime honours it.
        error.retry_after = _retry_after(headers) if error.retryable else None
        return error

    # -------------------------------------------------------------- transport
    async def _post(self, path: str, body: dict[str, Any], what: str) -> tuple[bytes, int]:
        """POST a JSON body; return ``(raw body, status)`` of a 2xx answer, else raise typed.

        The body is serialised before anything is sent: a value JSON cannot hold is the
        caller's mistake (``TypeError``, not retried), never a "bad response".
        """
        data = _dumps(body)
        loop = asyncio.get_running_loop()
        session = _private_session(loop) if self.fast_transport and is_private_loop(loop) else None
        # The sending happens in helpers that return either the answer or an already translated
        # error: the frames holding the Authorization header and the raw server body are gone
        # before anything is raised, and the error is raised outside any ``except`` block, so it
        # has no ``__context__`` (the SDK's exception holds the request headers) either.
        if session is None:
            outcome = await self._send_sdk(path, data, what)
        else:
            outcome = await self._send_fast(session, path, data, what)
        if isinstance(outcome, BackendError):
            raise outcome
        return outcome

    async def _send_sdk(self, path: str, data: bytes, what: str) -> tuple[bytes, int] | BackendError:
        try:
            response = await self._client().post(path, body=json.loads(data), cast_to=_httpx.Response)
            return await response.aread(), response.status_code
        except _TRANSPORT_ERRORS() as exc:
            return self._error(exc, what)

    async def _send_fast(self, session: Any, path: str, data: bytes,
                         what: str) -> tuple[bytes, int] | BackendError:
        # Fast path on the runtime's own loop: the same URL, headers and key as the
        # AsyncOpenAI client, sent through one shared aiohttp session. The SDK's request
        # pipeline (options models, httpx URL/header objects, connection pool) costs about
        # 0.75 ms of CPU per request, which caps a 2-core machine near 1,000 requests/s.
        url, headers = self._fast_target()
        timeout = _aiohttp().ClientTimeout(total=self.options.timeout)
        try:
            async with session.post(url + path, data=data, headers=headers,
                                    timeout=timeout) as response:
                raw = await response.read()
                if response.status >= 400:
                    text = raw.decode("utf-8", "replace")
                    return self._status_error(
                        response.status, text[:500], response.headers,
                        f"Error code: {response.status} - {_error_message(text)}", what)
                return raw, response.status
        except _TRANSPORT_ERRORS() as exc:
            return self._error(exc, what)

    def _fast_target(self) -> tuple[str, dict[str, str]]:
        if self._fast is None:
            client = self._client()
            headers = {k: v for k, v in {**client.default_headers, **client.auth_headers}.items()
                       if isinstance(v, str)}
            url = str(client.base_url).rstrip("/")
            # A closure, like the key itself: the headers hold the key in clear.
            self._fast = lambda: (url, headers)
        return self._fast()

    # -------------------------------------------------------------- chat
    async def complete(self, request: dict[str, Any]) -> Completion:
        """Send one chat-completions request (one attempt; the runtime retries).

        Args:
            request: the body; ``model`` defaults to ``self.model``.

        Returns:
            The :class:`~langtorch.backends.Completion`.
        """
        body = {"model": self.model, **request}
        body.pop("stream", None)
        body.pop("stream_options", None)
        # No local holds the raw body: it stays out of the frames of a parse error's traceback.
        return self._parse_chat(*await self._post("/chat/completions", body, "chat completion"),
                                int(body.get("n") or 1))

    def _parse_chat(self, raw: bytes, status: int, n: int) -> Completion:
        error: BadResponseError | None = None
        try:
            data = json.loads(raw)
            choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
            parsed = tuple(_choice(c) for c in choices)
            usage = data.get("usage") or {}
            result = Completion(
                choices=parsed,
                usage=Usage(int(usage.get("prompt_tokens") or 0),
                            int(usage.get("completion_tokens") or 0)),
                model=str(data.get("model") or self.model),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            error = BadResponseError(
                f"chat completion at {self._display_url} answered HTTP {status} with a body that "
                f"is not a chat completion ({type(exc).__name__}: {exc}); excerpt in .body.",
                status=status, body=redact(raw[:500].decode("utf-8", "replace"), self._key()))
        if error is None and len(parsed) != n:
            error = BadResponseError(
                f"chat completion at {self._display_url} returned {len(parsed)} choices, "
                f"expected n={n}.",
                status=status, body=redact(raw[:500].decode("utf-8", "replace"), self._key()))
        if error is not None:
            del raw  # the server's body, unredacted: not in the traceback's locals
            raise error
        return result

    async def stream(self, request: dict[str, Any]) -> AsyncIterator[str | Usage]:
        """Yield the first choice's text deltas as the server streams them (SSE), then its usage.

        Usage is asked for (``stream_options.include_usage``) unless the request sets
        ``stream_options`` itself.

        Example:
            >>> import asyncio
            >>> from langtorch.testing import OpenAIServer
            >>> async def main(url):
            ...     b = OpenAIBackend("m", base_url=url, api_key="sk-test1234")
            ...     req = {"messages": [{"role": "user", "content": "a b"}]}
            ...     return [d async for d in b.stream(req)]
            >>> with OpenAIServer() as server:
            ...     asyncio.run(main(server.url))
            ['', 'Echo:', ' a', ' b', Usage(prompt_tokens=3, completion_tokens=3)]
        """
        body = {"model": self.model, "stream_options": {"include_usage": True}, **request,
                "stream": True}
        body = json.loads(_dumps(body))  # numpy scalars become numbers; bad values: TypeError
        error: BackendError | None = None
        try:
            stream = await self._client().post(
                "/chat/completions", body=body, cast_to=object, stream=True,
                stream_cls=openai.AsyncStream[object])
            async for chunk in stream:
                if not isinstance(chunk, dict):
                    continue
                usage = chunk.get("usage")
                if usage:
                    yield Usage(int(usage.get("prompt_tokens") or 0),
                                int(usage.get("completion_tokens") or 0))
                for choice in chunk.get("choices") or []:
                    if choice.get("index", 0) == 0:
                        content = (choice.get("delta") or {}).get("content")
                        if content is not None:
                            yield _clean_text(content)
        except _TRANSPORT_ERRORS() as exc:
            error = self._error(exc, "chat completion stream")
        if error is not None:
            # Raised outside the except block: no __context__ holding the SDK's request headers.
            raise error

    # -------------------------------------------------------------- embeddings
    async def embed(self, texts: Sequence[str], **params: Any) -> Embeddings:
        """Embed ``texts`` in one request to ``/embeddings`` (one attempt).

        Example:
            >>> import asyncio
            >>> from langtorch.testing import OpenAIServer
            >>> with OpenAIServer(embedding_dim=4) as server:
            ...     b = OpenAIBackend("e", base_url=server.url, api_key="sk-test1234")
            ...     asyncio.run(b.embed(["a", "b"])).vectors.shape
            (2, 4)
        """
        body = {"model": self.model, "input": list(texts), "encoding_format": "float", **params}
        return self._parse_embeddings(*await self._post("/embeddings", body, "embeddings"),
                                      len(texts))

    def _parse_embeddings(self, raw: bytes, status: int, count: int) -> Embeddings:
        error: BadResponseError | None = None
        try:
            data = json.loads(raw)
            rows = sorted(data["data"], key=lambda d: d["index"])
            vectors = np.asarray([_decode_vector(r["embedding"]) for r in rows], dtype=np.float32)
            if vectors.shape[0] != count:
                raise ValueError(f"{vectors.shape[0]} vectors for {count} inputs")
            usage = data.get("usage") or {}
            return Embeddings(vectors, Usage(int(usage.get("prompt_tokens") or 0), 0),
                              str(data.get("model") or self.model))
        except (ValueError, KeyError, TypeError) as exc:
            error = BadResponseError(
                f"embeddings at {self._display_url} answered with a body that is not an embeddings "
                f"list ({type(exc).__name__}: {exc}).", status=status,
                body=redact(raw[:500].decode("utf-8", "replace"), self._key()))
        del raw
        raise error


# One aiohttp session for the runtime's private loop, shared by every OpenAIBackend (one
# connection pool; limits come from each backend's semaphore), closed at exit.
_shared: dict[str, Any] = {}


def _aiohttp() -> Any:
    import aiohttp

    return aiohttp


def _aiohttp_errors() -> tuple[type[BaseException], ...]:
    try:
        return (_aiohttp().ClientError,)
    except ImportError:
        return ()


def _private_session(loop: asyncio.AbstractEventLoop) -> Any:
    # Keyed by process and loop: a forked child has a new private loop, and the parent's session
    # (its connections, its loop) is unusable there.
    key = (os.getpid(), id(loop))
    if _shared.get("key") != key:
        try:
            aiohttp = _aiohttp()
        except ImportError:
            _shared.update(key=key, session=None)
            return None
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        session = aiohttp.ClientSession(connector=connector)
        _shared.update(key=key, session=session)
        atexit.register(_close_on_loop, session, loop)
    return _shared["session"]


def _close_on_loop(session: Any, loop: asyncio.AbstractEventLoop) -> None:
    if loop.is_closed() or not loop.is_running():
        return
    future = asyncio.run_coroutine_threadsafe(session.close(), loop)
    try:
        future.result(timeout=2)
    except (concurrent.futures.TimeoutError, RuntimeError):
        pass  # exiting anyway


def _TRANSPORT_ERRORS() -> tuple[type[BaseException], ...]:  # noqa: N802 - used like a constant
    """What a send may raise that means "the server or the network failed" (translated, maybe
    retried); anything else is a bug or a caller's mistake and propagates as is."""
    return (openai.APIError, _httpx.HTTPError, _httpx.StreamError, asyncio.TimeoutError,
            ConnectionError, *_aiohttp_errors())


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(
        f"a request parameter of type {type(value).__name__} ({value!r:.60}) cannot be sent as "
        "JSON; pass str, int, float, bool, None, lists or dicts.")


def _dumps(body: Any) -> bytes:
    """The request body as JSON bytes; numpy scalars and arrays become numbers and lists."""
    return json.dumps(body, default=_json_default).encode()


def display_url(url: str) -> str:
    """``url`` without ``user:password@`` and without a query string (either may hold a token).

    Example:
        >>> display_url("https://user:pw@host/v1?api-key=s")
        'https://host/v1'
    """
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)[-1]
        return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")
    except ValueError:
        return "<unparsable base_url>"


def _clean_text(text: str) -> str:
    """Lone UTF-16 surrogates (a server cut an emoji in half) become U+FFFD; pairs are joined."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _error_message(text: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body itself (shortened)."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text[:200]


def _choice(c: dict[str, Any]) -> Choice:
    message = _clean(c.get("message") or {})
    content = message.get("content")
    return Choice(
        text=content if isinstance(content, str) else "",
        finish_reason=c.get("finish_reason"),
        message={k: v for k, v in message.items() if v is not None},
        logprobs=c.get("logprobs"),
    )


def _decode_vector(value: Any) -> np.ndarray:
    if isinstance(value, str):  # base64 little-endian float32
        import base64

        return np.frombuffer(base64.b64decode(value), dtype="<f4")
    return np.asarray(value, dtype=np.float32)


def _excerpt(response: Any) -> str | None:
    try:
        return response.text[:500]
    except Exception:  # noqa: BLE001 - a streamed or closed body has no text; no excerpt then
        return None


def _retry_after(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    try:
        if headers.get("retry-after-ms"):
            return float(headers["retry-after-ms"]) / 1000.0
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None
