"""Embedding math: normalize, cosine_similarity, streaming topk, row packing."""

import numpy as np
import pytest

import langtorch.functional as F
from langtorch.functional import embedding as E


def test_normalize_and_cosine():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 8)), rng.normal(size=(7, 8))
    n = np.asarray(F.normalize(a))
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1.0, atol=1e-6)
    ref = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (
        b / np.linalg.norm(b, axis=1, keepdims=True)).T
    np.testing.assert_allclose(np.asarray(F.cosine_similarity(a, b)), ref, atol=1e-5)
    assert np.asarray(F.normalize(np.zeros((1, 3)))).tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("metric,n,chunk", [("cosine", 1000, 128), ("dot", 1000, 128),
                                            ("dot", 12000, 8192)])  # last: blocked top-k path
def test_topk_streams_chunks_like_bruteforce(metric, n, chunk):
    rng = np.random.default_rng(1)
    corpus = rng.normal(size=(n, 16)).astype(np.float32)
    queries = rng.normal(size=(9, 16)).astype(np.float32)
    scores, idx = F.topk(queries, corpus, k=5, chunk_size=chunk, metric=metric)  # last partial
    if metric == "cosine":
        c = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
        q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    else:
        c, q = corpus, queries
    full = q @ c.T
    ref = np.argsort(-full, axis=1)[:, :5]
    np.testing.assert_array_equal(idx, ref)
    np.testing.assert_allclose(scores, np.take_along_axis(full, ref, 1), atol=1e-4)


@pytest.mark.parametrize("chunk", [65536, 4096, 1000])
def test_topk_ties_go_to_the_lowest_row(chunk):
    # Duplicate documents score exactly the same. The blocked top-k returned the duplicate in
    # the block with the higher maximum (row 1000, next to the best row 1001) instead of the
    # lowest row (10) as lax.top_k does, so the answer depended on chunk_size and sharding.
    rng = np.random.default_rng(5)
    corpus = rng.normal(size=(32768, 4)).astype(np.float32)
    corpus[:, 0] = -np.abs(corpus[:, 0])
    corpus[10] = corpus[1000] = [0.5, 0, 0, 0]
    corpus[1001] = [0.9, 0, 0, 0]
    for mesh in (None, "auto"):
        _, idx = F.topk(np.array([1.0, 0, 0, 0], np.float32), corpus, k=2, metric="dot",
                        chunk_size=chunk, mesh=mesh)
        assert idx.tolist() == [1001, 10], (mesh, idx)


def test_topk_single_query_and_errors():
    corpus = np.eye(4, dtype=np.float32)
    s, i = F.topk(np.array([0.0, 0.0, 1.0, 0.0]), corpus, k=1)
    assert i.tolist() == [2] and s.shape == (1,)
    with pytest.raises(ValueError, match="k <= 4"):
        F.topk(corpus, corpus, k=5)


def test_pack_rows_respects_limits():
    rng = np.random.default_rng(2)
    lengths = rng.integers(2, 60, size=300).tolist()
    rows = E.pack_rows(lengths, row_len=128, max_segments=8)
    seen = sorted(i for r in rows for i in r)
    assert seen == list(range(300))
    assert all(sum(lengths[i] for i in r) <= 128 and len(r) <= 8 for r in rows)
    # first-fit decreasing keeps rows nearly full
    assert sum(lengths) / (128 * len(rows)) > 0.9
