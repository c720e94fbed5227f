"""lt.metrics against hand-computed references; to_records / to_pandas / from_pandas round trips;
lt.text keeps model output as data."""

import sys

import numpy as np
import pandas as pd
import pytest

import langtorch as lt
from langtorch.functional.errors import ShapeError


def test_accuracy_exact_match_f1_hand_computed():
    preds = lt.TextTensor(["Paris", "the Eiffel Tower!", "in 1889", "", "blue whale"])
    golds = lt.TextTensor(["paris", "Eiffel tower", "1889", "", "the blue whale shark"])
    acc = lt.metrics.accuracy(preds, golds)
    assert acc.per_entry.tolist() == [0.0, 0.0, 0.0, 1.0, 0.0] and acc.value == pytest.approx(0.2)
    assert lt.metrics.accuracy(preds, golds, ignore_case=True).per_entry.tolist() == [1, 0, 0, 1, 0]
    em = lt.metrics.exact_match(preds, golds)
    assert em.per_entry.tolist() == [1.0, 1.0, 0.0, 1.0, 0.0] and float(em) == pytest.approx(0.6)
    f = lt.metrics.f1(preds, golds)
    # "in 1889" vs "1889": P=1/2, R=1 -> 2/3; "blue whale" vs "blue whale shark": P=1, R=2/3 -> 0.8
    np.testing.assert_allclose(f.per_entry, [1.0, 1.0, 2 / 3, 1.0, 0.8])
    assert f.value == pytest.approx((1 + 1 + 2 / 3 + 1 + 0.8) / 5)
    assert f.n == 5 and repr(f) == "MetricResult(f1=0.8933, n=5)"


def test_f1_counts_repeated_tokens_and_empty_answers():
    r = lt.metrics.f1(["dog dog dog", "", "x"], ["dog", "cat", ""])
    # P = 1/3, R = 1 -> 0.5; an empty prediction or reference against a non-empty one scores 0
    assert r.per_entry.tolist() == [0.5, 0.0, 0.0]


def test_multiple_references_take_the_best_and_broadcasting():
    preds = lt.TextTensor(["a cat", "dog"])
    refs = lt.TextTensor([["the cat", "kitten"], ["puppy", "hound"]])
    assert lt.metrics.exact_match(preds, refs, multiple=True).per_entry.tolist() == [1.0, 0.0]
    # [2, 1] prompts x [3] targets broadcast to [2, 3]
    grid = lt.metrics.accuracy(lt.TextTensor([["yes"], ["no"]]), ["yes", "no", "yes"])
    assert grid.per_entry.tolist() == [[1, 0, 1], [0, 1, 0]]
    with pytest.raises(ShapeError):
        lt.metrics.f1(["a", "b"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="no entries"):
        lt.metrics.f1(lt.TextTensor([]), [])
    with pytest.raises(TypeError, match="targets"):
        lt.metrics.f1(["a"], [3])


def test_to_pandas_round_trip_with_metadata():
    t = lt.TextTensor(["4", "{not a field}", "6"], template=False)
    t.metadata["score"] = [0.5, 1.0, np.nan]
    t.metadata["model"] = "m"
    t.metadata["tokens"] = [3, 4, 5]
    r = lt.metrics.exact_match(t, ["4", "5", "6"])
    t = t.with_metadata(em=r.per_entry)
    df = t.to_pandas()
    assert df.columns.tolist() == ["text", "score", "model", "tokens", "em"]
    assert df["em"].tolist() == [1.0, 0.0, 1.0] and df["tokens"].dtype.kind == "i"
    back = lt.TextTensor.from_pandas(df)
    assert back.tolist() == t.tolist() and not back.is_template
    for k in t.metadata:
        a, b = t.metadata[k], back.metadata[k]
        assert a.tolist() == b.tolist() or np.allclose(a.astype(float), b.astype(float), equal_nan=True), k
    assert (back + " (source: table)").tolist()[1] == "{not a field} (source: table)"


def test_to_pandas_round_trip_2d_and_records():
    grid = lt.TextTensor([["Define {}."], ["Explain {}."]]) + lt.TextTensor(["a", "b", "c"])
    grid.metadata["topic"] = ["a", "b", "c"]
    df = grid.to_pandas()
    assert df.index.names == ["dim0", "dim1"] and len(df) == 6
    back = lt.TextTensor.from_pandas(df)
    assert back.shape == (2, 3) and back.tolist() == grid.tolist()
    assert back.metadata["topic"].tolist() == grid.metadata["topic"].tolist()
    rec = lt.TextTensor({"q": ["x", "y"], "lang": "en"})
    back = lt.TextTensor.from_pandas(rec.to_pandas(), fields=["q", "lang"])
    assert back.fields == ("q", "lang") and back["q"].tolist() == ["x", "y"]
    assert back.tolist() == rec.tolist()
    with pytest.raises(KeyError, match="no column 'answer'"):
        lt.TextTensor.from_pandas(df, text="answer")
    with pytest.raises(TypeError, match="row 1"):
        lt.TextTensor.from_pandas(pd.DataFrame({"text": ["a", 3]}))


def test_pandas_missing_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install langtorch-jax\[pandas\]"):
        lt.TextTensor(["a"]).to_pandas()
    assert lt.TextTensor(["a"]).to_records() == [{"text": "a"}]  # needs no pandas


def test_text_keeps_model_output_braces_literally(srv):
    from langtorch.backends import OpenAIBackend

    srv.responder = lambda body: "The {Prize} is announced in October."
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key="sk-loopback"))
    answer = llm(lt.TextTensor("Who wins?"))
    text = str(answer)  # user code turns the answer into a str ...
    assert (lt.text(text) + " (source: model)").item() == "The {Prize} is announced in October. (source: model)"
    # ... and the trap lt.text avoids: a plain TextTensor of the str is a template.
    assert (lt.TextTensor(text) + " (source: model)").item() == "The  (source: model) is announced in October."
    # A TextTensor made from the answer itself stays data, and lt.text keeps its metadata.
    assert (lt.TextTensor(answer) + "!").item() == "The {Prize} is announced in October.!"
    kept = lt.text(answer)
    assert kept.metadata["model"] == "m" and not kept.is_template
    batch = lt.text(["{a}", "{b}"]) + lt.TextTensor(["1", "2"])
    assert batch.tolist() == ["{a}1", "{b}2"]
    with pytest.raises(lt.errors.TemplateError, match="data"):
        lt.fill(lt.text("{x}"), "y")
    with pytest.raises(TypeError, match="always makes data"):
        lt.text("x", template=True)


