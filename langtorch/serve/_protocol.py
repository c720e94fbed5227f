"""The OpenAI wire format: request validation (errors that name the parameter) and the JSON
bodies of responses, chunks and errors. No I/O here: the aiohttp handlers in ``_app`` call it.

Example:
    >>> from langtorch.serve._protocol import ApiError, chat_request
    >>> body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "n": 0}
    >>> try:
    ...     chat_request(body, {"smollm2": None})
    ... except ApiError as e:
    ...     print(e.status, e.param)
    400 n
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from langtorch.errors import BadRequestError
from langtorch.functional.request import SamplingParams, fold_tool_turns, normalize_messages

__all__ = ["ApiError", "ChatCall", "CompletionCall", "chat_request", "completions_request",
           "embeddings_request", "error_body"]

# Keys that concern the HTTP exchange, not the model: removed before the backend sees the request.
_HTTP_ONLY = ("model", "stream", "stream_options", "user")
_EMBEDDING_KEYS = {"model", "input", "encoding_format", "dimensions", "user"}
MAX_STOP = 4          # OpenAI's limit on stop sequences
MAX_EMBED_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request


class ApiError(Exception):
    """An error answered in OpenAI's format: ``{"error": {"message", "type", "param", "code"}}``.

    Attributes:
        status: the HTTP status.
        param: the request parameter at fault (``None`` when none is).
        code: OpenAI's machine-readable code (``invalid_api_key``, ``model_not_found`` ...).
        headers: extra response headers (``Retry-After`` on 429/503).

    Example:
        >>> ApiError(400, "expected an int", param="n").body()["error"]["param"]
        'n'
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _error_type(status)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def _error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(message: str, *, type: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object.

    Example:
        >>> error_body("bad", type="invalid_request_error", param="n")["error"]["message"]
        'bad'
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _api_error(exc: BadRequestError, body: Mapping[str, Any]) -> ApiError:
    """The request reader's refusal as a 400 in OpenAI's format."""
    missing = exc.param == "messages" and body.get("messages") is None
    return _bad(exc.param, str(exc),
                code="missing_required_parameter" if missing else "invalid_value")


@dataclasses.dataclass
class ChatCall:
    """A validated chat-completions request.

    Attributes:
        model: the served model id the client named (echoed in responses).
        backend_request: the body the backend receives (messages normalised, ``adapter`` set,
            HTTP-only keys removed).
        stream: whether to answer with server-sent events.
        include_usage: ``stream_options.include_usage``.
        n: choices requested.
        messages: the normalised messages.
        sampling: the validated sampling parameters.
    """

    model: str
    backend_request: dict[str, Any]
    stream: bool
    include_usage: bool
    n: int
    messages: list[dict[str, str]]
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)


def _model_of(body: Any) -> str:
    """The request's ``model`` after checking that the body is an object naming one."""
    if not isinstance(body, Mapping):
        raise _bad(None, f"expected a JSON object as the request body, got {type(body).__name__}.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "expected `model` as a non-empty string; GET /v1/models lists the "
                   "served ids.", code="missing_required_parameter" if model is None else
                   "invalid_value")
    return model


def chat_request(body: Any, models: Mapping[str, str | None], *, max_n: int = 16) -> ChatCall:
    """Validate a chat-completions body against OpenAI's schema.

    Args:
        body: the parsed JSON body.
        models: served chat model ids -> the adapter name they select (``None``: the base model).
        max_n: the most choices one request may ask for.

    Raises:
        ApiError: 400 naming the parameter; 404 for an unknown model.

    Example:
        >>> from langtorch.serve._protocol import chat_request
        >>> call = chat_request({"model": "smollm2:sst", "messages": [
        ...     {"role": "user", "content": "Hi"}], "max_tokens": 4}, {"smollm2:sst": "sst"})
        >>> call.backend_request["adapter"], call.backend_request["max_tokens"]
        ('sst', 4)
    """
    model = _model_of(body)
    if model not in models:
        raise ApiError(404, f"The model {model!r} does not exist here; served models: "
                       f"{', '.join(sorted(models))}.", param="model", code="model_not_found")
    # The same readers LocalBackend uses: a request means the same thing at every entry point.
    try:
        messages = normalize_messages(fold_tool_turns(body.get("messages")))
        sampling = SamplingParams.from_request(body, max_n=max_n, max_stop=MAX_STOP)
    except BadRequestError as exc:
        raise _api_error(exc, body) from None
    n = sampling.n
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", f"expected `stream` as a boolean, got {stream!r}.")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise _bad("stream_options", "`stream_options` is only allowed when `stream` is true.")
        if not isinstance(options, Mapping) or not isinstance(
                options.get("include_usage", False), bool):
            raise _bad("stream_options", "expected `stream_options` as an object "
                       "{'include_usage': bool}.")
        include_usage = bool(options.get("include_usage", False))
    if "adapter" in body:
        raise _bad("adapter", "select an adapter by naming its model id (`model`: "
                   "'<base>:<adapter>'), not with an `adapter` field.")
    request = {k: v for k, v in body.items() if k not in _HTTP_ONLY}
    raw = body.get("messages")
    has_tool_turns = any(isinstance(m, Mapping) and (m.get("role") == "tool" or m.get(
        "tool_calls")) for m in raw)
    request["messages"] = list(raw) if has_tool_turns else messages  # the backend folds them
    if n != 1 or "n" in request:
        request["n"] = n
    adapter = models[model]
    if adapter is not None:
        request["adapter"] = adapter
    return ChatCall(model, request, bool(stream), include_usage, n, messages, sampling)


