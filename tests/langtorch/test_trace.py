"""Traces of real pipelines against the loopback server: span tree, paths, requests, usage."""

import asyncio
import importlib.util
import io
import json
import pathlib

import numpy as np
import pytest

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.errors import AuthenticationError

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEY = "sk-test-secret-abcdef123456"


def _example():
    spec = importlib.util.spec_from_file_location("conditional_qa", ROOT / "examples" / "conditional_qa.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def qa(srv):
    ex = _example()
    srv.responder = ex.scripted_model
    backend = OpenAIBackend("m", base_url=srv.url, api_key=KEY)
    return ex, ex.build_pipeline(backend), backend


def _subtree_kinds(span):
    return [(c.kind, c.path) for c in span.children if c.kind != "op"]


@pytest.mark.parametrize("question,branch", [("水的化学式是什么？", "high"), ("2025年诺贝尔文学奖得主会是谁？", "low")])
def test_seed_pipeline_span_tree(qa, srv, question, branch, capsys):
    ex, pipeline, backend = qa
    with lt.trace() as tr:
        out = pipeline(lt.TextTensor(question))
    root = tr.roots[0]
    assert (root.kind, root.path) == ("module", "ConditionalQAPipeline")
    expected = [("module", "ConditionalQAPipeline.qa"), ("module", "ConditionalQAPipeline.evaluator")]
    if branch == "low":
        expected.append(("module", "ConditionalQAPipeline.searcher"))
    assert _subtree_kinds(root) == expected
    # One LLM module shared by three sub-modules: a distinct path for each use.
    llm_paths = [s.path for s in tr.find(kind="llm")]
    want = ["ConditionalQAPipeline.qa.llm", "ConditionalQAPipeline.evaluator.llm"]
    if branch == "low":
        want.append("ConditionalQAPipeline.searcher.llm")
    assert llm_paths == want
    # The recorded messages equal what the server received, request by request.
    requests = tr.find(kind="request")
    assert [r.request["messages"] for r in requests] == [b["messages"] for b in srv.bodies]
    assert all(r.parent.kind == "llm" for r in requests)
    # Usage: the request spans sum to the backend's session usage, and to the output metadata.
    assert tr.usage == {"prompt_tokens": backend.usage.prompt_tokens,
                        "completion_tokens": backend.usage.completion_tokens}
    (made,) = [s for s in tr.find(kind="llm") if s.outputs[0]["texts"] == [str(out)]]
    assert made.usage["completion_tokens"] == int(np.sum(out.metadata["completion_tokens"]))
    assert made.path == ("ConditionalQAPipeline.qa.llm" if branch == "high" else "ConditionalQAPipeline.searcher.llm")
    # The key is nowhere in the trace.
    buf = io.StringIO()
    for s in tr.spans:
        buf.write(json.dumps(s.to_dict(), ensure_ascii=False, default=str))
    assert KEY not in buf.getvalue() and "sk-test" not in buf.getvalue()


def test_tracing_does_not_change_results(qa):
    ex, pipeline, _ = qa
    q = lt.TextTensor("2025年诺贝尔文学奖得主会是谁？")
    plain = pipeline(q)
    with lt.trace():
        traced = pipeline(q)
    assert traced.tolist() == plain.tolist()
    assert dict(traced.metadata) .keys() == dict(plain.metadata).keys()


def test_hundred_concurrent_entries_nest_under_their_parent(srv):
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY), temperature=0)
    chain = lt.TChain(lt.TLayer("Q{}: hi"), llm)
    srv.latency = 0.01
    xs = lt.TextTensor([str(i) for i in range(100)])
    with lt.trace() as tr:
        out = chain(xs)
    (llm_span,) = tr.find(kind="llm")
    assert llm_span.path == "TChain.1"
    assert llm_span.parent.path == "TChain"
    reqs = [c for c in llm_span.children if c.kind == "request"]
    assert len(reqs) == 100 and len(tr.find(kind="request")) == 100
    texts = sorted(r.request["messages"][-1]["content"] for r in reqs)
    assert texts == sorted(f"Q{i}: hi" for i in range(100))
    assert out.tolist() == [f"Echo: Q{i}: hi" for i in range(100)]
    assert srv.max_in_flight > 1  # really concurrent


