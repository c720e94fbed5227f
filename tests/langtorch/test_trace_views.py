"""Views of a trace: the terminal tree, the HTML page (run in a real headless Chromium), the DOT
graph (rendered by Graphviz) and the OpenTelemetry export (checked with the SDK's in-memory
exporter). Traces come from real pipelines against the loopback OpenAI server."""

from __future__ import annotations

import html.parser
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.functional.errors import LangTorchError
from langtorch.testing import default_responder
from langtorch.tracing import Span, Trace
from langtorch.tracing._otel import export_otel, require_otel
from langtorch.tracing._views import render_dot, render_graph, render_html, render_tree

KEY = "sk-test1234"
XSS = "</script><script>alert(1)</script>"


def _llm(srv, **kwargs):
    backend_kwargs = {k: kwargs.pop(k) for k in ("cache", "max_retries") if k in kwargs}
    return lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY, **backend_kwargs), **kwargs)


def _chain(srv, **kwargs):
    return lt.TChain(lt.TLayer("Q: {}"), _llm(srv, **kwargs))


def _run(srv, texts, *, trace_kwargs=None, raises=False, **kwargs):
    chain = _chain(srv, **kwargs)
    with lt.trace(**(trace_kwargs or {})) as tr:
        if raises:
            with pytest.raises(LangTorchError):
                chain(lt.TextTensor(texts))
        else:
            chain(lt.TextTensor(texts))
    return tr


def _line(tree: str, needle: str) -> str:
    lines = [ln for ln in tree.splitlines() if needle in ln]
    assert lines, f"no line with {needle!r} in:\n{tree}"
    return lines[0]


def _synthetic(n_requests: int, text: str = "question") -> Trace:
    """A hand-built trace: one module, one llm span, ``n_requests`` request spans."""
    tr = Trace(name="synthetic")
    tr.start, tr.end = 1000.0, 1000.0 + n_requests * 0.001 + 0.01
    root = Span(1, "Pipeline", "module", "Pipeline")
    llm = Span(2, "LLM", "llm", "Pipeline.llm", root)
    root.children.append(llm)
    for s in (root, llm):
        s.start, s.end = tr.start, tr.end
        s.inputs = s.outputs = [{"shape": [n_requests], "texts": [text] * min(n_requests, 10)}]
    llm.attrs = {"model": "m", "backend": "OpenAIBackend(model='m')"}
    llm.usage = {"prompt_tokens": 3 * n_requests, "completion_tokens": 2 * n_requests}
    tr.spans = [root, llm]
    for i in range(n_requests):
        r = Span(3 + i, "request", "request", "Pipeline.llm", llm)
        r.start, r.end = tr.start + i * 0.001, tr.start + i * 0.001 + 0.005
        r.request = {"model": "m", "messages": [{"role": "user", "content": f"{text} {i}"}]}
        r.response = {"model": "m", "choices": [{"text": f"answer {i}", "finish_reason": "stop"}]}
        r.usage = {"prompt_tokens": 3, "completion_tokens": 2}
        r.cached, r.attempts, r.attrs = i % 3 == 0, 1, {"entries": [i]}
        llm.children.append(r)
        tr.spans.append(r)
    tr.roots = [root]
    return tr


# ------------------------------------------------------------------------------------- tree
def test_tree_shows_paths_shapes_tokens_and_texts(srv, tmp_path):
    tr = _run(srv, ["a", "b"], temperature=0)
    tree = render_tree(tr)
    assert str(tr) == tree
    assert _line(tree, "TChain").startswith("TChain  [2] -> [2]")
    assert "TChain.0 TLayer  [2] -> [2]" in tree
    llm_line = _line(tree, "TChain.1 LLM")
    # Tokens as the server counted them (its own accounting of the bodies it received).
    usage = [srv._usage(body, default_responder(body)) for body in srv.bodies]
    p, c = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
    assert f"llm m  [2] -> [2]  tokens {p}+{c}" in llm_line
    assert "2 requests" in llm_line and "cached" not in llm_line
    assert '"Q: a" -> "Echo: Q: a"' in _line(tree, "request 0")
    assert '"Q: b" -> "Echo: Q: b"' in _line(tree, "request 1")
    assert re.search(r"\d+\.\d ms", llm_line)
    # op spans only with ops=True
    assert "op add" not in tree and "op add  [], [2] -> [2]" in render_tree(tr, ops=True)
    # The tree of a saved and reloaded trace is the same.
    tr.save(tmp_path / "t.jsonl")
    assert render_tree(Trace.load(tmp_path / "t.jsonl")) == tree


