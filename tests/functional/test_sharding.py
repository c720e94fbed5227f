"""Mesh-aware embeddings and top-k on 8 virtual CPU devices (one subprocess, checks reported back).

The subprocess runs with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must be
set before JAX starts, hence the subprocess); every check compares the sharded result with the
single-device one and also inspects the arrays' ``.sharding``.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from langtorch.functional import sharding as S

SCRIPT = textwrap.dedent(r"""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from langtorch.functional import embedding as E, sharding as S
    from langtorch.functional.models import bert

    out = {"devices": len(jax.devices())}
    cfg = bert.BertConfig(vocab_size=60, hidden_size=16, num_layers=2, num_heads=4,
                          intermediate_size=32, max_positions=64)
    params = bert.random_params(jax.random.key(0), cfg)
    rng = np.random.default_rng(0)
    seqs = [[1] + rng.integers(3, 60, rng.integers(1, 40)).tolist() + [2] for _ in range(37)]
    single = E.embed_token_ids(params, seqs, config=cfg, row_lengths=(32, 64))
    seen = []

    def spy(p, ids, seg, pos, **kw):
        r = E.embed_packed(p, ids, seg, pos, **kw)
        seen.append({"in": list(ids.sharding.spec), "out": list(r.sharding.spec),
                     "rows": int(ids.shape[0]), "shards": len(r.addressable_shards),
                     "param_spec": list(jax.tree.leaves(p)[0].sharding.spec)})
        return r

    sharded = E.embed_token_ids(params, seqs, config=cfg, row_lengths=(32, 64), mesh="auto",
                                encode_fn=spy)
    cos = np.sum(single * sharded, 1)
    out["tiny_min_cos"] = float(cos.min())
    out["tiny_seen"] = seen
    mesh42 = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    s42 = E.embed_token_ids(params, seqs, config=cfg, row_lengths=(32, 64), mesh=mesh42)
    out["mesh42_min_cos"] = float(np.sum(single * s42, 1).min())

    # real MiniLM, a few texts
    from langtorch.models import MiniLM
    texts = ["a cat sat on the mat", "quantum field theory", "", "hello world"] * 5 + ["x"]
    ref = MiniLM().embed_texts(texts)
    m = MiniLM(mesh="auto")
    got = m.embed_texts(texts)
    out["minilm_min_cos"] = float(np.sum(ref * got, 1).min())
    out["minilm_param_spec"] = list(m.params["layers"]["q_w"].sharding.spec)
    out["minilm_param_devices"] = len(m.params["layers"]["q_w"].sharding.device_set)
    import langtorch as lt
    t = lt.TextTensor([["a cat sat on the mat", "hello world"]]).embed(m)
    out["tensor_shape"] = list(t.embedding.shape)
    t2 = lt.TextTensor(["quantum field theory"]).embed(MiniLM(), mesh="auto")
    out["tensor_mesh_cos"] = float(np.dot(t2.embedding[0], ref[1]))

    # top-k: random corpora of several sizes, including fewer rows than devices
    res = {}
    for n, chunk, k in [(1000, 64, 5), (1001, 4096, 7), (5, 65536, 3), (3, 2, 2), (12000, 1024, 4),
                        (100, 2, 7)]:  # chunk_size < k
        corpus = rng.normal(size=(n, 16)).astype(np.float32)
        q = rng.normal(size=(6, 16)).astype(np.float32)
        for metric in ("cosine", "dot"):
            s1, i1 = E.topk(q, corpus, k=k, metric=metric, chunk_size=chunk)
            s8, i8 = E.topk(q, corpus, k=k, metric=metric, chunk_size=chunk, mesh="auto")
            res[f"{n}-{metric}"] = [bool((i1 == i8).all()), float(np.abs(s1 - s8).max())]
    out["topk"] = res
    # ties (duplicate documents, rows 10 and 1000, both in shard 0): the lowest row wins
    tc = rng.normal(size=(32768, 4)).astype(np.float32)
    tc[:, 0] = -np.abs(tc[:, 0])
    tc[10] = tc[1000] = [0.5, 0, 0, 0]
    tc[1001] = [0.9, 0, 0, 0]
    tq = np.array([1.0, 0, 0, 0], np.float32)
    out["ties"] = {f"{m}-{c}": E.topk(tq, tc, k=2, metric="dot", chunk_size=c,
                                      mesh=m)[1].tolist() == [1001, 10]
                   for m in (None, "auto") for c in (65536, 1024)}
    # a corpus padded by shard_batch (37 -> 40 rows of zeros): with rows=n padding never wins,
    # even where every real score is negative (dot) and the zero rows would score 0
    neg = -np.abs(rng.normal(size=(37, 4))).astype(np.float32)
    pq = np.abs(rng.normal(size=(3, 4))).astype(np.float32)
    padded, pn = S.shard_batch(neg, S.resolve_mesh("auto"), name="corpus")
    _, ref = E.topk(pq, neg, k=5, metric="dot")
    _, got = E.topk(pq, padded, k=5, metric="dot", mesh="auto", rows=pn)
    out["padded_rows"] = [int(padded.shape[0]), pn, bool((got == ref).all()), int(got.max())]
    corpus = rng.normal(size=(800, 16)).astype(np.float32)
    placed, n = S.shard_batch(corpus, S.resolve_mesh("auto"), name="corpus")
    out["placed_spec"] = list(placed.sharding.spec)
    out["placed_shards"] = [tuple(sh.data.shape) for sh in placed.addressable_shards][:2]
    _, ia = E.topk(corpus[:3], corpus, k=2, mesh="auto")
    _, ib = E.topk(corpus[:3], placed, k=2, mesh="auto")
    out["placed_equal"] = bool((ia == ib).all())
    _, i1 = E.topk(corpus[0], corpus, k=3, mesh="auto")
    out["single_query"] = i1.tolist()

    # mixing a mesh with arrays committed to other devices
    mesh2 = Mesh(np.array(jax.devices()[:2]), ("data",))
    on7 = jax.device_put(corpus, jax.devices()[7])
    try:
        E.topk(corpus[:2], on7, k=2, mesh=mesh2)
        out["mix_error"] = None
    except ValueError as e:
        out["mix_error"] = str(e)
    try:
        E.embed_token_ids(jax.device_put(params, jax.devices()[7]), seqs, config=cfg,
                          row_lengths=(64,), mesh=mesh2)
        out["mix_params_error"] = None
    except ValueError as e:
        out["mix_params_error"] = str(e)
    print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def report():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT"):])


