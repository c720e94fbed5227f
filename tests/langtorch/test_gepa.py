"""lt.optim.GEPA against a scripted engine where the right behaviour is known.

The task: an item of category ``cI`` has the label ``answer-I``. The scripted *model* answers
right only when its prompt states that category's rule (``If the category is cI, answer
answer-I.``); the metric's feedback on a wrong answer names the rule; the scripted *feedback
engine* (backward) passes the feedback it is shown on; the scripted *reflection engine* can only
add rules that appear in the text it is shown.
"""

import io
import json
import re

import pytest
import torch

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.errors import BudgetExceededError

KEY = "sk-test-abcdef123456"
RULE = "If the category is {c}, answer {a}."


def rule(i):
    return RULE.format(c=f"c{i}", a=f"answer-{i}")


def data(cats):
    return ([f"category c{i}: item {k}" for k, i in enumerate(cats)], [f"answer-{i}" for i in cats])


def metric(pred, target):
    if pred.strip() == target:
        return 1.0, "Correct."
    i = target.split("-")[1]
    return 0.0, f"Wrong: for category c{i} the answer is {target}."


def _value(user, component):
    block = user.split(f"### component: {component}\nCurrent value:\n<<<\n", 1)[1]
    return block.split("\n>>>", 1)[0]


def reflect_answer(user, *, choose=None, replace=False, k=1, spread=False):
    """The scripted reflection: add (or with replace=True: keep only) the rules named in the
    feedback shown, in the component ``choose(components, user)`` picks (default: the first);
    with ``spread=True`` proposal ``j`` writes them into component ``j`` instead."""
    components = re.findall(r"### component: (.+)", user)
    learned = sorted(set(re.findall(r"for category c(\d+) the answer is answer-\d+", user)), key=int)
    props = []
    for j in range(k):
        target = components[j % len(components)] if spread else choose(components, user) if choose else components[0]
        value = _value(user, target)
        base = value.split("\nIf the category")[0] if replace else value
        new = base + "".join("\n" + rule(i) for i in learned if replace or rule(i) not in value)
        variant = "" if spread or j == 0 else f"\n(variant {j})"
        props.append({"rewrites": [{"component": target, "new_value": new + variant}]})
    return json.dumps({"reasoning": "add the rules named in the feedback", "proposals": props})


def responder(counts, **reflect):
    def answer(body):
        user = body["messages"][-1]["content"]
        if "Components you may rewrite" in user:
            counts["reflect"] += 1
            assert body["response_format"]["type"] == "json_schema"
            return reflect_answer(user, **reflect)
        if "How should the prompt change" in user or "pieces of feedback on it" in user:
            counts["feedback"] += 1
            if "Extract the category" in user and "Wrong" not in user.split("It answered:")[0]:
                return "The extraction step is correct; nothing to change here."
            return "\n".join(re.findall(r"Wrong: for category c\d+ the answer is answer-\d+\.", user)) or "Fine."
        if user.startswith("Extract the category"):
            counts["model"] += 1
            return "Item: " + user.split(":", 1)[1].split(":")[0].strip()
        counts["model"] += 1
        cat = re.search(r"category (c\d+)", user.split("Item:")[-1]).group(1)
        return f"answer-{cat[1:]}" if RULE.format(c=cat, a=f"answer-{cat[1:]}") in user else "unknown"
    return answer


class Two(lt.TModule):
    """Two components: the rules of group A and of group B, in one prompt."""

    def __init__(self, llm):
        super().__init__()
        self.a = lt.TextParameter("Rules A:")
        self.b = lt.TextParameter("Rules B:")
        self.prompt = lt.TextParameter("{a}\n{b}\nItem: {x}", requires_grad=False)
        self.llm = llm

    def forward(self, x):
        return self.llm(self.prompt * lt.TextTensor({"a": self.a, "b": self.b, "x": x}))


def even_to_a(components, user):
    """Rules of even categories go to component a, odd ones to b."""
    cats = re.findall(r"for category c(\d+) the answer is", user)
    return "a" if int(cats[0]) % 2 == 0 else "b"


def _backend(srv, **kw):
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, **kw)


def _layer(srv, prompt="Label the item.\nItem: {}", **kw):
    return lt.TLayer(prompt, lt.nn.LLM(_backend(srv, **kw), temperature=0))