def test_tree_marks_cache_hits_on_a_rerun(srv, tmp_path):
    cache = tmp_path / "c.sqlite"
    _run(srv, ["a", "b"], cache=cache, temperature=0)
    sent = srv.chat_requests
    tr = _run(srv, ["a", "b"], cache=cache, temperature=0)
    assert srv.chat_requests == sent  # the rerun was answered by the cache
    tree = render_tree(tr)
    assert "2 requests (2 cached)" in _line(tree, "TChain.1 LLM")
    assert "cached" in _line(tree, "request 0") and "cached" in _line(tree, "request 1")
    assert _line(tree, "trace").startswith("trace  6 spans  2 requests (2 cached)")


def test_tree_marks_errors_and_retries(srv):
    srv.set_faults([None, "bad_request"])
    tr = _run(srv, ["a", "b"], raises=True, max_retries=0)
    tree = render_tree(tr)
    failed = [ln for ln in tree.splitlines() if "request" in ln and "✗ BackendError:" in ln]
    assert len(failed) == 1 and "HTTP 400" in failed[0]
    assert "(1 failed)" in _line(tree, "TChain.1 LLM") and "✗ " in _line(tree, "TChain.1 LLM")

    srv.set_faults(["rate_limit"])
    tr = _run(srv, ["a"], max_retries=2)
    tree = render_tree(tr)
    assert "2 attempts" in _line(tree, "request 0")
    assert "1 retry" in _line(tree, "TChain.1 LLM")
    assert "✗" not in tree


def test_tree_elides_long_texts(srv):
    long = "x" * 10_000
    tr = _run(srv, [long])
    tree = render_tree(tr, width=40)
    assert long[:100] not in tree
    assert "…" in _line(tree, "request 0")
    assert max(len(ln) for ln in tree.splitlines()) < 200


def test_tree_is_bounded_for_300_requests_and_keeps_failures(srv):
    srv.set_faults([None] * 200 + ["bad_request"])
    tr = _run(srv, [f"q{i}" for i in range(300)], raises=True, max_retries=0)
    assert len(tr.find(kind="request")) == 300
    tree = render_tree(tr)
    lines = tree.splitlines()
    assert len(lines) <= 15, tree
    assert sum("✗ BackendError" in ln for ln in lines) == 1  # the failure is shown, not hidden
    more = _line(tree, "more requests")
    assert more.strip("│ └├─").startswith("… 294 more requests")
    # 2,000 requests: still a screenful
    assert len(render_tree(_synthetic(2000)).splitlines()) <= 15


def test_tree_of_a_redacted_trace_shows_no_texts(srv):
    tr = _run(srv, ["secret question"], trace_kwargs={"redact_content": True})
    tree = render_tree(tr)
    assert "secret" not in tree and "Echo" not in tree
    assert "‹18 chars›" in _line(tree, "request 0")  # "Q: secret question"
    assert "TChain.1 LLM  llm m  [1] -> [1]" in tree


def test_tree_reads_recorded_messages_as_otel_does():
    # One reader of recorded content: text parts joined, other parts skipped, redacted parts
    # shown by length (a redacted list used to read as an empty text, '""').
    tr = _synthetic(2)
    first, second = tr.find(kind="request")
    first.request = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "look at "}, {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "this"}]}]}
    second.request = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": {"chars": 7}}, {"type": "text", "text": {"chars": 4}}]}]}
    tree = render_tree(tr)
    assert '"look at this" -> "answer 0"' in _line(tree, "request 0")
    assert "‹11 chars› -> " in _line(tree, "request 1")


def test_tree_rejects_a_bad_width():
    with pytest.raises(ValueError, match="width"):
        render_tree(Trace(), width=0)
    assert "(no spans recorded)" in render_tree(Trace())


# ------------------------------------------------------------------------------------- HTML
def _data_block(page: str) -> str:
    m = re.search(r'<script type="application/json" id="lt-data">(.*?)</script>', page, re.S)
    assert m, "no data block"
    return m.group(1)