@dataclasses.dataclass
class CompletionCall:
    """A validated legacy ``/v1/completions`` request (a raw prompt, no chat template).

    Attributes:
        model, stream, include_usage, n: as for :class:`ChatCall`.
        prompt: the prompt text.
        echo: whether the answer's text starts with the prompt.
        logprobs: ``None`` or how many most likely tokens to return per token (0..5).
        backend_request: what the backend receives (``prompt`` + sampling keys).
    """

    model: str
    prompt: str
    echo: bool
    logprobs: int | None
    stream: bool
    include_usage: bool
    n: int
    backend_request: dict[str, Any]


_COMPLETION_KEYS = {"model", "prompt", "echo", "logprobs", "stream", "stream_options", "user",
                    "n", "max_tokens", "temperature", "top_p", "seed", "stop",
                    "frequency_penalty", "presence_penalty", "logit_bias", "repetition_penalty",
                    "top_k", "min_p", "guided_regex", "guided_choice", "guided_json"}


def completions_request(body: Any, models: Mapping[str, str | None], *,
                        max_n: int = 16) -> CompletionCall:
    """Validate a legacy completions body (``prompt`` is one string, ``logprobs`` an int <= 5).

    Raises:
        ApiError: 400 naming the parameter; 404 for an unknown model.

    Example:
        >>> from langtorch.serve._protocol import completions_request
        >>> c = completions_request({"model": "m", "prompt": "1, 2,", "logprobs": 2}, {"m": None})
        >>> c.backend_request["top_logprobs"], c.echo
        (2, False)
    """
    model = _model_of(body)
    if model not in models:
        raise ApiError(404, f"The model {model!r} does not exist here; served models: "
                       f"{', '.join(sorted(models))}.", param="model", code="model_not_found")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _bad("prompt", "expected `prompt` as a non-empty string (one prompt per request).",
                   code="missing_required_parameter" if prompt is None else "invalid_value")
    unknown = sorted(k for k in body if k not in _COMPLETION_KEYS)
    if unknown:
        raise _bad(unknown[0], f"the completions parameter {unknown[0]!r} is not supported "
                   f"(supported: {', '.join(sorted(_COMPLETION_KEYS))}).")
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise _bad("echo", f"expected `echo` as a boolean, got {echo!r}.")
    lp = body.get("logprobs")
    if lp is not None and (not _is_int(lp) or not 0 <= lp <= 5):
        raise _bad("logprobs", f"expected `logprobs` as an integer in [0, 5], got {lp!r}.")
    if echo and lp is not None:
        raise _bad("echo", "`echo` with `logprobs` (the prompt's logprobs) is not supported; "
                   "send one of them.")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", f"expected `stream` as a boolean, got {stream!r}.")
    options = body.get("stream_options")
    include_usage = bool(isinstance(options, Mapping) and options.get("include_usage"))
    request = {k: v for k, v in body.items()
               if k not in _HTTP_ONLY and k not in ("echo", "logprobs", "prompt")}
    if lp is not None:
        request["logprobs"], request["top_logprobs"] = True, lp
    try:
        sampling = SamplingParams.from_request(request, max_n=max_n, max_stop=MAX_STOP)
    except BadRequestError as exc:
        raise _api_error(exc, body) from None
    request["prompt"] = prompt
    return CompletionCall(model, prompt, echo, lp, bool(stream), include_usage, sampling.n,
                          request)


def legacy_logprobs(content: list[dict[str, Any]] | None, offset: int = 0) -> dict | None:
    """Chat-shaped ``logprobs.content`` entries as the legacy completions ``logprobs`` object
    (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``).

    Example:
        >>> from langtorch.serve._protocol import legacy_logprobs
        >>> legacy_logprobs([{"token": "a", "logprob": -0.1, "top_logprobs": [
        ...     {"token": "a", "logprob": -0.1}]}])["text_offset"]
        [0]
    """
    if content is None:
        return None
    offsets, at = [], offset
    for e in content:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in content],
            "token_logprobs": [e["logprob"] for e in content],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]}
                             for e in content],
            "text_offset": offsets}


def text_completion_json(completion: Any, call: CompletionCall, *, id: str,
                         created: int) -> dict[str, Any]:
    """A ``text_completion`` object for a backend :class:`Completion`."""
    choices = []
    for i, ch in enumerate(completion.choices):
        content = (ch.logprobs or {}).get("content") if call.logprobs is not None else None
        head = call.prompt if call.echo else ""
        choices.append({"index": i, "text": head + ch.text,
                        "logprobs": legacy_logprobs(content, len(head)),
                        "finish_reason": ch.finish_reason or "stop"})
    return {"id": id, "object": "text_completion", "created": created, "model": call.model,
            "choices": choices, "usage": usage_json(completion.usage)}


