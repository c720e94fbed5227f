"""One typed request at the edge: chat messages and sampling parameters, validated once.

Every entry point that takes an OpenAI-style chat request — ``LocalBackend``, ``langtorch serve``
and the scripted test server — reads it through these two functions, so a request means the
same thing (and fails with the same error, naming the same parameter) wherever it comes in:

* :func:`normalize_messages` — ``[{"role", "content"}]`` with text content, ``developer``
  folded into ``system``; a message without a role is refused (OpenAI's rule).
* :func:`content_text` — the text a message's content carries, read leniently (servers that
  accept images, tools and audio show or count only the text).
* :class:`SamplingParams` — ``n``, ``max_tokens``, ``temperature``, ``top_p``, ``seed``,
  ``stop``, penalties, ``logit_bias``, ``logprobs`` / ``top_logprobs``, ``top_k``, ``min_p``
  with OpenAI's (and vLLM's) ranges, built by :meth:`SamplingParams.from_request`.

Both raise :class:`~langtorch.errors.BadRequestError` whose ``param`` names the field at fault
(``"messages[0].role"``, ``"top_p"``); nothing here knows about models or HTTP.

Example:
    >>> from langtorch.functional.request import SamplingParams, normalize_messages
    >>> normalize_messages([{"role": "developer", "content": [{"type": "text", "text": "Be brief"}]}])
    [{'role': 'system', 'content': 'Be brief'}]
    >>> SamplingParams.from_request({"temperature": 0, "stop": "\\n"}).stop
    ('\\n',)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from langtorch.functional.errors import BadRequestError

__all__ = ["ROLES", "SamplingParams", "content_text", "fold_tool_turns", "normalize_messages",
           "parse_tool_call"]

ROLES = ("system", "developer", "user", "assistant")


def _bad(param: str, message: str) -> BadRequestError:
    return BadRequestError(message, param=param)


def content_text(content: Any) -> str:
    """The text of a message's content: a string as is, the ``text`` of text parts of a list
    (other parts — images, audio — skipped), ``""`` for ``None``; never raises.

    The lenient reading, for views and fakes of OpenAI that accept every kind of part;
    :func:`normalize_messages` is the strict one for text-only models.

    Example:
        >>> from langtorch.functional.request import content_text
        >>> content_text([{"type": "text", "text": "a "}, {"type": "image_url"}, {"text": "b"}])
        'a b'
        >>> content_text(None), content_text(3)
        ('', '3')
    """
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, (list, tuple)):
        return "".join(p["text"] for p in content
                       if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return str(content)


def _content(content: Any, role: str, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":  # an assistant turn may carry no text
        return ""
    if isinstance(content, (list, tuple)):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise _bad(f"{where}.content[{j}]",
                           f"expected a text content part ({{'type': 'text', 'text': str}}), got "
                           f"a {kind!r} part: the local model reads text only.")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"{where}.content", f"expected message content as a string or a list of text "
                                   f"parts, got {type(content).__name__}.")


def fold_tool_turns(messages: Any) -> Any:
    """Tool-call turns as plain chat turns, for models that read text only: an assistant's
    ``tool_calls`` become its content (one ``{"name", "arguments"}`` JSON per line, what a
    local model is asked to write), a ``tool`` result becomes a user turn naming the call. A
    ``tool`` message that answers no earlier call is left as it is (:func:`normalize_messages`
    refuses it, as OpenAI does). Other messages (and anything that is not a list of messages)
    are returned as they are.

    Example:
        >>> from langtorch.functional.request import fold_tool_turns
        >>> fold_tool_turns([
        ...     {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {
        ...         "name": "add", "arguments": '{"a": 1}'}}]},
        ...     {"role": "tool", "tool_call_id": "c1", "content": "1"}])
        [{'role': 'assistant', 'content': '{"name": "add", "arguments": {"a": 1}}'}, {'role': 'user', 'content': 'Result of add: 1'}]
    """
    import json

    if not isinstance(messages, (list, tuple)):
        return messages
    names: dict[str, Any] = {}
    out: list[Any] = []
    for m in messages:
        if not isinstance(m, Mapping):
            out.append(m)
            continue
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls and isinstance(calls, (list, tuple)):
            parts = []
            for c in calls:
                fn = c.get("function", {}) if isinstance(c, Mapping) else {}
                fn = fn if isinstance(fn, Mapping) else {}
                args = fn.get("arguments", "{}")
                try:
                    args = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    pass
                if isinstance(c, Mapping):
                    names[str(c.get("id"))] = fn.get("name")
                parts.append(json.dumps({"name": fn.get("name"), "arguments": args}))
            text = content_text(m.get("content"))
            out.append({"role": "assistant", "content": (text + "\n" if text else "")
                        + "\n".join(parts)})
        elif m.get("role") == "tool" and str(m.get("tool_call_id")) in names:
            name = names[str(m.get("tool_call_id"))] or "the tool"
            out.append({"role": "user", "content": f"Result of {name}: "
                                                   f"{content_text(m.get('content'))}"})
        else:
            out.append(m)
    return out


def parse_tool_call(text: str, index: int = 0) -> dict | None:
    """A ``{"name", "arguments"}`` JSON answer (what constrained decoding of a tool call
    writes) as an OpenAI tool call, or ``None`` when the text is not one (a token budget that
    ran out mid-call). The id is a digest of the text and ``index``: the same answer, the same id.

    Example:
        >>> from langtorch.functional.request import parse_tool_call
        >>> call = parse_tool_call('{"name": "add", "arguments": {"a": 1}}')
        >>> call["type"], call["function"], call["id"].startswith("call_")
        ('function', {'name': 'add', 'arguments': '{"a": 1}'}, True)
        >>> parse_tool_call('{"name": "add", "argu') is None
        True
    """
    import hashlib
    import json

    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, Mapping) or not isinstance(obj.get("name"), str):
        return None
    digest = hashlib.sha256(f"{index}:{text}".encode()).hexdigest()[:24]
    return {"id": f"call_{digest}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))}}


def normalize_messages(messages: Any) -> list[dict[str, str]]:
    """Check chat messages and return them as ``[{"role", "content": str}]``.

    Roles are ``system``, ``developer`` (read as ``system``), ``user`` and ``assistant``; a
    message must name its role. Content is a string or a list of ``{"type": "text"}`` parts
    (joined); an assistant turn may have ``None`` content. Tool calls and images are refused: the
    local models read text only.

    Raises:
        BadRequestError: ``param`` names the field (``"messages"``, ``"messages[1].role"``,
            ``"messages[0].content[2]"`` ...).

    Example:
        >>> from langtorch.functional.request import normalize_messages
        >>> normalize_messages([{"role": "user", "content": "Hi"}])
        [{'role': 'user', 'content': 'Hi'}]
        >>> try:
        ...     normalize_messages([{"content": "Hi"}])
        ... except Exception as e:
        ...     print(e.param)
        messages[0].role
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        got = "nothing" if messages is None else (
            "an empty list" if isinstance(messages, (list, tuple)) else type(messages).__name__)
        raise _bad("messages", f"expected `messages` as a non-empty list of {{'role', 'content'}} "
                               f"objects, got {got}.")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise _bad(where, f"expected an object with 'role' and 'content', got "
                              f"{type(m).__name__}.")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            hint = (" (a 'tool' message must answer an earlier assistant message's tool_calls "
                    "by its tool_call_id)" if role == "tool" else
                    " ('function' messages are not supported: use tools)"
                    if role == "function" else
                    " (every message names its role)" if role is None else "")
            raise _bad(f"{where}.role", f"expected role 'system', 'user', 'assistant' or "
                                        f"'developer', got {role!r}{hint}.")
        if m.get("tool_calls"):
            raise _bad(f"{where}.tool_calls", "tool calls are not supported by the local model.")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content(m.get("content"), role, where)})
    return out


