"""Keep API keys out of every string langtorch produces (messages, bodies, reprs, logs)."""

from __future__ import annotations

import re

__all__ = ["mask_key", "redact"]

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
