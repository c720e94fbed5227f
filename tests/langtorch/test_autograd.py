"""The provenance graph and text backward, against the scripted loopback server."""

import json

import numpy as np
import pytest

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.errors import GraphError

KEY = "sk-test-abcdef123456"


def _backend(srv, **kw):
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, **kw)


# ----------------------------------------------------------------------------- lineage
def test_grid_lineage_maps_every_entry_to_its_template_and_input():
    templates = lt.TextParameter([["Define {}."], ["Explain {}."], ["Use {} in a sentence."]])
    inputs = lt.TextTensor(["entropy", "irony", "gravity", "time"])
    grid = templates + inputs
    node = grid.grad_fn
    t_edge, x_edge = node.edges
    assert (t_edge.role, x_edge.role) == ("template", "values") and t_edge.param is templates
    for p in range(3):
        for n in range(4):
            assert t_edge.index[p, n, 0] == p and x_edge.index[p, n, 0] == n
            assert grid[p, n].item() == str(templates.texts[p, 0]).replace("{}", str(inputs.texts[n]))


@pytest.mark.parametrize("op,expect", [
    (lambda t: t[1:, ::-1], [[5, 4, 3]]),
    (lambda t: t.reshape(3, 2), [[0, 1], [2, 3], [4, 5]]),
    (lambda t: t.T, [[0, 3], [1, 4], [2, 5]]),
    (lambda t: t.unsqueeze(0)[0], [[0, 1, 2], [3, 4, 5]]),
    (lambda t: t[np.array([[True, False, True], [False, True, False]])], [0, 2, 4]),
    (lambda t: t.map(str.upper), [[0, 1, 2], [3, 4, 5]]),
])
def test_structural_lineage(op, expect):
    p = lt.TextParameter([["a", "b", "c"], ["d", "e", "f"]])
    out = op(p)
    assert out.grad_fn.edges[0].index[..., 0].tolist() == expect
    flat = p.texts.reshape(-1).tolist()
    picked = np.vectorize(lambda i: flat[i])(out.grad_fn.edges[0].index[..., 0])
    assert np.char.upper(picked.astype(str)).tolist() == np.char.upper(np.asarray(out.tolist(), dtype=str)).tolist()


def test_join_split_stack_cat_lineage():
    p = lt.TextParameter([["a", "b"], ["c", "d"]])
    j = p.join("+", axis=0)
    assert j.tolist() == ["a+c", "b+d"] and j.grad_fn.edges[0].index.tolist() == [[0, 2], [1, 3]]
    s = lt.TextParameter(["x y", "z w"]).split(" ")
    assert s.grad_fn.edges[0].index[..., 0].tolist() == [[0, 0], [1, 1]]
    c = lt.cat([p[0], lt.TextTensor(["q"]), p[1]])
    e0, e1, e2 = c.grad_fn.edges
    assert e0.index[..., 0].tolist() == [0, 1, -1, -1, -1] and e2.index[..., 0].tolist() == [-1, -1, -1, 0, 1]
    st = lt.stack([p[:, 0], p[:, 1]], axis=1)
    assert st.grad_fn.op == "stack" and st.tolist() == p.tolist()


def test_no_hidden_columns_leak_and_metadata_kept():
    p = lt.TextParameter(["{}", "{}!"])
    x = lt.TextTensor(["a", "b"])
    x.metadata["k"] = np.array([1, 2])
    out = (p + x).reshape(2, 1)
    assert list(out.metadata) == ["k"] and out.metadata["k"].tolist() == [[1], [2]]


def test_detach_and_no_grad_cut_with_clear_errors():
    p = lt.TextParameter("Q: {}")
    loss_fn = lt.nn.MetricLoss("exact_match")
    with pytest.raises(GraphError, match="detach"):
        loss_fn((p + "a").detach(), "b").backward()
    with lt.no_grad():
        out = p + "a"
    with pytest.raises(GraphError, match="no_grad"):
        loss_fn(out, "b").backward()
    with pytest.raises(GraphError, match="f-string"):
        loss_fn(lt.TextTensor(f"{p + 'a'}"), "b").backward()
    frozen = lt.TextParameter("Q: {}", requires_grad=False)
    assert (frozen + "a").grad_fn is None


