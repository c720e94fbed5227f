"""Multi-host runs: start ``jax.distributed``, split a dataset per process, gather results back.

The same script runs on one process (everything here is then a no-op or the identity) and on
many: each process embeds its slice of the texts on its own local devices (``mesh="auto"``),
then :func:`gather` returns the rows in the original order on process 0 and :func:`topk` merges
per-process top-k candidates into the global answer with global indices.

Environment variables read by :func:`initialize` when its arguments are not given:

- ``LANGTORCH_COORDINATOR``: ``host:port`` of process 0's coordinator (e.g. ``10.0.0.1:1234``).
- ``LANGTORCH_NUM_PROCESSES``: the number of processes.
- ``LANGTORCH_PROCESS_ID``: this process's rank, ``0..N-1``.

Without them, on a cluster JAX knows how to detect (SLURM, Open MPI, Cloud TPU pod slices;
``JAX_COORDINATOR_ADDRESS`` etc.), ``jax.distributed.initialize()`` is called without arguments
and JAX fills them in; otherwise the run is single-process.

Example:
    >>> import langtorch as lt
    >>> info = lt.distributed.initialize()          # no cluster: one process, nothing started
    >>> info.process_id, info.num_processes
    (0, 1)
    >>> lt.distributed.shard_for_process(["a", "b", "c"])
    ['a', 'b', 'c']
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ProcessInfo", "initialize", "process_slice", "shard_for_process", "gather", "topk"]

ENV_COORDINATOR = "LANGTORCH_COORDINATOR"
ENV_NUM_PROCESSES = "LANGTORCH_NUM_PROCESSES"
ENV_PROCESS_ID = "LANGTORCH_PROCESS_ID"

# Markers of clusters that jax.distributed.initialize() detects by itself.
_CLUSTER_MARKERS = ("JAX_COORDINATOR_ADDRESS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES",
                    "MEGASCALE_COORDINATOR_ADDRESS")


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands: rank, process count, local and global device counts.

    Example:
        >>> from langtorch.distributed import ProcessInfo
        >>> ProcessInfo(0, 1, 1, 1).is_main
        True
    """

    process_id: int
    num_processes: int
    local_devices: int
    global_devices: int

    @property
    def is_main(self) -> bool:
        return self.process_id == 0


def _info() -> ProcessInfo:
    import jax

    return ProcessInfo(jax.process_index(), jax.process_count(), jax.local_device_count(),
                       jax.device_count())