def _counts():
    return {"model": 0, "feedback": 0, "reflect": 0}


def test_one_step_learns_from_the_feedback_and_counts_metric_calls(srv):
    counts = _counts()
    srv.responder = responder(counts)
    layer = _layer(srv)
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=metric,
                        reflection_engine=_backend(srv), trainset=data([0, 1]), valset=data([0, 1, 2]),
                        minibatch=2, merge=False)
    score = opt.step()
    # Seed on the valset (3), parent on the minibatch (2), child on the minibatch (2), child on the valset (3).
    assert opt.metric_calls == counts["model"] == 10
    assert counts["reflect"] == 1 and len(opt.pool) == 2
    assert rule(0) in str(layer.prompt) and rule(1) in str(layer.prompt)
    assert opt.scores.tolist() == [[0, 0, 0], [1, 1, 0]] and score == pytest.approx(2 / 3)
    lin = opt.lineage[1]
    assert lin["kind"] == "reflect" and lin["parents"] == [0] and lin["changed"] == ["prompt"]
    assert "for category c0" in lin["feedback"]["prompt"]


def test_front_keeps_a_candidate_best_on_a_subset_with_a_lower_mean(srv):
    counts = _counts()
    srv.responder = responder(counts, replace=True)  # the child forgets the parent's rule
    layer = _layer(srv, "Label the item.\nItem: {}\n" + rule(3))
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=metric,
                        reflection_engine=_backend(srv), trainset=data([0, 1]), valset=data([0, 1, 2, 3]),
                        minibatch=2, merge=False)
    opt.step()
    assert opt.scores.tolist() == [[0, 0, 0, 1], [1, 1, 0, 0]]
    mask, counts_led = opt.front()
    assert mask.tolist() == [True, True] and counts_led.tolist() == [2, 3]  # example 2: a tie, both kept
    assert opt.best == 1 and opt.to_pandas()["front"].tolist() == [True, True]


def test_merge_combines_two_components_each_fixed_by_a_different_parent(srv):
    counts = _counts()
    srv.responder = responder(counts)

    m = Two(lt.nn.LLM(_backend(srv), temperature=0))
    opt = lt.optim.GEPA([("a", m.a), ("b", m.b)], module=m, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([0, 2]), valset=data([0, 1, 2, 3]), minibatch=2)
    sd = opt.state_dict()
    seed = {"a": "Rules A:", "b": "Rules B:"}
    fixed_a, fixed_b = dict(seed, a="Rules A:\n" + rule(0)), dict(seed, b="Rules B:\n" + rule(2))
    lineage = [{"kind": "seed", "parents": [], "changed": [], "feedback": {}, "step": 0, "metric_calls": 4},
               {"kind": "reflect", "parents": [0], "changed": ["a"], "feedback": {}, "step": 0, "metric_calls": 8},
               {"kind": "reflect", "parents": [0], "changed": ["b"], "feedback": {}, "step": 1, "metric_calls": 12}]
    sd["gepa"].update(pool=[seed, fixed_a, fixed_b], scores=[[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]],
                      costs=[[0.0] * 4] * 3, tokens=[[0] * 4] * 3, lineage=lineage, metric_calls=12, merges_due=1)
    opt.load_state_dict(sd)
    srv_before = counts["reflect"]
    opt.step()
    assert counts["reflect"] == srv_before  # a merge step asks no reflection
    assert opt.pool[3] == {"a": fixed_a["a"], "b": fixed_b["b"]}
    assert opt.lineage[3]["kind"] == "merge" and opt.lineage[3]["parents"] == [1, 2]
    assert opt.scores[3].tolist() == [1, 0, 1, 0] and opt.best == 3
    # The subsample (2 examples where the parents differ) then the other 2 validation examples.
    assert opt.metric_calls == 12 + 4 and opt.history[-1]["kind"] == "merge"
    assert str(m.a) == fixed_a["a"] and str(m.b) == fixed_b["b"]


