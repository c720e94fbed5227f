"""Text optimizers against the scripted loopback server: mechanism, budgets, cache, persistence."""

import io
import json

import pytest
import torch

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.errors import BudgetExceededError, OptimizerError, ShapeError

KEY = "sk-test-abcdef123456"


def _backend(srv, **kw):
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, **kw)


def proposal(value):
    return json.dumps({"reasoning": "r", "improved_variable": value})


def test_tgd_applies_the_structured_proposal_and_keeps_placeholders(srv):
    srv.responder = lambda body: proposal("Answer {q} in one word.")
    p = lt.TextParameter("Answer {q}.")
    p.grad = lt.TextTensor("too long")
    opt = lt.optim.TGD([p], _backend(srv), constraints=["Stay polite."])
    opt.step()
    assert str(p) == "Answer {q} in one word."
    body = srv.bodies[-1]
    assert body["response_format"]["type"] == "json_schema"
    user = body["messages"][-1]["content"]
    assert "too long" in user and "Stay polite." in user and "{q}" in user


@pytest.mark.parametrize("bad", ["", "not json", json.dumps({"other": 1}), proposal("Answer now."),
                                 proposal("Answer {q} {extra}."), proposal("Answer {q")])
def test_tgd_malformed_answers_are_retried_then_error_and_unchanged(srv, bad):
    srv.responder = lambda body: bad
    p = lt.TextParameter("Answer {q}.")
    p.grad = lt.TextTensor("too long")
    opt = lt.optim.TGD([p], _backend(srv), max_attempts=2)
    srv.reset()
    with pytest.raises(OptimizerError) as info:
        opt.step()
    assert info.value.parameter == "param0" and str(p) == "Answer {q}."
    assert srv.chat_requests == 2  # retried, not read back from a cache


def test_tgd_retry_recovers_after_one_malformed_answer(srv):
    answers = iter(["not json", proposal("Answer {q} briefly.")])
    srv.responder = lambda body: next(answers)
    p = lt.TextParameter("Answer {q}.")
    p.grad = lt.TextTensor("too long")
    lt.optim.TGD([p], _backend(srv)).step()
    assert str(p) == "Answer {q} briefly."


def test_tgd_reverts_when_the_closure_scores_worse(srv):
    srv.responder = lambda body: proposal("Worse {q}.")
    p = lt.TextParameter("Good {q}.")
    p.grad = lt.TextTensor("change it")
    opt = lt.optim.TGD([p], _backend(srv))
    score = opt.step(lambda: 1.0 if str(p).startswith("Good") else 0.0)
    assert str(p) == "Good {q}." and score == 1.0
    assert opt.history[-1]["reverted"] is True
    srv.responder = lambda body: proposal("Better {q}.")
    score = opt.step(lambda: 2.0 if str(p).startswith("Better") else 1.0)
    assert str(p) == "Better {q}." and score == 2.0


def test_frozen_parameter_is_never_changed(srv):
    srv.responder = lambda body: proposal("changed {q}")
    frozen = lt.TextParameter("keep {q}", requires_grad=False)
    frozen.grad = lt.TextTensor("feedback")
    lt.optim.TGD([frozen], _backend(srv)).step()
    assert str(frozen) == "keep {q}"


def test_k_parameter_entries_updated_from_their_own_gradients(srv):
    srv.responder = lambda body: proposal(
        "NEW " + body["messages"][-1]["content"].split("Current value:\n<<<\n")[1].split("\n>>>")[0])
    p = lt.TextParameter(["A: {x}", "B: {x}", "C: {x}"])
    p.grad = lt.TextTensor(["fix A", "", "fix C"])
    lt.optim.TGD([p], _backend(srv)).step()
    assert p.tolist() == ["NEW A: {x}", "B: {x}", "NEW C: {x}"]


