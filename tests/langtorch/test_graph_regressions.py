"""Regression tests for defects found in review of the graph, tracing and text-optimization code.
Each fails when its bug is put back."""

import asyncio
import io
import json
import threading

import numpy as np
import pytest
import torch

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.errors import BudgetExceededError, GraphError, OptimizerError

KEY = "sk-test-abcdef123456"


def _backend(srv, **kw):
    kw.setdefault("api_key", KEY)
    return OpenAIBackend("m", base_url=srv.url, **kw)


# ------------------------------------------------------------------------------ tracing
def test_trace_only_nodes_do_not_make_tensors_require_grad():
    with lt.trace() as tr:
        t = lt.TextTensor("x") + "y"
    assert t.requires_grad is False and t.grad_fn is None and t.is_leaf
    u = t + "z"
    assert u._grad_fn is None  # recording does not continue after the trace
    assert tr.nodes  # the trace still has its graph for the DOT view
    with lt.trace():
        loss = lt.nn.MetricLoss("exact_match")(lt.TextTensor("a") + "b", "c")
    with pytest.raises(GraphError):
        loss.backward()


def test_spans_from_many_threads_keep_their_parents():
    def work(i):
        with lt.tracing.span("tool", f"outer{i}") as outer:
            for _ in range(200):
                with lt.tracing.span("tool", "inner") as inner:
                    assert inner.parent is outer

    with lt.trace() as tr:
        import contextvars

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(work, i)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(tr.roots) == 8 and len(tr.spans) == 8 * 201
    assert all(s.id == i + 1 for i, s in enumerate(tr.spans))
    assert all(len(r.children) == 200 for r in tr.roots)


def test_redact_content_covers_metadata_params_and_every_view(srv, tmp_path):
    class Tag(lt.TModule):
        def forward(self, x):
            out = x.map(str.upper)
            out.metadata["label"] = np.array(["METASECRET-1"], dtype=object).astype(str)
            return out

    llm = lt.nn.LLM(_backend(srv), temperature=0, stop=["STOPSECRET"], user="USERSECRET")
    chain = lt.TChain(Tag(), llm)
    with lt.trace(redact_content=True) as tr:
        chain(lt.TextTensor(["PROMPTSECRET"]))
    tr.save(tmp_path / "t.jsonl")
    views = [(tmp_path / "t.jsonl").read_text(), tr.to_html(), tr.to_dot(), str(tr)]
    for secret in ("METASECRET", "STOPSECRET", "USERSECRET", "PROMPTSECRET"):
        assert not any(secret in v for v in views), secret


def test_the_backends_own_key_is_redacted_even_when_not_key_shaped(srv, tmp_path):
    key = "gsk_live_0123456789abcdefXYZ"
    backend = _backend(srv, api_key=key)
    llm = lt.nn.LLM(backend, temperature=0)
    with lt.trace() as tr:
        llm(lt.TextTensor([f"debug: my key is {key}", "BEARER abc.def-secret"]))
    tr.save(tmp_path / "t.jsonl")
    views = [(tmp_path / "t.jsonl").read_text(), tr.to_html(), str(tr)]
    assert not any(key in v for v in views)
    assert not any("abc.def-secret" in v for v in views)
    buf = io.StringIO()
    lt.inspect_history(2, backend=backend, file=buf)
    assert key not in buf.getvalue()


def test_tracing_never_breaks_a_call_with_bearer_like_params(srv):
    llm = lt.nn.LLM(_backend(srv), temperature=0)
    plain = llm(lt.TextTensor("hi"), stop=['Bearer x"y'])
    with lt.trace():
        traced = llm(lt.TextTensor("hi"), stop=['Bearer x"y'])
    assert traced.tolist() == plain.tolist()