def test_two_stage_pipeline_rewrites_the_stage_whose_feedback_says_it_failed(srv):
    counts = _counts()

    def blame(components, user):
        # The scripted engine acts only on what it is shown: the component whose own feedback
        # names a wrong answer.
        for c in components:
            fb = user.split(f"### component: {c}\n", 1)[1].split("### component:")[0].split("Feedback", 1)[1]
            if "Wrong" in fb:
                return c
        raise AssertionError("no component's feedback names a failure")

    srv.responder = responder(counts, choose=blame)
    llm = lt.nn.LLM(_backend(srv), temperature=0)
    pipe = lt.TChain(lt.TLayer("Extract the category: {}", llm), lt.TLayer("Label the item.\n{}", llm))
    opt = lt.optim.GEPA(pipe.named_text_parameters(), module=pipe, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([0, 1]), valset=data([0, 1]), minibatch=2, merge=False)
    opt.step()
    user = next(b for b in srv.bodies if "Components you may rewrite" in b["messages"][-1]["content"])
    user = user["messages"][-1]["content"]
    assert "### component: 0.prompt" in user and "### component: 1.prompt" in user  # both offered, each its own feedback
    assert str(pipe[0].prompt) == "Extract the category: {}"
    assert rule(0) in str(pipe[1].prompt) and rule(1) in str(pipe[1].prompt)
    assert opt.lineage[1]["changed"] == ["1.prompt"]
    stage1 = user.split("### component: 0.prompt\n", 1)[1].split("### component:")[0]
    stage2 = user.split("### component: 1.prompt\n", 1)[1].split("Examples from this minibatch")[0]
    assert "extraction step is correct" in stage1 and "Wrong" not in stage1.split("Feedback", 1)[1]
    assert "Wrong: for category c0" in stage2 and "for category c0" in opt.lineage[1]["feedback"]["1.prompt"]
    assert opt.scores[1].tolist() == [1.0, 1.0]


def test_budget_stops_at_exactly_max_metric_calls_and_a_refused_step_sends_nothing(srv):
    counts = _counts()
    srv.responder = responder(counts)
    # Every training example is a new category, so every child beats its parent on its minibatch:
    # a step costs exactly its estimate, 1 (parent) + 1 (child) + 4 (child on the valset).
    layer = _layer(srv)
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([0, 1, 2, 3]), valset=data([0, 1, 2, 3]), minibatch=1, merge=False,
                        max_metric_calls=4 + 6 * 3)
    assert opt.estimate() == {"metric_calls": 10}
    best = opt.fit()
    assert opt.metric_calls == 22 == counts["model"] and opt.step_count == 3 and len(opt.pool) == 4
    assert best == opt.scores.mean(axis=1).max() >= 0.5
    srv.reset()
    with pytest.raises(BudgetExceededError, match="nothing was sent"):
        opt.step()
    assert srv.chat_requests == 0 and opt.metric_calls == 22
    # One call fewer: the third step no longer fits, and the run stops below the limit.
    counts2 = _counts()
    srv.responder = responder(counts2)
    layer2 = _layer(srv)
    opt2 = lt.optim.GEPA(layer2.named_text_parameters(), module=layer2, metric=metric,
                         reflection_engine=_backend(srv), trainset=data([0, 1, 2, 3]), valset=data([0, 1, 2, 3]),
                         minibatch=1, merge=False, max_metric_calls=21)
    opt2.fit()
    assert opt2.metric_calls == 16 == counts2["model"] and opt2.step_count == 2


def _run(srv, tmp_path, steps, state=None):
    srv.responder = responder(_counts(), k=2, spread=True)
    layer = Two(lt.nn.LLM(_backend(srv, cache=tmp_path / "cache.sqlite"), temperature=0))
    opt = lt.optim.GEPA([("a", layer.a), ("b", layer.b)], module=layer, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([0, 1, 2, 3, 4, 5]), valset=data([0, 1, 2, 3, 4, 5]), minibatch=1,
                        proposals=2, seed=3)
    if state is not None:
        layer.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    opt.fit(max_steps=steps)
    return layer, opt


