"""The response cache: SQLite in WAL mode, one row per sample, safe across threads and processes."""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from langtorch.backends.base import Choice
from langtorch.core import user_path

__all__ = ["ResponseCache", "cache_key", "canonical_json", "default_cache_path", "resolve_cache"]

# Keys that change how an answer is delivered, not what it is: a streamed and a plain call share
# cache entries.
_DELIVERY_KEYS = ("stream", "stream_options", "n")

# A cache's writer thread ends after this long without work.
_WRITER_IDLE_SECONDS = 2.0


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: equal requests give equal strings.

    Example:
        >>> canonical_json({"b": 1, "a": [1.0, "x"]})
        '{"a":[1.0,"x"],"b":1}'
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=_json_default)


def _json_default(value: Any) -> Any:
    # numpy scalars key like the Python numbers they are sent as (np.int64(5) and 5 share a key).
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def cache_key(request: Mapping[str, Any], sample: int, namespace: str = "") -> str:
    """sha256 of the canonical JSON of the full request (all sampling parameters), a sample index
    and a namespace (the backend type and server, see ``Backend.cache_namespace``).

    ``n``, ``stream`` and ``stream_options`` are left out: sample ``i`` of a request is the same
    whether it came alone, with ``n=5``, or streamed. So asking for more samples later reuses the
    ones already cached. The namespace keeps two servers that serve the same model name apart.

    Example:
        >>> r = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
        >>> cache_key(r, 0) == cache_key({**r, "n": 3}, 0) != cache_key(r, 1)
        True
    """
    body = {k: v for k, v in request.items() if k not in _DELIVERY_KEYS}
    key: dict[str, Any] = {"request": body, "sample": int(sample)}
    if namespace:
        key["backend"] = namespace
    payload = canonical_json(key)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def default_cache_path() -> Path:
    """``$LANGTORCH_CACHE_DIR/llm_cache.sqlite``, else ``~/.cache/langtorch/llm_cache.sqlite``.

    Example:
        >>> default_cache_path().name
        'llm_cache.sqlite'
    """
    if os.environ.get("LANGTORCH_CACHE_DIR"):
        root = user_path(os.environ["LANGTORCH_CACHE_DIR"], what="$LANGTORCH_CACHE_DIR")
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = user_path(xdg or "~/.cache", what="$XDG_CACHE_HOME") / "langtorch"
    return root / "llm_cache.sqlite"


def _set_wal(conn: sqlite3.Connection, timeout: float) -> None:
    # Switching to WAL needs a moment of exclusive access, and SQLite answers "database is
    # locked" at once (no busy handler) while another process is opening the same file: retry
    # for up to the connection's timeout.
    deadline = time.monotonic() + max(float(timeout), 0.1)
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


