"""A trace's plain data: the one strict-JSON form of recorded values (:func:`plain`), and the
one reading of recorded bodies that every view and the OpenTelemetry export use.

A trace records request and response bodies as they were sent (texts interned, or replaced by
``{"chars": n}`` under ``redact_content``). The readers here are lenient on purpose: the bodies
were already checked by the backend that sent them (:func:`langtorch.functional.request.
normalize_messages` for local models, the provider's API for the others), a request the backend
refused is still recorded (as a failed span) and must stay viewable, and a view never raises on
what a trace holds. So they never reject a message and never invent a field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from langtorch.functional.request import content_text

__all__ = ["plain", "recorded_text", "recorded_role", "UNKNOWN_ROLE"]

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


def plain(value: Any) -> Any:
    """The strict-JSON form of a recorded value: numpy scalars and arrays as numbers and
    lists, pydantic objects as dicts, other objects as their ``repr``, containers walked, and
    NaN and infinities as ``None`` (strict JSON has none; ``JSON.parse`` rejects them). The one
    rule for the trace's records, its saved file and its HTML page."""
    if isinstance(value, float) or isinstance(value, np.floating):
        value = float(value)
        return value if math.isfinite(value) else None  # strict JSON has no NaN / Infinity
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "model_dump"):
        return plain(value.model_dump())
    return repr(value)