def test_html_is_self_contained_and_escapes_script_breakouts(srv):
    tr = _run(srv, [XSS, "b & <b>c</b>", "ünï 😀"])
    page = render_html(tr)
    assert XSS not in page and "<b>c</b>" not in page
    data = json.loads(_data_block(page))
    assert data["spans"][0]["inputs"][0]["texts"] == [XSS, "b & <b>c</b>", "ünï 😀"]
    # Exactly the two scripts of the page: the data block and the code.
    assert len(re.findall(r"<script\b", page)) == 2
    # Nothing is loaded from anywhere (the data block may mention the server's URL, as text).
    outside = page.replace(_data_block(page), "")
    assert not re.search(r"\b(src|href)\s*=|@import|url\(|<link\b|<iframe\b|<img\b", outside)
    assert "innerHTML" not in outside and "outerHTML" not in outside


class _Dom(html.parser.HTMLParser):
    """Collects the page's visible text (outside script/style) and the tags it contains."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.tags: list[tuple[str, dict]] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("Chromium is not installed (apt-get install chromium); CI runs this test")


def _load(page_path, tmp_path, fragment=""):
    """The DOM after the page's script ran, and the console messages it logged."""
    proc = subprocess.run(
        [_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
         "--v=0", "--dump-dom", page_path.as_uri() + fragment],
        capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]
    dom = _Dom()
    dom.feed(proc.stdout)
    return proc.stdout, dom, console


