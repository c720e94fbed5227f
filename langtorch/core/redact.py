"""Keep API keys out of every string langtorch produces (messages, bodies, reprs, logs).

Besides strings shaped like keys, each object that holds credentials (a backend with an API key)
declares them with a ``redaction_secrets()`` method (:class:`HasSecrets`); traces, request
histories and tool errors redact what :func:`secrets_of` finds.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, runtime_checkable

__all__ = ["HasSecrets", "mask_key", "redact", "secrets_of"]

# Strings shaped like common provider keys, redacted even when they are not the configured key
# (a server may echo a different key it was sent, e.g. one from the environment).
_KEY_PATTERN = re.compile(r"\b(sk|rk|pk)-[A-Za-z0-9_\-]{6,}")
# The token ends at whitespace or a quote, so a redacted repr keeps its closing quote and brace.
_BEARER_PATTERN = re.compile(r"(Bearer\s+)[^\s'\"]+", re.IGNORECASE)


def mask_key(key: str | None) -> str | None:
    """A display form of a key that shows only that one is set.

    Example:
        >>> mask_key("sk-abcdef123456")
        'sk-***'
        >>> mask_key(None) is None
        True
    """
    if key is None:
        return None
    return key[:3] + "***" if len(key) > 8 else "***"


def redact(text: str | None, *secrets: str | None) -> str | None:
    """Replace each secret, key-shaped strings and bearer tokens in ``text`` by ``***``.

    Example:
        >>> redact("bad key sk-abcdef123456 sent", "sk-abcdef123456")
        'bad key *** sent'
        >>> redact("Authorization: Bearer xyz")
        'Authorization: Bearer ***'
        >>> redact(repr({"Authorization": "Bearer xyz"}))
        "{'Authorization': 'Bearer ***'}"
    """
    if not text:
        return text
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    text = _KEY_PATTERN.sub("***", text)
    return _BEARER_PATTERN.sub(r"\1***", text)


@runtime_checkable
class HasSecrets(Protocol):
    """An object that holds secrets (API keys) to keep out of every string langtorch stores or
    prints: :meth:`langtorch.backends.Backend.redaction_secrets` is one; any object may be.

    Example:
        >>> from langtorch.core.redact import HasSecrets
        >>> class Vault:
        ...     def redaction_secrets(self):
        ...         return ("hunter22",)
        >>> isinstance(Vault(), HasSecrets)
        True
    """

    def redaction_secrets(self) -> tuple[str, ...]:
        """The secret strings to redact wherever they appear (never print them)."""
        ...


def secrets_of(source: Any) -> tuple[str, ...]:
    """The secrets ``source`` declares: a string is itself, an object with
    ``redaction_secrets()`` (:class:`HasSecrets`) gives those, anything else none. Empty
    strings and ``None`` are dropped.

    Example:
        >>> from langtorch.core.redact import secrets_of
        >>> class Vault:
        ...     def redaction_secrets(self):
        ...         return ("hunter22", None)
        >>> secrets_of(Vault()), secrets_of("pw-1234"), secrets_of(None)
        (('hunter22',), ('pw-1234',), ())
    """
    if isinstance(source, str):
        found: Any = (source,)
    elif isinstance(source, HasSecrets):
        found = source.redaction_secrets() or ()
    else:
        return ()
    return tuple(x for x in found if isinstance(x, str) and x)
