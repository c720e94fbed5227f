"""Handing the C heap's freed memory back to the operating system.

Compiling and running XLA programs allocates and frees gigabytes; glibc keeps freed memory in
its arenas, so a process's resident memory stays near its peak. :func:`release_heap` returns it
(glibc's ``malloc_trim(0)``). The decode engine calls it after each program its warm-up compiles
and when its worker goes idle after work; ``langtorch serve`` also calls it every 30 s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

__all__ = ["release_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    # glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows).
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_heap() -> bool:
    """Give the C heap's free memory back to the operating system (glibc's ``malloc_trim``).

    Measured (2026-12-08, 2-core Zen 4): a 64-slot SmolLM2 engine held 6.8 GiB resident after
    its warm-up with 0.9 GiB of live arrays, and 2.6 GiB after one call (300 ms; a second call
    right after took 14 ms). It holds each of glibc's arenas' locks in turn while it works:
    other threads' allocations wait meanwhile. Returns whether it ran (``False`` where the C
    library has no ``malloc_trim``).

    Example:
        >>> from langtorch.core import release_heap
        >>> release_heap() in (True, False)
        True
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
