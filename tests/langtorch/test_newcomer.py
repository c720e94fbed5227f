"""What a newcomer trips on (issue 23, items 6-8): paths with ``~`` and ``$VARS``, templates
checked when they are made, and ``if`` on a batch's metadata explained."""

import os
import pickle
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.core import user_path
from langtorch.errors import LangTorchError, ShapeError, TemplateError
from langtorch.runtime import ResponseCache, complete, default_cache_path

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ 6. paths
@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fake home folder and a separate working folder, so a literal ./~ would show up."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LT_NEWCOMER_DIR", str(home / "from-env"))
    monkeypatch.chdir(work)
    return home


def _no_literal_dirs(work: Path) -> None:
    left = [p.name for p in work.iterdir()]
    assert not any(name.startswith(("~", "$")) for name in left), f"literal path made: {left}"


def test_user_path_expands_home_and_variables(home):
    assert user_path("~/a/b") == home / "a" / "b"
    assert user_path("$LT_NEWCOMER_DIR/x") == home / "from-env" / "x"
    assert user_path("${LT_NEWCOMER_DIR}/x") == home / "from-env" / "x"
    assert user_path(Path("~") / "p") == home / "p"
    assert user_path("rel/x") == Path("rel/x")  # relative stays relative


def test_user_path_refuses_unset_variables_and_non_paths(home, monkeypatch):
    monkeypatch.delenv("LT_NEWCOMER_UNSET", raising=False)
    with pytest.raises(ValueError, match="LT_NEWCOMER_UNSET.*not set"):
        user_path("$LT_NEWCOMER_UNSET/cache.sqlite", what="cache")
    with pytest.raises(TypeError, match="str or os.PathLike"):
        user_path(3)
    with pytest.raises(TypeError, match="bytes"):
        user_path(b"~/x")
    with pytest.raises(ValueError, match="empty"):
        user_path("")
    # "${}" names no variable: said so (before: "the environment variable  which is not set;
    # set it (export =...)")
    with pytest.raises(ValueError, match=r"empty \$\{\} \(no variable name\)") as info:
        user_path("${}/x", what="cache")
    assert "export =" not in str(info.value)


def test_response_cache_and_backend_cache_option_expand_paths(home, srv):
    cache = ResponseCache("~/lt/c.sqlite")
    assert cache.path == home / "lt" / "c.sqlite" and cache.path.is_file()
    # RuntimeOptions' cache= (what docs/index.md shows): the file lands under the home folder
    backend = OpenAIBackend("m", base_url=srv.url, api_key="sk-newcomer-0123456789",
                            cache="$LT_NEWCOMER_DIR/responses.sqlite")
    assert complete(backend, [{"messages": [{"role": "user", "content": "hi"}]}], progress=False).ok
    assert (home / "from-env" / "responses.sqlite").is_file()
    assert len(ResponseCache(home / "from-env" / "responses.sqlite")) == 1
    _no_literal_dirs(Path.cwd())


