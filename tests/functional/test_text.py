"""TextTensor contracts: construction, structure ops, broadcasting, fills, metadata, pytree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import langtorch.functional as F
from langtorch.functional import ShapeError, TemplateError, TextTensor

# ------------------------------------------------------------------------------ construction


def test_construct_scalar_nested_numpy_and_copy():
    assert TextTensor("x").shape == ()
    assert TextTensor([["a", "b"], ["c", "d"]]).shape == (2, 2)
    assert TextTensor(np.array(["a", "bb"])).tolist() == ["a", "bb"]
    assert TextTensor(np.array(["a", "b"], dtype=object)).tolist() == ["a", "b"]
    t = TextTensor(["a"], metadata={"k": [1]})
    u = TextTensor(t)
    u.metadata["j"] = 2
    assert "j" not in t.metadata and u.metadata["k"].tolist() == [1]
    assert TextTensor([]).shape == (0,)


def test_texts_are_string_dtype_and_read_only():
    t = TextTensor(["a", "b"])
    assert t.texts.dtype == np.dtypes.StringDType()
    with pytest.raises(ValueError):
        t.texts[0] = "z"
    with pytest.raises(TypeError, match="immutable"):
        t[0] = "z"


@pytest.mark.parametrize(
    "bad, index, typename",
    [([1, "a"], "(0,)", "int"), ([["a", None]], "(0, 1)", "NoneType"), (["a", b"b"], "(1,)", "bytes")],
)
def test_non_text_entries_name_type_and_index(bad, index, typename):
    with pytest.raises(TypeError) as info:
        TextTensor(bad)
    assert index in str(info.value) and typename in str(info.value)


def test_non_text_scalar_and_numeric_array():
    with pytest.raises(TypeError, match="int"):
        TextTensor(5)
    with pytest.raises(TypeError, match="dtype"):
        TextTensor(np.arange(3))


def test_ragged_lists_are_shape_errors():
    with pytest.raises(ShapeError, match="rectangular"):
        TextTensor([["a", "b"], ["c"]])


def test_records_from_dict_and_list_of_dicts():
    r = TextTensor({"theme": ["spring", "autumn"], "form": "haiku"})
    assert r.shape == (2,) and r.fields == ("theme", "form")
    assert r["form"].tolist() == ["haiku", "haiku"]
    assert str(r[0]) == "theme: spring\nform: haiku"
    rl = TextTensor([{"q": "a", "n": "1"}, {"q": "b", "n": "2"}])
    assert rl["n"].tolist() == ["1", "2"]
    with pytest.raises(ValueError, match="same fields"):
        TextTensor([{"q": "a"}, {"x": "b"}])
    with pytest.raises(TypeError, match="'n'"):
        TextTensor([{"n": 1}])
    with pytest.raises(KeyError, match="fields"):
        r["missing"]


# ---------------------------------------------------------------------------- structure ops


def test_shape_ndim_len_iteration_item_str_repr():
    t = TextTensor([["a", "b", "c"], ["d", "e", "f"]])
    assert (t.shape, t.ndim, len(t), t.size) == ((2, 3), 2, 2, 6)
    assert [r.tolist() for r in t] == [["a", "b", "c"], ["d", "e", "f"]]
    assert t[1, 2].item() == "f" and str(t[1, 2]) == "f"
    assert repr(TextTensor("x")) == "TextTensor('x')"
    assert "TextTensor([['a', 'b', 'c']," in repr(t)
    with pytest.raises(TypeError, match="0-d"):
        len(TextTensor("x"))
    with pytest.raises(ValueError, match="one entry"):
        t.item()
    with pytest.raises(TypeError, match="ambiguous"):
        bool(t)


def test_indexing_kinds():
    t = TextTensor(["a", "b", "c", "d"])
    assert t[1:3].tolist() == ["b", "c"]
    assert t[np.array([True, False, True, False])].tolist() == ["a", "c"]
    assert t[[3, 0]].tolist() == ["d", "a"]
    assert t[np.array([2, 1])].tolist() == ["c", "b"]
    assert t[jnp.array([0, 3])].tolist() == ["a", "d"]
    assert t[None].shape == (1, 4)
    assert t[..., None].shape == (4, 1)
    assert t[-1].item() == "d"
    with pytest.raises(IndexError):
        t[7]
    with pytest.raises(IndexError, match="too many"):
        t[0, 0]


def test_indexing_with_torch_topk_indices():
    torch = pytest.importorskip("torch")
    t = TextTensor(["a", "b", "c"])
    _, idx = torch.topk(torch.tensor([0.1, 0.9, 0.5]), 2)
    assert t[idx].tolist() == ["b", "c"]


def test_reshape_transpose_squeeze_unsqueeze_flatten():
    t = TextTensor(["a", "b", "c", "d", "e", "f"])
    r = t.reshape(2, 3)
    assert r.tolist() == [["a", "b", "c"], ["d", "e", "f"]]
    assert t.reshape((3, -1)).shape == (3, 2)
    assert r.T.tolist() == [["a", "d"], ["b", "e"], ["c", "f"]]
    assert r.transpose(1, 0).shape == (3, 2)
    assert r.unsqueeze(0).shape == (1, 2, 3) and r.unsqueeze(-1).shape == (2, 3, 1)
    assert r.unsqueeze(1).squeeze().shape == (2, 3)
    assert r.flatten().tolist() == t.tolist()
    with pytest.raises(ShapeError, match=r"\(6,\).*\(4, 2\)"):
        t.reshape(4, 2)
    with pytest.raises(ShapeError):
        r.squeeze(0)
    with pytest.raises(ShapeError, match="permutation"):
        r.transpose(0, 0)


def test_stack_and_cat():
    a, b = TextTensor(["a", "b"]), TextTensor(["c", "d"])
    assert F.stack([a, b]).tolist() == [["a", "b"], ["c", "d"]]
    assert F.stack([a, b], axis=-1).tolist() == [["a", "c"], ["b", "d"]]
    assert F.cat([a, b]).tolist() == ["a", "b", "c", "d"]
    assert F.cat([a.unsqueeze(0), b.unsqueeze(0)], axis=1).shape == (1, 4)
    with pytest.raises(ShapeError, match="one shape"):
        F.stack([a, TextTensor(["x"])])
    with pytest.raises(ShapeError):
        F.cat([a.reshape(1, 2), TextTensor([["x"], ["y"]])], axis=0)
    with pytest.raises(TypeError, match="non-empty list"):
        F.stack([])
    assert TextTensor([a, b]).shape == (2, 2)


# ------------------------------------------------------------------------- fill and concat


def test_plus_fills_or_concatenates_as_in_the_seed():
    assert str(TextTensor("请翻译以下句子：{input}") + TextTensor("Hello, world!")) == "请翻译以下句子：Hello, world!"
    assert str(TextTensor("模型，请问：") + TextTensor("天空为什么是蓝色的？")) == "模型，请问：天空为什么是蓝色的？"
    batched = TextTensor(["写一首关于{theme}的诗"] * 3) + TextTensor(["春天", "夏天", "秋天"])
    assert batched.tolist() == ["写一首关于春天的诗", "写一首关于夏天的诗", "写一首关于秋天的诗"]


def test_prompt_grid_broadcast():
    grid = TextTensor([["A: {}"], ["B: {}"]]) + TextTensor(["x", "y", "z"])
    assert grid.shape == (2, 3)
    assert grid.tolist() == [["A: x", "A: y", "A: z"], ["B: x", "B: y", "B: z"]]


def test_mixed_templates_per_entry():
    t = TextTensor(["<{}>", "prefix ", "{x}{x}"]) + TextTensor(["v"])
    assert t.tolist() == ["<v>", "prefix v", "vv"]


def test_broadcast_mismatch_names_both_shapes():
    with pytest.raises(ShapeError, match=r"\(3,\) and \(2,\)"):
        TextTensor(["a", "b", "c"]) + TextTensor(["x", "y"])


def test_strict_fill_errors():
    with pytest.raises(TemplateError, match="no placeholders"):
        TextTensor("plain") * TextTensor("x")
    with pytest.raises(TemplateError, match=r"\['extra'\]"):
        TextTensor("{a}") * TextTensor({"a": "1", "extra": "2"})
    assert (TextTensor("{a}") + TextTensor({"a": "1", "extra": "2"})).item() == "1"


def test_missing_field_names_field_and_index():
    with pytest.raises(TemplateError) as info:
        TextTensor(["{a}", "{a} {b}"]) + TextTensor({"a": ["1", "2"]})
    assert info.value.field == "b" and info.value.index == (1,)


def test_multiple_fields_need_records():
    with pytest.raises(TemplateError, match="keyed records"):
        TextTensor("{a} {b}") + "x"


def test_values_never_reparsed_and_outputs_are_data():
    out = TextTensor("say {x}") + TextTensor("{y} {{z}} {0.__class__}", template=False)
    assert out.item() == "say {y} {{z}} {0.__class__}"
    # a str value is not parsed either (a value is never a template)
    assert (TextTensor("say {x}") + "{y} {{z}} {0.__class__}").item() == out.item()
    assert not out.is_template
    # data on the left of + concatenates, never parses
    assert (out + TextTensor("!")).item() == "say {y} {{z}} {0.__class__}!"
    with pytest.raises(TemplateError, match="data"):
        out * TextTensor("x")
    data = TextTensor("{not a template", template=False)
    assert (data + "x").item() == "{not a template" + "x"


def test_malformed_left_template_raises_with_hint():
    with pytest.raises(TemplateError, match="template=False"):
        TextTensor('Return {"a": 1} for ') + TextTensor("x")


def test_format_and_radd_rmul():
    assert TextTensor("{greet}, {}!").format("world", greet="Hi").item() == "Hi, world!"
    assert TextTensor("no fields {{x}}").format(a="1").item() == "no fields {x}"
    assert ("Q: {}" + TextTensor(["a", "b"])).tolist() == ["Q: a", "Q: b"]
    assert ("Q: {}" * TextTensor("a")).item() == "Q: a"
    assert (np.array(["{}!"]) + TextTensor("a")).tolist() == ["a!"]


def test_concat_explicit():
    assert F.concat(["a", "b"], "c", sep="-").tolist() == ["a-c", "b-c"]
    assert F.concat("{x}", "{y}").is_template
    assert F.concat("{x}", "{y}").item() == "{x}{y}"


# ------------------------------------------------------------------------------ join/split/map


def test_join_axes_and_split():
    t = TextTensor([["a", "b"], ["c", "d"]])
    assert t.join(" ").tolist() == ["a b", "c d"]
    assert t.join("|", axis=0).tolist() == ["a|c", "b|d"]
    assert t.join(axis=None).item() == "abcd"
    assert TextTensor("x").join(",").item() == "x"
    assert TextTensor(["a,b", "c,d"]).split(",").tolist() == [["a", "b"], ["c", "d"]]
    assert TextTensor("a b  c").split().tolist() == ["a", "b", "c"]
    with pytest.raises(ShapeError, match="pad"):
        TextTensor(["a,b", "c"]).split(",")
    assert TextTensor(["a,b", "c"]).split(",", pad="").tolist() == [["a", "b"], ["c", ""]]
    assert TextTensor(["a,b,c"]).split(",", maxsplit=1).tolist() == [["a", "b,c"]]
    with pytest.raises(ShapeError, match="out of range"):
        t.join(",", axis=2)


def test_map():
    t = TextTensor([["a", "b"]], metadata={"k": [[1, 2]]})
    m = t.map(str.upper)
    assert m.tolist() == [["A", "B"]] and m.metadata["k"].tolist() == [[1, 2]] and not m.is_template
    with pytest.raises(TypeError, match=r"index \(0, 1\)"):
        t.map(lambda s: 1 if s == "b" else s)


# ------------------------------------------------------------------------------- metadata


def test_metadata_scalar_on_0d_as_in_the_seed():
    answer = TextTensor("这是答案")
    answer.metadata["confidence"] = 0.65
    confidence = answer.metadata.get("confidence", 0.0)
    assert confidence < 0.7 and f"{confidence:.2f}" == "0.65"
    answer.metadata["usage"] = {"prompt_tokens": 3}
    assert answer.metadata["usage"] == {"prompt_tokens": 3}
    assert "confidence" in repr(answer.metadata)


def test_metadata_flows_through_structure_ops():
    t = TextTensor([["a", "b"], ["c", "d"]])
    t.metadata["score"] = [[1, 2], [3, 4]]
    t.metadata["model"] = "m"
    assert t[1].metadata["score"].tolist() == [3, 4]
    assert t[1, 0].metadata["score"] == 3
    assert t.T.metadata["score"].tolist() == [[1, 3], [2, 4]]
    assert t.reshape(4).metadata["score"].tolist() == [1, 2, 3, 4]
    assert t.unsqueeze(0).metadata["model"].shape == (1, 2, 2)
    assert F.cat([t, t]).metadata["score"].shape == (4, 2)
    with pytest.raises(ShapeError, match=r"\(3,\).*\(2, 2\)"):
        t.metadata["bad"] = [1, 2, 3]


def test_metadata_merges_through_fills():
    p = TextTensor("Q: {}", metadata={"src": "prompt", "p": 1})
    x = TextTensor(["a", "b"], metadata={"src": ["u1", "u2"]})
    out = p + x
    assert out.metadata["src"].tolist() == ["u1", "u2"]
    assert out.metadata["p"].tolist() == [1, 1]


# ---------------------------------------------------------------------------- embeddings


def test_embedding_slot_carried_and_validated():
    emb = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    t = TextTensor([["a", "b"], ["c", "d"]], embedding=emb)
    assert t[1].embedding.tolist() == emb[1].tolist()
    assert t[..., 0].embedding.shape == (2, 3)
    assert t.T.embedding[0, 1].tolist() == emb[1, 0].tolist()
    assert t.reshape(4).embedding.shape == (4, 3)
    assert (t + "x").embedding is None
    with pytest.raises(ShapeError, match=r"\(2, 2\) \+ \(d,\)"):
        TextTensor([["a", "b"], ["c", "d"]], embedding=np.zeros((2, 3)))
    e = TextTensor(["a", "bb"]).embed(lambda xs: np.array([[len(x)] for x in xs], dtype=np.float32))
    assert e.embedding.tolist() == [[1.0], [2.0]]
    with pytest.raises(ShapeError):
        TextTensor(["a"]).embed(lambda xs: np.zeros(3))


def test_detach_copies_metadata_and_stops_gradients():
    t = TextTensor(["a"], embedding=jnp.ones((1, 2)))
    g = jax.grad(lambda e: jnp.sum(t.with_embedding(e).detach().embedding * e))(jnp.ones((1, 2)))
    assert g.tolist() == [[1.0, 1.0]]  # only the direct factor contributes


# -------------------------------------------------------------------------------- pytree


def test_pytree_roundtrip_and_jit():
    t = TextTensor(["a", "b"], embedding=jnp.ones((2, 3)), metadata={"k": [1, 2]})
    leaves, treedef = jax.tree_util.tree_flatten(t)
    assert len(leaves) == 1 and leaves[0].shape == (2, 3)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert back.tolist() == ["a", "b"] and back.metadata["k"].tolist() == [1, 2]

    @jax.jit
    def double(x):
        return x.with_embedding(x.embedding * 2)

    out = double(t)
    assert out.tolist() == ["a", "b"] and float(out.embedding.sum()) == 12.0
    assert jax.tree_util.tree_leaves(TextTensor("no embedding")) == []


# ------------------------------------------------------------------ review regressions


def test_jit_sees_metadata_changes():
    calls = []

    @jax.jit
    def f(t):
        calls.append(1)
        return t.with_embedding(t.embedding + 1)

    t = TextTensor(["a"], embedding=jnp.zeros((1, 2)))
    t.metadata["s"] = 1
    assert f(t).metadata["s"].tolist() == [1]
    t.metadata["s"] = 2
    assert f(t).metadata["s"].tolist() == [2]


def test_records_of_data_stay_data():
    out = TextTensor("model says {secret}", template=False)
    rec = TextTensor({"q": out})
    assert not rec.is_template
    assert (rec + TextTensor({"secret": "INJECTED"})).item() == "q: model says {secret}secret: INJECTED"
    assert TextTensor({"q": "user text"}).is_template


def test_format_with_missing_value_is_an_error():
    with pytest.raises(TemplateError, match=r"\{name\}"):
        TextTensor("Hello {name}").format()


def test_no_aliasing_between_tensors():
    arr = np.array(["p", "q"], dtype=np.dtypes.StringDType())
    t = TextTensor(arr)
    arr[0] = "X"
    assert t.tolist() == ["p", "q"] and t.texts.tolist() == ["p", "q"]
    x = TextTensor(["a", "b"], metadata={"v": [1, 2]})
    y = x + "!"
    with pytest.raises(ValueError, match="read-only"):
        y.metadata["v"][0] = 99
    y.metadata["v"] = [5, 6]  # replacing a whole column is the way to change it
    assert x.metadata["v"].tolist() == [1, 2]
    z = x.detach()
    z.metadata["v"][0] = 7
    assert x.metadata["v"].tolist() == [1, 2]


def test_empty_inputs():
    assert (TextTensor("a {}") + TextTensor([])).shape == (0,)
    assert (TextTensor(["a {}", "b {}"]).reshape(2, 1) + TextTensor([])).shape == (2, 0)
    assert TextTensor([["a"], ["b"]])[:, :0].join(",").tolist() == ["", ""]
    assert TextTensor(["a", "b"])[[]].shape == (0,)


def test_nul_survives_zero_d_fills():
    assert (TextTensor("a{}b\x00") + TextTensor("\x00x\x00")).item() == "a\x00x\x00b\x00"


def test_small_conveniences():
    t = TextTensor([["a", "b"], ["c", "d"]])
    assert "c" in t and "z" not in t
    e = TextTensor([TextTensor(["a"], embedding=np.ones((1, 2))), TextTensor(["b"], embedding=np.zeros((1, 2)))])
    assert e.embedding.shape == (2, 1, 2)
    assert type(TextTensor([np.str_("a")]).tolist()[0]) is str
    s = F.stack([TextTensor(["a"], metadata={"m": ["x"]}), TextTensor(["b"], metadata={"m": [1]})])
    assert s.metadata["m"].tolist() == [["x"], [1]]


def test_per_entry_object_metadata_on_nd_tensors():
    msgs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}, {"role": "assistant", "content": "!"}]]
    t = TextTensor(["a", "b"]).with_metadata(messages=msgs)
    assert t[1].metadata["messages"] == msgs[1]
    with pytest.raises(ShapeError, match="one value per entry"):
        TextTensor(["a", "b"]).with_metadata(bad=[[1], [2, 3], [4]])


def test_pickle_and_deepcopy_keep_texts_read_only():
    import copy
    import pickle

    t = TextTensor(["a"], metadata={"k": [1]})
    for c in (copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        assert c.tolist() == ["a"] and c.metadata["k"].tolist() == [1]
        assert not c.texts.flags.writeable


def test_metadata_with_column_shares_columns_and_checks_the_shape():
    t = TextTensor(["a", "b"], metadata={"k": [1, 2]})
    m = t.metadata.with_column("n", np.array([3, 4]))
    assert sorted(m) == ["k", "n"] and sorted(t.metadata) == ["k"]
    assert m.column("k") is t.metadata.column("k") and m["n"].tolist() == [3, 4]
    with pytest.raises(ShapeError, match=r"shape \(3,\).*\(2,\)"):
        t.metadata.with_column("n", np.array([1, 2, 3]))
    with pytest.raises(TypeError, match="keys must be str"):
        t.metadata.with_column(1, np.array([1, 2]))
