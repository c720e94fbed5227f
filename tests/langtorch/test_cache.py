"""The SQLite response cache: hits, partial samples, failures, redaction, processes, resume."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from langtorch.backends import Choice, OpenAIBackend, Usage
from langtorch.runtime import ResponseCache, cache_key, complete, default_cache_path

KEY = "sk-cache-test-0123456789abcdef"


def reqs(*texts, **kw):
    return [{"messages": [{"role": "user", "content": t}], **kw} for t in texts]


def make(srv, path, **kw):
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, cache=path, backoff_base=0.001, **kw)


def test_key_is_canonical_and_covers_every_parameter():
    a = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0.5}
    b = {"temperature": 0.5, "messages": [{"content": "x", "role": "user"}], "model": "m"}
    assert cache_key(a, 0) == cache_key(b, 0) == cache_key({**a, "stream": True, "n": 4}, 0)
    assert cache_key(a, 0) != cache_key({**a, "temperature": 0.6}, 0) != cache_key(a, 1)
    assert cache_key(a, 0) != cache_key({**a, "seed": 1}, 0)


def test_hit_reports_zero_usage_and_sends_nothing(srv, tmp_path):
    backend = make(srv, tmp_path / "c.sqlite")
    first = complete(backend, reqs("a", "b"), progress=False)
    assert first.usage.total_tokens > 0 and srv.chat_requests == 2
    again = complete(backend, reqs("a", "b"), progress=False)
    assert srv.chat_requests == 2 and again.cache_hits == 2 and again.usage == Usage()
    assert [c.text for c in again.completions] == ["Echo: a", "Echo: b"]
    assert all(c.cached and c.usage == Usage() for c in again.completions)
    off = complete(backend, reqs("a"), use_cache=False, progress=False)
    assert srv.chat_requests == 3 and not off.completions[0].cached


def test_more_samples_later_asks_only_for_the_missing(srv, tmp_path):
    backend = make(srv, tmp_path / "c.sqlite")
    complete(backend, reqs("s", n=2), progress=False)
    result = complete(backend, reqs("s", n=4), progress=False)
    assert srv.bodies[-1]["n"] == 2 and len(result.completions[0].choices) == 4
    assert [c.text for c in result.completions[0].choices][:2] == ["Echo: s", "Echo: s [1]"]


def test_failures_are_never_cached(srv, tmp_path):
    backend = make(srv, tmp_path / "c.sqlite", max_retries=0)
    srv.set_faults(["server_error", "malformed_json"])
    result = complete(backend, reqs("x", "y"), progress=False)
    assert len(result.errors) == 2 and len(ResponseCache(tmp_path / "c.sqlite")) == 0
    assert complete(backend, reqs("x", "y"), progress=False).ok and srv.chat_requests == 4


def test_rows_and_file_hold_no_api_key(srv, tmp_path):
    path = tmp_path / "c.sqlite"
    complete(make(srv, path), reqs("secret-free"), progress=False)
    rows = ResponseCache(path).rows()
    assert rows and all(KEY not in str(row) for row in rows)
    for f in tmp_path.iterdir():
        assert KEY.encode() not in f.read_bytes()


def test_wal_mode_and_default_path(tmp_path, monkeypatch):
    cache = ResponseCache(tmp_path / "x" / "c.sqlite")
    mode = cache._connection().execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    monkeypatch.setenv("LANGTORCH_CACHE_DIR", str(tmp_path / "d"))
    assert default_cache_path() == tmp_path / "d" / "llm_cache.sqlite"


_WORKER = textwrap.dedent("""
    import sys
    from langtorch.backends import OpenAIBackend
    from langtorch.runtime import complete
    url, path, start, count, conc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    b = OpenAIBackend("m", base_url=url, api_key="sk-worker-000000", cache=path, max_concurrency=conc)
    reqs = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(start, start + count)]
    r = complete(b, reqs, progress=False)
    assert r.ok, r.errors
    print("done", flush=True)