def test_eight_devices(report):
    assert report["devices"] == 8


def test_sharded_embeddings_equal_single_device(report):
    assert report["tiny_min_cos"] >= 0.99999
    assert report["mesh42_min_cos"] >= 0.99999
    assert report["minilm_min_cos"] >= 0.99999
    assert report["tensor_shape"] == [1, 2, 384]
    assert report["tensor_mesh_cos"] >= 0.99999


def test_embedding_batches_are_really_sharded(report):
    seen = report["tiny_seen"]
    assert seen, "the encoder was never called"
    for call in seen:
        assert call["in"] == ["data", None]
        assert call["out"][0] == "data"
        assert call["shards"] == 8 and call["rows"] % 8 == 0  # padded, not refused
        assert call["param_spec"] == []
    assert report["minilm_param_spec"] == []
    assert report["minilm_param_devices"] == 8


def test_sharded_topk_equals_single_device(report):
    for key, (same, err) in report["topk"].items():
        assert same, key
        assert err < 1e-4, key
    assert report["placed_spec"] == ["data", None]
    assert report["placed_shards"] == [[100, 16], [100, 16]]
    assert report["placed_equal"]
    assert all(report["ties"].values()), report["ties"]  # ties: the lowest row, as top_k
    assert report["padded_rows"] == [40, 37, True, report["padded_rows"][3]]
    assert report["padded_rows"][3] < 37  # a padding row (37..39) is never returned
    assert report["single_query"][0] == 0


def test_mixing_mesh_and_placed_arrays_names_both_shardings(report):
    msg = report["mix_error"]
    assert msg and msg.startswith("corpus:")
    assert "SingleDeviceSharding" in msg and "NamedSharding" in msg and "devices=[0, 1]" in msg
    msg = report["mix_params_error"]
    assert msg and msg.startswith("params:") and "SingleDeviceSharding" in msg


# ---------------------------------------------------------------- helpers, in-process (1 device)

def test_pad_to_multiple_and_resolve_errors():
    x, n = S.pad_to_multiple(np.ones((5, 2)), 4, value=7)
    assert x.shape == (8, 2) and n == 5 and x[5:].tolist() == [[7, 7]] * 3
    assert S.pad_to_multiple(np.ones((0, 2)), 4)[0].shape == (0, 2)
    with pytest.raises(ValueError, match="multiple"):
        S.pad_to_multiple(np.ones(3), 0)
    with pytest.raises(ValueError, match="mesh"):
        S.resolve_mesh("all")
    with pytest.raises(TypeError, match="mesh"):
        S.resolve_mesh(8)
    import jax
    from jax.sharding import Mesh

    with pytest.raises(ValueError, match="'data' axis"):
        S.resolve_mesh(Mesh(np.array(jax.devices()), ("batch",)))