def test_resume_equals_uninterrupted_and_state_loads_with_weights_only(srv, tmp_path):
    full_layer, full = _run(srv, tmp_path, 6)
    layer, half = _run(srv, tmp_path, 2)
    buf = io.BytesIO()
    torch.save({"model": layer.state_dict(), "optim": half.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert KEY not in repr(state)
    resumed_layer, resumed = _run(srv, tmp_path, 4, state)
    assert resumed.pool == full.pool and resumed.lineage == full.lineage
    assert resumed.scores.tolist() == full.scores.tolist() and resumed.metric_calls == full.metric_calls
    # The LLM-request counters differ (the resumed run reads the shared cache); the search does not.
    strip = lambda h: [{k: v for k, v in r.items() if k not in ("calls", "tokens")} for r in h]  # noqa: E731
    assert strip(resumed.history) == strip(full.history) and resumed_layer.state_dict() == full_layer.state_dict()
    assert len(full.pool) > 2 and full.step_count == resumed.step_count == 6
    assert {lin["kind"] for lin in full.lineage} == {"seed", "reflect", "merge"}
    df = full.to_pandas()
    assert len(df) == len(full.pool) and {"score", "front", "leads", "parents", "changed"} <= set(df.columns)


def test_several_proposals_are_scored_as_one_grid(srv):
    counts = _counts()
    srv.responder = responder(counts, k=3)
    srv.latency = 0.02
    layer = _layer(srv)
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([0, 1]), valset=data([0]), minibatch=2, proposals=3, merge=False)
    opt.step()
    # seed 1 + parent 2 + three children x 2 + the accepted children x 1.
    assert opt.history[-1]["child_scores"] == [2.0, 2.0, 2.0] and len(opt.pool) == 4
    assert opt.metric_calls == 1 + 2 + 6 + 3 == counts["model"] and srv.max_in_flight > 1


def test_cost_objective_keeps_a_cheaper_candidate_and_reports_the_cheapest_within_epsilon(srv):
    srv.responder = responder(_counts())
    layer = _layer(srv)
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([0]), valset=data([0, 1]), minibatch=1, objectives=("score", "tokens"))
    sd = opt.state_dict()
    sd["gepa"].update(pool=[{"prompt": "a {}"}, {"prompt": "b {}"}, {"prompt": "c {}"}],
                      scores=[[1, 1], [0.9, 0.9], [0, 0]], tokens=[[50, 50], [10, 10], [60, 60]],
                      costs=[[0.0] * 2] * 3,
                      lineage=[{"kind": "seed", "parents": [], "changed": [], "feedback": {}, "step": 0,
                                "metric_calls": 2}] * 3)
    opt.load_state_dict(sd)
    mask, _ = opt.front()
    assert mask.tolist() == [True, True, False]  # the cheap one stays though its score is lower
    assert opt.best == 0 and opt.cheapest(0.0) == 0 and opt.cheapest(0.1) == 1
    assert lt.pareto(opt.scores)[0].tolist() == [True, False, False]  # score alone drops it
    assert str(layer.prompt) == "a {}"


def test_examples_from_traces_are_shown_to_the_reflection(srv, tmp_path):
    counts = _counts()
    srv.responder = responder(counts)
    layer = _layer(srv)
    with lt.trace() as tr:
        layer(lt.TextTensor(["category c7: from production"]))
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([0]), valset=data([0]), minibatch=1, merge=False)
    tr.save(tmp_path / "prod.jsonl")
    n = opt.add_examples_from_trace(tmp_path / "prod.jsonl",
                                    lambda x, y: (0.0, "Wrong: for category c7 the answer is answer-7."))
    assert n == 1
    opt.step()
    user = next(b["messages"][-1]["content"] for b in srv.bodies if "Components you may rewrite" in b["messages"][-1]["content"])
    assert "Examples from production traces" in user and "from production" in user
    assert rule(7) in str(opt.pool[1]["prompt"])  # learned from the trace's feedback too


def test_bad_input():
    m = lt.TLayer("{}")
    eng = OpenAIBackend("m", api_key=KEY)
    kw = dict(module=m, metric="exact_match", reflection_engine=eng, trainset=(["a"], ["a"]), valset=(["a"], ["a"]))
    with pytest.raises(ValueError, match="minibatch"):
        lt.optim.GEPA(m.named_text_parameters(), **{**kw, "minibatch": 2})
    with pytest.raises(ValueError, match="max_metric_calls"):
        lt.optim.GEPA(m.named_text_parameters(), **kw, minibatch=1, max_metric_calls=0)
    with pytest.raises(ValueError, match="objectives"):
        lt.optim.GEPA(m.named_text_parameters(), **kw, minibatch=1, objectives=("cost",))
    with pytest.raises(TypeError, match="reflection_engine"):
        lt.optim.GEPA(m.named_text_parameters(), **{**kw, "reflection_engine": "gpt"}, minibatch=1)
    with pytest.raises(ValueError, match="1-d"):
        lt.optim.GEPA(m.named_text_parameters(), **{**kw, "valset": (["a", "b"], ["a"])}, minibatch=1)
    with pytest.raises(ValueError, match="not a text parameter"):
        lt.optim.GEPA([lt.TextParameter("x")], **kw, minibatch=1)
    with pytest.raises(ValueError, match="bound"):
        lt.optim.GEPA(m.named_text_parameters(), **kw, minibatch=1).fit()