def test_nan_is_null_in_the_html_data_and_the_saved_file(tmp_path):
    # One rule for non-finite numbers (strict JSON has none): null, in the page and the file.
    tr = _synthetic(1)
    (req,) = tr.find(kind="request")
    req.cost, req.attrs = float("nan"), {"entries": [0], "score": float("inf")}
    data = json.loads(_data_block(render_html(tr)))
    (spec,) = [d for d in data["spans"] if d["id"] == req.id]
    assert spec["cost"] is None and spec["attrs"]["score"] is None
    tr.save(tmp_path / "t.jsonl")
    strict = {"parse_constant": lambda c: pytest.fail(f"{c} in the saved trace")}
    records = [json.loads(line, **strict) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    (saved,) = [r for r in records if r.get("id") == req.id and r["type"] == "span"]
    assert saved["cost"] is None and saved["attrs"]["score"] is None
    assert Trace.load(tmp_path / "t.jsonl").find(kind="request")[0].cost is None


def test_html_runs_in_chromium(srv, tmp_path):
    tr = _run(srv, [XSS, "b"])
    target = next(s for s in tr.find(kind="request") if XSS in json.dumps(s.request))
    page = tmp_path / "trace.html"
    tr.to_html(page)
    raw, dom, console = _load(page, tmp_path, f"#span-{target.id}")
    assert console == []
    body = next(attrs for tag, attrs in dom.tags if tag == "body")
    assert body.get("data-ready") == "1", raw[-3000:]
    assert ("div", {"id": "lt-ready", "hidden": ""}) in dom.tags
    text = "\n".join(dom.text)
    assert "error:" not in text
    for path in ("TChain", "TChain.0 TLayer", "TChain.1 LLM"):
        assert path in text
    # The selected request's messages and answer, in the details pane, as text.
    assert "Q: " + XSS in text and "Echo: Q: " + XSS in text
    assert [tag for tag, _ in dom.tags].count("script") == 2  # no injected <script> element
    assert "<script>alert(1)</script>" not in raw.replace(_data_block(raw), "")
    # The timeline has one bar per request.
    assert sum(1 for tag, a in dom.tags if "lt-bar" in a.get("class", "")) == 2


def test_html_of_a_redacted_trace_in_chromium(srv, tmp_path):
    tr = _run(srv, ["secret %DATA% question"], trace_kwargs={"redact_content": True, "name": "%JS%"})
    page = tmp_path / "redacted.html"
    tr.to_html(page)
    assert "secret" not in page.read_text(encoding="utf-8")
    request = tr.find(kind="request")[0]
    raw, dom, console = _load(page, tmp_path, f"#span-{request.id}")
    assert console == [] and 'data-ready="1"' in raw
    text = "\n".join(dom.text)
    assert f"({len('Q: secret %DATA% question')} chars, content not recorded)" in text
    assert "langtorch trace: %JS%" in text and "content redacted" in text


def test_html_handles_2000_requests(tmp_path):
    tr = _synthetic(2000, text=XSS)
    page = tmp_path / "big.html"
    tr.to_html(page)
    raw, dom, console = _load(page, tmp_path, "#span-1900")
    assert console == []
    assert 'data-ready="1"' in raw
    rows = [a for tag, a in dom.tags if "lt-row" in a.get("class", "").split()]
    # Children are paged in 50 at a time: revealing span 1900 (request 1897) pages in the
    # requests up to it (1,900 of them), not all 2,000.
    assert len(rows) == 2 + 1900
    selected = [a for a in rows if "sel" in a.get("class", "").split()]
    assert [a.get("data-span") for a in selected] == ["1900"]
    bars = sum(1 for tag, a in dom.tags if "lt-bar" in a.get("class", ""))
    assert bars == 200  # the timeline shows the first 200 and a "show more" button
    text = "\n".join(dom.text)
    assert "more of" in text and f"{XSS} 1897" in text


def test_html_first_page_is_small_for_2000_requests(tmp_path):
    page = tmp_path / "big.html"
    _synthetic(2000).to_html(page)
    raw, dom, console = _load(page, tmp_path)
    assert console == [] and 'data-ready="1"' in raw
    rows = [a for tag, a in dom.tags if "lt-row" in a.get("class", "").split()]
    assert len(rows) <= 2  # the llm span with 2,000 children starts collapsed


# -------------------------------------------------------------------------------------- DOT
def _svg_texts(dot: str) -> list[str]:
    graphviz = pytest.importorskip("graphviz")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz 'dot' is not installed (apt-get install graphviz)")
    svg = graphviz.Source(dot).pipe(format="svg").decode("utf-8")
    root = ET.fromstring(svg)
    return [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]


def test_dot_of_a_pipeline_renders_with_parameters_highlighted(srv):
    tr = _run(srv, ["a", "b"])
    dot = render_dot(tr)
    assert dot.startswith("digraph langtorch {")
    param = next(n for n in tr.nodes if n["op"] == "parameter")
    assert re.search(rf'"{param["id"]}" \[label="prompt\\n\[\]  requires_grad\\n\\"Q: {{}}\\"".*fillcolor="#fde68a"', dot)
    assert f'"{param["id"]}" -> "n' in dot and 'label="template"' in dot
    assert 'label="TChain.0"' in dot and 'label="TChain.1"' in dot  # clusters by module path
    texts = _svg_texts(dot)
    assert {"add", "llm", "prompt", "TChain.0", "TChain.1"} <= set(texts)
    assert '"Q: {}"' in texts  # the parameter's value, braces intact
    assert "template" in texts and "input" in texts


def test_dot_escapes_quotes_backslashes_newlines_braces_and_unicode():
    tr = Trace()
    weird = 'say "{x}" \\ {{y}} <b>&amp;</b> ünï 😀\nnext line'
    tr.nodes = [
        {"id": "p1", "op": "parameter", "name": 'tmpl "1"', "path": 'A.b"c', "shape": [2],
         "requires_grad": False, "value": [weird, "second"]},
        {"id": 1, "op": "fill\\op", "path": 'A.b"c', "shape": [2],
         "inputs": [{"node": "p1", "role": "template", "shape": [2]},
                    {"node": None, "role": 'va"l\nues', "shape": [2]}]},
        {"id": 2, "op": "llm", "path": "A", "shape": [2], "inputs": [{"node": 1, "role": "input", "shape": [2]},
                                                                   {"node": 99, "role": "x", "shape": [2]}]},
    ]
    dot = render_dot(tr)
    texts = _svg_texts(dot)
    assert 'tmpl "1"' in texts and "fill\\op" in texts and 'A.b"c' in texts
    assert 'va"l' in texts and "ues" in texts  # a newline in a role breaks the line, nothing else
    assert json.dumps(weird[:39] + "…", ensure_ascii=False) + " (+1)" in texts  # the value, visibly escaped
    assert "frozen" in " ".join(texts) and "(outside this trace)" in texts
    assert 'fillcolor="#e5e7eb"' in dot  # a frozen parameter is grey


def test_dot_of_a_trace_without_graph_is_a_valid_empty_graph():
    dot = render_dot(Trace())
    assert dot.startswith("digraph") and "No provenance graph" in dot
    assert any("No provenance graph" in t for t in _svg_texts(dot))


def test_render_graph_writes_svg(srv, tmp_path):
    pytest.importorskip("graphviz")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz 'dot' is not installed (apt-get install graphviz)")
    tr = _run(srv, ["a"])
    out = tr.render(tmp_path / "graph.svg")
    assert out == str(tmp_path / "graph.svg")
    assert ET.parse(out).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    assert render_graph(tr, tmp_path / "graph.png", format="png") == str(tmp_path / "graph.png")
    assert (tmp_path / "graph.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_render_graph_names_the_install_commands(monkeypatch, tmp_path):
    pytest.importorskip("graphviz")
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot on PATH
    with pytest.raises(RuntimeError, match=r"apt-get install graphviz.*brew install graphviz"):
        render_graph(Trace(), tmp_path / "g.svg")
    monkeypatch.setitem(sys.modules, "graphviz", None)  # the package missing
    with pytest.raises(RuntimeError, match=r"pip install graphviz"):
        render_graph(Trace(), tmp_path / "g.svg")


# ------------------------------------------------------------------------------ OpenTelemetry
@pytest.fixture
def otel():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _everything(o) -> str:
    """Every string an exported span carries: name, attributes, events, status."""
    parts = [o.name, o.status.description or ""]
    parts += [f"{k}={v!r}" for k, v in o.attributes.items()]
    parts += [f"{e.name} {dict(e.attributes)!r}" for e in o.events]
    return "\n".join(parts)


def test_otel_follows_the_genai_conventions(srv, otel):
    provider, exporter = otel
    tr = _run(srv, ["a", "b c"], temperature=0.5, max_tokens=20, top_p=0.9, seed=3)
    export_otel(tr, tracer_provider=provider)
    spans = exporter.get_finished_spans()
    assert len(spans) == len(tr.spans)
    by_lt = {o.attributes["langtorch.span_id"]: o for o in spans}
    by_otel = {o.context.span_id: o for o in spans}
    for s in tr.spans:  # same tree, same times
        o = by_lt[s.id]
        parent = by_otel[o.parent.span_id].attributes["langtorch.span_id"] if o.parent else None
        assert parent == s.parent_id
        assert o.context.trace_id == spans[0].context.trace_id
        assert o.start_time == round(s.start * 1e9) and o.end_time == round(s.end * 1e9)
        assert o.attributes["langtorch.kind"] == s.kind and o.attributes.get("langtorch.path") == s.path
    requests = [by_lt[s.id] for s in tr.find(kind="request")]
    assert len(requests) == 2
    for o in requests:
        a = o.attributes
        assert o.name == "chat m" and o.kind.name == "CLIENT"
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
        assert a["gen_ai.request.model"] == "m" and a["gen_ai.response.model"] == "m"
        assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.max_tokens"] == 20
        assert a["gen_ai.request.top_p"] == 0.9 and a["gen_ai.request.seed"] == 3
        assert a["gen_ai.response.finish_reasons"] == ("stop",)
        messages = json.loads(a["gen_ai.input.messages"])
        body = next(b for b in srv.bodies if b["messages"][-1]["content"] == messages[-1]["parts"][0]["content"])
        usage = srv._usage(body, default_responder(body))  # the server's own accounting
        assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        assert messages[-1]["role"] == "user" and messages[-1]["parts"][0]["type"] == "text"
        output = json.loads(a["gen_ai.output.messages"])
        assert output == [{"role": "assistant", "finish_reason": "stop",
                           "parts": [{"type": "text", "content": "Echo: " + messages[-1]["parts"][0]["content"]}]}]
    llm = by_lt[tr.find(kind="llm")[0].id]
    assert llm.name == "chat m" and llm.attributes["gen_ai.request.temperature"] == 0.5
    # The batch's totals do not repeat gen_ai.usage.* (backends sum those over spans).
    assert "gen_ai.usage.input_tokens" not in llm.attributes
    assert llm.attributes["langtorch.usage.input_tokens"] == sum(o.attributes["gen_ai.usage.input_tokens"] for o in requests)
    assert by_lt[1].name == "TChain" and by_lt[2].name == "TChain.0 TLayer"
    assert by_lt[1].attributes["langtorch.input.texts"] == ("a", "b c")


def test_otel_without_content_and_without_keys(otel):
    from langtorch.testing import OpenAIServer

    provider, exporter = otel
    leaked = "my key is sk-test1234abcdef"
    with OpenAIServer(api_key="sk-test-server-secret") as server:
        ok = lt.nn.LLM(OpenAIBackend("m", base_url=server.url, api_key="sk-test-server-secret"))
        bad = lt.nn.LLM(OpenAIBackend("m", base_url=server.url, api_key="sk-test-wrong-key-123", max_retries=0))
        with lt.trace() as tr:
            ok(lt.TextTensor([leaked]))
            with pytest.raises(LangTorchError):
                bad(lt.TextTensor(["hi"]))
    export_otel(tr, tracer_provider=provider)
    spans = exporter.get_finished_spans()
    assert spans and all("sk-test" not in _everything(o) for o in spans)
    assert "my key is ***" in "".join(_everything(o) for o in spans)  # redacted, not dropped
    failed = [o for o in spans if o.attributes.get("error.type")]
    assert {o.attributes["langtorch.kind"] for o in failed} == {"llm", "request"}
    assert all(o.status.status_code.name == "ERROR" for o in failed)
    assert all(any(e.name == "exception" for e in o.events) for o in failed)

    exporter.clear()
    export_otel(tr, capture_content=False, tracer_provider=provider)
    spans = exporter.get_finished_spans()
    assert len(spans) == len(tr.spans)
    for o in spans:
        assert not any("messages" in k or "texts" in k for k in o.attributes)
        assert "my key" not in _everything(o) and "Echo" not in _everything(o)
    assert any(o.attributes.get("gen_ai.usage.input_tokens") for o in spans)  # usage still there


def test_otel_tool_embed_and_cached_spans(srv, otel, tmp_path):
    provider, exporter = otel
    llm = _llm(srv, cache=tmp_path / "c.sqlite")
    llm(lt.TextTensor(["a"]))
    embed = lt.nn.Embed(OpenAIBackend("e", base_url=srv.url, api_key=KEY))
    with lt.trace() as tr:
        llm(lt.TextTensor(["a"]))
        embed(lt.TextTensor(["x", "y"]))
        with lt.tracing.span("tool", "search", inputs=[lt.TextTensor("query")]) as s:
            lt.tracing.set_outputs(s, lt.TextTensor("result"))
    tr.export_otel(tracer_provider=provider)
    by_name = {o.name: o for o in exporter.get_finished_spans()}
    tool = by_name["execute_tool search"].attributes
    assert tool["gen_ai.operation.name"] == "execute_tool" and tool["gen_ai.tool.name"] == "search"
    assert tool["gen_ai.tool.call.arguments"] == "query" and tool["gen_ai.tool.call.result"] == "result"
    emb = by_name["embeddings e"].attributes
    assert emb["gen_ai.operation.name"] == "embeddings" and emb["gen_ai.request.model"] == "e"
    assert emb["gen_ai.usage.input_tokens"] > 0
    request = next(o for o in exporter.get_finished_spans() if o.attributes["langtorch.kind"] == "request")
    assert request.attributes["langtorch.cached"] is True


def test_otel_keeps_the_recorded_role_and_reads_content_like_the_views(otel):
    # A recorded message without a role (a request its backend refused) is exported as sent,
    # with role "unknown": never guessed as "user".
    provider, exporter = otel
    tr = _synthetic(1)
    (req,) = tr.find(kind="request")
    req.request = {"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"content": [{"type": "text", "text": "a "}, {"type": "input_audio"}, {"text": "b"}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    export_otel(tr, tracer_provider=provider)
    (o,) = [o for o in exporter.get_finished_spans() if o.attributes["langtorch.kind"] == "request"]
    messages = json.loads(o.attributes["gen_ai.input.messages"])
    assert messages == [{"role": "developer", "parts": [{"type": "text", "content": "be brief"}]},
                        {"role": "unknown", "parts": [{"type": "text", "content": "a b"}]}]


def test_otel_trace_flag_and_missing_package(monkeypatch):
    # otel=True exports to the global provider (a no-op one here: never set in this process).
    with lt.trace(otel=True) as tr:
        lt.TLayer("Q: {}")(lt.TextTensor(["a"]))
    assert tr.spans
    require_otel()
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with pytest.raises(ImportError, match=r"pip install opentelemetry-sdk"):
        require_otel()
    with pytest.raises(ImportError, match=r"otel"):
        lt.trace(otel=True).__enter__()