def test_metric_results_compare_and_round_as_numbers():
    r = lt.metrics.accuracy(["a", "b", "c"], ["a", "b", "x"])
    assert r >= 2 / 3 and r <= 2 / 3 and not r >= 0.7 and not r <= 0.6 and r > 0.6 and r < 0.7
    assert round(r, 2) == 0.67 and round(r) == 1
    with pytest.raises(TypeError, match="ignore_case"):
        lt.metrics.accuracy(["a"], ["A"], ignore_case="no")  # a truthy str must not switch it on


def test_pandas_round_trip_of_merged_object_columns_keeps_none():
    # where() leaves None in str/bool columns; pandas turns a missing str into NaN on the way.
    t = lt.where(np.array([True, False, True]),
                 lt.TextTensor(["a", "b", "c"], metadata={"f": [0.5, 1.5, 2.5]}),
                 lt.TextTensor(["x", "y", "z"], metadata={"src": "web", "ok": True}))
    back = lt.TextTensor.from_pandas(t.to_pandas())
    assert back.metadata["src"].tolist() == [None, "web", None]
    assert back.metadata["ok"].tolist() == [None, True, None]
    f = back.metadata["f"]  # float columns keep NaN
    assert f.dtype.kind == "f" and f[0] == 0.5 and np.isnan(f[1])
    df = pd.DataFrame({"text": ["a", "b"], "s": pd.array(["p", pd.NA], dtype="string")})
    assert lt.TextTensor.from_pandas(df).metadata["s"].tolist() == ["p", None]


def test_from_pandas_records_need_no_text_column_and_duplicates_are_named():
    df = pd.DataFrame({"question": ["q1", "q2"], "lang": ["en", "fr"], "gold": ["a", "b"]})
    t = lt.TextTensor.from_pandas(df, fields=["question", "lang"])
    assert t["question"].tolist() == ["q1", "q2"] and t.metadata["gold"].tolist() == ["a", "b"]
    with pytest.raises(ValueError, match=r"duplicated column names \['x'\]"):
        lt.TextTensor.from_pandas(pd.DataFrame([["a", 1, 2]], columns=["text", "x", "x"]))