def test_budget_stops_exactly_and_a_too_small_budget_fails_before_any_call(srv):
    layer = lt.TLayer("{}", lt.nn.LLM(_backend(srv), temperature=0))
    proposer = lambda v, k, rng: [f"{i}: {{}}" for i in range(k)]  # noqa: E731
    x, y = lt.TextTensor(["a", "b", "c"]), lt.TextTensor(["a", "b", "c"])
    opt = lt.optim.Search(layer.named_text_parameters(), proposer, 3, module=layer,
                          metric="contains", inputs=x, targets=y, max_calls=10)
    assert opt.estimate() == opt.estimate(x) == {"calls": 12}
    srv.reset()
    with pytest.raises(BudgetExceededError, match="needs up to 12"):
        opt.step()
    assert srv.chat_requests == 0 and str(layer.prompt) == "{}"
    budget = lt.optim.Budget(max_calls=5)
    with budget, pytest.raises(BudgetExceededError) as info:
        layer(lt.TextTensor([str(i) for i in range(8)]))
    assert len(info.value.errors) == 3
    done = [t for t in info.value.results.tolist() if t]
    assert len(done) == 5 and all(t.startswith("Echo: ") for t in done)
    assert budget.calls == 5 and srv.chat_requests == 5


def test_search_scores_the_grid_in_one_call_and_keeps_the_best(srv):
    def answer(body):
        content = body["messages"][-1]["content"]
        if "candidate values" in content:
            return json.dumps({"candidates": ["Say {}", "Reply {} please", "no placeholder"]})
        return content.upper() if content.startswith("Say") else content

    srv.responder = answer
    backend = _backend(srv)
    layer = lt.TLayer("Tell {}", lt.nn.LLM(backend, temperature=0))
    opt = lt.optim.Search(layer.named_text_parameters(), backend, 3, module=layer,
                          metric=lambda p, t: float(p == p.upper()), inputs=["a", "b"], targets=["A", "B"])
    srv.reset()
    best = opt.step()
    assert best == 1.0 and str(layer.prompt) == "Say {}"
    # 1 proposer request + 3 candidates (the one without the placeholder dropped) x 2 inputs.
    assert srv.chat_requests == 1 + 3 * 2
    kept = [h for h in opt.history if h["kept"]]
    assert kept[0]["value"] == "Say {}"


def test_rerun_against_the_cache_makes_zero_requests(srv, tmp_path):
    srv.responder = lambda body: body["messages"][-1]["content"]
    runs = []
    for _ in range(2):
        backend = _backend(srv, cache=tmp_path / "c.sqlite")
        layer = lt.TLayer("Q {}", lt.nn.LLM(backend, temperature=0))
        opt = lt.optim.Search(layer.named_text_parameters(), lambda v, k, rng: ["{}", "A {}"], 2,
                              module=layer, metric="exact_match", inputs=["x", "y"], targets=["x", "y"])
        srv.reset()
        opt.step()
        runs.append((srv.chat_requests, str(layer.prompt), [h["score"] for h in opt.history]))
    assert runs[0][0] == 6 and runs[1][0] == 0
    assert runs[0][1:] == runs[1][1:]


def test_functional_call_candidates_in_one_batched_call_without_mutation(srv):
    srv.latency = 0.02
    layer = lt.TLayer("Q: {}", lt.nn.LLM(_backend(srv), temperature=0))
    cands = lt.TextTensor(["A {}", "B {}", "C {}"])
    srv.reset()
    out = lt.func.functional_call(layer, {"prompt": cands}, lt.TextTensor(["x", "y"]))
    assert out.shape == (3, 2) and out.tolist()[1] == ["Echo: B x", "Echo: B y"]
    assert srv.chat_requests == 6 and srv.max_in_flight > 1
    assert str(layer.prompt) == "Q: {}"
    with pytest.raises(KeyError, match="prompt"):
        lt.func.functional_call(layer, {"nope": "x"}, lt.TextTensor(["x"]))
    with pytest.raises(ShapeError):
        lt.func.functional_call(layer, {"prompt": [["a"], ["b"]]}, lt.TextTensor(["x"]))


def test_functional_call_system_prompt_candidates(srv):
    srv.responder = lambda body: body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else "-"
    llm = lt.nn.LLM(_backend(srv), system="S0", temperature=0)
    out = lt.func.functional_call(llm, {"system": ["S1", "S2"]}, lt.TextTensor(["x", "y", "z"]))
    assert out.tolist() == [["S1"] * 3, ["S2"] * 3]


