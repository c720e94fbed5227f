"""lt.Index / lt.nn.Retrieve: top-k against a numpy brute-force reference, save/load round trip
(safetensors + JSON, validated), embedders (loopback embeddings endpoint, callables, MiniLM)."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import langtorch as lt
from langtorch.backends import OpenAIBackend


def _reference_topk(queries, corpus, k):
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    c = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    scores = q @ c.T
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, idx, axis=1), idx


def test_index_of_1000_texts_saves_loads_and_returns_the_same_topk(srv, tmp_path):
    backend = OpenAIBackend("emb", base_url=srv.url, api_key="sk-loopback")
    texts = [f"passage number {i} about topic {i % 37}" for i in range(1000)]
    index = lt.Index(texts, embedder=backend, metadata={"source": [f"doc{i // 10}" for i in range(1000)]})
    assert len(index) == 1000 and srv.embedding_requests >= 1
    queries = lt.TextTensor([["passage number 17 about topic 17", "what about topic 3?"],
                             ["an unrelated question", "passage number 999 about topic 0"]])
    hits = index.search(queries, k=5)
    assert hits.shape == (2, 2, 5) and not hits.is_template

    # Reference: brute force in numpy over the same vectors (query vectors via the same endpoint).
    qv = lt.nn.Embed(backend)(queries).embedding.reshape(4, -1)
    ref_scores, ref_idx = _reference_topk(qv, index.embeddings, 5)
    np.testing.assert_array_equal(hits.metadata["index"].reshape(4, 5), ref_idx)
    np.testing.assert_allclose(hits.metadata["score"].reshape(4, 5), ref_scores, rtol=1e-5, atol=1e-6)
    assert hits[0, 0, 0].item() == texts[17] and hits[1, 1, 0].item() == texts[999]
    assert hits.tolist()[1][0] == [texts[i] for i in ref_idx[2]]
    assert hits.metadata["source"][0, 0, 0] == "doc1"

    index.save(tmp_path / "idx")
    srv.reset()
    loaded = lt.Index.load(tmp_path / "idx", embedder=backend)
    assert len(loaded) == 1000 and loaded.metric == "cosine"
    np.testing.assert_array_equal(loaded.embeddings, index.embeddings)
    again = loaded.search(queries, k=5)
    assert again.tolist() == hits.tolist()
    np.testing.assert_array_equal(again.metadata["index"], hits.metadata["index"])
    np.testing.assert_array_equal(again.metadata["score"], hits.metadata["score"])
    assert again.metadata["source"].tolist() == hits.metadata["source"].tolist()
    assert srv.embedding_requests == 1  # only the queries were embedded after loading


def _saved(tmp_path):
    path = tmp_path / "idx"
    lt.Index(["a", "b", "c"], embeddings=np.eye(3)).save(path)
    return path


def test_load_validates_both_files(tmp_path):
    path = _saved(tmp_path)
    doc = json.loads((path / "index.json").read_text())

    def write(**changes):
        (path / "index.json").write_text(json.dumps({**doc, **changes}))

    write(texts=["a", "b"], count=2)
    with pytest.raises(ValueError, match=r"shape \(3, 3\).*2 texts"):
        lt.Index.load(path)
    write(format="something-else")
    with pytest.raises(ValueError, match="not a langtorch index"):
        lt.Index.load(path)
    write(version=99)
    with pytest.raises(ValueError, match="version"):
        lt.Index.load(path)
    write(metadata={"k": [1]})
    with pytest.raises(ValueError, match="metadata"):
        lt.Index.load(path)
    write(metadata={"k": [{"a": 1}, 2, 3]})
    with pytest.raises(ValueError, match="only str, int"):
        lt.Index.load(path)
    write()
    save_file({"embeddings": np.full((3, 3), np.nan, np.float32)}, str(path / "embeddings.safetensors"))
    with pytest.raises(ValueError, match="NaN"):
        lt.Index.load(path)
    save_file({"embeddings": np.eye(3, dtype=np.float32), "extra": np.ones(1, np.float32)},
              str(path / "embeddings.safetensors"))
    with pytest.raises(ValueError, match="one tensor"):
        lt.Index.load(path)
    (path / "embeddings.safetensors").write_bytes(b"\x80\x04not safetensors")  # e.g. a pickle
    with pytest.raises(ValueError, match="safetensors"):
        lt.Index.load(path)
    (path / "index.json").unlink()
    with pytest.raises(FileNotFoundError, match="index.json"):
        lt.Index.load(path)


def test_add_search_validation():
    def emb(texts):
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    index = lt.Index(embedder=emb)
    with pytest.raises(ValueError, match="empty"):
        index.search("x", k=1)
    index.add(["a", "bb"], metadata={"n": [1, 2]})
    index.add(lt.TextTensor(["ccc"], metadata={"n": 3}))
    assert len(index) == 3 and index.texts.metadata["n"].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="metadata columns"):
        index.add(["dddd"])
    with pytest.raises(ValueError, match="k must be between 1 and 3"):
        index.search("x", k=4)
    with pytest.raises(TypeError, match="k"):
        index.search("x", k=1.5)
    with pytest.raises(ValueError, match="dimension 3"):
        index.search(lt.TextTensor("q", embedding=np.ones(3)), k=1)
    with pytest.raises(ValueError, match="embeddings must have shape"):
        index.add(["e"], embeddings=np.ones((2, 2)), metadata={"n": [4]})
    with pytest.raises(TypeError, match="embedder"):
        lt.Index(["a"], embedder=42)
    with pytest.raises(ValueError, match="metric"):
        lt.Index(metric="l2")
    with pytest.raises(ValueError, match="shape"):
        lt.Index(["a", "b"], embedder=lambda ts: np.ones((1, 2)))
    with pytest.raises(TypeError, match="langtorch.Index"):
        lt.nn.Retrieve(["a"], k=1)
    with pytest.raises(ValueError, match="positive int"):
        lt.nn.Retrieve(index, k=0)


def test_passages_are_data_and_retrieval_records_lineage():
    index = lt.Index(["Prize: {Prize}", "other"], embeddings=np.eye(2))
    q = lt.TextParameter("{}")  # a query that requires grad (e.g. a tuned query rewrite)
    query = (q + "find it").with_embedding(np.array([1.0, 0.0]))
    hits = lt.nn.Retrieve(index, k=2)(query)
    assert (hits + " (retrieved)").tolist() == ["Prize: {Prize} (retrieved)", "other (retrieved)"]
    assert hits.grad_fn is not None and hits.grad_fn.op == "retrieve"
    assert hits.grad_fn.edges[0].index[..., 0].tolist() == [0, 0]


def test_retrieve_with_the_local_minilm_finds_the_relevant_passage():
    notes = ["The Eiffel Tower is in Paris.", "Bananas are rich in potassium.",
             "The Great Wall is in China.", "Python is a programming language."]
    retrieve = lt.nn.Retrieve(lt.Index(notes), k=2)  # embedder=None: all-MiniLM-L6-v2
    hits = retrieve(lt.TextTensor(["Where is the Eiffel Tower?", "Which fruit has potassium?"]))
    assert hits[:, 0].tolist() == [notes[0], notes[1]]
    from langtorch.models import default_embedder

    vec = default_embedder().embed_texts(["Where is the Eiffel Tower?"])
    ref_scores, ref_idx = _reference_topk(vec, retrieve.index.embeddings, 2)
    np.testing.assert_array_equal(hits.metadata["index"][0], ref_idx[0])
    np.testing.assert_allclose(hits.metadata["score"][0], ref_scores[0], rtol=1e-5, atol=1e-6)


def test_failed_save_keeps_the_previous_index_and_encodes_first(tmp_path):
    path = tmp_path / "idx"
    lt.Index(["old a", "old b"], embeddings=np.eye(2)).save(path)
    bad = lt.Index(["fine", "lone surrogate \ud800"], embeddings=np.eye(2) * 2)
    with pytest.raises(ValueError, match="UTF-8"):
        bad.save(path)
    kept = lt.Index.load(path)  # the folder still holds the old, readable index
    assert kept.texts.tolist() == ["old a", "old b"]
    np.testing.assert_array_equal(kept.embeddings, np.eye(2))
    assert sorted(p.name for p in path.iterdir()) == ["embeddings.safetensors", "index.json"]


def test_index_copies_the_callers_embeddings():
    vecs = np.eye(2, dtype=np.float32)
    index = lt.Index(["x", "y"], embeddings=vecs)
    vecs[0] = np.nan  # the caller reuses its buffer
    np.testing.assert_array_equal(index.embeddings, np.eye(2))
    assert index.search(lt.TextTensor("q", embedding=np.array([1.0, 0.0])), k=1).item() == "x"


def test_hostile_inputs_fail_with_value_errors(tmp_path):
    index = lt.Index(["x", "y"], embeddings=np.eye(2))
    with pytest.raises(ValueError, match="NaN"):  # a NaN query would return arbitrary hits
        index.search(lt.TextTensor("q", embedding=np.array([np.nan, 0.0])), k=1)
    with pytest.raises(ValueError, match="d >= 1"):
        lt.Index(["x"], embeddings=np.zeros((1, 0)))
    with pytest.raises(ValueError, match="array of numbers"):
        lt.Index(["x"], embeddings=[["a"]])
    for key in ("score", "index"):  # search() would overwrite the column on every hit
        with pytest.raises(ValueError, match=f"'{key}' is reserved"):
            lt.Index(["x"], embeddings=np.eye(1), metadata={key: [1]})
    path = _saved(tmp_path)
    doc = json.loads((path / "index.json").read_text())
    (path / "index.json").write_text(json.dumps({**doc, "metadata": {"score": [1, 2, 3]}}))
    with pytest.raises(ValueError, match="Index.load.*reserved"):
        lt.Index.load(path)
    deep = '{"format": "langtorch.Index", "version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (path / "index.json").write_text(deep)
    with pytest.raises(ValueError, match="not valid JSON"):
        lt.Index.load(path)


def test_retrieve_accepts_numpy_ints():
    index = lt.Index(["x", "y"], embeddings=np.eye(2))
    r = lt.nn.Retrieve(index, k=np.int64(2))
    assert r.k == 2 and type(r.k) is int
    assert r(lt.TextTensor("q", embedding=np.array([0.0, 1.0]))).tolist() == ["y", "x"]


def test_search_after_add_sees_the_new_passages_and_their_metadata():
    # search() keeps its passage arrays between calls (not rebuilt from N strings per call);
    # an add must replace them.
    index = lt.Index(["x", "y"], embeddings=np.eye(3)[:2], metadata={"src": ["a", "b"]})
    q = lt.TextTensor("q", embedding=np.array([0.1, 0.0, 1.0]))  # x is the best of the two
    assert index.search(q, k=1).metadata["src"].tolist() == ["a"]
    index.add(["z"], embeddings=np.eye(3)[2:], metadata={"src": ["c"]})
    hit = index.search(q, k=1)
    assert hit.tolist() == ["z"] and hit.metadata["src"].tolist() == ["c"]
    assert index.search(q, k=3).metadata["index"].tolist()[0] == 2


def test_the_rag_recipe_in_the_docs_runs(srv, tmp_path, monkeypatch):
    import pathlib
    import re

    doc = (pathlib.Path(__file__).parents[2] / "docs" / "recipes.md").read_text(encoding="utf-8")
    code = re.search(r"## RAG\n.*?```python\n(.*?)```", doc, re.S).group(1)
    monkeypatch.chdir(tmp_path)  # the recipe saves to "kb/"
    ns = {"passages": ["The Eiffel Tower is in Paris.", "Bananas are rich in potassium."],
          "sources": ["wiki/eiffel", "wiki/banana"],
          "more_passages": ["The Great Wall is in China.", "Honey bees make {honey}."],
          "urls": ["wiki/wall", "wiki/bees"]}
    exec(compile(code, "docs/recipes.md", "exec"), ns)  # MiniLM embeds (embedder=None)
    assert len(ns["index"]) == 4 and (tmp_path / "kb" / "index.json").is_file()
    srv.responder = lambda body: "ANSWER"
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key="sk-loopback"))
    out = ns["RAG"](ns["retrieve"], llm)(lt.TextTensor(["Where is the Eiffel Tower?", "What do bees make?"]))
    assert out.tolist() == ["ANSWER", "ANSWER"]
    sent = {b["messages"][-1]["content"].rsplit("Question: ", 1)[1]: b["messages"][-1]["content"]
            for b in srv.bodies}  # requests run concurrently: match them by question
    assert "The Eiffel Tower is in Paris." in sent["Where is the Eiffel Tower?"]
    assert "Honey bees make {honey}." in sent["What do bees make?"]  # braces reach the model as data


def test_nan_metadata_stays_a_float_column_through_search_save_and_load(tmp_path):
    index = lt.Index(["x", "y"], embeddings=np.eye(2), metadata={"rating": [np.nan, 4.5]})
    q = lt.TextTensor("q", embedding=np.array([1.0, 0.2]))
    for idx in (index, (index.save(tmp_path / "i"), lt.Index.load(tmp_path / "i"))[1]):
        col = idx.search(q, k=2).metadata["rating"]
        assert col.dtype.kind == "f" and np.isnan(col[0]) and col[1] == 4.5
        assert (col > 4).tolist() == [False, True]  # comparable, as a float column is
