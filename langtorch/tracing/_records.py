"""Reading a trace's recorded bodies, the one way every view and the OpenTelemetry export do.

A trace records request and response bodies as they were sent (texts interned, or replaced by
``{"chars": n}`` under ``redact_content``). The readers here are lenient on purpose: the bodies
were already checked by the backend that sent them (:func:`langtorch.functional.request.
normalize_messages` for local models, the provider's API for the others), a request the backend
refused is still recorded (as a failed span) and must stay viewable, and a view never raises on
what a trace holds. So they never reject a message and never invent a field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langtorch.functional.request import content_text

__all__ = ["recorded_text", "recorded_role", "UNKNOWN_ROLE"]

UNKNOWN_ROLE = "unknown"
"""The role shown for a recorded message that named none (no backend answers such a message:
it can only be in a failed request)."""


def _is_text_part(part: Any) -> bool:
    return isinstance(part, Mapping) and isinstance(part.get("text"), str)


def recorded_text(content: Any) -> str | None:
    """The text of a recorded message content, read as
    :func:`~langtorch.functional.request.content_text` reads it (a string; the text parts of a
    list joined, other parts skipped); ``None`` when there is no text to show: no content, a
    content removed by ``redact_content`` (``{"chars": n}``), or parts none of which is text."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)) and any(_is_text_part(p) for p in content):
        return content_text(content)
    return None


def recorded_role(message: Mapping[str, Any]) -> str:
    """A recorded message's role as it was sent; :data:`UNKNOWN_ROLE` when it named none
    (never a guess such as ``"user"``: the trace shows what was sent)."""
    role = message.get("role")
    return role if isinstance(role, str) and role else UNKNOWN_ROLE