def test_fewshot_bootstraps_passing_runs_into_demos(srv):
    def answer(body):
        content = body["messages"][-1]["content"]
        task = content.rsplit("Input: ", 1)[-1].split("\n")[0]
        return task.upper() if "Output:" in content.split(task)[0] else task

    srv.responder = answer
    llm = lt.nn.LLM(_backend(srv), temperature=0)

    class Prog(lt.TModule):
        def __init__(self):
            super().__init__()
            self.demos = lt.TextParameter("")
            self.prompt = lt.TextParameter("{demos}\nInput: {x}")
            self.llm = llm

        def forward(self, x):
            return self.llm(self.prompt * lt.TextTensor({"demos": self.demos, "x": x}))

    prog = Prog()
    opt = lt.optim.FewShot([("demos", prog.demos)], lambda p, t: float(p == t) or float(t == "OK"), k=1, module=prog,
                           n_candidates=2, inputs=["ok", "b"], targets=["OK", "B"])
    score = opt.step()
    assert opt.pool == [("ok", "ok")]
    assert str(prog.demos) == "Input: ok\nOutput: ok" and score == 1.0


def test_state_dicts_are_plain_data(srv, tmp_path):
    srv.responder = lambda body: proposal("New {q}.")
    layer = lt.TLayer("Old {q}.")
    layer.prompt.grad = lt.TextTensor("improve")
    opt = lt.optim.TGD(layer.named_text_parameters(), _backend(srv), max_calls=50)
    opt.step(lambda: 1.0)
    buf = io.BytesIO()
    torch.save({"model": layer.state_dict(), "optim": opt.state_dict()}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert loaded["model"]["prompt"] == "New {q}."
    fresh = lt.TLayer("Old {q}.")
    fresh.load_state_dict(loaded["model"])
    opt2 = lt.optim.TGD(fresh.named_text_parameters(), _backend(srv), max_calls=50)
    opt2.load_state_dict(loaded["optim"])
    assert opt2.history == opt.history and opt2.budget.calls == opt.budget.calls == 1
    assert KEY not in repr(loaded)


def test_optimizer_bad_input():
    with pytest.raises(ValueError, match="empty parameter list"):
        lt.optim.Search([], lambda v, k, r: [], 1, module=lt.TLayer("x"), metric="exact_match")
    with pytest.raises(TypeError, match="TextParameters"):
        lt.optim.Search([torch.nn.Parameter(torch.zeros(1))], lambda v, k, r: [], 1,
                        module=lt.TLayer("x"), metric="exact_match")
    with pytest.raises(TypeError):
        lt.optim.TGD([lt.TextParameter("x")], feedback_engine="not an engine")


def test_fewshot_knn_demos_per_input_with_local_minilm(srv, tmp_path):
    # The "model" answers right only when its demonstrations mention the same topic as the input.
    def answer(body):
        content = body["messages"][-1]["content"]
        demos, question = content.rsplit("\nQ: ", 1)
        topic = question.split()[-1]
        return f"about {topic}" if topic in demos else "no idea"

    srv.responder = answer
    llm = lt.nn.LLM(_backend(srv), temperature=0)

    class Prog(lt.TModule):
        def __init__(self):
            super().__init__()
            self.demos = lt.nn.Demos(1)
            self.prompt = lt.TextParameter("{demos}\nQ: {x}")
            self.llm = llm

        def forward(self, x):
            return self.llm(self.prompt * lt.TextTensor({"demos": self.demos(x), "x": x}))

    prog = Prog()
    train_x = lt.TextTensor(["tell me about cats", "tell me about rivers", "tell me about cats"])
    train_y = lt.TextTensor(["about cats", "about rivers", "about cats"])
    prog.demos.set_pool([("question on cats", "about cats"), ("question on rivers", "about rivers")])
    opt = lt.optim.FewShot([prog.demos.pool], "exact_match", k=1, module=prog, inputs=train_x, targets=train_y)
    opt.step()
    assert sorted(opt.pool) == [("tell me about cats", "about cats"), ("tell me about rivers", "about rivers")]
    pairs = prog.demos.pairs()
    assert ("tell me about rivers", "about rivers") in pairs and len(pairs) == 4
    # Each input got its nearest demonstration (MiniLM): cats -> a cats demo, rivers -> a rivers demo.
    chosen = prog.demos(lt.TextTensor(["what about cats", "what about rivers"])).tolist()
    assert "cats" in chosen[0] and "rivers" in chosen[1]
    # The pool saves and loads as plain data, whatever its size.
    path = tmp_path / "prog.pt"
    torch.save(prog.state_dict(), path)
    fresh = Prog()
    fresh.load_state_dict(torch.load(path, weights_only=True))
    assert fresh.demos.pairs() == pairs


def test_every_optimizer_has_torch_step_closure():
    """One contract: step(closure=None) on every optimizer (no step(inputs, targets) override)."""
    import inspect

    optimizers = [v for v in vars(lt.optim).values()
                  if isinstance(v, type) and issubclass(v, lt.optim.TextOptimizer)]
    assert {c.__name__ for c in optimizers} >= {"TGD", "Search", "FewShot", "TokenSearch"}
    for cls in optimizers:
        params = list(inspect.signature(cls.step).parameters.values())[1:]
        assert params[0].name == "closure" and params[0].default is None, cls.__name__
        assert all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[1:]), cls.__name__