def test_entries_of_a_k_parameter_are_components_of_their_own(srv):
    counts = _counts()
    srv.responder = responder(counts, choose=lambda comps, user: "rules[0]" if even_to_a(comps, user) == "a" else "rules[1]")

    class Rules(lt.TModule):
        def __init__(self, llm):
            super().__init__()
            self.rules = lt.TextParameter(["Rules A:", "Rules B:"])
            self.prompt = lt.TextParameter("{a}\n{b}\nItem: {x}", requires_grad=False)
            self.llm = llm

        def forward(self, x):
            return self.llm(self.prompt * lt.TextTensor({"a": self.rules[0], "b": self.rules[1], "x": x}))

    m = Rules(lt.nn.LLM(_backend(srv), temperature=0))
    opt = lt.optim.GEPA([("rules", m.rules)], module=m, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([1]), valset=data([0, 1]), minibatch=1, merge=False)
    opt.step()
    user = next(b["messages"][-1]["content"] for b in srv.bodies if "Components you may rewrite" in b["messages"][-1]["content"])
    assert "### component: rules[0]" in user and "### component: rules[1]" in user
    assert m.rules.shape == (2,) and m.rules.tolist() == ["Rules A:", "Rules B:\n" + rule(1)]
    assert opt.lineage[1]["changed"] == ["rules[1]"] and opt.scores.tolist() == [[0, 0], [0, 1]]


def test_a_minibatch_the_parent_solves_is_not_reflected_on_with_perfect_score(srv):
    counts = _counts()
    srv.responder = responder(counts)
    layer = _layer(srv, "Label the item.\nItem: {}\n" + rule(0))
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=metric, reflection_engine=_backend(srv),
                        trainset=data([0, 0]), valset=data([0, 1]), minibatch=2, perfect_score=1.0)
    opt.step()
    assert counts["reflect"] == 0 and counts["feedback"] == 0 and len(opt.pool) == 1
    assert opt.metric_calls == 2 + 2 and "perfect" in opt.history[-1]["note"]


def test_reflection_through_an_llm_module_retries_malformed_answers_then_gives_up_cleanly(srv):
    counts = _counts()
    good = responder(counts)
    answers = iter(["not json"])

    def flaky(body):
        if "Components you may rewrite" in body["messages"][-1]["content"]:
            nxt = next(answers, None)
            if nxt is not None:
                return nxt
        return good(body)

    srv.responder = flaky
    layer = _layer(srv)
    engine = lt.nn.LLM(_backend(srv, cache=None), temperature=0)
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=metric, reflection_engine=engine,
                        trainset=data([0]), valset=data([0]), minibatch=1, merge=False)
    opt.step()
    assert rule(0) in str(layer.prompt) and len(opt.pool) == 2
    # A proposal that drops the {} placeholder is refused every time: a warning, nothing changes.
    srv.responder = lambda body: (json.dumps({"reasoning": "r", "proposals": [{"rewrites": [
        {"component": "prompt", "new_value": "no placeholder"}]}]})
        if "Components you may rewrite" in body["messages"][-1]["content"] else good(body))
    layer2 = _layer(srv)
    opt2 = lt.optim.GEPA(layer2.named_text_parameters(), module=layer2, metric=metric, reflection_engine=engine,
                         trainset=data([0]), valset=data([0]), minibatch=1, merge=False, max_attempts=2)
    with pytest.warns(RuntimeWarning, match="no usable proposal"):
        opt2.step()
    assert len(opt2.pool) == 1 and str(layer2.prompt) == "Label the item.\nItem: {}" and opt2.metric_calls == 2
    assert "placeholders" in opt2.history[-1]["note"]