class ResponseCache:
    """Completed answers keyed by :func:`cache_key`, in a SQLite file in WAL mode.

    Every completed request is committed at once, so an interrupted batch (Ctrl-C, a killed
    process) keeps what it finished and a rerun sends only the rest. WAL lets readers and one
    writer work at the same time; other processes wait on the lock (``busy_timeout``). Only
    successful answers are stored, never errors, and never credentials: a row holds the request
    body (no headers) and one choice.

    Args:
        path: the database file (parent folders are created); ``~`` and environment variables
            are expanded (``"~/.cache/langtorch/responses.sqlite"``, ``"$XDG_CACHE_HOME/x.sqlite"``).
        timeout: seconds to wait for another process's write lock.

    Example:
        >>> import tempfile, os
        >>> from langtorch.backends import Choice
        >>> cache = ResponseCache(os.path.join(tempfile.mkdtemp(), "c.sqlite"))
        >>> req = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        >>> cache.put(req, [Choice("hello")], model="m")
        >>> cache.get(req, 1)[0].text, cache.get(req, 2)
        ('hello', None)
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 60.0):
        self.path = user_path(path, what="ResponseCache: path")
        # Private: prompts and answers may be confidential (0700 folder, 0600 file; SQLite gives
        # its -wal and -shm files the database file's mode).
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        _live_caches.add(self)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._queue: queue.Queue | None = None
        self._queue_lock = threading.Lock()  # not self._lock: queueing must not wait for a write
        self._writer_pid = -1
        self._writer_error: BaseException | None = None
        # Readers get a connection per thread, without self._lock: in WAL mode a read never
        # waits for a writer, so an event loop looking up the cache is not stuck behind a write
        # that waits (up to ``timeout``) for another process's lock.
        self._readers = threading.local()
        with self._lock:
            conn = self._connection()
            conn.execute(
                "CREATE TABLE IF NOT EXISTS responses ("
                " key TEXT PRIMARY KEY, model TEXT, request TEXT, sample INTEGER,"
                " choice TEXT NOT NULL, created REAL)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS embeddings ("
                " key TEXT PRIMARY KEY, model TEXT, vector BLOB NOT NULL, created REAL)"
            )
            conn.commit()

    def _connection(self) -> sqlite3.Connection:
        # A connection must not cross a fork: each process opens its own.
        if self._conn is None or self._pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=self.timeout, check_same_thread=False,
                                   isolation_level=None)
            _set_wal(conn, self.timeout)
            # NORMAL in WAL mode: a committed transaction survives a killed process (only an OS
            # crash may lose the last ones), at a fraction of FULL's fsync cost.
            conn.execute("PRAGMA synchronous=NORMAL")
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._readers, "conn", None)
        if conn is None or self._readers.pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            self._readers.conn, self._readers.pid = conn, os.getpid()
        return conn

    def get(self, request: Mapping[str, Any], n: int = 1, *, namespace: str = "") -> list[Choice] | None:
        """Samples ``0..n-1`` of ``request`` when all are cached, else ``None``."""
        found = self.get_samples(request, n, namespace=namespace)
        return None if len(found) < n else [found[i] for i in range(n)]

    def get_samples(self, request: Mapping[str, Any], n: int, *, start: int = 0,
                    namespace: str = "") -> dict[int, Choice]:
        """The cached samples among ``start..start+n-1`` of ``request``, by sample index."""
        keys = {cache_key(request, i, namespace): i for i in range(start, start + n)}
        marks = ",".join("?" * len(keys))
        rows = self._reader().execute(
            f"SELECT key, choice FROM responses WHERE key IN ({marks})", tuple(keys)).fetchall()
        return {keys[k]: Choice(**json.loads(v)) for k, v in rows}

    def put(self, request: Mapping[str, Any], choices: Sequence[Choice], *, model: str = "",
            first_sample: int = 0, namespace: str = "") -> None:
        """Store ``choices`` as samples ``first_sample, first_sample + 1, ...`` of ``request``."""
        self.put_samples(request, dict(enumerate(choices, start=first_sample)), model=model,
                         namespace=namespace)

    def put_samples(self, request: Mapping[str, Any], samples: Mapping[int, Choice], *,
                    model: str = "", namespace: str = "") -> None:
        """Store choices by sample index, in one committed transaction."""
        self._write_rows(self._rows(request, samples, model, namespace))

    @staticmethod
    def _rows(request: Mapping[str, Any], samples: Mapping[int, Choice], model: str,
              namespace: str = "") -> list[tuple]:
        body = canonical_json({k: v for k, v in request.items() if k not in _DELIVERY_KEYS})
        now = time.time()
        return [(cache_key(request, i, namespace), model, body, i,
                 json.dumps(dataclasses.asdict(c)), now)
                for i, c in samples.items()]

    def _write_rows(self, rows: list[tuple]) -> None:
        self._insert("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)", rows)

    def _insert(self, sql: str, rows: list[tuple]) -> None:
        """Run ``executemany(sql, rows)`` as one committed transaction (rolled back on error)."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(sql, rows)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def put_soon(self, request: Mapping[str, Any], samples: Mapping[int, Choice], *,
                 model: str = "", namespace: str = "") -> None:
        """Queue choices for a background writer thread, which commits what is queued together.

        An event loop must not block on disk: with one commit per answer, a 2,000-request batch
        spends most of a second in SQLite. The writer commits within milliseconds (group
        commit), so a killed process loses at most the answers of the last few milliseconds;
        :meth:`flush` waits until everything queued is committed.

        Example:
            >>> import tempfile, os
            >>> from langtorch.backends import Choice
            >>> cache = ResponseCache(os.path.join(tempfile.mkdtemp(), "c.sqlite"))
            >>> cache.put_soon({"messages": []}, {0: Choice("a")}); cache.flush()
            >>> len(cache)
            1
        """
        with self._queue_lock:
            if self._queue is None or self._writer_pid != os.getpid():
                self._queue = queue.Queue()
                self._writer_pid = os.getpid()
                threading.Thread(target=self._write_loop, args=(self._queue,),
                                 name="langtorch-cache-writer", daemon=True).start()
            self._queue.put((dict(request), dict(samples), model, namespace))

    def _write_loop(self, q: queue.Queue) -> None:
        while True:
            try:
                items = [q.get(timeout=_WRITER_IDLE_SECONDS)]
            except queue.Empty:
                with self._queue_lock:  # idle: end the thread; the next put_soon starts another
                    if q.empty():
                        if self._queue is q:
                            self._queue = None
                        return
                continue
            while True:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write_rows([row for request, samples, model, namespace in items
                                  for row in self._rows(request, samples, model, namespace)])
            except BaseException as e:  # noqa: BLE001 - reported by flush()
                self._writer_error = e
            finally:
                for _ in items:
                    q.task_done()

    def flush(self) -> None:
        """Wait until every answer queued by :meth:`put_soon` is committed (re-raises a write error)."""
        q = self._queue
        if q is not None and self._writer_pid == os.getpid():
            q.join()
        if self._writer_error is not None:
            error, self._writer_error = self._writer_error, None
            raise error

    @staticmethod
    def embedding_key(model: str, text: str, params: Mapping[str, Any], namespace: str = "") -> str:
        """sha256 of the canonical JSON of ``(model, embedding params, input text)`` and the
        backend's namespace (type and server)."""
        key: dict[str, Any] = {"embedding": {"model": model, **params}, "input": text}
        if namespace:
            key["backend"] = namespace
        payload = canonical_json(key)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def get_vectors(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Cached embedding vectors (float32) by :meth:`embedding_key`, for the keys present.

        Example:
            >>> import tempfile, os, numpy as np
            >>> cache = ResponseCache(os.path.join(tempfile.mkdtemp(), "c.sqlite"))
            >>> k = cache.embedding_key("e", "hi", {})
            >>> cache.put_vectors({k: np.ones(3, np.float32)}, model="e")
            >>> cache.get_vectors([k])[k].tolist()
            [1.0, 1.0, 1.0]
        """
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(keys), 500):  # SQLite caps the number of bound parameters
            part = list(keys[start:start + 500])
            marks = ",".join("?" * len(part))
            rows = self._reader().execute(
                f"SELECT key, vector FROM embeddings WHERE key IN ({marks})", part).fetchall()
            found.update((k, np.frombuffer(v, dtype="<f4").copy()) for k, v in rows)
        return found

    def put_vectors(self, vectors: Mapping[str, np.ndarray], *, model: str = "") -> None:
        """Store embedding vectors by :meth:`embedding_key`, in one committed transaction."""
        now = time.time()
        rows = [(k, model, np.asarray(v, dtype="<f4").tobytes(), now) for k, v in vectors.items()]
        self._insert("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?, ?)", rows)

    def __len__(self) -> int:
        """Number of cached answer samples (embeddings not counted)."""
        with self._lock:
            return self._connection().execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def rows(self) -> Iterable[tuple[Any, ...]]:
        """Every stored row ``(key, model, request, sample, choice, created)`` (for inspection)."""
        with self._lock:
            return self._connection().execute("SELECT * FROM responses").fetchall()

    def clear(self) -> None:
        """Delete every entry (answers and embeddings)."""
        with self._lock:
            self._connection().execute("DELETE FROM responses")
            self._connection().execute("DELETE FROM embeddings")

    def close(self) -> None:
        """Close this process's connection (it reopens on next use)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None
        reader = getattr(self._readers, "conn", None)
        if reader is not None and self._readers.pid == os.getpid():
            reader.close()
        self._readers.conn = None

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r})"


# Caches with answers possibly still queued: flushed at interpreter exit (the writer thread is a
# daemon; without this, the last answers of a script that ends right after a call could be lost).
_live_caches: weakref.WeakSet[ResponseCache] = weakref.WeakSet()


def _flush_at_exit() -> None:
    for cache in list(_live_caches):
        try:
            cache.flush()
        except Exception:  # noqa: BLE001 - exiting: a failed write cannot be reported anywhere
            pass


atexit.register(_flush_at_exit)


def resolve_cache(cache: Any) -> ResponseCache | None:
    """``None``/``False`` -> no cache; ``True`` -> :func:`default_cache_path`; a path -> a cache there
    (``~`` and environment variables expanded, see :func:`langtorch.core.user_path`).

    Example:
        >>> resolve_cache(None) is None
        True
    """
    if cache is None or cache is False:
        return None
    if isinstance(cache, ResponseCache):
        return cache
    if cache is True:
        return ResponseCache(default_cache_path())
    if isinstance(cache, (str, os.PathLike)):
        return ResponseCache(cache)
    raise TypeError(f"cache expected None, True, a path or a ResponseCache, got {type(cache).__name__}.")