@dataclasses.dataclass
class EmbeddingsCall:
    """A validated embeddings request: ``model``, ``inputs`` and ``encoding_format``."""

    model: str
    inputs: list[str]
    encoding_format: str
    dimensions: int | None


def embeddings_request(body: Any, models: Any) -> EmbeddingsCall:
    """Validate an embeddings body (text inputs, ``float`` or ``base64`` encoding).

    Raises:
        ApiError: 400 naming the parameter; 404 for an unknown model.

    Example:
        >>> from langtorch.serve._protocol import embeddings_request
        >>> embeddings_request({"model": "minilm", "input": "hi"}, {"minilm"}).inputs
        ['hi']
    """
    model = _model_of(body)
    if model not in models:
        raise ApiError(404, f"The embedding model {model!r} does not exist here; served: "
                       f"{', '.join(sorted(models)) or 'none'}.", param="model",
                       code="model_not_found")
    raw = body.get("input")
    inputs = [raw] if isinstance(raw, str) else raw
    if not isinstance(inputs, list) or not inputs:
        raise _bad("input", "expected `input` as a string or a non-empty list of strings.",
                   code="missing_required_parameter" if raw is None else "invalid_value")
    if len(inputs) > MAX_EMBED_INPUTS:
        raise _bad("input", f"expected at most {MAX_EMBED_INPUTS} inputs, got {len(inputs)}.")
    for i, text in enumerate(inputs):
        if not isinstance(text, str):
            what = ("token ids (the server tokenises text itself)"
                    if isinstance(text, (int, list)) else type(text).__name__)
            raise _bad(f"input[{i}]", f"expected a string, got {what}.")
        if not text:
            raise _bad(f"input[{i}]", "expected a non-empty string.")
    unknown = sorted(k for k in body if k not in _EMBEDDING_KEYS)
    if unknown:
        raise _bad(unknown[0], f"the embeddings parameter {unknown[0]!r} is not supported "
                   f"(supported: {', '.join(sorted(_EMBEDDING_KEYS))}).")
    fmt = body.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in ("float", "base64"):
        raise _bad("encoding_format", f"expected `encoding_format` 'float' or 'base64', got "
                   f"{fmt!r}.")
    dims = body.get("dimensions")
    if dims is not None and (not _is_int(dims) or dims < 1):
        raise _bad("dimensions", f"expected `dimensions` as an integer >= 1, got {dims!r}.")
    return EmbeddingsCall(model, list(inputs), fmt, dims)


def usage_json(usage: Any) -> dict[str, int]:
    """``{"prompt_tokens", "completion_tokens", "total_tokens"}`` of a :class:`Usage`.

    Example:
        >>> from langtorch.backends import Usage
        >>> usage_json(Usage(3, 2))["total_tokens"]
        5
    """
    p, c = int(usage.prompt_tokens), int(usage.completion_tokens)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def completion_json(completion: Any, *, id: str, created: int, model: str) -> dict[str, Any]:
    """A ``chat.completion`` object for a backend :class:`Completion`."""
    return {
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": i,
                     "message": _message_json(ch),
                     "logprobs": getattr(ch, "logprobs", None),
                     "finish_reason": ch.finish_reason or "stop"}
                    for i, ch in enumerate(completion.choices)],
        "usage": usage_json(completion.usage),
    }


def _message_json(choice: Any) -> dict[str, Any]:
    msg = {"role": "assistant", "content": choice.text, "refusal": None}
    calls = (getattr(choice, "message", None) or {}).get("tool_calls")
    if calls:
        msg["content"] = choice.text or None
        msg["tool_calls"] = list(calls)
    return msg


def chunk_json(*, id: str, created: int, model: str, choices: list[dict[str, Any]],
               include_usage: bool, usage: Any = None) -> dict[str, Any]:
    """A ``chat.completion.chunk``; with ``include_usage`` every chunk carries ``usage``
    (``null`` except on the last, choice-less one), as OpenAI sends it."""
    chunk: dict[str, Any] = {"id": id, "object": "chat.completion.chunk", "created": created,
                             "model": model, "choices": choices}
    if include_usage:
        chunk["usage"] = None if usage is None else usage_json(usage)
    return chunk


def embeddings_json(vectors: np.ndarray, *, model: str, encoding_format: str,
                    prompt_tokens: int) -> dict[str, Any]:
    """An embeddings ``list`` object; base64 is the little-endian float32 bytes (OpenAI's)."""
    data = []
    vectors = np.asarray(vectors, np.float32)
    for i, v in enumerate(vectors):
        if encoding_format == "base64":
            emb: Any = base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
        else:
            emb = v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": int(prompt_tokens), "total_tokens": int(prompt_tokens)}}