def test_topk_rows_limits_the_search_to_the_real_rows():
    from langtorch.functional import topk

    rng = np.random.default_rng(2)
    real = -np.abs(rng.normal(size=(37, 4))).astype(np.float32)
    padded = np.concatenate([real, np.zeros((3, 4), np.float32)])  # zeros would score 0
    q = np.abs(rng.normal(size=(2, 4))).astype(np.float32)
    _, ref = topk(q, real, k=5, metric="dot")
    for mesh in (None, "auto"):
        for chunk in (8, 65536):
            _, got = topk(q, padded, k=5, metric="dot", mesh=mesh, chunk_size=chunk, rows=37)
            np.testing.assert_array_equal(got, ref)
        with pytest.raises(ValueError, match="rows: expected an int in 1..40"):
            topk(q, padded, k=5, mesh=mesh, rows=41)
        with pytest.raises(ValueError, match="k <= 3"):
            topk(q, padded, k=5, mesh=mesh, rows=3)


def test_topk_mesh_argument_validation():
    from langtorch.functional import topk

    corpus = np.eye(4, dtype=np.float32)
    with pytest.raises(ValueError, match="k <= 4"):
        topk(corpus, corpus, k=5, mesh="auto")
    with pytest.raises(ValueError, match="queries"):
        topk(np.ones((2, 3)), corpus, k=1, mesh="auto")
    with pytest.raises(ValueError, match="chunk_size"):
        topk(corpus, corpus, k=1, chunk_size=0)


@pytest.mark.parametrize("mesh", [None, "auto"])
def test_topk_refuses_non_finite_queries(mesh):
    # A NaN query scores NaN against every row; top_k then "ranks" rows 0..k-1 first, so the
    # caller got arbitrary rows as matches. Refused on both paths, naming the query.
    from langtorch.functional import topk

    corpus = np.random.default_rng(0).normal(size=(9, 4)).astype(np.float32)
    q = np.ones((3, 4), np.float32)
    q[2, 1] = np.nan
    with pytest.raises(ValueError, match="query 2 has NaN"):
        topk(q, corpus, k=3, mesh=mesh)
    with pytest.raises(ValueError, match="query 0 has NaN or inf"):
        topk(np.array([np.inf, 0, 0, 0], np.float32), corpus, k=3, mesh=mesh)
    assert topk(q[:2], corpus, k=3, mesh=mesh)[1].shape == (2, 3)


def test_a_mesh_with_other_processes_devices_is_refused(monkeypatch):
    # A global multi-host mesh used to fail late and obscurely (JAX cannot fetch the
    # data-sharded embeddings/scores into numpy); now it is refused up front, pointing at
    # mesh="auto" per process + langtorch.distributed. Simulated by claiming to be process 1.
    import jax

    from langtorch.functional import embedding as E
    from langtorch.functional.models import bert

    mesh = S.resolve_mesh("auto")
    S.check_local(mesh)  # our own devices: fine
    cfg = bert.BertConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2,
                          intermediate_size=8, max_positions=16)
    p = bert.random_params(jax.random.key(0), cfg)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with pytest.raises(ValueError, match=r"mesh: the mesh spans devices of other processes \[0\]"):
        E.topk(np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32), k=1, mesh=mesh)
    with pytest.raises(ValueError, match="mesh='auto'"):
        E.embed_token_ids(p, [[1, 2]], config=cfg, row_lengths=(16,), mesh=mesh)
    from langtorch.functional import engine
    from langtorch.functional.models import llama

    small = llama.LlamaConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
                              num_kv_heads=1, head_dim=8, intermediate_size=32,
                              max_positions=32)
    lp = llama.random_params(jax.random.key(1), small)
    with pytest.raises(ValueError, match="other processes"):
        engine.SlotBatch(lp, config=small, mesh=mesh)


def test_docstring_examples():
    import doctest

    assert doctest.testmod(S).failed == 0


def test_replicate_places_an_array_shared_by_trees_once():
    # A quantized model's fp32 and bf16 views share their int8 storage; replicated for a mesh
    # with one memo, they still share it (one copy per device, not one per view).
    import jax.numpy as jnp

    from langtorch.functional import sharding as S

    mesh = S.resolve_mesh("auto")
    shared, own = jnp.ones((4, 4), jnp.int8), jnp.ones(3)
    memo: dict = {}
    a = S.replicate({"q": shared, "b": own}, mesh, memo=memo)
    b = S.replicate({"q": shared, "b": jnp.ones(3)}, mesh, memo=memo)
    assert a["q"] is b["q"] and a["b"] is not b["b"]
    assert S.replicate({"q": shared}, mesh)["q"] is not a["q"]  # no memo: a new copy