def test_search_step_closure_score_and_the_deprecated_data_form(srv):
    proposer = lambda v, k, rng: ["{}!", "{}"]  # noqa: E731
    layer = lt.TLayer("{}?")
    opt = lt.optim.Search(layer.named_text_parameters(), proposer, 2, module=layer, metric="exact_match",
                          inputs=["a", "b"], targets=["a", "b"])
    calls = []
    score = opt.step(lambda: calls.append(str(layer.prompt)) or 0.25)
    assert score == 0.25 and calls == ["{}"]  # called once, after the update
    old_layer = lt.TLayer("{}?")
    old = lt.optim.Search(old_layer.named_text_parameters(), proposer, 2, module=old_layer, metric="exact_match")
    with pytest.warns(DeprecationWarning, match="give the data to the constructor"):
        assert old.step(["a", "b"], targets=["a", "b"]) == 1.0
    assert str(old_layer.prompt) == "{}" and old.history == [dict(h) for h in opt.history]
    with pytest.raises(ValueError, match="no examples to score on"):
        lt.optim.Search(layer.named_text_parameters(), proposer, 1, module=layer, metric="exact_match").step()
    with pytest.raises(ValueError, match="both inputs= and targets="):
        lt.optim.Search(layer.named_text_parameters(), proposer, 1, module=layer, metric="exact_match",
                        inputs=["a"])


def test_minibatches_cover_every_example_each_epoch_and_resume(srv):
    seen = []
    layer = lt.TLayer("{}")

    def metric(pred, target):
        seen.append(target)
        return 1.0

    xs = [str(i) for i in range(5)]

    def make():
        return lt.optim.Search(layer.named_text_parameters(), lambda v, k, rng: [], 1, module=layer,
                               metric=metric, inputs=xs, targets=xs, batch_size=2, seed=7)

    opt = make()
    assert opt.estimate() == {"calls": 2 * 2}
    batches = []
    for _ in range(6):  # two epochs of batches 2, 2, 1
        seen.clear()
        opt.step()
        batches.append(sorted(seen))
    assert [len(b) for b in batches] == [2, 2, 1, 2, 2, 1]
    assert sorted(sum(batches[:3], [])) == xs and sorted(sum(batches[3:], [])) == xs
    assert batches[:3] != batches[3:]  # each epoch its own order
    resumed = make()
    resumed.load_state_dict(lt.optim.Search.state_dict(opt) | {"step_count": 4})
    seen.clear()
    resumed.step()
    assert sorted(seen) == batches[4]
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        lt.optim.Search(layer.named_text_parameters(), lambda v, k, rng: [], 1, module=layer,
                        metric=metric, inputs=xs, targets=xs, batch_size=0)


def test_a_custom_feedback_engine_drives_backward_and_tgd(srv):
    """The seam: backward and TGD talk to any lt.autograd.FeedbackEngine, not to a backend."""
    from langtorch.autograd import Answer, FeedbackEngine

    class Critic:
        def __init__(self):
            self.prompts = []

        async def afeedback(self, prompts, *, response_format=None, token_room=None, validate=None,
                            raise_errors=True):
            self.prompts += [p[-1]["content"] for p in prompts]
            if response_format is not None:  # TGD asks for a proposal in structured output
                return [Answer(proposal("Answer {q} in one word."), "stop") for _ in prompts]
            return [Answer("Ask for one word.") for _ in prompts]

    critic = Critic()
    assert isinstance(critic, FeedbackEngine)
    srv.responder = lambda body: "a long answer"
    prompt = lt.TextParameter("Answer {q}.")
    llm = lt.nn.LLM(_backend(srv), temperature=0)
    out = llm(prompt * lt.TextTensor({"q": lt.TextTensor(["2+2?", "3+3?"])}))
    loss = lt.nn.MetricLoss(lambda p, t: (0.0, "too long"))(out, "4")
    srv.reset()
    loss.backward(feedback_engine=critic)
    assert srv.chat_requests == 0  # the critic answered everything
    assert str(prompt.grad) == "Ask for one word."  # two items merged by the critic
    assert sum("How should the prompt change" in p for p in critic.prompts) == 2
    lt.optim.TGD([prompt], critic).step()
    assert str(prompt) == "Answer {q} in one word." and srv.chat_requests == 0


