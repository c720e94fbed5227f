"""GEPA: reflective evolution of text parameters over a per-example Pareto front.

The algorithm (Agrawal et al., 2025, arXiv 2507.19457), on langtorch's graph:

1. The *pool* starts with the module's current values, scored on every validation example (one
   row of the score matrix ``[candidates, validation examples]``).
2. Each :meth:`GEPA.step` picks a *parent* from the per-example Pareto front of the pool
   (:func:`langtorch.pareto`: candidates best on at least one validation example), at random
   weighted by how many examples it leads — after GEPA's removal of candidates that only share
   fronts with others (:meth:`GEPA.parent_weights`).
3. It runs the parent on a training minibatch and calls ``loss.backward()``: the metric's
   feedback travels back through the pipeline's graph, so every parameter (every entry of a
   ``[K]`` parameter) gets *its own* feedback in ``param.grad`` — the component that caused a
   failure is found by the graph, not guessed from raw traces.
4. The reflection engine is shown the components whose feedback is worst (lowest mean score
   behind it), with the minibatch's examples, and asked in structured output (a JSON schema) for
   ``proposals`` rewrites.
5. All children are scored on the minibatch as one ``[P] x [minibatch]`` grid
   (:func:`langtorch.evaluate`); a child that beats its parent's minibatch score joins the pool
   with its full validation row (the accepted children's rows are one more grid).
6. After an accepted child, a later step *merges* two frontier candidates component-wise: from a
   common ancestor, each component is taken from the descendant that changed it. A merge joins
   the pool when it scores at least as well as both parents on a validation subsample.

A *metric call* is one (candidate, example) evaluation. ``max_metric_calls`` is never exceeded:
a step that could exceed it raises :class:`~langtorch.errors.BudgetExceededError` before
sending anything, and :meth:`GEPA.fit` stops there.
"""

from __future__ import annotations

import json
import random
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.autograd import as_feedback_engine, enable_grad, get_feedback_engine
from langtorch.core import require_capabilities
from langtorch.errors import BudgetExceededError
from langtorch.evaluation import evaluate
from langtorch.optim._base import TextOptimizer, score_of
from langtorch.optim._pool import CandidatePool, get_entry
from langtorch.optim._reflection import Reflector, examples_from_trace, worst_components
from langtorch.tensor import TextTensor

__all__ = ["GEPA"]

_OBJECTIVES = ("score", "cost", "tokens")

def _pair(data: Any, what: str) -> tuple[TextTensor, TextTensor]:
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"{what} must be an (inputs, targets) pair of TextTensors (or lists of str), got "
                        f"{type(data).__name__}")
    x, y = (d if isinstance(d, TextTensor) else TextTensor(d, template=False) for d in data)
    if x.ndim != 1 or x.shape != y.shape or x.shape[0] == 0:
        raise ValueError(f"{what}: inputs and targets must be non-empty 1-d and of one length, got shapes "
                         f"{x.shape} and {y.shape}")
    return x, y