def test_paths_through_module_lists_and_async_calls(srv):
    llm = lt.nn.LLM(_backend(srv), temperature=0)

    class P(lt.TModule):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([lt.TLayer("A {}"), lt.TLayer("B {}")])
            self.llm = llm

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

        async def aforward(self, x):
            return await self.llm.acall(x)

    p = P()
    with lt.trace() as tr:
        p(lt.TextTensor("x"))
        asyncio.run(p.aforward(lt.TextTensor("y")))
    assert [s.path for s in tr.find(kind="module")] == ["P", "P.layers.0", "P.layers.1"]
    assert [s.path for s in tr.find(kind="llm")] == ["LLM"]  # called directly, outside P's forward


def test_streams_are_traced_and_remembered(srv):
    backend = _backend(srv)
    llm = lt.nn.LLM(backend, stream=True)
    with lt.trace() as tr:
        text = "".join(llm(lt.TextTensor("hello")))
    (span,) = tr.find(kind="llm")
    (req,) = tr.find(kind="request")
    assert span.outputs[0]["texts"] == [text] and req.response["choices"][0]["text"] == text
    assert backend.history[-1]["response"] == [text]


def test_grad_mode_is_per_task_and_decorates_coroutines():
    ng = lt.no_grad()
    p = lt.TextParameter("{}")

    async def task(delay):
        with ng:
            await asyncio.sleep(delay)
            return (p + "x").requires_grad

    async def main():
        return await asyncio.gather(task(0.02), task(0.01))

    assert asyncio.run(main()) == [False, False]
    assert lt.is_grad_enabled()

    @lt.no_grad()
    async def coro():
        return lt.is_grad_enabled()

    assert asyncio.run(coro()) is False
    with pytest.raises(TypeError, match="generator"):
        lt.no_grad()(lambda: (yield))


def test_user_subclasses_keep_their_type_when_recorded():
    class MyT(lt.TextTensor):
        __slots__ = ()

    x = MyT(["a", "b"])
    with lt.trace():
        assert type(x.reshape(2, 1)) is MyT and type(x + "!") is MyT


@pytest.mark.parametrize("lines", [
    [],
    [{"type": "span", "id": 1, "name": "a", "kind": "module"}],
    [{"type": "trace"}, {"type": "span", "name": "a", "kind": "module"}],
    [{"type": "trace"}, {"type": "span", "id": 1, "name": "a", "kind": "module", "parent_id": 2, "children": [2]},
     {"type": "span", "id": 2, "name": "b", "kind": "module", "parent_id": 1, "children": [1]}],
    [{"type": "trace"}, {"type": "span", "id": 1, "name": "a", "kind": "module", "children": "x"}],
])
def test_trace_load_rejects_hostile_files(tmp_path, lines):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    with pytest.raises(ValueError):
        lt.Trace.load(path)


def test_failing_ops_close_their_span_and_graph_false_keeps_op_spans():
    p = lt.TextParameter(["a", "b"])
    with lt.trace() as tr, pytest.raises(lt.errors.ShapeError):
        p.reshape(3)
    (span,) = tr.find(kind="op")
    assert span.end is not None and span.error["type"] == "ShapeError"
    with lt.trace(graph=False) as tr2:
        (lt.TextTensor("a {}") + "b").reshape(1)
    assert [s.name for s in tr2.find(kind="op")] == ["add", "reshape"] and tr2.nodes == []
    with lt.trace() as tr3:
        lt.TextTensor([lt.TextTensor("a"), lt.TextTensor("b")])
    assert [s.name for s in tr3.find(kind="op")] == ["stack"]


# ------------------------------------------------------------------------ optimization
class QA(lt.TModule):
    def __init__(self):
        super().__init__()
        self.prompt = lt.TextParameter("Context: {ctx} Question: {q}")

    def forward(self, ctx, q):
        return self.prompt * lt.TextTensor({"ctx": ctx, "q": q})