def test_feedback_engine_default_and_deprecated_backward_engine_names(srv):
    backend = _backend(srv)
    try:
        lt.autograd.set_feedback_engine(backend)
        engine = lt.autograd.get_feedback_engine()
        assert isinstance(engine, lt.autograd.FeedbackEngine) and engine.backend is backend
        with pytest.warns(DeprecationWarning, match="set_feedback_engine"):
            lt.optim.set_backward_engine(None)
        with pytest.warns(DeprecationWarning, match="get_feedback_engine"):
            assert lt.optim.get_backward_engine() is None
    finally:
        lt.autograd.set_feedback_engine(None)
    with pytest.raises(TypeError, match="FeedbackEngine"):
        lt.autograd.set_feedback_engine("not an engine")


class _Misbehaving:
    """A feedback engine that breaks the contract: too few answers, or a failed prompt returned
    with text (and without raising, though raise_errors=True)."""

    def __init__(self, mode):
        self.mode = mode

    async def afeedback(self, prompts, *, response_format=None, token_room=None, validate=None,
                        raise_errors=True):
        from langtorch.autograd import Answer
        from langtorch.errors import BackendError

        if self.mode == "short":
            return [Answer("Be brief.")] * (len(prompts) - 1)
        if self.mode == "not answers":
            return ["Be brief." for _ in prompts]
        failed = Answer("Error: 500 the critic is down", error=BackendError("critic down", status=500))
        return [failed] + [Answer(proposal("Answer {q}!") if response_format else "Be brief.")
                           for _ in prompts[1:]]


def test_a_feedback_engine_that_breaks_the_contract_fails_clearly_and_never_becomes_feedback(srv):
    """Regression: backward zipped the engine's answers with its prompts (too few answers lost
    feedback silently: grad '' with count 2) and used a failed answer's text as feedback; TGD
    and Search failed with KeyError / IndexError, and Search hid the engine's error."""
    from langtorch.errors import BackendError, BatchError

    srv.responder = lambda body: "a long answer"
    llm = lt.nn.LLM(_backend(srv), temperature=0)

    def loss_of(prompt):
        out = llm(prompt * lt.TextTensor({"q": lt.TextTensor(["2+2?", "3+3?"])}))
        return lt.nn.MetricLoss(lambda p, t: (0.0, "too long"))(out, "4")

    for mode in ("short", "not answers"):
        error = "must return one lt.autograd.Answer per prompt"
        prompt = lt.TextParameter("Answer {q}.")
        with pytest.raises(TypeError, match=error):
            loss_of(prompt).backward(feedback_engine=_Misbehaving(mode))
        assert prompt.grad is None
        prompt.grad = lt.TextTensor("be brief")
        with pytest.raises(TypeError, match=error):
            lt.optim.TGD([prompt], _Misbehaving(mode)).step()
        layer = lt.TLayer("{}?")
        with pytest.raises(TypeError, match=error):
            lt.optim.Search(layer.named_text_parameters(), _Misbehaving(mode), 2, module=layer,
                            metric="exact_match", inputs=["a"], targets=["a"]).step()
    # A failed prompt is raised (never turned into feedback text), on its own or in a BatchError.
    prompt = lt.TextParameter("Answer {q}.")
    with pytest.raises(BatchError) as caught:
        loss_of(prompt).backward(feedback_engine=_Misbehaving("failed"))
    assert list(caught.value.errors) == [(0,)] and prompt.grad is None
    layer = lt.TLayer("{}?")
    with pytest.raises(BackendError, match="critic down"):
        lt.optim.Search(layer.named_text_parameters(), _Misbehaving("failed"), 2, module=layer,
                        metric="exact_match", inputs=["a"], targets=["a"]).step()
    # TGD asks with raise_errors=False: the failed entry is retried, and its text is never parsed.
    p = lt.TextParameter(["Answer {q}.", "Reply {q}."])
    p.grad = lt.TextTensor(["be brief", "be brief"])
    with pytest.raises(OptimizerError, match="critic down"):
        lt.optim.TGD([p], _Misbehaving("failed")).step()
    assert p.tolist() == ["Answer {q}.", "Reply {q}."]


    # The checks ask for no option the caller did not: a minimal engine still answers backward.
    class Minimal:
        async def afeedback(self, prompts):
            from langtorch.autograd import Answer

            return [Answer("Be brief.") for _ in prompts]

    prompt = lt.TextParameter("Answer {q}.")
    loss_of(prompt).backward(feedback_engine=Minimal())
    assert str(prompt.grad) == "Be brief."


