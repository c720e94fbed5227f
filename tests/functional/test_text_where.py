"""where / masked_scatter / index_put: entries, metadata merging, embeddings, validation."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from langtorch.functional import TextTensor
from langtorch.functional.errors import ShapeError
from langtorch.functional.textops import index_put, masked_scatter, where


def _ref_where(cond, a, b):
    return np.where(cond, np.array(a, dtype=object), np.array(b, dtype=object)).tolist()


def test_where_matches_numpy_with_broadcasting():
    cond = np.array([[True], [False]])
    a = TextTensor(["a0", "a1", "a2"])
    b = TextTensor([["b0"], ["b1"]])
    out = where(cond, a, b)
    assert out.shape == (2, 3)
    assert out.tolist() == _ref_where(cond, a.tolist(), b.tolist())


@pytest.mark.parametrize("make", [np.asarray, torch.tensor, jnp.asarray, list])
def test_where_accepts_numpy_torch_jax_and_list_conditions(make):
    cond = make([True, False, True])
    out = where(cond, TextTensor(["a", "b", "c"]), TextTensor(["x", "y", "z"]))
    assert out.tolist() == ["a", "y", "c"]


@pytest.mark.parametrize("cond", [np.array([1, 0]), np.array([0.5, 0.1]), TextTensor(["a", "b"])])
def test_where_rejects_non_bool_conditions(cond):
    with pytest.raises(TypeError, match="cond"):
        where(cond, TextTensor(["a", "b"]), "x")


def test_where_shape_mismatch_names_shapes():
    with pytest.raises(ShapeError, match=r"\(3,\).*\(2,\)"):
        where(np.array([True, False, True]), TextTensor(["a", "b"]), "x")


def test_where_merges_metadata_by_the_chosen_side():
    a = TextTensor(["a0", "a1", "a2"], metadata={"confidence": [0.9, 0.2, 0.8], "module": "qa",
                                                 "tokens": [3, 4, 5]})
    b = TextTensor(["b0", "b1", "b2"], metadata={"module": "augmented", "source": "web"})
    out = where(a.metadata["confidence"] >= 0.5, a, b)
    assert out.tolist() == ["a0", "b1", "a2"]
    assert out.metadata["module"].tolist() == ["qa", "augmented", "qa"]
    conf = out.metadata["confidence"]
    assert conf[0] == 0.9 and np.isnan(conf[1]) and conf[2] == 0.8
    assert out.metadata["tokens"].tolist() == [3, None, 5]  # int column: None where missing
    assert out.metadata["source"].tolist() == [None, "web", None]
    # the operands are unchanged
    assert a.metadata["module"].tolist() == ["qa"] * 3 and "source" not in a.metadata


def test_where_mixed_dtype_column_becomes_object():
    a = TextTensor(["a", "b"], metadata={"v": [1.5, 2.5]})
    b = TextTensor(["x", "y"], metadata={"v": ["p", "q"]})
    assert where(np.array([True, False]), a, b).metadata["v"].tolist() == [1.5, "q"]


def test_where_template_flag_and_embeddings():
    a = TextTensor(["{x}", "{y}"], embedding=np.ones((2, 3)))
    b = TextTensor(["p", "q"], template=False, embedding=np.zeros((2, 3)))
    out = where(np.array([True, False]), a, b)
    assert not out.is_template  # data on one side: never parsed
    np.testing.assert_array_equal(out.embedding, [[1, 1, 1], [0, 0, 0]])
    assert where(np.array([True, False]), a, "s").embedding is None
    both = where(np.array([True, False]), a, TextTensor(["{z}", "w"]))
    assert both.is_template


def test_where_records_need_the_same_fields():
    r1 = TextTensor({"q": ["a", "b"], "c": "x"})
    r2 = TextTensor({"q": ["c", "d"], "c": "y"})
    out = where(np.array([False, True]), r1, r2)
    assert out["q"].tolist() == ["c", "b"] and out["c"].tolist() == ["y", "x"]
    with pytest.raises(ShapeError, match="fields"):
        where(np.array([False, True]), r1, TextTensor(["a", "b"]))


def test_where_0d():
    assert where(True, TextTensor("a"), "b").item() == "a"
    assert where(np.bool_(False), TextTensor("a"), "b").item() == "b"


def test_masked_scatter_in_row_major_order_like_torch():
    t = TextTensor([["a", "b"], ["c", "d"]])
    mask = np.array([[True, False], [True, True]])
    out = masked_scatter(t, mask, TextTensor(["1", "2", "3"]))
    ref = np.array(t.tolist(), dtype=object)
    ref[mask] = ["1", "2", "3"]
    assert out.tolist() == ref.tolist()
    assert t.tolist() == [["a", "b"], ["c", "d"]]  # functional: no mutation
    # the same via torch's own masked_scatter on numbers
    nums = torch.arange(4).reshape(2, 2).masked_scatter(torch.tensor(mask), torch.tensor([10, 20, 30]))
    assert nums.tolist() == [[10, 1], [20, 30]] and ref.tolist() == [["1", "b"], ["2", "3"]]


def test_masked_scatter_metadata_and_counts():
    t = TextTensor(["a", "b", "c"], metadata={"confidence": [0.9, 0.1, 0.2]})
    low = t.metadata["confidence"] < 0.5
    branch = TextTensor(["B", "C"], metadata={"source": "web"})
    out = masked_scatter(t, low, branch)
    assert out.tolist() == ["a", "B", "C"]
    conf = out.metadata["confidence"]  # t's column: kept where t's entries stay, NaN elsewhere
    assert conf[0] == 0.9 and np.isnan(conf[1:]).all()
    assert out.metadata["source"].tolist() == [None, "web", "web"]
    with pytest.raises(ShapeError, match="selects 2 entries but values has 3"):
        masked_scatter(t, low, TextTensor(["x", "y", "z"]))
    assert masked_scatter(t, low, "N/A").tolist() == ["a", "N/A", "N/A"]  # one value for all
    with pytest.raises(TypeError, match="mask"):
        masked_scatter(t, [1, 0, 1], "x")
    with pytest.raises(ShapeError, match="does not broadcast"):
        masked_scatter(t, [True, False], "x")


def test_masked_scatter_keeps_embeddings_when_both_have_them():
    t = TextTensor(["a", "b"], embedding=np.zeros((2, 2)))
    v = TextTensor(["B"], embedding=np.ones((1, 2)))
    np.testing.assert_array_equal(masked_scatter(t, [False, True], v).embedding, [[0, 0], [1, 1]])


def test_index_put_matches_numpy_assignment():
    t = TextTensor([["a", "b", "c"], ["d", "e", "f"]], metadata={"n": [[1, 2, 3], [4, 5, 6]]})
    for index, values in [((0, 1), "X"), ((slice(None), 2), ["P", "Q"]), (([1, 0], [0, 2]), ["u", "v"]),
                          (np.array([[True, False, False], [False, False, True]]), ["m", "n"]),
                          (torch.tensor([1]), [["r", "s", "t"]])]:
        ref = np.array(t.tolist(), dtype=object)
        ref[index if not isinstance(index, torch.Tensor) else index.numpy()] = np.array(values, dtype=object)
        out = index_put(t, index, TextTensor(values))
        assert out.tolist() == ref.tolist(), index
        assert out.metadata["n"].shape == (2, 3)
    out = index_put(t, (0, 1), TextTensor("X", metadata={"n": 9}))
    assert out.metadata["n"].tolist() == [[1, 9, 3], [4, 5, 6]]
    with pytest.raises(IndexError, match="shape"):
        index_put(t, (5, 0), "x")
    with pytest.raises(ShapeError, match="do not broadcast"):
        index_put(t, (slice(None), 0), TextTensor(["a", "b", "c"]))


def test_methods_delegate():
    t = TextTensor(["a", "b", "c"])
    assert t.where(t != "b", "x").tolist() == ["a", "x", "c"]
    assert t.masked_scatter(t == "c", TextTensor(["C"])).tolist() == ["a", "b", "C"]
    assert t.index_put([0], TextTensor(["A"])).tolist() == ["A", "b", "c"]


def test_to_records():
    t = TextTensor({"q": ["x", "y"], "lang": "en"}, metadata={"score": [1, 2]})
    recs = t.to_records()
    assert recs[1] == {"text": "q: y\nlang: en", "q": "y", "lang": "en", "score": 2}
    assert type(recs[0]["score"]) is int
    bad = TextTensor(["a"], metadata={"text": ["oops"]})
    with pytest.raises(ValueError, match="'text'"):
        bad.to_records()


def test_empty_batches_with_list_masks():
    # a mask built by a list comprehension over an empty batch is [] (float64 to numpy)
    empty = TextTensor([])
    assert where([], empty, empty).shape == (0,)
    assert masked_scatter(empty, [], TextTensor([])).shape == (0,)
    assert masked_scatter(TextTensor(["a"]), [False], TextTensor([])).tolist() == ["a"]
    with pytest.raises(TypeError, match="dtype"):
        where(np.array([], dtype=np.int64), TextTensor(["a"]), "b")  # arrays still need bool