def _int_env(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r}.") from None


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: Sequence[int] | None = None,
    cpu_collectives: str = "gloo",
    timeout_s: int = 300,
) -> ProcessInfo:
    """Join (or skip joining) a multi-process JAX run; call it before any other JAX work.

    Arguments not given come from ``LANGTORCH_COORDINATOR`` / ``LANGTORCH_NUM_PROCESSES`` /
    ``LANGTORCH_PROCESS_ID``; with none of them set and no cluster JAX detects, the run stays
    single-process and nothing is started. Calling it again after a successful start is a no-op.

    Args:
        coordinator_address: ``host:port`` of process 0 (it listens there).
        num_processes: the number of processes (>= 1).
        process_id: this process's rank in ``0..num_processes-1``.
        local_device_ids: restrict this process to these local devices (e.g. one GPU each).
        cpu_collectives: the CPU backend's cross-process collectives (``"gloo"`` or
            ``"mpi"``); the CPU backend has none unless one is chosen before JAX starts.
        timeout_s: how long to wait for every process to join.

    Returns:
        A :class:`ProcessInfo`.

    Raises:
        ValueError: inconsistent arguments (e.g. ``process_id`` out of range, a process count
            above 1 without a coordinator address), naming the parameter.

    Example:
        >>> from langtorch.distributed import initialize
        >>> initialize().num_processes
        1
    """
    import jax

    if jax.distributed.is_initialized():
        return _info()
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    if num_processes is None:
        num_processes = _int_env(ENV_NUM_PROCESSES)
    if process_id is None:
        process_id = _int_env(ENV_PROCESS_ID)
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes: expected >= 1, got {num_processes}.")
    if process_id is not None and not 0 <= process_id < (num_processes or 1 << 30):
        raise ValueError(f"process_id: expected 0..{(num_processes or 1) - 1}, got {process_id}.")
    if cpu_collectives not in ("gloo", "mpi"):
        raise ValueError(f"cpu_collectives: expected 'gloo' or 'mpi', got {cpu_collectives!r}.")
    detected = any(os.environ.get(m) for m in _CLUSTER_MARKERS) or (
        (_int_env("SLURM_NTASKS") or 1) > 1)
    if coordinator_address is None:
        if num_processes not in (None, 1):
            raise ValueError(f"coordinator_address: needed for num_processes={num_processes} "
                             f"(or set {ENV_COORDINATOR}=host:port).")
        if not detected:
            return _info()  # single process: nothing to start
    elif num_processes is None or process_id is None:
        raise ValueError(f"num_processes/process_id: needed with coordinator_address "
                         f"(or set {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID}).")
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    try:
        jax.distributed.initialize(coordinator_address=coordinator_address,
                                   num_processes=num_processes, process_id=process_id,
                                   local_device_ids=local_device_ids,
                                   initialization_timeout=timeout_s)
    except RuntimeError as exc:
        # Only JAX's "must be called before any JAX calls..." (a timeout may also say "before").
        if "must be called before" in str(exc).lower():
            raise RuntimeError(
                "langtorch.distributed.initialize() must run before any JAX work in this "
                "process (before loading a model or creating arrays); call it first thing in "
                f"the script. JAX said: {exc}") from exc
        raise
    return _info()


def process_slice(n: int, *, process_id: int | None = None,
                  num_processes: int | None = None) -> slice:
    """The contiguous block of ``range(n)`` that a process owns (sizes differ by at most 1).

    Example:
        >>> from langtorch.distributed import process_slice
        >>> [process_slice(10, process_id=p, num_processes=3) for p in range(3)]
        [slice(0, 4, None), slice(4, 7, None), slice(7, 10, None)]
    """
    if n < 0:
        raise ValueError(f"n: expected >= 0, got {n}.")
    if process_id is None or num_processes is None:
        info = _info()
        process_id = info.process_id if process_id is None else process_id
        num_processes = info.num_processes if num_processes is None else num_processes
    if num_processes < 1:
        raise ValueError(f"num_processes: expected >= 1, got {num_processes}.")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id: expected 0..{num_processes - 1}, got {process_id}.")
    base, extra = divmod(n, num_processes)
    start = process_id * base + min(process_id, extra)
    return slice(start, start + base + (1 if process_id < extra else 0))


def shard_for_process(items: Sequence[Any], **kwargs: Any) -> list[Any]:
    """This process's contiguous slice of ``items`` (all of them in a single-process run).

    Example:
        >>> from langtorch.distributed import shard_for_process
        >>> shard_for_process(list("abcde"), process_id=1, num_processes=2)
        ['d', 'e']
    """
    if isinstance(items, (str, bytes)):
        raise TypeError("items: expected a sequence of items, got one string.")
    items = list(items)
    return items[process_slice(len(items), **kwargs)]


def _allgather(x: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=False))