def test_functional_call_detects_a_module_that_does_not_broadcast_candidates():
    ctx, q = lt.TextTensor("C", template=False), lt.TextTensor(["q0", "q1"], template=False)
    cands = lt.TextTensor(["A {ctx} {q}", "B {ctx} {q}"])
    with pytest.warns(RuntimeWarning, match="once per candidate"):
        out = lt.func.functional_call(QA(), {"prompt": cands}, ctx, q)
    assert out.tolist() == [["A C q0", "A C q1"], ["B C q0", "B C q1"]]
    with pytest.raises(lt.errors.ShapeError):
        lt.func.functional_call(QA(), {"prompt": cands}, ctx, q, batching="broadcast")
    # The common case stays one batched call, without a warning.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = lt.func.functional_call(lt.TLayer("Q: {}"), {"prompt": ["A {}", "B {}"]}, lt.TextTensor(["x", "y"]))
    assert out.tolist() == [["A x", "A y"], ["B x", "B y"]]


def test_a_budget_entered_twice_counts_each_attempt_once(srv):
    budget = lt.optim.Budget(max_calls=3)
    llm = lt.nn.LLM(_backend(srv), temperature=0)
    with budget, budget:
        llm(lt.TextTensor(["a", "b", "c"]))
    assert budget.calls == 3


def test_feedback_shown_to_the_engine_is_worst_first(srv):
    seen = []

    def answer(body):
        content = body["messages"][-1]["content"]
        seen.append(content)
        return "merged"

    srv.responder = answer
    p = lt.TextParameter("{}")
    x = lt.TextTensor([f"q{i}" for i in range(12)])
    y = lt.TextTensor([f"q{i}" for i in range(8)] + ["w"] * 4)
    loss = lt.nn.MetricLoss("exact_match")(p + x, y)
    loss.backward(feedback_engine=_backend(srv), max_feedback=8)
    first = seen[0]
    assert first.count("is wrong") == 4  # all four wrong entries made it into the first merge
    assert p.grad.metadata["count"] == 12


def test_tgd_refuses_a_step_that_cannot_fit_and_restores_on_closure_failure(srv):
    srv.responder = lambda body: json.dumps({"reasoning": "r", "improved_variable": "New {x}"})
    p = lt.TextParameter(["A {x}", "B {x}", "C {x}"])
    p.grad = lt.TextTensor(["f", "f", "f"])
    opt = lt.optim.TGD([p], _backend(srv), max_calls=2)
    srv.reset()
    with pytest.raises(BudgetExceededError, match="nothing was sent"):
        opt.step()
    assert srv.chat_requests == 0 and p.tolist() == ["A {x}", "B {x}", "C {x}"]
    srv.responder = lambda body: json.dumps({"reasoning": "r", "improved_variable": "New {q}"})
    q = lt.TextParameter("Old {q}")
    q.grad = lt.TextTensor("f")
    calls = iter([0.5, RuntimeError("closure broke")])

    def closure():
        v = next(calls)
        if isinstance(v, Exception):
            raise v
        return v

    opt2 = lt.optim.TGD([q], _backend(srv))
    with pytest.raises(RuntimeError):
        opt2.step(closure)
    assert str(q) == "Old {q}" and opt2.step_count == 0


def test_tgd_escapes_literal_json_braces_and_sizes_max_tokens(srv):
    srv.responder = lambda body: json.dumps({"reasoning": "r", "improved_variable": 'Reply {q} as {"label": 1}'})
    p = lt.TextParameter("Reply {q}")
    p.grad = lt.TextTensor("use JSON")
    lt.optim.TGD([p], _backend(srv)).step()
    assert str(p) == 'Reply {q} as {{"label": 1}}'
    assert (lt.TextTensor(str(p)) + "x").item() == 'Reply x as {"label": 1}'
    long = lt.TextParameter("word " * 1000 + "{q}")
    long.grad = lt.TextTensor("shorter")
    srv.responder = lambda body: json.dumps({"reasoning": "r", "improved_variable": "short {q}"})
    lt.optim.TGD([long], _backend(srv)).step()
    assert srv.bodies[-1]["max_tokens"] > 2000