# ----------------------------------------------------------------------------- backward
class TwoStage(lt.TModule):
    """Two TextParameters, two LLM calls: a [K] per-class draft prompt, then a refine prompt."""

    def __init__(self, llm):
        super().__init__()
        self.draft = lt.TextParameter(["Draft (class A): {}", "Draft (class B): {}"])
        self.refine = lt.TextParameter("Refine: {}")
        self.llm = llm

    def forward(self, x, cls):
        drafted = self.llm(self.draft[cls] + x)
        return self.llm(self.refine + drafted)


def engine_answer(body):
    """The scripted engine: backward requests get feedback naming what they were about."""
    content = body["messages"][-1]["content"]
    if "How should the prompt change" in content:
        value = content.split("<<<\n", 1)[1].split("\n>>>", 1)[0]
        return f"Feedback on [{value}]"
    if "pieces of feedback" in content:
        return "Merged: " + " | ".join(line[2:] for line in content.splitlines() if line.startswith("- "))
    return "Echo: " + content


def test_two_stage_pipeline_gets_gradients_on_both_routed_to_entries(srv):
    srv.responder = engine_answer
    backend = _backend(srv)
    model = TwoStage(lt.nn.LLM(backend, temperature=0))
    x = lt.TextTensor(["apples", "pears", "plums"])
    cls = np.array([0, 0, 1])
    y = model(x, cls)
    loss = lt.nn.MetricLoss(lambda p, t: (0.0, f"wrong for {t}"))(y, lt.TextTensor(["A", "A", "B"]))
    srv.reset()
    loss.backward(feedback_engine=backend)
    assert model.draft.grad.shape == (2,) and model.refine.grad.shape == ()
    draft = model.draft.grad.tolist()
    # Class A's entry heard only about apples and pears, class B's only about plums.
    assert "apples" in draft[0] and "pears" in draft[0] and "plums" not in draft[0]
    assert "plums" in draft[1] and "apples" not in draft[1]
    assert model.draft.grad.metadata["count"].tolist() == [2, 1]
    assert model.refine.grad.metadata["count"] == 3
    assert str(model.refine.grad).startswith("Merged:")
    # One backward level's requests ran concurrently in one call; all went through the server.
    assert srv.chat_requests == len(srv.bodies) > 0
    sent = [b["messages"][-1]["content"] for b in srv.bodies]
    assert any("wrong for B" in s for s in sent)


def test_backward_through_llm_needs_an_engine_and_sends_nothing_without(srv):
    lt.optim.set_backward_engine(None)
    llm = lt.nn.LLM(_backend(srv), temperature=0)
    p = lt.TextParameter("Q: {}")
    loss = lt.nn.MetricLoss("exact_match")(llm(p + "x"), "y")
    srv.reset()
    with pytest.raises(GraphError, match="engine"):
        loss.backward()
    assert srv.chat_requests == 0


def test_default_engine_and_accumulation_and_zero_grad(srv):
    srv.responder = engine_answer
    backend = _backend(srv)
    llm = lt.nn.LLM(backend, temperature=0)
    p = lt.TextParameter("Q: {}")
    lt.optim.set_backward_engine(backend)
    try:
        for _ in range(2):
            loss = lt.nn.MetricLoss(lambda a, b: (0.0, "bad"))(llm(p + "x"), "y")
            loss.backward()
        assert p.grad.metadata["count"] == 2
        assert str(p.grad).startswith("Merged:")
        opt = lt.optim.TGD([p], backend)
        opt.zero_grad()
        assert p.grad is None
    finally:
        lt.optim.set_backward_engine(None)


def test_system_prompt_parameter_gets_feedback(srv):
    def answer(body):
        content = body["messages"][-1]["content"]
        if "How should the system prompt change" in content:
            return "be shorter"
        if "pieces of feedback" in content:
            assert content.count("be shorter") == 2  # both entries' feedback reached the merge
            return "merged: be shorter"
        return "a long answer"

    srv.responder = answer
    backend = _backend(srv)
    llm = lt.nn.LLM(backend, system="You are verbose.", temperature=0)
    loss = lt.nn.MetricLoss(lambda a, b: (0.0, "too long"))(llm(lt.TextTensor(["q1", "q2"])), "x")
    loss.backward(feedback_engine=backend)
    assert str(llm.system.grad) == "merged: be shorter"
    assert llm.system.grad.metadata["count"] == 2


