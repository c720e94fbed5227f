"""``langtorch.inspect_history``: the latest requests with what was sent and received.

:class:`RequestHistory` observes the runtime's requests (``langtorch.core.events``) and keeps a
record of each in its backend's ``history`` and in a process-wide list of the latest ones.
"""

from __future__ import annotations

import collections
import datetime
import sys
import time
import weakref
from typing import Any

from langtorch.core.redact import redact, secrets_of

__all__ = ["RequestHistory", "inspect_history"]

# The latest requests of every backend, for inspect_history() without a backend.
_recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=200)




class RequestHistory:
    """The request observer behind ``backend.history`` and :func:`inspect_history`: one record
    per request that ended (sent or answered by the cache), in the backend's ``history`` (bounded
    by ``options.history``; 0 keeps none) and in the process-wide list. Registered by
    ``langtorch.tracing``.

    Example:
        >>> import collections
        >>> from langtorch.core import Choice, Completion
        >>> from langtorch.core.events import RequestEvent
        >>> class B:
        ...     history = collections.deque(maxlen=5)
        >>> ev = RequestEvent(B(), {"model": "m", "messages": []}, result=Completion((Choice("hi"),)),
        ...                   latency=0.5)
        >>> RequestHistory().request_ended(ev, None)
        >>> B.history[0]["response"], B.history[0]["latency"]
        (['hi'], 0.5)
    """

    def request_started(self, event: Any) -> None:
        return None

    def request_ended(self, event: Any, state: None) -> None:
        backend, result, error = event.backend, event.result, event.error
        history = getattr(backend, "history", None)
        if history is None or history.maxlen == 0:
            return
        record = {
            "time": time.time(), "model": str(event.body.get("model")), "request": event.body,
            "response": None if result is None else [c.text for c in result.choices],
            "finish_reasons": None if result is None else [c.finish_reason for c in result.choices],
            "usage": None if result is None else {"prompt_tokens": result.usage.prompt_tokens,
                                                  "completion_tokens": result.usage.completion_tokens},
            "cached": bool(result is not None and result.cached), "latency": event.latency,
            "error": None if error is None else f"{type(error).__name__}: {redact(str(error), *secrets_of(backend))}",
            # For redacting the printout (inspect_history); the key itself is never stored.
            "_backend": weakref.ref(backend),
        }
        history.append(record)
        _recent.append(record)


def _elide(text: str, limit: int) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + f"… [{len(text)} chars]"


def inspect_history(n: int = 1, *, backend: Any = None, max_chars: int = 2000, file: Any = None) -> list[dict[str, Any]]:
    """Print the last ``n`` requests (messages sent, answers received, usage, latency), like
    DSPy's ``inspect_history``, and return their records.

    Args:
        n: how many of the latest requests.
        backend: one backend's ``history``; ``None``: the latest requests of all backends in
            this process.
        max_chars: texts longer than this are elided in the printout (records keep them whole).
        file: where to print (default ``sys.stdout``).

    Returns:
        The records, oldest first: dicts with ``time``, ``model``, ``request`` (the body sent),
        ``response`` (the choices' texts), ``finish_reasons``, ``usage``, ``cached``,
        ``latency`` (seconds) and ``error``.

    Example:
        >>> import io, langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> with OpenAIServer() as server:
        ...     b = OpenAIBackend("m", base_url=server.url, api_key="sk-test1234")
        ...     _ = lt.nn.LLM(b)(lt.TextTensor("hi"))
        >>> records = lt.inspect_history(1, backend=b, file=io.StringIO())
        >>> records[0]["request"]["messages"], records[0]["response"]
        ([{'role': 'user', 'content': 'hi'}], ['Echo: hi'])
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"inspect_history(n) needs a positive int, got {n!r}")
    if backend is None:
        source = list(_recent)
    else:
        history = getattr(backend, "history", None)
        if history is None:
            raise TypeError(f"inspect_history(backend=...) expected a langtorch Backend, got {type(backend).__name__}")
        source = list(history)
    records = source[-n:]
    out = sys.stdout if file is None else file

    def clean(text: str, r: dict[str, Any]) -> str:
        ref = r.get("_backend")
        return redact(text, *secrets_of(ref() if ref is not None else None)) or ""

    for r in records:
        when = datetime.datetime.fromtimestamp(r["time"]).strftime("%Y-%m-%d %H:%M:%S")
        flags = " (cached)" if r["cached"] else ""
        print(f"[{when}] {r['model']}{flags}  {r['latency'] * 1000:.0f} ms", file=out)
        body = r["request"]
        for m in body.get("messages", []):
            content = m.get("content")
            text = content if isinstance(content, str) else repr(content)
            print(f"  {m.get('role', '?')}: {_elide(clean(text, r), max_chars)}", file=out)
        params = {k: v for k, v in body.items() if k not in ("messages", "model")}
        if params:
            print(f"  params: {_elide(clean(repr(params), r), max_chars)}", file=out)
        if r["error"]:
            print(f"  error: {_elide(r['error'], max_chars)}", file=out)
        else:
            for i, text in enumerate(r["response"] or []):
                label = "assistant" if len(r["response"]) == 1 else f"assistant[{i}]"
                print(f"  {label}: {_elide(clean(text, r), max_chars)}", file=out)
            if r["usage"]:
                print(f"  tokens: {r['usage']['prompt_tokens']} prompt + {r['usage']['completion_tokens']} completion", file=out)
        print(file=out)
    return records