""")


def _spawn(srv, path, start, count, conc=4):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", _WORKER, srv.url, str(path), str(start), str(count),
                             str(conc)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def test_concurrent_processes_share_one_cache_file(srv, tmp_path):
    path = tmp_path / "shared.sqlite"
    srv.latency = 0.002
    procs = [_spawn(srv, path, start, 30) for start in (0, 15)]  # overlapping ranges
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()[-2000:]
    cache = ResponseCache(path)
    assert len(cache) == 45
    before = srv.chat_requests
    complete(make(srv, path), reqs(*[f"q{i}" for i in range(45)]), progress=False)
    assert srv.chat_requests == before  # all 45 were cached by the two processes


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_process_keeps_completed_entries_and_rerun_sends_only_the_rest(srv, tmp_path, sig):
    path = tmp_path / "resume.sqlite"
    srv.latency = 0.05
    proc = _spawn(srv, path, 0, 80, conc=2)  # ~2 s of work: the signal lands mid-batch
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists() and len(ResponseCache(path)) >= 6:
            break
        time.sleep(0.02)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode != 0  # it was interrupted before finishing
    kept = len(ResponseCache(path))
    assert 6 <= kept < 80
    srv.reset()
    srv.latency = 0.0
    result = complete(make(srv, path, max_concurrency=8), reqs(*[f"q{i}" for i in range(80)]),
                      progress=False)
    assert result.ok and srv.chat_requests == 80 - kept and result.cache_hits == kept
    assert [c.text for c in result.completions] == [f"Echo: q{i}" for i in range(80)]


def test_embeddings_are_cached_per_text(srv, tmp_path):
    from langtorch.runtime import embed

    backend = OpenAIBackend("e", base_url=srv.url, api_key=KEY, cache=tmp_path / "c.sqlite",
                            embed_batch_size=2)
    first, usage = embed(backend, ["a", "b", "c"], dimensions=4)
    assert srv.embedding_requests == 2 and usage.prompt_tokens == 3
    again, usage = embed(backend, ["c", "d", "a"], dimensions=4)
    assert srv.embedding_requests == 3 and srv.bodies[-1]["input"] == ["d"]  # only the new text
    assert usage.prompt_tokens == 1 and (again[0] == first[2]).all() and (again[2] == first[0]).all()
    embed(backend, ["a"], dimensions=8)  # other parameters: another key
    assert srv.embedding_requests == 4


def test_cache_folder_and_file_are_private(tmp_path):
    """LOW: prompts and answers are not world-readable (0700 folder, 0600 file)."""
    cache = ResponseCache(tmp_path / "new" / "c.sqlite")
    cache.put({"messages": []}, [], model="m")
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    assert cache.path.stat().st_mode & 0o777 == 0o600


_EXIT_RIGHT_AFTER = """
import sys
from langtorch.backends import Choice
from langtorch.runtime import ResponseCache
cache = ResponseCache(sys.argv[1])
for i in range(200):
    cache.put_soon({"messages": [{"role": "user", "content": str(i)}]}, {0: Choice(str(i))})
"""


def test_answers_queued_at_exit_are_written(tmp_path):
    """M5: a script that ends right after queueing answers keeps them (atexit flush)."""
    path = tmp_path / "c.sqlite"
    subprocess.run([sys.executable, "-c", _EXIT_RIGHT_AFTER, str(path)], check=True, timeout=60)
    assert len(ResponseCache(path)) == 200


def test_reads_do_not_wait_for_a_writer(tmp_path):
    """LOW: a lookup (on the event loop) does not wait behind a write holding the writer lock."""
    import threading

    cache = ResponseCache(tmp_path / "c.sqlite")
    req = {"messages": [{"role": "user", "content": "q"}]}
    cache.put(req, [Choice("a")])
    got = []
    with cache._lock:  # a write in progress (e.g. waiting for another process's lock)
        reader = threading.Thread(target=lambda: got.append(cache.get(req)[0].text))
        reader.start()
        reader.join(5)
    assert got == ["a"]