def test_text_loss_retries_malformed_judgements_then_parse_error(srv):
    answers = iter(["not json", json.dumps({"score": 0.25, "feedback": "vague"})])
    srv.responder = lambda body: next(answers)
    judge = lt.nn.TextLoss("Is it precise?", _backend(srv))
    loss = judge(lt.TextTensor(["an answer"]))
    assert loss.tolist() == ["vague"] and loss.metadata["score"].tolist() == [0.25]
    srv.responder = lambda body: json.dumps({"score": 7, "feedback": "x"})
    with pytest.raises(lt.errors.ParseError, match="after 2 attempts"):
        lt.nn.TextLoss("Is it precise?", _backend(srv), max_attempts=2)(lt.TextTensor(["b"]))


# ----------------------------------------------------------------------------- op rules
def _builtin_ops():
    """Every text op of the library: the textops functions and the TextTensor methods that
    dispatch through ``__text_function__``."""
    import langtorch.functional.textops as textops
    from langtorch.functional.text import TextTensor as Base

    ops = [getattr(textops, n) for n in textops.__all__]
    ops += [v for v in vars(Base).values() if hasattr(v, "__text_impl__")]
    return [op for op in ops if hasattr(op, "__text_impl__")]


def test_every_builtin_op_declares_its_rule():
    """A new op without a registered rule would record under its function's name with the
    default rule; the library's own ops each declare theirs (docs/architecture.md)."""
    ops = _builtin_ops()
    assert len(ops) >= 20
    missing = [op.__name__ for op in ops if lt.autograd.op_rule(op) is None]
    assert missing == []


def test_rules_are_found_by_the_function_not_its_name(monkeypatch):
    """An op renamed (here: fill's implementation dispatched under the name 'pour') keeps its
    lineage, roles and backward rule: rules are keyed by the function object."""
    from langtorch.functional.text import text_function

    impl = lt.functional.fill.__text_impl__
    monkeypatch.setattr(impl, "__name__", "pour")
    pour = text_function(impl)
    p = lt.TextParameter("Q: {}")
    out = pour(p, lt.TextTensor(["a", "b"]))
    node = out.grad_fn
    assert node.op == "fill" and node.rule is lt.autograd.op_rule(lt.functional.fill)
    assert [e.role for e in node.edges] == ["template", "values"]
    lt.nn.MetricLoss(lambda pred, target: 0.0)(out, "x").backward()
    # fill's backward rule: the template's feedback names the prompt each item was about.
    assert "<<<Q: a>>>" in p.grad.item() and "<<<Q: b>>>" in p.grad.item()
    assert p.grad.metadata["count"] == 2


def test_a_rule_registered_for_a_new_op_is_used():
    from langtorch.autograd import OpRule, fill_feedback, register_op
    from langtorch.functional.text import text_function

    @text_function
    def twice(t, sep=" "):
        return lt.functional.join(lt.functional.stack([t, t], axis=-1), sep)

    def lineage(operands, bound, out):  # each output entry came from the same input entry
        return [lt.autograd.identity_index(out.shape)]

    p = lt.TextParameter(["a", "b"])
    assert twice(p).grad_fn.op == "twice"                        # no rule: the default one
    assert twice(p).grad_fn.edges[0].index.shape == (2, 1)       # lineage from metadata tagging
    register_op(twice, OpRule("repeat", lineage=lineage, roles=("source",),
                              attrs=lambda b: {"sep": b["sep"]}, feedback=fill_feedback))
    node = twice(p, sep="|").grad_fn
    assert (node.op, node.name, node.attrs) == ("repeat", "RepeatBackward", {"sep": "|"})
    assert node.edges[0].role == "source" and node.rule.feedback is fill_feedback
    assert node.edges[0].index[..., 0].tolist() == [0, 1]


def test_add_names_its_operands_by_textops_fill_rule():
    """``add`` fills a template and concatenates data (textops.add_fills): its roles follow."""
    p = lt.TextParameter("Q: {}")
    filled = p + "a"
    assert [e.role for e in filled.grad_fn.edges] == ["template"]
    appended = filled + lt.TextParameter("!")
    assert [e.role for e in appended.grad_fn.edges] == ["left", "right"]
    from langtorch.functional.textops import add_fills

    assert add_fills(p) and not add_fills(filled)


