"""Session-wide test settings.

JAX's persistent compilation cache is off for the test run (``LANGTORCH_COMPILATION_CACHE=0``,
inherited by the subprocesses tests start): a clean CI clone never has a warm cache to read, and
one full run on 2026-12-01 ended in a segmentation fault inside JAX's cache *write*
(``compilation_cache.put_executable_and_time``, from the engine's worker thread) after ~830 tests
in one process; that file alone and with a fresh cache passed. Set the variable yourself to run
the tests with the cache.
"""

import os

os.environ.setdefault("LANGTORCH_COMPILATION_CACHE", "0")
