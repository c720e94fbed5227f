"""Session-wide test settings.

**Compiled programs are dropped when the process nears the kernel's memory-map limit.** Every
program XLA:CPU compiles keeps its machine code in a few anonymous memory mappings (about five for
a small function, hundreds for a decoder step), and JAX keeps every compiled program of every
jitted function alive for the life of the process. One pytest process compiles thousands of them;
on 2026-12-01 a full run passed 65,530 mappings (Linux's default ``vm.max_map_count``) after
~800 tests, the next ``mmap`` inside LLVM failed, and XLA segfaulted mid-compilation (twice in the
engine's worker thread, once inside the persistent-cache write). Each file passed alone. After
each test, if the process holds more than ``_MAP_BUDGET`` mappings, ``jax.clear_caches()`` frees
the compiled programs (the next call recompiles what it needs); measured on that run: mappings grew
~100 per second of testing.

The user's persistent compilation cache is off for the test run (``LANGTORCH_COMPILATION_CACHE=0``,
inherited by the subprocesses tests start): a clean CI clone never has a warm cache to read.
Instead the run gets a fresh, empty JAX cache of its own (``JAX_COMPILATION_CACHE_DIR``, a
temporary directory made by the first pytest process, shared by the xdist workers and the
servers tests start, removed at exit), so a program compiled by one test is read back by the next
that needs it: measured 2026-12-06 on 2 cores, four SmolLM2 serving files 253 -> 216 s.
``LANGTORCH_TEST_XLA_CACHE=0`` turns it off; a ``JAX_COMPILATION_CACHE_DIR`` you set yourself
is used as it is. A run killed before exit leaves its ``/tmp/langtorch-test-xla-*`` behind.
"""

import gc
import os

import pytest

os.environ.setdefault("LANGTORCH_COMPILATION_CACHE", "0")

if os.environ.get("LANGTORCH_TEST_XLA_CACHE", "1") != "0" and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _xla_cache = tempfile.mkdtemp(prefix="langtorch-test-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _xla_cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    atexit.register(shutil.rmtree, _xla_cache, ignore_errors=True)

_MAP_BUDGET = 30_000


def _memory_maps() -> int:
    """How many memory mappings this process holds (0 where ``/proc`` does not exist)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


@pytest.fixture(autouse=True)
def _bounded_compiled_programs():
    yield
    if _memory_maps() > _MAP_BUDGET:
        import jax

        jax.clear_caches()
        gc.collect()