def test_per_entry_system_prompts_and_failed_entries_send_no_feedback(srv):
    srv.responder = lambda body: "fb" if "How should" in body["messages"][-1]["content"] else "answer"
    backend = _backend(srv)
    llm = lt.nn.LLM(backend, system="MODULE", temperature=0)
    x = lt.nn.chat([[{"role": "user", "content": "q1"}], [{"role": "user", "content": "q2"}]],
                   system=["OWN", ""])
    loss = lt.nn.MetricLoss(lambda a, b: (0.0, "bad"))(llm(x), "t")
    loss.backward(feedback_engine=backend)
    assert llm.system.grad.metadata["count"] == 1  # only entry 1 used the module's system prompt

    srv.set_faults([None, "bad_request"])  # the second request fails
    p = lt.TextParameter("Q: {}")
    llm2 = lt.nn.LLM(_backend(srv, max_retries=0), temperature=0)
    with pytest.raises(lt.errors.BatchError) as info:
        llm2(p + lt.TextTensor(["a", "b"]))
    srv.set_faults(None)
    srv.reset()
    partial = info.value.results
    lt.nn.MetricLoss(lambda a, b: (0.0, "bad"))(partial, "t").backward(feedback_engine=backend)
    asked = [b["messages"][-1]["content"] for b in srv.bodies]
    assert len(asked) == 1 and "Q: a" in asked[0] or "Q: b" in asked[0]


def test_llm_engine_runtime_switches_stay_out_of_requests(srv):
    srv.responder = lambda body: "fb"
    backend = _backend(srv)
    engine = lt.nn.LLM(backend, temperature=0, use_cache=False, n=3)
    llm = lt.nn.LLM(backend, temperature=0)
    p = lt.TextParameter("Q: {}")
    loss = lt.nn.MetricLoss(lambda a, b: (0.0, "bad"))(llm(p + "x"), "t")
    srv.reset()
    loss.backward(feedback_engine=engine)
    assert all(not ({"use_cache", "progress", "n"} & set(b)) for b in srv.bodies)


def test_accumulated_scores_are_weighted_and_targets_get_no_feedback():
    p = lt.TextParameter(["A {}", "B {}"])
    ref = lt.TextParameter("gold")
    for score in (1.0, 0.0):
        out = p + lt.TextTensor(["x"]).reshape(1)
        lt.nn.MetricLoss(lambda a, b, s=score: s)(out[0:1] if score else out, ref).backward()
    assert p.grad.metadata["count"].tolist() == [2, 1]
    assert p.grad.metadata["score"].tolist() == [0.5, 0.0]
    assert ref.grad is None


def test_backward_requests_of_one_level_run_concurrently(srv):
    srv.responder = lambda body: "fb"
    srv.latency = 0.05
    backend = _backend(srv)
    llm = lt.nn.LLM(backend, temperature=0)
    p = lt.TextParameter("Q: {}")
    loss = lt.nn.MetricLoss(lambda a, b: (0.0, "bad"))(llm(p + lt.TextTensor([f"x{i}" for i in range(8)])), "t")
    srv.reset()
    loss.backward(feedback_engine=backend)
    assert srv.max_in_flight > 1


def test_fewshot_refuses_outputs_that_do_not_pair_with_inputs(srv):
    llm = lt.nn.LLM(_backend(srv), temperature=0.7, n=2)

    class Prog(lt.TModule):
        def __init__(self):
            super().__init__()
            self.demos = lt.TextParameter("")
            self.llm = llm

        def forward(self, x):
            return self.llm(self.demos + x)

    prog = Prog()
    opt = lt.optim.FewShot([prog.demos], "contains", k=1, module=prog,
                           inputs=lt.TextTensor(["a"]), targets=lt.TextTensor(["a"]))
    with pytest.raises(OptimizerError, match="input's shape"):
        opt.step()


def test_optimizer_state_refuses_other_parameter_shapes(srv):
    a = lt.TextParameter(["x", "y", "z"])
    opt = lt.optim.TGD([a], _backend(srv))
    sd = opt.state_dict()
    other = lt.optim.TGD([lt.TextParameter(["x"] * 5)], _backend(srv))
    with pytest.raises(ValueError, match="shapes"):
        other.load_state_dict(sd)