def test_default_cache_dir_variable_expands(home, monkeypatch):
    monkeypatch.setenv("LANGTORCH_CACHE_DIR", "~/ltc")
    assert default_cache_path() == home / "ltc" / "llm_cache.sqlite"
    monkeypatch.delenv("LANGTORCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "$LT_NEWCOMER_DIR/xdg")
    assert default_cache_path() == home / "from-env" / "xdg" / "langtorch" / "llm_cache.sqlite"


def test_docs_index_cache_example_lands_in_the_home_folder(home):
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    paths = re.findall(r'cache="([^"]+)"', text)
    assert paths, "docs/index.md shows a cache= path"
    for p in paths:
        cache = ResponseCache(p)
        assert home in cache.path.parents, (p, cache.path)
    _no_literal_dirs(Path.cwd())


def test_index_save_load_expand_paths(home):
    index = lt.Index(["x", "y"], embeddings=np.eye(2, dtype=np.float32))
    index.save("~/idx")
    assert (home / "idx" / "index.json").is_file()
    assert len(lt.Index.load("~/idx")) == 2
    index.save("$LT_NEWCOMER_DIR/idx")
    assert (home / "from-env" / "idx" / "embeddings.safetensors").is_file()
    assert lt.Index.load("${LT_NEWCOMER_DIR}/idx").search(
        lt.TextTensor("q", embedding=np.array([0.0, 1.0])), k=1).item() == "y"
    _no_literal_dirs(Path.cwd())


def test_trace_save_load_expand_paths(home):
    with lt.trace() as tr:
        _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
    tr.save("~/t.jsonl")
    assert (home / "t.jsonl").is_file()
    os.makedirs(home / "from-env", exist_ok=True)
    tr.save("${LT_NEWCOMER_DIR}/t.jsonl")
    assert len(lt.Trace.load("$LT_NEWCOMER_DIR/t.jsonl").spans) == len(tr.spans)
    assert len(lt.Trace.load("~/t.jsonl").spans) == len(tr.spans)
    _no_literal_dirs(Path.cwd())


# -------------------------------------------------------------------- 7. templates when made
@pytest.mark.parametrize("text, what", [
    ("{x.__class__}", "attribute access"),
    ("Hi {user[0]}", "indexing"),
    ("{x!r}", "conversion"),
    ('Classify {text}. Answer as {"label": 1}', "not an identifier"),
    ("{} and {0}", "cannot mix"),
    # A format spec: refused when made, like the others (before, it was kept as a template that
    # does not parse, failed only when filled, and an LLM sent it unfilled).
    ("Total: {amount:.2f}", "format spec"),
    ("{name:>10}|", "format spec"),
])
def test_template_is_refused_when_made(text, what):
    with pytest.raises(TemplateError, match=what) as info:
        lt.TextTensor(text)
    message = str(info.value)
    assert "lt.text(" in message and "{{" in message and "template=False" in message
    assert info.value.template == text and info.value.index == ()


def test_refused_wherever_the_text_goes_next():
    # each of these paths took the text before and checked it only at fill time (or never:
    # an LLM call sent a text that did not parse as written)
    with pytest.raises(TemplateError, match=r"entry \(1,\)") as info:
        lt.TextTensor(["Q: {q}", "{q.__init__.__globals__}"])
    assert info.value.index == (1,)
    with pytest.raises(TemplateError, match="attribute access"):
        lt.TextParameter("{x.__class__}")
    with pytest.raises(TemplateError, match="indexing"):
        lt.TLayer("Answer {q[0]}")
    p = lt.TextParameter("Q: {q}")
    with pytest.raises(TemplateError, match="conversion"):
        p.data = "Q: {q!r}"
    assert str(p) == "Q: {q}"  # unchanged
    data = lt.text("{x.__class__}")  # data is fine ...
    with pytest.raises(TemplateError, match="attribute access"):
        lt.TextTensor(data, template=True)  # ... until it is made a template
    with pytest.raises(TemplateError, match="attribute access"):
        "{x.__class__} " + lt.text("v")  # a str on the left of + is the template
    with pytest.raises(TemplateError, match="attribute access"):
        lt.functional.fill("{x.__class__}", "v")


def test_values_and_data_keep_their_braces():
    prompt = lt.TextTensor("Q: {q}")
    assert (prompt + "{x.__class__}").item() == "Q: {x.__class__}"
    assert (prompt * lt.TextTensor({"q": "{x[0]} {"})).item() == "Q: {x[0]} {"
    assert (prompt + lt.text("{x!r}")).item() == "Q: {x!r}"
    assert lt.functional.concat("a", "{x.y}").item() == "a{x.y}"
    assert not lt.functional.concat("a", "{x.y}").is_template  # a value that is no template
    joined = lt.TextTensor(["{}", "{0}"]).join(" ")  # "{} {0}" cannot be a template: data
    assert joined.item() == "{} {0}" and not joined.is_template


def test_literal_braces_in_a_prompt_that_is_not_a_template_are_explained():
    # JSON with no placeholder is kept as written (a Tool's arguments, a prompt sent as is) ...
    args = lt.TextTensor(['{"city": "Oslo"}', '{"n": {"a": 1}}', "Reply as {label: str}"])
    assert args.tolist() == ['{"city": "Oslo"}', '{"n": {"a": 1}}', "Reply as {label: str}"]
    # ... and + on it says what the braces are and how to append instead
    prompt = lt.TextTensor('Reply in JSON like {"label": "spam"}. Message: ')
    with pytest.raises(TemplateError) as info:
        prompt + "win a prize"
    message = str(info.value)
    assert "lt.text(prompt) + value" in message and "{{" in message
    assert (lt.text(prompt) + "win a prize").item() == 'Reply in JSON like {"label": "spam"}. Message: win a prize'
    escaped = lt.TextTensor('Reply in JSON like {{"label": "spam"}}. Message: {}')
    assert (escaped + "win").item() == 'Reply in JSON like {"label": "spam"}. Message: win'


def test_records_of_values_with_braces_are_data_not_refused():
    r = lt.TextTensor({"question": ["what is {x.y}?", "ok"], "ctx": "{"})
    assert not r.is_template
    out = lt.TextTensor("{question} / {ctx}") * r
    assert out.tolist() == ["what is {x.y}? / {", "ok / {"]
    with pytest.raises(TemplateError, match="attribute access"):
        lt.TextTensor({"question": "{x.y}"}, template=True)


# ------------------------------------------------------------------- 8. branching on a batch
def _batch():
    return lt.TextTensor(["a", "b", "c"], metadata={"confidence": [0.9, 0.2, 0.8]})


def test_if_on_batch_metadata_names_the_fix():
    t = _batch()
    with pytest.raises(ShapeError) as info:
        if t.metadata["confidence"] >= 0.7:
            pass
    message = str(info.value)
    assert "metadata['confidence']" in message and "3 values" in message
    assert "lt.where" in message and "masked_scatter" in message and "for entry in t" in message
    assert "truth value of an array" not in message
    # catchable as a langtorch error and as what numpy users catch
    for cls in (LangTorchError, ValueError):
        with pytest.raises(cls):
            bool(t.metadata["confidence"])
    with pytest.raises(ShapeError, match="lt.where"):
        if t.metadata["confidence"] > 0.5 and t.metadata["confidence"] < 1:
            pass


def test_the_fixes_the_error_names_work():
    t = _batch()
    high = t.metadata["confidence"] >= 0.7
    out = lt.where(high, t, lt.text("searched"))
    assert out.tolist() == ["a", "searched", "c"]
    low = ~high
    fixed = t.masked_scatter(low, t[low].map(str.upper))
    assert fixed.tolist() == ["a", "B", "c"]
    assert [str(e) for e in t if e.metadata["confidence"] >= 0.7] == ["a", "c"]
    assert bool(high.any()) and not bool(high.all())


def test_metadata_columns_still_behave_like_numpy_and_torch():
    t = _batch()
    col = t.metadata["confidence"]
    assert isinstance(col, np.ndarray) and col.tolist() == [0.9, 0.2, 0.8]
    assert type(col.mean()) is np.float64 and type((col > 0.5).any()) is np.bool_
    assert type(np.asarray(col)) is np.ndarray
    assert np.shares_memory(col, t.metadata.column("confidence"))  # a view, no copy
    assert torch.equal(torch.as_tensor(col), torch.tensor([0.9, 0.2, 0.8], dtype=torch.float64))
    assert torch.equal(torch.from_numpy(np.asarray(col)), torch.as_tensor(col))
    assert np.allclose(jnp.asarray(col), [0.9, 0.2, 0.8])
    assert col[col > 0.5].tolist() == [0.9, 0.8] and float(col[1]) == 0.2
    assert f"{col.max():.2f}" == "0.90"
    t.metadata["double"] = col * 2  # assigned back: a plain column
    assert type(t.metadata.column("double")) is np.ndarray
    assert pickle.loads(pickle.dumps(col)).tolist() == col.tolist()
    one = lt.TextTensor(["only"], metadata={"confidence": [0.9]})
    assert bool(one.metadata["confidence"] >= 0.7)  # one value: numpy's answer


def test_single_question_pipeline_stays_as_written():
    t = lt.TextTensor("q")
    t.metadata["confidence"] = 0.65
    confidence = t.metadata.get("confidence", 0.0)
    assert confidence < 0.7 and f"{confidence:.2f}" == "0.65"  # a plain Python float
    assert type(confidence) is float


def test_trace_html_and_render_expand_the_home_folder(tmp_path, monkeypatch):
    import shutil

    import langtorch as lt

    monkeypatch.setenv("HOME", str(tmp_path))
    with lt.trace() as tr:
        _ = lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
    tr.to_html("~/t.html")
    assert (tmp_path / "t.html").read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")
    if shutil.which("dot") is not None:
        out = tr.render("~/g.svg")
        assert out == str(tmp_path / "g.svg") and (tmp_path / "g.svg").exists()


def test_load_state_dict_with_a_saved_text_that_is_no_template_says_so():
    """A state dict saved before templates were checked when made may hold a prompt that does not
    parse. Loading it names the template problem; before this was fixed the message read
    "expected str or nested lists of str, got str"."""
    layer = lt.TLayer("Answer {q}.")
    with pytest.raises(RuntimeError) as info:
        layer.load_state_dict({"prompt": 'Reply as {"a": 1} to {q}'})
    message = str(info.value)
    assert "got str" not in message
    assert 'text parameter named "prompt": the saved text is not a valid template' in message
    assert "lt.text(" in message and "{{" in message
    assert str(layer.prompt) == "Answer {q}."  # left as it was
    with pytest.raises(RuntimeError, match="expected str or nested lists of str, got int"):
        layer.load_state_dict({"prompt": 3})


def test_texttensor_guide_names_the_error_a_batch_if_raises():
    """docs/texttensor.md's batch-branching section described numpy's message, which `if` on a
    batch's metadata no longer raises; a reader searching the guide for their error found
    nothing. It names the ShapeError and the message's own words."""
    guide = (ROOT / "docs" / "texttensor.md").read_text(encoding="utf-8")
    section = guide.split("## Batch branching", 1)[1].split("\n## ", 1)[0]
    assert "ShapeError" in section and "names the fixes" in section
    t = _batch()
    with pytest.raises(ShapeError, match="one per entry"):
        bool(t.metadata["confidence"] >= 0.7)