def test_async_tasks_nest_under_the_span_that_created_them(srv):
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY), temperature=0)

    async def main():
        with lt.tracing.span("tool", "fanout") as outer:
            await asyncio.gather(*(llm.acall(lt.TextTensor(f"q{i}")) for i in range(20)))
        return outer

    with lt.trace() as tr:
        outer = asyncio.run(main())
    llm_spans = tr.find(kind="llm")
    assert len(llm_spans) == 20 and all(s.parent is outer for s in llm_spans)
    assert all(len([c for c in s.children if c.kind == "request"]) == 1 for s in llm_spans)


def test_cached_rerun_marks_spans_cached(srv, tmp_path):
    backend = OpenAIBackend("m", base_url=srv.url, api_key=KEY, cache=tmp_path / "c.sqlite")
    llm = lt.nn.LLM(backend, temperature=0)
    x = lt.TextTensor(["a", "b"])
    with lt.trace() as first:
        llm(x)
    with lt.trace() as second:
        llm(x)
    assert [r.cached for r in first.find(kind="request")] == [False, False]
    assert [r.cached for r in second.find(kind="request")] == [True, True]
    assert second.find(kind="llm")[0].cached == 2
    assert second.usage == {"prompt_tokens": 0, "completion_tokens": 0}


def test_error_mid_pipeline_is_recorded_and_propagates_unchanged(srv):
    srv.api_key = "sk-right-key-000000"
    try:
        llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY, max_retries=0))
        chain = lt.TChain(lt.TLayer("Q: {}"), llm)
        with lt.trace() as tr:
            with pytest.raises(AuthenticationError) as info:
                chain(lt.TextTensor("x"))
    finally:
        srv.api_key = None
    assert type(info.value) is AuthenticationError
    assert tr.roots[0].error["type"] == "AuthenticationError"
    (req,) = tr.find(kind="request")
    assert req.error["type"] == "AuthenticationError"
    assert KEY not in json.dumps([s.to_dict() for s in tr.spans], default=str)


def test_save_load_round_trip(qa, tmp_path):
    _, pipeline, _ = qa
    with lt.trace() as tr:
        pipeline(lt.TextTensor("2025年诺贝尔文学奖得主会是谁？"))
    path = tmp_path / "trace.jsonl"
    tr.save(path)
    back = lt.Trace.load(path)
    assert [s.to_dict() for s in back.spans] == [json.loads(json.dumps(s.to_dict(), default=str)) for s in tr.spans]
    assert back.roots[0].children[0].path == "ConditionalQAPipeline.qa"
    assert back.nodes == json.loads(json.dumps(tr.nodes))
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        lt.Trace.load(tmp_path / "bad.jsonl")


def test_redact_content_keeps_only_shapes_lengths_usage(srv):
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY), temperature=0)
    with lt.trace(redact_content=True) as tr:
        llm(lt.TextTensor(["secret prompt"]))
    dumped = json.dumps([s.to_dict() for s in tr.spans], default=str)
    assert "secret prompt" not in dumped and "Echo" not in dumped
    (req,) = tr.find(kind="request")
    assert req.usage["prompt_tokens"] > 0
    assert tr.find(kind="llm")[0].inputs[0] == {"shape": [1], "chars": [13]}


def test_texts_stored_once_and_truncated(srv):
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY), temperature=0)
    long = "x" * 5000
    with lt.trace(max_text_chars=100) as tr:
        llm(lt.TextTensor([long, long, "short"]))
    llm_span = tr.find(kind="llm")[0]
    stored = llm_span.inputs[0]["texts"]
    assert len(stored[0]) < 200 and stored[0].endswith("[5000 chars]")
    assert stored[0] is stored[1]  # one string object for equal texts
    req_text = tr.find(kind="request")[0].request["messages"][-1]["content"]
    assert req_text is stored[0]