def test_script_errors_in_user_callables_are_server_errors_not_misses(srv):
    from langtorch.testing import Script

    def broken(body):
        raise KeyError("missing")

    srv.responder = Script([("x", broken)])
    with pytest.raises(lt.errors.BackendError) as info:
        lt.nn.LLM(_backend(srv, max_retries=0))(lt.TextTensor("x"))
    assert getattr(info.value, "status", None) == 500
    srv.responder = Script(strict=True)
    with pytest.raises(lt.errors.BackendError) as info:
        lt.nn.LLM(_backend(srv, max_retries=0))(lt.TextTensor("y"))
    assert getattr(info.value, "status", None) == 400


class Roll(lt.TModule):
    """Reorders each candidate row differently: it does not broadcast candidates."""

    def __init__(self):
        super().__init__()
        self.prompt = lt.TextParameter("A {}")

    def forward(self, x):
        out = self.prompt + x
        if out.ndim == 2:
            return lt.stack([out[i][np.roll(np.arange(out.shape[1]), i)] for i in range(out.shape[0])])
        return out


@pytest.mark.parametrize("make_input", [
    lambda: lt.TextTensor(["x", "y"], template=False),
    lambda: lt.TextParameter(["x", "y"]),
    lambda: lt.TextParameter("{}") + lt.TextTensor(["x", "y"], template=False),
])
def test_functional_call_checks_inputs_that_have_a_graph_too(make_input):
    x = make_input()
    with pytest.warns(RuntimeWarning, match="once per candidate"):
        out = lt.func.functional_call(Roll(), {"prompt": ["A {}", "B {}"]}, x)
    assert out.tolist() == [["A x", "A y"], ["B x", "B y"]]
    if not x.requires_grad:
        assert out.grad_fn is None  # the check's temporary graph does not leak out
    batched = lt.func.functional_call(lt.TLayer("{}"), {"prompt": ["A {}", "B {}"]}, lt.TextTensor(["x"]))
    assert batched.grad_fn is None


def test_empty_inputs_through_functional_call_and_demos():
    out = lt.func.functional_call(lt.TLayer("Q: {}"), {"prompt": ["A {}", "B {}"]}, lt.TextTensor([]))
    assert out.shape == (2, 0)
    emb = lambda texts: np.ones((len(texts), 2), np.float32)  # noqa: E731
    demos = lt.nn.Demos(1, embedder=emb, pool=[("a", "b")])
    assert demos(lt.TextTensor([])).shape == (0,)
    bad = lt.nn.Demos(1, embedder=lambda texts: np.ones((len(texts) + 1, 2), np.float32), pool=[("a", "b")])
    with pytest.raises(ValueError, match="embedder"):
        bad(lt.TextTensor(["q"]))
    with pytest.raises(ValueError, match="max_pool"):
        lt.optim.FewShot([demos.pool], "exact_match", module=lt.TChain(demos), max_pool=0)


def test_override_parameters_nests_and_is_private_to_its_context():
    """nn's public seam under functional_call: the override reads through module attributes,
    stacks on an outer one, ends with the block, and is not seen by another thread."""
    from langtorch.nn.modules import override_parameters

    layer = lt.TLayer("Q: {}")
    seen = []
    with override_parameters([(layer.prompt, lt.TextTensor("A: {}"))]):
        other = threading.Thread(target=lambda: seen.append(str(layer.prompt)))
        other.start()
        other.join()
        with override_parameters([]):
            assert layer(lt.TextTensor("x")).item() == "A: x"
    assert seen == ["Q: {}"] and layer(lt.TextTensor("x")).item() == "Q: x"
    with pytest.raises(TypeError, match="TextParameter, value"):
        with override_parameters([("prompt", lt.TextTensor("A: {}"))]):
            pass