def gather(local: Any, *, to: int | str = 0) -> np.ndarray | None:
    """Concatenate every process's rows (from :func:`shard_for_process` slices) in input order.

    A collective: every process must call it. Blocks may have different lengths (including 0).

    Args:
        local: this process's ``[n_p, ...]`` results.
        to: ``0`` (default): the full array on process 0 and ``None`` elsewhere; ``"all"``: on
            every process.

    Example:
        >>> import numpy as np
        >>> from langtorch.distributed import gather
        >>> gather(np.ones((2, 3))).shape        # single process: the rows themselves
        (2, 3)
    """
    import jax

    if to not in (0, "all"):
        raise ValueError(f"to: expected 0 or 'all', got {to!r}.")
    local = np.asarray(local)
    if local.ndim == 0:
        raise ValueError("local: expected an array with a leading row axis, got a scalar.")
    if jax.process_count() == 1:
        return local
    lengths = _allgather(np.array([local.shape[0]], np.int64)).reshape(-1)
    width = int(lengths.max())
    padded = np.zeros((width,) + local.shape[1:], local.dtype)
    padded[:local.shape[0]] = local
    blocks = _allgather(padded)
    if to == 0 and jax.process_index() != 0:
        return None
    return np.concatenate([blocks[p, :int(n)] for p, n in enumerate(lengths)])


def topk(queries: Any, local_corpus: Any, k: int = 10, *, metric: str = "cosine",
         mesh: Any = None, chunk_size: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Global top-``k`` over a corpus split across processes by :func:`shard_for_process`.

    Each process scores its own rows (on its local devices, ``mesh`` as in
    :func:`langtorch.functional.topk`), keeps its top-k with global row indices, and one
    all-gather of the ``processes x k`` candidates gives every process the same answer. Every
    process must call it with the same queries; ``k`` may not exceed the total corpus rows.

    Returns:
        ``(scores [Q, k], indices [Q, k])``, indices into the whole (unsplit) corpus.

    Example:
        >>> import numpy as np
        >>> from langtorch.distributed import topk
        >>> topk(np.array([[0.0, 1.0]]), np.eye(2, dtype=np.float32), k=1)[1].tolist()
        [[1]]
    """
    import jax

    from langtorch.functional import topk as local_topk

    local_corpus = np.asarray(local_corpus) if not isinstance(local_corpus, jax.Array) \
        else local_corpus
    q = np.asarray(queries, np.float32)
    single = q.ndim == 1
    q = q[None] if single else q
    bad = np.flatnonzero(~np.isfinite(q).all(axis=-1))
    if bad.size:  # checked before any collective, so every process raises (none waits)
        raise ValueError(f"queries: query {int(bad[0])} has NaN or inf values.")
    if jax.process_count() == 1:
        s, i = local_topk(q, local_corpus, k, metric=metric, mesh=mesh, chunk_size=chunk_size)
        return (s[0], i[0]) if single else (s, i)
    n_local = int(local_corpus.shape[0])
    counts = _allgather(np.array([n_local], np.int64)).reshape(-1)
    total = int(counts.sum())
    if not 0 < k <= total:
        raise ValueError(f"topk: expected 0 < k <= {total} (corpus rows on all processes), "
                         f"got k={k}.")
    offset = int(counts[:jax.process_index()].sum())
    kk = min(k, n_local)
    s = np.full((q.shape[0], k), -np.inf, np.float32)
    i = np.full((q.shape[0], k), -1, np.int64)  # -1: an unused slot of a short process
    if kk:
        ls, li = local_topk(q, local_corpus, kk, metric=metric, mesh=mesh,
                            chunk_size=chunk_size)
        s[:, :kk], i[:, :kk] = ls, li + offset
    all_s = _allgather(s).transpose(1, 0, 2).reshape(q.shape[0], -1)
    all_i = _allgather(i).transpose(1, 0, 2).reshape(q.shape[0], -1)
    s, i = _merge(all_s, all_i, k)
    return (s[0], i[0]) if single else (s, i)


def _merge(all_s: np.ndarray, all_i: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    # The k best candidates per query, ordered as jax.lax.top_k orders them (so one process
    # and many agree): NaN above everything, then by score, ties by position (= process, then
    # rank); an unused slot (index -1) only after every real row, whatever its score.
    nan = np.isnan(all_s)
    key = np.where(nan, 0.0, -all_s.astype(np.float64))
    order = np.lexsort((key, ~nan, all_i < 0), axis=1)[:, :k]
    return np.take_along_axis(all_s, order, 1), np.take_along_axis(all_i, order, 1)