def test_no_grad_records_no_graph_and_ops_without_params_record_nothing():
    p = lt.TextParameter("Q: {}")
    with lt.no_grad():
        out = p + lt.TextTensor(["a"])
    assert out.grad_fn is None and out._cut == "no_grad"
    with lt.trace() as tr, lt.no_grad():
        lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
    assert tr.nodes == [] and tr.find(kind="op") == []
    plain = lt.TextTensor("Q: {}") + lt.TextTensor(["a"])
    assert plain.grad_fn is None  # no parameter, no trace: nothing recorded


def test_history_and_short_callresult_repr(srv):
    backend = OpenAIBackend("m", base_url=srv.url, api_key=KEY, history=3)
    llm = lt.nn.LLM(backend, temperature=0)
    llm(lt.TextTensor([f"q{i}" for i in range(5)]))
    assert len(backend.history) == 3
    buf = io.StringIO()
    records = lt.inspect_history(2, backend=backend, file=buf)
    assert [r["response"] for r in records] == [["Echo: q3"], ["Echo: q4"]]
    assert "user: q4" in buf.getvalue() and "assistant: Echo: q4" in buf.getvalue()
    assert len(repr(llm.last_call)) < 200 and "requests=5" in repr(llm.last_call)
    with pytest.raises(ValueError):
        lt.inspect_history(0)


def test_inspect_module_passes_through(capsys):
    x = lt.TextTensor(["a" * 500, "b"])
    x.metadata["score"] = np.array([0.5, 1.0])
    ins = lt.Inspect("here", max_chars=20)
    assert ins(x) is x
    out = capsys.readouterr().out
    assert "[here] TextTensor shape (2,)" in out and "[500 chars]" in out and "score=" in out
    with pytest.raises(ValueError):
        lt.Inspect(max_entries=0)


def test_records_and_pandas_have_one_row_per_span(srv):
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY), temperature=0)
    with lt.trace() as tr:
        lt.TChain(lt.TLayer("Q: {}"), llm)(lt.TextTensor(["a", "b"]))
    rows = tr.to_records()
    assert len(rows) == len(tr.spans)
    assert [r["kind"] for r in rows].count("request") == 2
    req = next(r for r in rows if r["kind"] == "request")
    assert req["prompt_tokens"] > 0 and "duration" in req and req["parent_id"] is not None
    pd = pytest.importorskip("pandas")
    df = tr.to_pandas()
    assert isinstance(df, pd.DataFrame) and list(df["kind"]) == [r["kind"] for r in rows]


def test_a_backend_declares_its_secrets_through_the_public_method():
    # Secrets that do not look like keys are redacted only because the backend declares them:
    # through redaction_secrets() (public), or the deprecated _secrets override (still honoured).
    from langtorch.backends import Backend
    from langtorch.core import Choice, Completion, HasSecrets, Usage, secrets_of

    secret = "hunter22-password"

    class Leaky(Backend):
        async def complete(self, request):
            return Completion((Choice(f"my password is {secret}"),), Usage(3, 4))

        def redaction_secrets(self):
            return (secret,)

    with pytest.warns(DeprecationWarning, match="redaction_secrets"):
        class Legacy(Backend):
            async def complete(self, request):
                return Completion((Choice(f"my password is {secret}"),), Usage(3, 4))

            def _secrets(self):
                return (secret,)

    for cls in (Leaky, Legacy):
        backend = cls("m", history=2)
        assert isinstance(backend, HasSecrets) and secrets_of(backend) == (secret,)
        with lt.trace() as tr:
            out = lt.nn.LLM(backend)(lt.TextTensor(["q"]))
        assert secret in out.item()  # the answer itself is the user's
        stored = json.dumps([s.to_dict() for s in tr.spans], default=str)
        assert secret not in stored and "my password is ***" in stored, cls
        buf = io.StringIO()
        lt.inspect_history(1, backend=backend, file=buf)
        assert secret not in buf.getvalue() and "my password is ***" in buf.getvalue(), cls
    key = "sk-test-secret-abcdef123456"
    api = OpenAIBackend("m", base_url="http://127.0.0.1:9", api_key=key)
    assert api.redaction_secrets() == (key,) and key not in repr(api)
