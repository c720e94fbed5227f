"""langtorch.runtime — the LLM runtime: executor, limits, retries, cache, usage and cost.

* :func:`acomplete` / :func:`complete`: many chat requests to one backend, concurrently, with
  de-duplication, cache, concurrency cap, token buckets, retries and budget; a
  :class:`CallResult` in input order. :func:`raise_for_errors` turns failures into typed errors.
* :func:`astream`: one request's text as it arrives. :func:`aembed` / :func:`embed`: embeddings.
* :class:`ResponseCache`: the SQLite (WAL) response cache; :func:`cache_key`,
  :func:`default_cache_path`.
* :class:`TokenBucket`: the client-side rate limiter; :class:`Slots`: the concurrency limit. :func:`run_sync`: run a coroutine from sync
  code, inside a running event loop too.

Example:
    >>> from langtorch.runtime import TokenBucket
    >>> TokenBucket(120).rate
    2.0
"""

from langtorch.core.sync import run_sync
from langtorch.runtime._budget import Budget
from langtorch.runtime._cache import ResponseCache, cache_key, canonical_json, default_cache_path
from langtorch.runtime._executor import (
    CallResult,
    acomplete,
    aembed,
    astream,
    complete,
    embed,
    raise_for_errors,
)
from langtorch.runtime._limits import Slots, TokenBucket
from langtorch.runtime._usage import cost_of, price_for

__all__ = [
    "Budget",
    "CallResult",
    "ResponseCache",
    "Slots",
    "TokenBucket",
    "acomplete",
    "aembed",
    "astream",
    "cache_key",
    "canonical_json",
    "complete",
    "cost_of",
    "default_cache_path",
    "embed",
    "price_for",
    "raise_for_errors",
    "run_sync",
]