def test_declared_feedback_rules_are_what_backward_does():
    """The rules on the nodes (fill: template gets context; loss: the target gets nothing) give
    exactly the gradients loss.backward() writes."""
    from langtorch.autograd import fill_feedback, loss_feedback

    template, target = lt.TextParameter("Say {}"), lt.TextParameter("b")
    out = template + lt.TextTensor("a")
    loss = lt.nn.MetricLoss(lambda pred, t: (0.0, "too plain"))(out, target)
    assert loss.grad_fn.rule is lt.autograd.TEXT_LOSS and out.grad_fn.rule.feedback is fill_feedback
    items = [(loss.item() + " (score 0)", 0.0)]
    to_pred, to_target = (loss_feedback(loss.grad_fn, e, 0, items) for e in loss.grad_fn.edges)
    assert to_target is None
    expected = fill_feedback(out.grad_fn, out.grad_fn.edges[0], 0, to_pred)
    loss.backward()
    assert template.grad.item() == expected[0][0] and target.grad is None


def test_a_parameter_is_known_to_the_graph_by_its_class_flag():
    """autograd (below langtorch.tensor) knows parameters by ``__text_parameter__``."""
    class Prompt(lt.TextTensor):
        __slots__ = ("requires_grad",)
        __text_parameter__ = True

    q = Prompt("Q: {}")
    q.requires_grad = True
    assert lt.autograd.requires_grad(q) and (q + "a").grad_fn.edges[0].param is q


def test_backward_runs_the_rule_a_node_carries_not_its_name():
    """loss.backward() applies each node's declared feedback rule. Before, the backward pass
    matched node names ("fill", "add", "loss", "llm"): an op registered with fill_feedback gave
    its template no context, and a rule that stops feedback into an input was ignored."""
    from langtorch.autograd import OpRule, fill_feedback, register_op
    from langtorch.functional.text import text_function

    @text_function
    def my_fill(template, values):
        return lt.functional.fill(template, values)

    @text_function
    def guarded(t, guard):
        return lt.functional.concat(t, guard)

    register_op(my_fill, OpRule("my_fill", roles=("template", "values"), feedback=fill_feedback))
    register_op(guarded, OpRule("guarded", roles=("text", "guard"),
                                feedback=lambda node, edge, o, items: None if edge.role == "guard" else items))
    template, guard = lt.TextParameter("Say {}"), lt.TextParameter("!")
    out = guarded(my_fill(template, lt.TextTensor("a")), guard)
    loss = lt.nn.MetricLoss(lambda pred, t: (0.0, "too plain"))(out, "b")
    loss.backward()
    assert template.grad.item().startswith("On the prompt this template produced, <<<Say a>>>: ")
    assert "too plain" in template.grad.item()
    assert guard.grad is None  # the rule lets nothing into the guard


def test_engine_keyword_is_a_deprecated_alias_of_feedback_engine(srv):
    # "engine" names the decode engine; the critic is the feedback engine. The old keyword
    # still works (same feedback, same requests) and warns; both at once is refused.
    srv.responder = engine_answer

    def run(**kw):
        p = lt.TextParameter("Q: {}")
        llm = lt.nn.LLM(_backend(srv), temperature=0)
        loss = lt.nn.MetricLoss(lambda a, b: (0.0, "too vague"))(llm(p + lt.TextTensor(["x"])), "y")
        loss.backward(**kw)
        return p.grad.tolist()

    want = run(feedback_engine=_backend(srv))
    with pytest.warns(DeprecationWarning, match="feedback_engine="):
        assert run(engine=_backend(srv)) == want
    with pytest.warns(DeprecationWarning, match="feedback_engine="):
        p = lt.TextParameter("Q: {}")
        lt.autograd.backward(lt.nn.MetricLoss("exact_match")(p + "a", "A"), engine=_backend(srv))
    with pytest.raises(TypeError, match="both feedback_engine= and"):
        run(feedback_engine=_backend(srv), engine=_backend(srv))
    with pytest.warns(DeprecationWarning, match="feedback_engine="):
        opt = lt.optim.TGD([lt.TextParameter("x")], engine=_backend(srv))
    with pytest.warns(DeprecationWarning, match="TGD.feedback_engine"):
        assert opt.engine is opt.feedback_engine is not None
    with pytest.raises(TypeError, match="both feedback_engine= and"):
        lt.optim.TGD([lt.TextParameter("x")], _backend(srv), engine=_backend(srv))
    with pytest.raises(TypeError, match="expected a feedback_engine"):
        lt.optim.TGD([lt.TextParameter("x")])
