"""The lowest layer of ``langtorch``: what every other package shares and nothing here imports.

* :mod:`langtorch.core.capabilities` — :class:`Capabilities`, what a backend declares it can do
  (structured output, tools, logprobs, ...), and :func:`require_capabilities`, the check that
  whatever needs one runs before its first request.
* :mod:`langtorch.core.context` — the context variables of a run (module call path, the open
  span and trace, the op guard), shared by the tracer and the provenance graph.
* :mod:`langtorch.core.events` — request events: the runtime reports each request's start and
  end to observers (the tracer, the request history, progress bars); :func:`add_request_observer`.
* :mod:`langtorch.core.heap` — :func:`release_heap`: hand the C heap's freed memory back to
  the operating system (the decode engine and ``langtorch serve`` call it).
* :mod:`langtorch.core.paths` — :func:`user_path`: every path a user gives (``cache=``,
  ``Index.save``, ``Trace.save``) with ``~`` and environment variables expanded.
* :mod:`langtorch.core.redact` — :func:`redact` / :func:`mask_key`: API keys never leave in a
  repr, log, exception, trace or cache; :class:`HasSecrets` / :func:`secrets_of`: how an
  object (a backend) declares the secrets it holds.
* :mod:`langtorch.core.sync` — :func:`run_sync`: the private event loop that sync calls run on
  (Jupyter-safe, no ``nest_asyncio``); :func:`nested_sync_calls` for sync tools that call LLMs.
* :mod:`langtorch.core.types` — the value types that cross layers: :class:`Usage`,
  :class:`Choice`, :class:`Completion`, :class:`Embeddings`.

``langtorch.core`` imports nothing from ``langtorch`` but ``langtorch.functional`` (errors);
see ``docs/architecture.md`` for the order of the packages above it.

Example:
    >>> from langtorch.core import redact
    >>> redact("key sk-abcdefghijkl in a message")
    'key *** in a message'
"""

__version__ = "0.1.0"

from langtorch.core import capabilities, context, events, heap, paths  # noqa: E402
from langtorch.core.capabilities import Capabilities, require_capabilities
from langtorch.core.events import (
    RequestEvent,
    RequestObserver,
    add_request_observer,
    remove_request_observer,
)
from langtorch.core.heap import release_heap
from langtorch.core.paths import user_path
from langtorch.core.redact import HasSecrets, mask_key, redact, secrets_of
from langtorch.core.sync import is_private_loop, nested_sync_calls, run_sync
from langtorch.core.types import Choice, Completion, Embeddings, Usage

__all__ = [
    "Capabilities",
    "Choice",
    "Completion",
    "Embeddings",
    "HasSecrets",
    "RequestEvent",
    "RequestObserver",
    "Usage",
    "add_request_observer",
    "capabilities",
    "context",
    "events",
    "heap",
    "is_private_loop",
    "mask_key",
    "nested_sync_calls",
    "paths",
    "redact",
    "release_heap",
    "remove_request_observer",
    "require_capabilities",
    "run_sync",
    "secrets_of",
    "user_path",
]
