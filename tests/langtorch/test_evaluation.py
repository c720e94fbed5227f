"""lt.evaluate (candidate x example grids in one batched call) and lt.pareto (per-example fronts)."""

import itertools

import numpy as np
import pytest

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.errors import BudgetExceededError

KEY = "sk-test-abcdef123456"


def _llm(srv, **kw):
    return lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY, **kw), temperature=0)


def _echo(body):
    return body["messages"][-1]["content"]


def test_scores_shapes_and_one_batched_call(srv):
    srv.responder = _echo
    srv.latency = 0.02
    layer = lt.TLayer("{}", _llm(srv))
    x, y = lt.TextTensor(["a", "b", "c"]), lt.TextTensor(["a", "b!", "?c"])
    srv.reset()
    ev = lt.evaluate(layer, x, y, "exact_match")
    assert ev.shape == (3,) and ev.scores.tolist() == [1.0, 0.0, 0.0] and srv.chat_requests == 3
    srv.reset()
    ev = lt.evaluate(layer, x, y, "exact_match", candidates={"prompt": ["{}", "{}!", "?{}"]})
    assert ev.shape == (3, 3) and srv.chat_requests == 9 and srv.max_in_flight > 1
    assert ev.scores.tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert ev.outputs.tolist()[1] == ["a!", "b!", "c!"]
    assert str(layer.prompt) == "{}"  # not mutated
    assert ev.feedback[1, 0] == "The output 'a!' is wrong: the expected answer is 'a'."
    assert ev.mean(-1).tolist() == pytest.approx([1 / 3] * 3)


def test_two_parameters_crossed_give_p_q_n():
    class Two(lt.TModule):
        def __init__(self):
            super().__init__()
            self.pre = lt.TextParameter("")
            self.post = lt.TextParameter("")

        def forward(self, x):
            return self.pre + x + self.post

    m = Two()
    x, y = lt.TextTensor(["a", "b"]), lt.TextTensor(["<a>", "<b"])
    ev = lt.evaluate(m, x, y, "exact_match", candidates={"pre": ["", "<"], "post": ["", ">", "!"]})
    assert ev.shape == (2, 3, 2) and ev.axes == ("pre", "post")
    # The reference: each combination evaluated on its own.
    for i, pre in enumerate(["", "<"]):
        for j, post in enumerate(["", ">", "!"]):
            want = [float(pre + s + post == t) for s, t in zip("ab", ["<a>", "<b"])]
            assert ev.scores[i, j].tolist() == want
    # A list of full candidates is one axis (zipped, not crossed); names left out keep the module's.
    ev = lt.evaluate(m, x, y, "exact_match", candidates=[{"pre": "<", "post": ">"}, {"pre": "<"}])
    assert ev.shape == (2, 2) and ev.scores.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    df = ev.to_pandas()
    assert len(df) == 4 and set(df.columns) >= {"candidate", "input", "target", "output", "score", "feedback"}


def test_usage_and_cost_per_entry_and_cache(srv, tmp_path):
    srv.responder = lambda body: "one two three"
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY, price=(1e6, 2e6),
                                  cache=tmp_path / "c.sqlite"), temperature=0)
    layer = lt.TLayer("say {}", llm)
    ev = lt.evaluate(layer, ["x", "y z"], ["-", "-"], "exact_match")
    assert ev.completion_tokens.tolist() == [3, 3]
    assert (ev.prompt_tokens > 0).all() and ev.prompt_tokens[1] > ev.prompt_tokens[0]
    assert ev.cost.tolist() == pytest.approx((ev.prompt_tokens * 1.0 + ev.completion_tokens * 2.0).tolist())
    assert ev.calls == 2 and ev.tokens == int(ev.usage.sum())
    srv.reset()
    again = lt.evaluate(layer, ["x", "y z"], ["-", "-"], "exact_match")
    assert srv.chat_requests == 0 and again.calls == 0 and again.usage.tolist() == [0, 0]
    assert again.scores.tolist() == ev.scores.tolist()