def test_deprecated_step_forms_reject_what_the_old_signature_rejected(srv):
    """Regression: step(inputs, targets, inputs=...) silently let the keyword win (the old
    step(inputs, targets) raised TypeError), and FewShot.step(x, y, val_inputs=v) scored v
    against the training targets; batch_size=np.int64(2) was refused."""
    import numpy as np

    layer = lt.TLayer("{}?")

    def search(**kw):
        return lt.optim.Search(layer.named_text_parameters(), lambda v, k, rng: ["{}"], 1, module=layer,
                               metric="exact_match", **kw)

    with pytest.raises(TypeError, match="multiple values for argument 'inputs'"):
        search().step(["a"], ["a"], inputs=["b"])
    assert str(layer.prompt) == "{}?"
    demos = lt.TLayer("{}")
    few = lt.optim.FewShot(demos.named_text_parameters(), "exact_match", k=1, module=demos)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="both val_inputs and val_targets"):
        few.step(["a"], ["a"], val_inputs=["b"])
    opt = search(inputs=["a", "b", "c"], targets=["a", "b", "c"], batch_size=np.int64(2))
    assert opt.estimate() == {"calls": 2 * 2}


def test_examples_whose_targets_do_not_pair_with_the_inputs_fail_in_the_constructor(srv):
    """Regression: Search(inputs=3 texts, targets=2) was accepted, and step() sent the whole
    candidates x inputs grid before the metric failed with a broadcasting ShapeError."""
    srv.responder = lambda body: "x"
    prog = lt.TLayer("{}?", lt.nn.LLM(_backend(srv)))
    unpaired = {"inputs": ["a", "b", "c"], "targets": ["a", "b"]}
    message = r"targets of shape \(2,\) do not pair with inputs of shape \(3,\)"
    with pytest.raises(ValueError, match=message):
        lt.optim.Search(prog.named_text_parameters(), lambda v, k, rng: ["{}"], 1, module=prog,
                        metric="exact_match", **unpaired)
    with pytest.raises(ValueError, match=message):
        lt.optim.FewShot(prog.named_text_parameters(), "exact_match", module=prog, **unpaired)
    assert srv.chat_requests == 0
    one_target = lt.optim.Search(prog.named_text_parameters(), lambda v, k, rng: ["{}"], 1, module=prog,
                                 metric="exact_match", inputs=["a", "b"], targets="x")
    assert one_target.step() == 1.0  # one target for all inputs still broadcasts


def test_search_keeps_the_complete_candidates_of_an_answer_cut_by_max_tokens():
    # A small model's JSON answer can run past max_tokens inside its second candidate: the
    # complete candidates before the cut are used (not "no usable candidates").
    from langtorch.optim._search import _candidates

    cut = '{"candidates": ["Answer briefly.", "Answer with a \\"quoted\\" word.", "Answer in a ver'
    assert _candidates(cut, None) == ["Answer briefly.", 'Answer with a "quoted" word.']
    assert _candidates('{"candidates": ["a", "b"]}', None) == ["a", "b"]
    assert _candidates('{"candidates": ["only the start', None) is None
    assert _candidates('{"other": ["a"', None) is None
    assert _candidates("not json", None) is None
    # Placeholders are still checked on salvaged candidates.
    assert _candidates('{"candidates": ["Say {x}.", "Say it.", "Say {', ("x",)) == ["Say {x}."]