def _int(request: Mapping[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = request.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _bad(key, f"expected `{key}` as an integer, got {value!r}.")
    value = int(value)
    if value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _bad(key, f"expected `{key}` as an integer {rng}, got {value}.")
    return value


def _float(request: Mapping[str, Any], key: str, default: float, low: float, high: float,
           low_open: bool = False) -> float:
    value = request.get(key)
    if value is None:
        return default
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if ok:
        value = float(value)
        ok = math.isfinite(value) and low <= value <= high and not (low_open and value == low)
    if not ok:
        rng = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise _bad(key, f"expected `{key}` as a number in {rng}, got {value!r}.")
    return value


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """The sampling part of a chat request, validated (OpenAI's names and ranges).

    Attributes:
        n: choices to generate (>= 1).
        max_tokens: most tokens per choice, or ``None`` (the caller's default); read from
            ``max_completion_tokens`` or ``max_tokens`` (they must agree when both are given).
        temperature: ``[0, 2]`` (OpenAI's default 1.0; 0 = greedy).
        top_p: ``(0, 1]``.
        seed: an integer, or ``None`` (a fresh random seed per request).
        stop: stop strings (empty ones dropped).
        frequency_penalty, presence_penalty: OpenAI's, ``[-2, 2]`` (0 = off).
        repetition_penalty: Hugging Face's / vLLM's, ``> 0`` (1 = off).
        top_k: vLLM's, ``-1`` or ``0`` (off) or ``>= 1``; min_p: vLLM's, ``[0, 1]`` (0 = off).
        logit_bias: ``{token id: bias in [-100, 100]}`` (keys as ints; ids checked against
            the model's vocabulary where it runs) or ``None``.
        logprobs: whether to return the sampled tokens' logprobs; top_logprobs: how many
            most likely tokens with each (``0..20``, only with ``logprobs``) or ``None``.

    Example:
        >>> from langtorch.functional.request import SamplingParams
        >>> p = SamplingParams.from_request({"max_completion_tokens": 5, "top_p": 0.9, "n": 2})
        >>> p.max_tokens, p.top_p, p.n, p.temperature
        (5, 0.9, 2, 1.0)
    """

    n: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    @classmethod
    def from_request(cls, request: Mapping[str, Any], *, max_n: int | None = None,
                     max_stop: int | None = None) -> SamplingParams:
        """Read and check the sampling fields of a request mapping (other keys are ignored).

        Args:
            request: the chat-completions request.
            max_n: the most choices allowed (``None``: no limit).
            max_stop: the most stop strings allowed (``None``: no limit; OpenAI allows 4).

        Raises:
            BadRequestError: ``param`` names the field (``"n"``, ``"top_p"``, ``"stop"`` ...).

        Example:
            >>> from langtorch.functional.request import SamplingParams
            >>> try:
            ...     SamplingParams.from_request({"top_p": 0})
            ... except Exception as e:
            ...     print(e.param, "|", e)
            top_p | expected `top_p` as a number in (0, 1], got 0.0.
        """
        if not isinstance(request, Mapping):
            raise _bad("request", f"expected a request mapping, got {type(request).__name__}.")
        n = _int(request, "n", 1, max_n)
        a, b = _int(request, "max_tokens", 1), _int(request, "max_completion_tokens", 1)
        if a is not None and b is not None and a != b:
            raise _bad("max_completion_tokens", "`max_tokens` and `max_completion_tokens` "
                                                "disagree; send one of them.")
        temperature = _float(request, "temperature", 1.0, 0.0, 2.0)
        top_p = _float(request, "top_p", 1.0, 0.0, 1.0, low_open=True)
        seed = request.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise _bad("seed", f"expected `seed` as an integer, got {seed!r}.")
        stop = request.get("stop")
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops) \
                or (max_stop is not None and len(stops) > max_stop):
            most = "" if max_stop is None else f"at most {max_stop} "
            raise _bad("stop", f"expected `stop` as a string or a list of {most}strings, got "
                               f"{stop!r}.")
        top_k = _int(request, "top_k", -1)
        bias = request.get("logit_bias")
        if bias is not None:
            if not isinstance(bias, Mapping):
                raise _bad("logit_bias", f"expected `logit_bias` as an object mapping token ids "
                                         f"to numbers in [-100, 100], got {bias!r}.")
            clean = {}
            for k, v in bias.items():
                if isinstance(k, bool) or not (isinstance(k, numbers.Integral) or (
                        isinstance(k, str) and k.strip().isdigit())):
                    raise _bad("logit_bias", f"expected token ids (integers) as `logit_bias` "
                                             f"keys, got {k!r}.")
                if isinstance(v, bool) or not isinstance(v, numbers.Real) or \
                        not math.isfinite(v) or not -100 <= v <= 100:
                    raise _bad("logit_bias", f"expected `logit_bias[{k!r}]` as a number in "
                                             f"[-100, 100], got {v!r}.")
                clean[int(k)] = float(v)
            bias = clean or None
        logprobs = request.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _bad("logprobs", f"expected `logprobs` as a boolean, got {logprobs!r}.")
        top_logprobs = _int(request, "top_logprobs", 0, 20)
        if top_logprobs is not None and not logprobs:
            raise _bad("top_logprobs", "`top_logprobs` requires `logprobs: true`.")
        return cls(n=1 if n is None else n, max_tokens=b if b is not None else a,
                   temperature=temperature, top_p=top_p,
                   seed=None if seed is None else int(seed), stop=tuple(s for s in stops if s),
                   frequency_penalty=_float(request, "frequency_penalty", 0.0, -2.0, 2.0),
                   presence_penalty=_float(request, "presence_penalty", 0.0, -2.0, 2.0),
                   repetition_penalty=_float(request, "repetition_penalty", 1.0, 0.0,
                                             math.inf, low_open=True),
                   top_k=0 if top_k is None else max(0, top_k),
                   min_p=_float(request, "min_p", 0.0, 0.0, 1.0), logit_bias=bias,
                   logprobs=bool(logprobs), top_logprobs=top_logprobs)