def test_budget_is_enforced(srv):
    srv.responder = _echo
    layer = lt.TLayer("{}", _llm(srv))
    budget = lt.optim.Budget(max_calls=4)
    srv.reset()
    with pytest.raises(BudgetExceededError):
        lt.evaluate(layer, ["a", "b", "c"], ["a", "b", "c"], "exact_match",
                    candidates={"prompt": ["{}", "{}."]}, budget=budget)
    assert srv.chat_requests == 4 and budget.calls == 4


def test_reduce_plot_and_errors(tmp_path):
    m = lt.TLayer("{}")
    red = lt.evaluate(m, ["a", "b"], ["a", "b!"], "exact_match", candidates={"prompt": ["{}", "{}!"]}, reduce="max")
    assert red.tolist() == [1.0, 1.0]
    assert lt.evaluate(m, ["a", "b"], ["a", "c"], "exact_match", reduce="mean") == 0.5
    ev = lt.evaluate(m, ["a", "b"], ["a", "c"], "exact_match", candidates={"prompt": ["{}", "c"]})
    ev.plot(tmp_path / "grid.png")
    assert (tmp_path / "grid.png").stat().st_size > 0
    with pytest.raises(KeyError, match="prompt"):
        lt.evaluate(m, ["a"], ["a"], "exact_match", candidates={"nope": ["x"]})
    with pytest.raises(ValueError, match="shape"):
        lt.evaluate(m, ["a"], ["a"], "exact_match", candidates={"prompt": [["x", "y"]]})
    with pytest.raises(ValueError, match="reduce"):
        lt.evaluate(m, ["a"], ["a"], "exact_match", reduce="median")
    with pytest.raises(TypeError, match="TModule"):
        lt.evaluate(lambda x: x, ["a"], ["a"], "exact_match")


def _front_reference(scores):
    """Per-example Pareto front by loops: p leads n when no q dominates it on n."""
    p, n, k = scores.shape
    counts = np.zeros(p, dtype=int)
    for i in range(p):
        for e in range(n):
            dominated = any(all(scores[q, e, o] >= scores[i, e, o] for o in range(k))
                            and any(scores[q, e, o] > scores[i, e, o] for o in range(k)) for q in range(p))
            counts[i] += not dominated
    return counts


def test_pareto_matches_a_loop_reference_with_ties_and_objectives():
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = rng.integers(0, 3, size=(5, 7)).astype(float)  # many ties
        mask, counts = lt.pareto(s)
        assert counts.tolist() == _front_reference(s[..., None]).tolist()
        assert mask.tolist() == (counts > 0).tolist()
        # Candidates on another axis.
        assert lt.pareto(s.T, dim=1)[1].tolist() == counts.tolist()
        both = np.stack([s, -rng.integers(0, 3, size=s.shape)], -1)
        assert lt.pareto(both, objective_dim=-1)[1].tolist() == _front_reference(both).tolist()


def test_front_keeps_a_subset_specialist_with_a_lower_mean():
    s = np.array([[1.0, 1.0, 1.0, 0.0],    # mean 0.75
                  [0.0, 0.0, 0.0, 1.0],    # mean 0.25, the only one right on example 3
                  [0.5, 0.5, 0.5, 0.5]])   # mean 0.5, best on nothing
    mask, counts = lt.pareto(s)
    assert mask.tolist() == [True, True, False] and counts.tolist() == [3, 1, 0]
    # Ties are kept: both lead an example they share the best score on.
    assert lt.pareto(np.array([[1.0, 0.0], [1.0, 1.0]]))[1].tolist() == [1, 2]
    with pytest.raises(ValueError, match="NaN"):
        lt.pareto(np.array([[np.nan]]))
    with pytest.raises(ValueError, match="objective_dim"):
        lt.pareto(s, objective_dim=0)


def test_crossed_grid_equals_itertools_product_order():
    m = lt.TLayer("{}")
    pre = ["{}", "x{}", "{}y"]
    ev = lt.evaluate(m, ["a"], ["xa"], "exact_match", candidates={"prompt": pre})
    combos = list(itertools.product(pre))
    assert [ev.candidates[0][i] for i in range(3)] == [c[0] for c in combos]
    assert ev.scores[:, 0].tolist() == [0.0, 1.0, 0.0]