def _check_options(module: Any, minibatch: Any, proposals: Any, max_merges: Any, max_attempts: Any,
                   objectives: Sequence[str]) -> tuple[str, ...]:
    """GEPA's module and counts checked; its objectives as a tuple."""
    from langtorch.nn import TModule

    if not isinstance(module, TModule):
        raise TypeError(f"GEPA's module must be a langtorch TModule, got {type(module).__name__}")
    for name, v, low in (("minibatch", minibatch, 1), ("proposals", proposals, 1),
                         ("max_merges", max_merges, 0), ("max_attempts", max_attempts, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
    objectives = tuple(objectives)
    if not objectives or objectives[0] != "score" or not set(objectives) <= set(_OBJECTIVES) or \
            len(set(objectives)) != len(objectives):
        raise ValueError(f"objectives must start with 'score' and may add 'cost' or 'tokens' (e.g. "
                         f"('score', 'cost')), got {objectives!r}")
    return objectives


def _reflection_engine(reflection_engine: Any) -> Any:
    """The reflection engine as a feedback engine, checked to offer structured output."""
    try:
        engine = as_feedback_engine(reflection_engine)
    except TypeError as e:
        raise TypeError(f"reflection_engine: {e}") from None
    # The rewrites come in a JSON schema: an engine that declares no structured output fails
    # here, before the valset is scored.
    require_capabilities(engine, "structured_output", who="lt.optim.GEPA's reflection_engine",
                         alternatives=[
        "a reflection engine over a backend with structured output, e.g. "
        "reflection_engine=lt.nn.LLM(OpenAIBackend(\"gpt-4o-mini\")); the engine of the "
        "backward pass (feedback_engine=) asks for free text and can be any engine.",
        "lt.optim.Search with a mutation proposer (a callable (value, k, rng) -> list[str]), "
        "which asks no engine.",
    ])
    return engine


def _check_metric_budget(max_metric_calls: Any, n_val: int, minibatch: int, proposals: int) -> None:
    """``max_metric_calls`` must leave room for the first step (or be ``None``)."""
    first = n_val + minibatch * (1 + proposals) + proposals * n_val
    if max_metric_calls is not None and (not isinstance(max_metric_calls, int) or isinstance(max_metric_calls, bool)
                                         or max_metric_calls < first):
        raise ValueError(f"max_metric_calls must be an int >= {first}, what the first step can use (the initial "
                         f"values on the valset, {n_val}; the parent and {proposals} child(ren) on a minibatch of "
                         f"{minibatch}; the child(ren) on the valset), or None; got {max_metric_calls!r}")


def _module_names(opt: Any, module: Any) -> dict[int, str]:
    """``{id(parameter): its name in module}`` for the optimizer's parameters, each checked to be
    a plain-text parameter of ``module``."""
    named = {id(p): n for n, p in module.named_text_parameters()}
    names: dict[int, str] = {}
    for p in opt.parameters():
        if id(p) not in named:
            raise ValueError(f"parameter {opt.name_of(p)!r} is not a text parameter of the module")
        if p.fields and p.requires_grad:
            # Its plain value is the rendered texts: written back, the records lose their fields.
            raise ValueError(
                f"parameter {named[id(p)]!r} holds keyed records (fields {list(p.fields)}, e.g. an lt.nn.Demos "
                "pool); GEPA rewrites plain texts only. Leave it out: [(n, p) for n, p in "
                "module.named_text_parameters() if not p.fields] (lt.optim.FewShot fills a Demos pool).")
        names[id(p)] = named[id(p)]
    return names


class GEPA(TextOptimizer):
    """Reflective evolution (GEPA) of a module's text parameters, with torch.optim's shape.

    See the module docstring for the algorithm. ``step()`` is one GEPA iteration;
    :meth:`fit` steps until the metric-call budget (or ``max_steps``) and leaves the module
    holding the best candidate (highest mean validation score; ties go to the cheaper, then the
    older). After every step the module holds the best candidate so far.

    Args:
        params: the TextParameters to evolve (``module.named_text_parameters()`` or a subset);
            every entry of an n-d parameter (``[K]`` prompts, demos) is its own component.
            Parameters of keyed records (an ``lt.nn.Demos`` pool) are refused: leave them out.
        module: the program (a :class:`~langtorch.TModule`) that uses them.
        metric: ``(prediction, target) -> score | (score, feedback)`` (as
            :class:`~langtorch.nn.MetricLoss` takes), a metric name, or an ``lt.nn`` loss module.
            Higher is better; the feedback text is what the reflection reads.
        reflection_engine: the LLM that rewrites components: a
            :class:`~langtorch.autograd.FeedbackEngine` (an ``lt.nn.LLM``) or a Backend; it
            answers in structured output (a JSON schema): one that declares none
            (``engine.capabilities``) raises :class:`~langtorch.errors.CapabilityError` here.
        trainset, valset: ``(inputs, targets)`` pairs of 1-d TextTensors (or lists of str).
            Minibatches come from ``trainset``; the score matrix is over ``valset``.
        minibatch: training examples per reflection.
        max_metric_calls: the budget in metric calls (one candidate on one example), at least
            what the first step can use (:meth:`estimate` before it); ``None``: no limit (then
            :meth:`fit` needs ``max_steps``).
        merge: whether to merge frontier candidates (at most ``max_merges`` attempts in all).
        objectives: ``("score",)``, or with ``"cost"`` (the backends' price) or ``"tokens"``:
            the front keeps candidates not dominated on (score, minus cost) per example.
        seed: seeds the minibatch order, the parent choice and the merge choice.
        feedback_engine: the engine of ``loss.backward()`` (default: the one set with
            ``lt.autograd.set_feedback_engine``, else ``reflection_engine``); not needed when
            the module makes no LLM call.
        proposals: children asked for per step (scored together as one grid).
        max_merges: most merge attempts.
        max_attempts: tries for a well-formed reflection answer per step.
        perfect_score: the metric's best score, when it has one (e.g. 1.0): a minibatch the
            parent already solves perfectly is not reflected on (nothing to learn; its metric
            calls are spent), and entries at it send no feedback backward. ``None``: never skip.
        max_calls, max_tokens, max_cost: the optimizer's LLM :class:`~langtorch.optim.Budget`
            (every request it makes: forward, backward, reflection, evaluation).

    Attributes:
        pool: the candidates, each a dict ``{parameter name: value}`` (plain data).
        scores: the score matrix ``[len(pool), len(valset)]`` (a float array).
        lineage: per candidate ``{"kind": "seed" | "reflect" | "merge", "parents", "changed",
            "feedback", "step", "metric_calls"}``.
        metric_calls: metric calls made so far.
        examples: ``(input, output, score, feedback)`` records from
            :meth:`add_examples_from_trace`, shown to the reflection engine.

    Example:
        >>> import json, langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> m = lt.TLayer("{}")           # the model: the prompt filled with the input
        >>> rewrite = {"reasoning": "add !", "proposals": [{"rewrites": [{"component": "prompt", "new_value": "{}!"}]}]}
        >>> with OpenAIServer(lambda body: json.dumps(rewrite)) as server:
        ...     opt = lt.optim.GEPA(m.named_text_parameters(), module=m, metric="exact_match",
        ...                         reflection_engine=OpenAIBackend("r", base_url=server.url, api_key="sk-test1234"),
        ...                         trainset=(["a", "b"], ["a!", "b!"]), valset=(["c"], ["c!"]),
        ...                         minibatch=2, max_metric_calls=6)
        ...     best = opt.fit()
        >>> best, str(m.prompt), opt.metric_calls
        (1.0, '{}!', 6)
    """

    def __init__(self, params: Any, *, module: Any, metric: Any, reflection_engine: Any, trainset: Any,
                 valset: Any, minibatch: int = 3, max_metric_calls: int | None = None, merge: bool = True,
                 objectives: Sequence[str] = ("score",), seed: int = 0, feedback_engine: Any = None,
                 proposals: int = 1, max_merges: int = 5, max_attempts: int = 3,
                 perfect_score: float | None = None, max_calls: int | None = None,
                 max_tokens: int | None = None, max_cost: float | None = None):
        objectives = _check_options(module, minibatch, proposals, max_merges, max_attempts, objectives)
        super().__init__(params, {}, max_calls=max_calls, max_tokens=max_tokens, max_cost=max_cost)
        self.module = module
        self.metric = metric
        from langtorch.nn import MetricLoss, TextLoss

        self._loss_fn = metric if isinstance(metric, (MetricLoss, TextLoss)) else MetricLoss(metric)
        self.reflection_engine = _reflection_engine(reflection_engine)
        self._reflector = Reflector(self.reflection_engine, proposals, max_attempts)
        self.feedback_engine = feedback_engine
        self.train = _pair(trainset, "trainset")
        self.val = _pair(valset, "valset")
        if minibatch > self.train[0].shape[0]:
            raise ValueError(f"minibatch={minibatch} is larger than the trainset ({self.train[0].shape[0]} examples)")
        n_val = self.val[0].shape[0]
        _check_metric_budget(max_metric_calls, n_val, minibatch, proposals)
        self.minibatch = minibatch
        self.max_metric_calls = max_metric_calls
        self.merge = bool(merge)
        self.objectives = objectives
        self.proposals = proposals
        self.max_merges = max_merges
        self.max_attempts = max_attempts
        if perfect_score is not None and (isinstance(perfect_score, bool) or not isinstance(perfect_score, (int, float))):
            raise TypeError(f"perfect_score must be a number or None, got {perfect_score!r}")
        self.perfect_score = None if perfect_score is None else float(perfect_score)
        self._module_names: dict[int, str] = _module_names(self, module)
        self._trainable = [p for p in self.parameters() if p.requires_grad]
        if not self._trainable:
            raise ValueError("GEPA got no parameter with requires_grad=True: nothing to evolve")
        self.rng = random.Random(seed)
        self._pool = CandidatePool(n_val, objectives)
        self.metric_calls = 0
        self.examples: list[dict[str, Any]] = []
        self._order: list[int] = []
        self._pos = 0
        self._merges_due = 0
        self._merges_done = 0
        self._tried_merges: list[list[int]] = []
        self._last: dict[str, Any] = {}

    # ------------------------------------------------------------------ engines
    # ------------------------------------------------------------------ pool views
    @property
    def pool(self) -> list[dict[str, Any]]:
        """The candidates, each ``{parameter name: value}`` (plain data)."""
        return self._pool.candidates

    @property
    def lineage(self) -> list[dict[str, Any]]:
        """Per candidate: ``kind``, ``parents``, ``changed``, ``feedback``, ``step``, ``metric_calls``."""
        return self._pool.lineage

    @property
    def scores(self) -> np.ndarray:
        """The score matrix ``[len(pool), len(valset)]``."""
        return self._pool.scores

    def front(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mask, counts)`` of the pool's per-example Pareto front over the objectives (see
        :func:`langtorch.pareto`)."""
        return self._pool.front()

    def parent_weights(self) -> np.ndarray:
        """The weights a parent is drawn with: examples led after GEPA's removal of candidates
        that only share fronts with others (see :meth:`CandidatePool.parent_weights`)."""
        return self._pool.parent_weights()

    @property
    def best(self) -> int:
        """Index of the best candidate: highest mean validation score, ties to the cheaper
        (mean cost, or tokens), then the older."""
        return self._pool.best()

    def cheapest(self, epsilon: float = 0.0) -> int:
        """Index of the cheapest candidate whose mean validation score is within ``epsilon`` of
        the best (cost, or tokens when the objectives name no cost; ties to the higher score)."""
        return self._pool.cheapest(epsilon)

    # ------------------------------------------------------------------ module values
    def _current(self) -> dict[str, Any]:
        return {self._module_names[id(p)]: p.tolist() for p in self._trainable}

    def _set(self, cand: Mapping[str, Any]) -> None:
        for p in self._trainable:
            p.data = TextTensor(cand[self._module_names[id(p)]])

    def _components(self) -> list[tuple[str, Any, tuple[int, ...] | None]]:
        """``(display name, parameter, entry index or None)`` of every component."""
        out = []
        for p in self._trainable:
            name = self._module_names[id(p)]
            if p.ndim == 0:
                out.append((name, p, None))
            else:
                for idx in np.ndindex(*p.shape):
                    out.append((f"{name}[{', '.join(map(str, idx))}]", p, idx))
        return out

    # ------------------------------------------------------------------ evaluation
    def _grid(self, cands: list[dict[str, Any]], x: TextTensor, y: TextTensor) -> Any:
        """Score candidates x examples as one grid; counts the metric calls."""
        self.metric_calls += len(cands) * x.shape[0]
        return evaluate(self.module, x, y, self.metric, candidates=cands, budget=self.budget)

    def _add(self, cand: dict[str, Any], scores: Any, costs: Any, tokens: Any, info: dict[str, Any]) -> int:
        return self._pool.add(cand, scores, costs, tokens,
                              {"step": self.step_count, "metric_calls": self.metric_calls, **info})

    def _need(self, calls: int, what: str) -> None:
        left = None if self.max_metric_calls is None else self.max_metric_calls - self.metric_calls
        if left is not None and calls > left:
            raise BudgetExceededError(
                f"GEPA.step ({what}) needs up to {calls} metric calls and {left} of max_metric_calls="
                f"{self.max_metric_calls} are left; nothing was sent. Raise max_metric_calls, or use a "
                "smaller minibatch or fewer proposals.")

    def _seed_pool(self) -> None:
        x, y = self.val
        ev = self._grid([self._current()], x, y)
        self._add(self._current(), ev.scores[0], ev.cost[0], ev.usage[0],
                  {"kind": "seed", "parents": [], "changed": [], "feedback": {}})

    # ------------------------------------------------------------------ the step
    def estimate(self) -> dict[str, int]:
        """Metric calls the next ``step()`` can make at most (the budget pre-check)."""
        n_val = self.val[0].shape[0]
        seed = 0 if self.pool else n_val
        reflect = self.minibatch * (1 + self.proposals) + self.proposals * n_val
        return {"metric_calls": seed + (n_val if self._merge_pair() is not None else reflect)}

    def step(self, closure: Any = None) -> float:
        """One GEPA iteration (a merge when one is due and possible, else a reflective
        mutation); the first step also scores the initial values on the valset.

        Args:
            closure: optional; called after the step (the module then holds the best
                candidate) and its loss or score is returned, as in torch.

        Returns:
            The best mean validation score in the pool (or the closure's score).

        Raises:
            BudgetExceededError: the step could exceed ``max_metric_calls`` (raised before
                anything is sent; nothing changes) or the LLM budget. On any error the module
                is left holding the best candidate; the metric calls the step made stay counted.
        """
        self._need(self.estimate()["metric_calls"], "this step")
        self._last = {}
        if not self.pool:
            self._seed_pool()
        pair = self._merge_pair()
        try:
            if pair is not None:
                self._merge_step(*pair)
            else:
                self._reflect_step()
        except BaseException:
            self._set(self.pool[self.best])  # the step had set the module to its parent
            raise
        self.step_count += 1
        self._set(self.pool[self.best])
        mask, _ = self.front()
        best = float(self.scores[self.best].mean())
        self.history.append({"step": self.step_count, "param": "pool", "value": len(self.pool), "score": best,
                             "best": self.best, "front_size": int(mask.sum()), "metric_calls": self.metric_calls,
                             "calls": self.budget.calls, "tokens": self.budget.tokens,
                             **self._last})
        if closure is not None:
            with self.budget:
                return score_of(closure())
        return best

    def fit(self, max_steps: int | None = None) -> float:
        """Step until ``max_metric_calls`` cannot fit another step (stops cleanly: nothing of
        the refused step is sent) or ``max_steps`` steps ran; the module ends holding the best
        candidate. Returns its mean validation score.

        Raises:
            ValueError: neither ``max_metric_calls`` nor ``max_steps`` bounds the run.
        """
        if max_steps is None and self.max_metric_calls is None:
            raise ValueError("fit() needs a bound: give GEPA(max_metric_calls=...) or fit(max_steps=...)")
        done = 0
        while max_steps is None or done < max_steps:
            try:
                self.step()
            except BudgetExceededError:
                break
            done += 1
        if self.pool:
            self._set(self.pool[self.best])
            return float(self.scores[self.best].mean())
        return float("nan")

    # ------------------------------------------------------------------ reflective mutation
    def _next_minibatch(self) -> list[int]:
        n = self.train[0].shape[0]
        if self._pos + self.minibatch > len(self._order):
            self._order = list(range(n))
            self.rng.shuffle(self._order)
            self._pos = 0
        out = self._order[self._pos:self._pos + self.minibatch]
        self._pos += self.minibatch
        return out

    def _choose_parent(self) -> int:
        weights = self.parent_weights()
        idx = [i for i in range(len(self.pool)) if weights[i] > 0]
        return self.rng.choices(idx, weights=[int(weights[i]) for i in idx])[0]

    def _reflect_step(self) -> None:
        parent = self._choose_parent()
        batch = self._next_minibatch()
        x = TextTensor(self.train[0].texts[batch].tolist(), template=False)
        y = TextTensor(self.train[1].texts[batch].tolist(), template=False)
        loss_fn = self._loss_fn
        self._set(self.pool[parent])
        self.zero_grad()
        self.metric_calls += len(batch)
        self._last = {"kind": "reflect", "parent": parent, "minibatch": batch, "accepted": []}
        with self.budget, enable_grad():
            out = self.module(x)
            loss = loss_fn(out, y)
            parent_scores = np.asarray(loss.metadata.column("score"), dtype=np.float64).reshape(-1)
            if self.perfect_score is not None and (parent_scores >= self.perfect_score).all():
                self._last["note"] = "the parent is perfect on this minibatch"
                return
            engine = self.feedback_engine or get_feedback_engine() or self.reflection_engine
            max_score = None if self.perfect_score is None else self.perfect_score - 1e-9
            loss.backward(feedback_engine=engine, max_score=max_score)
        offered = worst_components(self._components())
        if not offered:
            self._last["note"] = "no parameter received feedback"
            return
        children = self._propose(parent, offered, x, out, loss)
        if not children:
            return
        ev = self._grid([c for c, _ in children], x, y)
        child_sums = ev.scores.reshape(len(children), -1).sum(axis=1)
        self._last["child_scores"] = [float(s) for s in child_sums]
        self._last["parent_score"] = float(parent_scores.sum())
        winners = [k for k in range(len(children)) if child_sums[k] > parent_scores.sum()]
        if not winners:
            return
        vx, vy = self.val
        val = self._grid([children[k][0] for k in winners], vx, vy)
        for row, k in enumerate(winners):
            cand, changed = children[k]
            fb = {name: text for name, _, _, text, _ in offered if name in changed}
            i = self._add(cand, val.scores[row], val.cost[row], val.usage[row], {"kind": "reflect", "parents": [parent], "changed": changed,
                                           "feedback": fb, "minibatch": batch,
                                           "minibatch_scores": [float(parent_scores.sum()), float(child_sums[k])]})
            self._last["accepted"].append(i)
        if self.merge and self._merges_done + self._merges_due < self.max_merges:
            self._merges_due += 1

    def _propose(self, parent: int, offered: list, x: TextTensor, out: Any, loss: Any) -> list:
        outs = np.asarray(out.texts, dtype=object).reshape(-1)
        fbs = np.asarray(loss.texts, dtype=object).reshape(-1)
        sc = np.asarray(loss.metadata.column("score"), dtype=np.float64).reshape(-1)
        rows = list(zip(x.tolist(), outs, sc, fbs))
        named = [(name, self._module_names[id(p)], idx, text, s) for name, p, idx, text, s in offered]
        children, problem = self._reflector.propose(self.pool[parent], named, rows, self.examples, self.budget)
        if children:
            self._last["proposed"] = len(children)
            return children
        warnings.warn(f"GEPA step {self.step_count}: the reflection engine gave no usable proposal in "
                      f"{self.max_attempts} attempts ({problem}); the step changes nothing.", RuntimeWarning,
                      stacklevel=3)
        self._last["note"] = f"no usable proposal: {problem}"
        return []

    # ------------------------------------------------------------------ merge
    def _merge_pair(self) -> tuple[int, int, dict[str, Any]] | None:
        if not (self.merge and self._merges_due > 0 and self.pool):
            return None
        components = [(self._module_names[id(p)], idx) for _, p, idx in self._components()]
        return self._pool.merge_pair(components, self._tried_merges)

    def _merge_step(self, i: int, j: int, child: dict[str, Any]) -> None:
        self._merges_due -= 1
        self._merges_done += 1
        self._tried_merges.append([i, j])
        si, sj = self.scores[i], self.scores[j]
        n_val = si.shape[0]
        k = min(self.minibatch, n_val)
        differ = [n for n in range(n_val) if si[n] != sj[n]]
        self.rng.shuffle(differ)
        rest = [n for n in range(n_val) if n not in differ]
        self.rng.shuffle(rest)
        sub = sorted((differ + rest)[:k])
        vx, vy = self.val
        ev = self._grid([child], TextTensor(vx.texts[sub].tolist(), template=False),
                        TextTensor(vy.texts[sub].tolist(), template=False))
        got = float(ev.scores[0].sum())
        self._last = {"kind": "merge", "parent": [i, j], "subsample": sub, "accepted": [],
                      "merge_score": got, "parent_scores": [float(si[sub].sum()), float(sj[sub].sum())]}
        if got < max(si[sub].sum(), sj[sub].sum()):
            return
        others = [n for n in range(n_val) if n not in sub]
        scores = np.zeros(n_val)
        costs, tokens = np.zeros(n_val), np.zeros(n_val, dtype=np.int64)
        scores[sub], costs[sub], tokens[sub] = ev.scores[0], ev.cost[0], ev.usage[0]
        if others:
            ev2 = self._grid([child], TextTensor(vx.texts[others].tolist(), template=False),
                             TextTensor(vy.texts[others].tolist(), template=False))
            scores[others], costs[others], tokens[others] = ev2.scores[0], ev2.cost[0], ev2.usage[0]
        changed = [name for name, p, idx in self._components()
                   if get_entry(child[self._module_names[id(p)]], idx)
                   != get_entry(self.pool[i][self._module_names[id(p)]], idx)]
        k = self._add(child, scores, costs, tokens, {"kind": "merge", "parents": [i, j], "changed": changed,
                                                     "feedback": {}})
        self._last["accepted"].append(k)

    # ------------------------------------------------------------------ traces
    def add_examples_from_trace(self, trace: Any, metric: Any) -> int:
        """Turn the top-level runs of a saved :func:`lt.trace <langtorch.trace>` (production
        traffic) into ``(input, output, score, feedback)`` examples that every reflection is shown
        (the four lowest-scored). Runs that raised are skipped (a failed entry's empty output is
        not an example). Returns how many were added.

        Args:
            trace: an :class:`~langtorch.Trace` or the path it was saved to.
            metric: ``(input, output) -> score | (score, feedback)`` (no target in production).

        Raises:
            TypeError, ValueError: the metric returned something else, or a non-finite score.

        Example:
            >>> import langtorch as lt
            >>> from langtorch.backends import OpenAIBackend
            >>> m = lt.TLayer("Q: {}")
            >>> with lt.trace() as tr:
            ...     _ = m(lt.TextTensor(["a", "bb"]))
            >>> opt = lt.optim.GEPA(m.named_text_parameters(), module=m, metric="exact_match",
            ...                     reflection_engine=OpenAIBackend("x", api_key="sk-x1234567"),
            ...                     trainset=(["a"], ["a"]), valset=(["a"], ["a"]), minibatch=1)
            >>> opt.add_examples_from_trace(tr, lambda x, y: (float(len(y) < 5), "too long" if len(y) >= 5 else "ok"))
            2
            >>> [(e["output"], e["feedback"]) for e in opt.examples]
            [('Q: a', 'ok'), ('Q: bb', 'too long')]
        """
        found = examples_from_trace(trace, metric)
        self.examples.extend(found)
        return len(found)

    # ------------------------------------------------------------------ persistence and views
    def state_dict(self) -> dict[str, Any]:
        """Adds the pool, the score/cost/token matrices, the lineage, the metric-call counter,
        the minibatch order, the merge counters, the trace examples and the random state — all
        plain data (``torch.load(..., weights_only=True)`` reads it)."""
        sd = super().state_dict()
        sd["gepa"] = json.loads(json.dumps({
            **self._pool.state_dict(), "metric_calls": self.metric_calls, "order": self._order, "pos": self._pos,
            "merges_due": self._merges_due, "merges_done": self._merges_done, "tried_merges": self._tried_merges,
            "examples": self.examples}))
        sd["history"] = json.loads(json.dumps(sd["history"]))
        version, internal, gauss = self.rng.getstate()
        sd["rng"] = [version, list(internal), gauss]
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores everything :meth:`state_dict` saved; the module is set to the best candidate."""
        if "gepa" not in state_dict or "rng" not in state_dict:
            raise ValueError("not a GEPA state dict (it has no 'gepa' and 'rng' entries): load what "
                             "GEPA.state_dict() saved")
        super().load_state_dict(state_dict)
        g = state_dict["gepa"]
        self._pool.load_state_dict(g)
        self.metric_calls, self._order, self._pos = int(g["metric_calls"]), list(g["order"]), int(g["pos"])
        self._merges_due, self._merges_done = int(g["merges_due"]), int(g["merges_done"])
        self._tried_merges = [list(t) for t in g["tried_merges"]]
        self.examples = json.loads(json.dumps(g["examples"]))
        version, internal, gauss = state_dict["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        if self.pool:
            self._set(self.pool[self.best])

    def to_pandas(self) -> Any:
        """The pool as a DataFrame: one row per candidate with its values, mean validation
        score, mean cost and tokens, whether it is on the front and how many examples it leads,
        and its lineage."""
        return self._pool.to_pandas()

    def plot(self, path: Any = None) -> Any:
        """The best mean validation score and the front size per metric call (matplotlib);
        saved to ``path`` when given."""
        return _plot_history(self.history, path)


def _plot_history(history: list[dict[str, Any]], path: Any) -> Any:
    try:
        import matplotlib

        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot() needs matplotlib: pip install matplotlib") from None
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    calls = [h["metric_calls"] for h in history]
    a.step(calls, [h["score"] for h in history], where="post", marker="o")
    a.set_xlabel("metric calls")
    a.set_ylabel("best mean validation score")
    b.step(calls, [h["front_size"] for h in history], where="post", marker="o")
    b.set_xlabel("metric calls")
    b.set_ylabel("Pareto front size")
    fig.suptitle("GEPA")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path)
        plt.close(fig)
    return fig
