"""Context variables shared by the provenance graph and the tracer (private).

* ``call_path``: the module call path of the running code, e.g. ``("Pipeline", "qa", "llm")`` —
  distinct for each use of a shared module.
* ``current_span`` / ``active_trace``: the innermost open span and the recording trace.
* ``in_op``: set while an op's implementation runs, so ops it calls internally are not recorded
  a second time.

All are :class:`contextvars.ContextVar`s: correct per thread and per asyncio task; langtorch's
``run_sync`` runs its coroutine in a copy of the caller's context.
"""

from __future__ import annotations

import contextvars
from typing import Any

call_path: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("langtorch_call_path", default=())
current_module: contextvars.ContextVar[Any] = contextvars.ContextVar("langtorch_current_module", default=None)
current_span: contextvars.ContextVar[Any] = contextvars.ContextVar("langtorch_current_span", default=None)
active_trace: contextvars.ContextVar[Any] = contextvars.ContextVar("langtorch_active_trace", default=None)
in_op: contextvars.ContextVar[bool] = contextvars.ContextVar("langtorch_in_op", default=False)


def path_string() -> str:
    """The current call path as a dotted string (``""`` outside any module)."""
    return ".".join(call_path.get())
