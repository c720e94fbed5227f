"""langtorch.distributed: two real processes on 127.0.0.1 (jax.distributed, gloo CPU collectives)
embed a split corpus with MiniLM and answer top-k; the answer must equal one process's."""

import doctest
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import langtorch as lt
from langtorch import distributed as D

SCRIPT = textwrap.dedent(r"""
    import json, random
    import numpy as np
    import langtorch as lt
    info = lt.distributed.initialize()
    from langtorch.models import MiniLM
    rng = random.Random(0)
    words = "river mountain quantum algorithm cat dog music piano ocean star code".split()
    corpus = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(23)]
    queries = ["a cat and a dog", "piano music", "quantum code", "ocean river"]
    model = MiniLM(mesh="auto")
    local = lt.distributed.shard_for_process(corpus)
    local_emb = model.embed_texts(local)
    q = model.embed_texts(queries)
    full = lt.distributed.gather(local_emb)
    scores, idx = lt.distributed.topk(q, local_emb, k=5)
    empty = lt.distributed.gather(np.zeros((info.process_id, 2), np.float32), to="all")
    print("RESULT" + json.dumps({
        "pid": info.process_id, "n": info.num_processes, "local": len(local),
        "full": None if full is None else full.tolist(),
        "idx": idx.tolist(), "scores": scores.tolist(), "empty_rows": len(empty)}))
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _result(stdout):
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT")]
    return json.loads(lines[-1][len("RESULT"):]) if lines else None


@pytest.fixture(scope="module")
def runs():
    base = {k: v for k, v in os.environ.items() if not k.startswith("LANGTORCH_")}
    base.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    one = subprocess.run([sys.executable, "-c", SCRIPT], env=base, capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    port = _free_port()
    procs = []
    for pid in range(2):
        env = dict(base, LANGTORCH_COORDINATOR=f"127.0.0.1:{port}",
                   LANGTORCH_NUM_PROCESSES="2", LANGTORCH_PROCESS_ID=str(pid))
        procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, err[-3000:]
        outs.append(_result(out))
    return _result(one.stdout), outs


def test_two_processes_match_one(runs):
    one, (p0, p1) = runs
    assert one["n"] == 1 and one["local"] == 23
    assert (p0["pid"], p1["pid"], p0["n"]) == (0, 1, 2)
    assert p0["local"] + p1["local"] == 23 and p0["local"] == 12
    # gather: the full matrix in input order on process 0 only
    assert p1["full"] is None
    a, b = np.array(one["full"]), np.array(p0["full"])
    assert a.shape == b.shape == (23, 384)
    assert np.sum(a * b, 1).min() >= 0.99999
    # top-k: both processes get the single-process answer, with global indices
    assert p0["idx"] == one["idx"] == p1["idx"]
    np.testing.assert_allclose(p0["scores"], one["scores"], atol=1e-5)
    assert max(max(r) for r in p0["idx"]) >= 12  # the answer uses rows held by process 1
    # uneven (and empty) blocks gather fine
    assert p0["empty_rows"] == p1["empty_rows"] == 1 and one["empty_rows"] == 0


def test_single_process_is_the_identity():
    info = D.initialize()
    assert (info.process_id, info.num_processes) == (0, 1) and info.is_main
    assert D.shard_for_process([1, 2, 3]) == [1, 2, 3]
    x = np.arange(6).reshape(3, 2)
    assert D.gather(x).tolist() == x.tolist()
    assert lt.distributed is D


def test_process_slices_cover_in_order():
    for n in (0, 1, 7, 10):
        for procs in (1, 2, 3, 8):
            got = [i for p in range(procs)
                   for i in range(n)[D.process_slice(n, process_id=p, num_processes=procs)]]
            assert got == list(range(n))


def test_bad_arguments_name_the_parameter(monkeypatch):
    with pytest.raises(ValueError, match="coordinator_address"):
        D.initialize(num_processes=2)
    with pytest.raises(ValueError, match="num_processes"):
        D.initialize("127.0.0.1:1", num_processes=0)
    with pytest.raises(ValueError, match="process_id"):
        D.initialize("127.0.0.1:1", num_processes=2, process_id=2)
    monkeypatch.setenv("LANGTORCH_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="LANGTORCH_NUM_PROCESSES"):
        D.initialize()
    monkeypatch.delenv("LANGTORCH_NUM_PROCESSES")
    monkeypatch.setenv("SLURM_NTASKS", "4(x2)")
    with pytest.raises(ValueError, match="SLURM_NTASKS: expected an integer"):
        D.initialize()
    monkeypatch.delenv("SLURM_NTASKS")
    with pytest.raises(TypeError, match="items"):
        D.shard_for_process("abc")
    with pytest.raises(ValueError, match="to"):
        D.gather(np.ones(2), to=1)


def test_topk_refuses_nan_queries_before_any_collective(monkeypatch):
    # A process without corpus rows skipped the local top-k (where NaN queries are refused)
    # and waited in the all-gather for processes that had raised: checked up front now.
    import jax

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(D, "_allgather", lambda x: pytest.fail("collective reached"))
    with pytest.raises(ValueError, match="query 1 has NaN"):
        D.topk(np.array([[1.0, 0.0], [np.nan, 0.0]]), np.zeros((0, 2), np.float32), k=1)


def test_initialize_explains_only_the_must_run_first_error(monkeypatch):
    # Any RuntimeError mentioning "before" (e.g. a join timeout) was reported as "initialize()
    # must run before any JAX work", hiding the real cause.
    import jax

    def boom(msg):
        def init(**kw):
            raise RuntimeError(msg)
        return init

    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.config, "update", lambda *a: None)
    monkeypatch.setattr(jax.distributed, "initialize",
                        boom("Barrier timed out before all 2 tasks joined"))
    with pytest.raises(RuntimeError, match="^Barrier timed out"):
        D.initialize("127.0.0.1:1", num_processes=2, process_id=0)
    monkeypatch.setattr(jax.distributed, "initialize", boom(
        "jax.distributed.initialize() must be called before any JAX calls that might "
        "initialise the XLA backend."))
    with pytest.raises(RuntimeError, match="must run before any JAX work"):
        D.initialize("127.0.0.1:1", num_processes=2, process_id=0)


def test_process_slice_refuses_zero_processes():
    with pytest.raises(ValueError, match="num_processes: expected >= 1, got 0"):
        D.process_slice(3, process_id=0, num_processes=0)


def test_cross_process_merge_never_returns_unused_slots_and_orders_like_top_k():
    # Process 0 had 2 rows (k=4: two unused slots, index -1), process 1 four; one real score is
    # NaN. The merge used to sort NaN last, so an unused slot (reported as row 0) beat it.
    import jax

    s = np.array([[0.5, np.nan, -np.inf, -np.inf, 0.9, 0.5, -0.2, 0.1]], np.float32)
    i = np.array([[1, 0, -1, -1, 2, 5, 3, 4]])
    ms, mi = D._merge(s, i, 6)
    assert mi.tolist() == [[0, 2, 1, 5, 4, 3]]
    real = s[:, [0, 1, 4, 5, 6, 7]]
    ts, ti = jax.lax.top_k(real, 6)  # one process's order over the same rows
    assert mi.tolist() == np.array([[1, 0, 2, 5, 3, 4]])[0][np.asarray(ti)].tolist()
    np.testing.assert_array_equal(ms, np.asarray(ts))


def test_docstring_examples():
    assert doctest.testmod(D).failed == 0
