"""``Script``: a deterministic, rule-based responder for :class:`OpenAIServer` (scripted mode).

For testing optimization loops (and any pipeline) without a model: each request is matched
against the rules in order; the first rule that matches answers. A rule can be limited to a
number of uses (``times``), so a script can answer the same prompt differently over time (a
malformed answer first, a good one next).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["Script", "ScriptError"]


class ScriptError(LookupError):
    """No rule of a strict :class:`Script` matched a request (the server answers 400 with this
    message, so the client sees it).

    Example:
        >>> issubclass(ScriptError, LookupError)
        True
    """


def _last_user(body: Mapping[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else str(c)
    return ""


class Script:
    """A responder built from rules: ``OpenAIServer(Script([(match, answer), ...]))``.

    Args:
        rules: ``(match, answer)`` or ``(match, answer, times)`` tuples. ``match`` is a ``str``
            (a substring of the last user message), a compiled ``re.Pattern`` (searched in it),
            or a callable ``body -> bool``. ``answer`` is anything the server accepts (a str, a
            dict sent as JSON, a :class:`~langtorch.testing.Reply`, a list of those for ``n > 1``)
            or a callable ``body -> answer``. ``times`` limits how often the rule answers.
        default: the answer when no rule matches (a value or a callable ``body -> answer``);
            ``None`` with ``strict=False`` echoes like the default server.
        strict: when True, a request no rule matches is answered with HTTP 400 naming it (not
            retried by clients).

    Attributes:
        log: ``(rule index or None, last user message)`` per request answered, in order.

    Example:
        >>> import openai
        >>> from langtorch.testing import OpenAIServer, Script
        >>> script = Script([("capital", "Paris"), ("2+2", "5", 1), ("2+2", "4")])
        >>> with OpenAIServer(script) as server:
        ...     c = openai.OpenAI(base_url=server.url, api_key="sk-test")
        ...     ask = lambda q: c.chat.completions.create(model="m", messages=[{"role": "user", "content": q}]).choices[0].message.content
        ...     [ask("capital of France?"), ask("2+2?"), ask("2+2?")]
        ['Paris', '5', '4']
        >>> [i for i, _ in script.log]
        [0, 1, 2]
    """

    def __init__(self, rules: Any = (), *, default: Any = None, strict: bool = False):
        self._rules: list[list[Any]] = []
        for rule in rules:
            if not isinstance(rule, tuple) or len(rule) not in (2, 3):
                raise TypeError(f"a rule is (match, answer) or (match, answer, times), got {rule!r}")
            self.add(*rule)
        self.default = default
        self.strict = bool(strict)
        self.log: list[tuple[int | None, str]] = []
        self._lock = threading.Lock()

    def add(self, match: Any, answer: Any, times: int | None = None) -> Script:
        """Append a rule (see the class docstring); returns the script for chaining.

        Example:
            >>> Script().add("hi", "hello").add(lambda body: True, "fallback")._rules[0][1]
            'hello'
        """
        if not (isinstance(match, (str, re.Pattern)) or callable(match)):
            raise TypeError(f"a rule's match must be a str, a re.Pattern or a callable, got {type(match).__name__}")
        if times is not None and (not isinstance(times, int) or times < 1):
            raise ValueError(f"times must be a positive int or None, got {times!r}")
        self._rules.append([match, answer, times])
        return self

    def _matches(self, match: Any, body: Mapping[str, Any], text: str) -> bool:
        if isinstance(match, str):
            return match in text
        if isinstance(match, re.Pattern):
            return match.search(text) is not None
        return bool(match(body))

    def __call__(self, body: Mapping[str, Any]) -> Any:
        text = _last_user(body)
        with self._lock:
            for i, rule in enumerate(self._rules):
                match, answer, times = rule
                if times == 0 or not self._matches(match, body, text):
                    continue
                if times is not None:
                    rule[2] = times - 1
                self.log.append((i, text))
                break
            else:
                self.log.append((None, text))
                if self.default is None and self.strict:
                    raise ScriptError(f"no scripted rule matched the request {text[:200]!r}")
                answer = self.default
        if answer is None:
            from langtorch.testing._server import default_responder

            return default_responder(dict(body))
        return answer(body) if callable(answer) else answer
