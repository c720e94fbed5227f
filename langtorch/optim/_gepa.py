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

from langtorch.autograd import enable_grad, get_backward_engine
from langtorch.errors import BudgetExceededError, ParseError
from langtorch.evaluation import evaluate, pareto
from langtorch.optim._base import TextOptimizer, score_of
from langtorch.optim._tgd import _escape_literal_braces, _fields
from langtorch.tensor import TextTensor

__all__ = ["GEPA"]

_OBJECTIVES = ("score", "cost", "tokens")

_SYSTEM = (
    "You improve the text parameters (prompts, instructions, demonstrations) of a language-model "
    "pipeline. You are shown components of the pipeline, the feedback each component received "
    "(propagated back from the pipeline's outputs), and examples with their outputs and scores. "
    "Rewrite the components so that the failures described in the feedback do not happen again, "
    "keeping what works. Answer only with the JSON object asked for.")


def _schema(names: Sequence[str]) -> dict[str, Any]:
    rewrite = {"type": "object",
               "properties": {"component": {"type": "string", "enum": list(names)},
                              "new_value": {"type": "string"}},
               "required": ["component", "new_value"], "additionalProperties": False}
    proposal = {"type": "object", "properties": {"rewrites": {"type": "array", "items": rewrite, "minItems": 1}},
                "required": ["rewrites"], "additionalProperties": False}
    return {"type": "object",
            "properties": {"reasoning": {"type": "string"},
                           "proposals": {"type": "array", "items": proposal, "minItems": 1}},
            "required": ["reasoning", "proposals"], "additionalProperties": False}


def _pair(data: Any, what: str) -> tuple[TextTensor, TextTensor]:
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"{what} must be an (inputs, targets) pair of TextTensors (or lists of str), got "
                        f"{type(data).__name__}")
    x, y = (d if isinstance(d, TextTensor) else TextTensor(d, template=False) for d in data)
    if x.ndim != 1 or x.shape != y.shape or x.shape[0] == 0:
        raise ValueError(f"{what}: inputs and targets must be non-empty 1-d and of one length, got shapes "
                         f"{x.shape} and {y.shape}")
    return x, y


def _check_value(new: str, old: str) -> str:
    """The new value of a component when it keeps the old one's placeholders (literal braces an
    engine wrote single are doubled for it), else ``ValueError``."""
    new = new.strip()
    if not new:
        raise ValueError("the new value is empty")
    old_fields = _fields(old)
    if old_fields is None:
        return new  # the old value is not a template (plain text): any text will do
    if _fields(new) != old_fields:
        escaped = _escape_literal_braces(new, old_fields)
        if escaped is not None and _fields(escaped) == old_fields:
            return escaped
        raise ValueError(f"the new value must keep exactly the placeholders {list(old_fields)}, got "
                         f"{list(_fields(new) or ['<not a valid template>'])}")
    return new


class GEPA(TextOptimizer):
    """Reflective evolution (GEPA) of a module's text parameters, with torch.optim's shape.

    See the module docstring for the algorithm. ``step()`` is one GEPA iteration;
    :meth:`fit` steps until the metric-call budget (or ``max_steps``) and leaves the module
    holding the best candidate (highest mean validation score; ties go to the cheaper, then the
    older). After every step the module holds the best candidate so far.

    Args:
        params: the TextParameters to evolve (``module.named_text_parameters()`` or a subset);
            every entry of an n-d parameter (``[K]`` prompts, demos) is its own component.
        module: the program (a :class:`~langtorch.TModule`) that uses them.
        metric: ``(prediction, target) -> score | (score, feedback)`` (as
            :class:`~langtorch.nn.MetricLoss` takes), a metric name, or an ``lt.nn`` loss module.
            Higher is better; the feedback text is what the reflection reads.
        reflection_engine: the LLM that rewrites components (a Backend or an ``lt.nn.LLM``); it
            answers in structured output (a JSON schema).
        trainset, valset: ``(inputs, targets)`` pairs of 1-d TextTensors (or lists of str).
            Minibatches come from ``trainset``; the score matrix is over ``valset``.
        minibatch: training examples per reflection.
        max_metric_calls: the budget in metric calls (one candidate on one example); ``None``:
            no limit (then :meth:`fit` needs ``max_steps``).
        merge: whether to merge frontier candidates (at most ``max_merges`` attempts in all).
        objectives: ``("score",)``, or with ``"cost"`` (the backends' price) or ``"tokens"``:
            the front keeps candidates not dominated on (score, minus cost) per example.
        seed: seeds the minibatch order, the parent choice and the merge choice.
        feedback_engine: the engine of ``loss.backward()`` (default: the one set with
            ``lt.optim.set_backward_engine``, else ``reflection_engine``); not needed when the
            module makes no LLM call.
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
        super().__init__(params, {}, max_calls=max_calls, max_tokens=max_tokens, max_cost=max_cost)
        self.module = module
        self.metric = metric
        self.reflection_engine = self._as_llm(reflection_engine, "reflection_engine")
        self.feedback_engine = feedback_engine
        self.train = _pair(trainset, "trainset")
        self.val = _pair(valset, "valset")
        if minibatch > self.train[0].shape[0]:
            raise ValueError(f"minibatch={minibatch} is larger than the trainset ({self.train[0].shape[0]} examples)")
        n_val = self.val[0].shape[0]
        if max_metric_calls is not None and (not isinstance(max_metric_calls, int) or isinstance(max_metric_calls, bool)
                                             or max_metric_calls < n_val):
            raise ValueError(f"max_metric_calls must be an int >= len(valset) = {n_val} (scoring the initial "
                             f"values costs that much), or None; got {max_metric_calls!r}")
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
        named = {id(p): n for n, p in module.named_text_parameters()}
        self._module_names: dict[int, str] = {}
        for p in self.parameters():
            if id(p) not in named:
                raise ValueError(f"parameter {self.name_of(p)!r} is not a text parameter of the module")
            self._module_names[id(p)] = named[id(p)]
        self._trainable = [p for p in self.parameters() if p.requires_grad]
        if not self._trainable:
            raise ValueError("GEPA got no parameter with requires_grad=True: nothing to evolve")
        self.rng = random.Random(seed)
        self.pool: list[dict[str, Any]] = []
        self._scores: list[list[float]] = []
        self._costs: list[list[float]] = []
        self._tokens: list[list[int]] = []
        self.lineage: list[dict[str, Any]] = []
        self.metric_calls = 0
        self.examples: list[dict[str, Any]] = []
        self._order: list[int] = []
        self._pos = 0
        self._merges_due = 0
        self._merges_done = 0
        self._tried_merges: list[list[int]] = []
        self._last: dict[str, Any] = {}

    # ------------------------------------------------------------------ engines
    @staticmethod
    def _as_llm(engine: Any, what: str) -> Any:
        from langtorch.backends import Backend
        from langtorch.nn import LLM

        if isinstance(engine, LLM):
            return engine
        if isinstance(engine, Backend):
            return LLM(engine, temperature=0, max_tokens=4000)
        raise TypeError(f"{what} must be a langtorch Backend or an lt.nn.LLM, got {type(engine).__name__}")

    # ------------------------------------------------------------------ pool views
    @property
    def scores(self) -> np.ndarray:
        """The score matrix ``[len(pool), len(valset)]``."""
        return np.array(self._scores, dtype=np.float64).reshape(len(self._scores), self.val[0].shape[0])

    def _objective_grid(self) -> np.ndarray:
        cols = [self.scores]
        for o in self.objectives[1:]:
            cols.append(-np.array(self._costs if o == "cost" else self._tokens, dtype=np.float64).reshape(self.scores.shape))
        return np.stack(cols, -1)

    def front(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mask, counts)`` of the pool's per-example Pareto front over the objectives (see
        :func:`langtorch.pareto`)."""
        if not self.pool:
            return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
        if len(self.objectives) == 1:
            return pareto(self.scores)
        return pareto(self._objective_grid(), objective_dim=-1)

    def _mean_cost(self) -> np.ndarray:
        key = self.objectives[1] if len(self.objectives) > 1 else "tokens"
        grid = self._costs if key == "cost" else self._tokens
        return np.array(grid, dtype=np.float64).reshape(self.scores.shape).mean(axis=1)

    @property
    def best(self) -> int:
        """Index of the best candidate: highest mean validation score, ties to the cheaper
        (mean cost, or tokens), then the older."""
        means, costs = self.scores.mean(axis=1), self._mean_cost()
        return int(min(range(len(self.pool)), key=lambda i: (-means[i], costs[i], i)))

    def cheapest(self, epsilon: float = 0.0) -> int:
        """Index of the cheapest candidate whose mean validation score is within ``epsilon`` of
        the best (cost, or tokens when the objectives name no cost; ties to the higher score).

        Example:
            >>> import numpy as np
            >>> opt = GEPA.__new__(GEPA)
            >>> opt.pool, opt.objectives = [{}, {}], ("score", "tokens")
            >>> opt.val, opt._scores, opt._tokens = (np.zeros(2),), [[1.0, 1.0], [1.0, 0.8]], [[90, 90], [10, 10]]
            >>> opt.cheapest(0.0), opt.cheapest(0.1)
            (0, 1)
        """
        means, costs = self.scores.mean(axis=1), self._mean_cost()
        ok = [i for i in range(len(self.pool)) if means[i] >= means.max() - epsilon - 1e-12]
        return int(min(ok, key=lambda i: (costs[i], -means[i], i)))

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

    @staticmethod
    def _get(value: Any, idx: tuple[int, ...] | None) -> str:
        if idx is None:
            return value
        for i in idx:
            value = value[i]
        return value

    @staticmethod
    def _put(cand: dict[str, Any], name: str, idx: tuple[int, ...] | None, new: str) -> None:
        if idx is None:
            cand[name] = new
            return
        value = json.loads(json.dumps(cand[name]))  # a deep copy of nested lists
        at = value
        for i in idx[:-1]:
            at = at[i]
        at[idx[-1]] = new
        cand[name] = value

    # ------------------------------------------------------------------ evaluation
    def _grid(self, cands: list[dict[str, Any]], x: TextTensor, y: TextTensor) -> Any:
        """Score candidates x examples as one grid; counts the metric calls."""
        self.metric_calls += len(cands) * x.shape[0]
        return evaluate(self.module, x, y, self.metric, candidates=cands, budget=self.budget)

    def _add(self, cand: dict[str, Any], ev: Any, row: int, info: dict[str, Any]) -> int:
        self.pool.append(cand)
        self._scores.append([float(s) for s in ev.scores[row]])
        self._costs.append([float(c) for c in ev.cost[row]])
        self._tokens.append([int(t) for t in ev.usage[row]])
        self.lineage.append({"step": self.step_count, "metric_calls": self.metric_calls, **info})
        return len(self.pool) - 1

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
        self._add(self._current(), ev, 0, {"kind": "seed", "parents": [], "changed": [], "feedback": {}})

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
                anything is sent; nothing changes) or the LLM budget.
        """
        self._need(self.estimate()["metric_calls"], "this step")
        self._last = {}
        if not self.pool:
            self._seed_pool()
        pair = self._merge_pair()
        if pair is not None:
            self._merge_step(*pair)
        else:
            self._reflect_step()
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

    def _leads(self) -> np.ndarray:
        """``[candidates, examples]``: whether a candidate is on an example's front."""
        grid = self.scores[..., None] if len(self.objectives) == 1 else self._objective_grid()
        ge = (grid[:, None] >= grid[None, :]).all(-1)
        gt = (grid[:, None] > grid[None, :]).any(-1)
        return ~(ge & gt).any(0)

    def parent_weights(self) -> np.ndarray:
        """How many validation examples each candidate leads once candidates that only share
        fronts are dropped (GEPA's dominated-program removal): visiting candidates from the
        lowest mean score up, one whose every example front also holds another remaining
        candidate is removed. A parent is drawn with these weights.

        Example:
            >>> opt = GEPA.__new__(GEPA)
            >>> import numpy as np
            >>> opt.pool, opt.objectives, opt.val = [{}, {}], ("score",), (np.zeros(3),)
            >>> opt._scores = [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]    # the seed only ties
            >>> opt.parent_weights().tolist()
            [0, 3]
        """
        leads = self._leads()
        order = sorted(range(len(self.pool)), key=lambda i: (self.scores[i].mean(), -i))
        alive = set(range(len(self.pool)))
        changed = True
        while changed:
            changed = False
            for p in order:
                if p not in alive:
                    continue
                others = list(alive - {p})
                if others and all(leads[others, n].any() for n in np.flatnonzero(leads[p])):
                    alive.discard(p)
                    changed = True
                    break
        keep = np.zeros(len(self.pool), dtype=bool)
        keep[list(alive)] = True
        return (leads & keep[:, None]).sum(axis=1).astype(np.int64)

    def _choose_parent(self) -> int:
        weights = self.parent_weights()
        idx = [i for i in range(len(self.pool)) if weights[i] > 0]
        return self.rng.choices(idx, weights=[int(weights[i]) for i in idx])[0]

    def _reflect_step(self) -> None:
        parent = self._choose_parent()
        batch = self._next_minibatch()
        x = TextTensor(self.train[0].texts[batch].tolist(), template=False)
        y = TextTensor(self.train[1].texts[batch].tolist(), template=False)
        from langtorch.nn import MetricLoss, TextLoss

        loss_fn = self.metric if isinstance(self.metric, (MetricLoss, TextLoss)) else MetricLoss(self.metric)
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
            engine = self.feedback_engine or get_backward_engine() or self.reflection_engine
            max_score = None if self.perfect_score is None else self.perfect_score - 1e-9
            loss.backward(engine=engine, max_score=max_score)
        offered = self._worst_components()
        if not offered:
            self._last["note"] = "no parameter received feedback"
            return
        children = self._propose(parent, offered, x, y, out, loss)
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
            i = self._add(cand, val, row, {"kind": "reflect", "parents": [parent], "changed": changed,
                                           "feedback": fb, "minibatch": batch,
                                           "minibatch_scores": [float(parent_scores.sum()), float(child_sums[k])]})
            self._last["accepted"].append(i)
        if self.merge and self._merges_done + self._merges_due < self.max_merges:
            self._merges_due += 1

    def _worst_components(self) -> list[tuple[str, Any, Any, str, float]]:
        """``(name, parameter, index, feedback, score)`` of the components whose feedback is
        worst: the lowest mean loss score behind it (all of them when unscored)."""
        found = []
        for name, p, idx in self._components():
            if p.grad is None:
                continue
            texts = np.asarray(p.grad.texts, dtype=object)
            text = str(texts[idx] if idx is not None else (texts.item() if texts.ndim == 0 else texts))
            if not text.strip():
                continue
            col = np.asarray(p.grad.metadata.column("score"), dtype=np.float64) if "score" in p.grad.metadata else None
            s = float(col[idx] if idx is not None else col.reshape(-1)[0]) if col is not None else float("nan")
            found.append((name, p, idx, text, s))
        scored = [f for f in found if np.isfinite(f[4])]
        if not scored:
            return found
        worst = min(f[4] for f in scored)
        return [f for f in scored if f[4] <= worst + 1e-9]

    def _request(self, parent: int, offered: list, x: TextTensor, y: TextTensor, out: Any, loss: Any) -> Any:
        from langtorch.nn import chat

        cand = self.pool[parent]
        parts = ["Components you may rewrite, with the feedback each received:"]
        for name, p, idx, text, s in offered:
            value = self._get(cand[self._module_names[id(p)]], idx)
            keep = _fields(value)
            rule = (f"\n(A template: keep exactly the placeholders {', '.join('{' + f + '}' for f in keep)}; "
                    "write literal braces doubled.)" if keep else "")
            score = f" (mean score {s:.3g} of the examples behind it)" if np.isfinite(s) else ""
            parts.append(f"### component: {name}\nCurrent value:\n<<<\n{value}\n>>>{rule}\n"
                         f"Feedback{score}:\n<<<\n{text}\n>>>")
        outs = np.asarray(out.texts, dtype=object).reshape(-1)
        fbs = np.asarray(loss.texts, dtype=object).reshape(-1)
        sc = np.asarray(loss.metadata.column("score"), dtype=np.float64).reshape(-1)
        rows = [f"- Input: {xi}\n  Output: {oi}\n  Score: {si:g}\n  Feedback: {fi}"
                for xi, oi, si, fi in zip(x.tolist(), outs, sc, fbs)]
        parts.append("Examples from this minibatch:\n" + "\n".join(rows))
        if self.examples:
            worst = sorted(self.examples, key=lambda e: e["score"])[:4]
            parts.append("Examples from production traces:\n" + "\n".join(
                f"- Input: {e['input']}\n  Output: {e['output']}\n  Score: {e['score']:g}\n  Feedback: {e['feedback']}"
                for e in worst))
        k = self.proposals
        parts.append(f"Write {k} proposal{'s' if k > 1 else ''}{' (different from each other)' if k > 1 else ''}; "
                     "each rewrites one or more of the components above. Reply with JSON: "
                     '{"reasoning": "<short>", "proposals": [{"rewrites": [{"component": "<name>", '
                     '"new_value": "<the new text>"}]}]}')
        return chat([{"role": "system", "content": _SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}])

    def _propose(self, parent: int, offered: list, x: TextTensor, y: TextTensor, out: Any,
                 loss: Any) -> list[tuple[dict[str, Any], list[str]]]:
        from langtorch.autograd import no_grad

        by_name = {name: (p, idx) for name, p, idx, _, _ in offered}
        fmt = {"type": "json_schema", "json_schema": {"name": "gepa_proposals", "schema": _schema(list(by_name))}}
        request = self._request(parent, offered, x, y, out, loss)
        problem = ""
        for attempt in range(self.max_attempts):
            try:
                with self.budget, no_grad():
                    answer = self.reflection_engine(request, response_format=fmt,
                                                    **({"use_cache": False} if attempt else {}))
                parsed = answer.metadata["parsed"]
            except ParseError as e:
                problem = str(e)
                continue
            children, problem = self._children(parent, parsed, by_name)
            if children:
                self._last["proposed"] = len(children)
                return children
        warnings.warn(f"GEPA step {self.step_count}: the reflection engine gave no usable proposal in "
                      f"{self.max_attempts} attempts ({problem}); the step changes nothing.", RuntimeWarning,
                      stacklevel=3)
        self._last["note"] = f"no usable proposal: {problem}"
        return []

    def _children(self, parent: int, parsed: Any, by_name: Mapping[str, Any]) -> tuple[list, str]:
        out: list[tuple[dict[str, Any], list[str]]] = []
        problem = ""
        proposals = parsed.get("proposals") if isinstance(parsed, Mapping) else None
        if not isinstance(proposals, list):
            return [], f"the answer lacks a 'proposals' list: {str(parsed)[:200]!r}"
        seen = [self.pool[parent]] + [c for c, _ in out]
        for prop in proposals[: self.proposals]:
            child = json.loads(json.dumps(self.pool[parent]))
            changed: list[str] = []
            try:
                rewrites = prop["rewrites"]
                for rw in rewrites:
                    name = rw["component"]
                    if name not in by_name:
                        raise ValueError(f"unknown component {name!r} (offered: {sorted(by_name)})")
                    p, idx = by_name[name]
                    pname = self._module_names[id(p)]
                    new = _check_value(str(rw["new_value"]), self._get(child[pname], idx))
                    self._put(child, pname, idx, new)
                    changed.append(name)
            except (KeyError, TypeError, ValueError) as e:
                problem = f"{type(e).__name__}: {e}"
                continue
            if child not in seen:
                seen.append(child)
                out.append((child, changed))
        if not out and not problem:
            problem = "every proposal equals the parent"
        return out, problem

    # ------------------------------------------------------------------ merge
    def _ancestors(self, i: int) -> set[int]:
        out, todo = set(), [i]
        while todo:
            for q in self.lineage[todo.pop()]["parents"]:
                if q not in out:
                    out.add(q)
                    todo.append(q)
        return out

    def _merged(self, i: int, j: int) -> dict[str, Any] | None:
        common = self._ancestors(i) & self._ancestors(j)
        if not common or i in self._ancestors(j) or j in self._ancestors(i):
            return None
        a = max(common)
        means = self.scores.mean(axis=1)
        child = json.loads(json.dumps(self.pool[i]))
        took = {i: False, j: False}
        for _, p, idx in self._components():
            pname = self._module_names[id(p)]
            vi, vj, va = (self._get(self.pool[k][pname], idx) for k in (i, j, a))
            if vi == vj:
                continue
            src = j if vi == va else i if vj == va else (i if means[i] >= means[j] else j)
            took[src] = True
            self._put(child, pname, idx, vi if src == i else vj)
        if not (took[i] and took[j]) or child in self.pool:
            return None
        return child

    def _merge_pair(self) -> tuple[int, int, dict[str, Any]] | None:
        if not (self.merge and self._merges_due > 0 and self.pool):
            return None
        mask, _ = self.front()
        idx = [i for i in range(len(self.pool)) if mask[i]]
        pairs = [(i, j) for a, i in enumerate(idx) for j in idx[a + 1:] if [i, j] not in self._tried_merges]
        for i, j in pairs:
            child = self._merged(i, j)
            if child is not None:
                return i, j, child
        return None

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
                   if self._get(child[self._module_names[id(p)]], idx)
                   != self._get(self.pool[i][self._module_names[id(p)]], idx)]
        self.pool.append(child)
        self._scores.append(scores.tolist())
        self._costs.append(costs.tolist())
        self._tokens.append([int(t) for t in tokens])
        self.lineage.append({"step": self.step_count, "metric_calls": self.metric_calls, "kind": "merge",
                             "parents": [i, j], "changed": changed, "feedback": {}})
        self._last["accepted"].append(len(self.pool) - 1)

    # ------------------------------------------------------------------ traces
    def add_examples_from_trace(self, trace: Any, metric: Any) -> int:
        """Turn the top-level runs of a saved :func:`lt.trace <langtorch.trace>` (production
        traffic) into ``(input, output, score, feedback)`` examples that every reflection is shown
        (the four lowest-scored). Returns how many were added.

        Args:
            trace: an :class:`~langtorch.Trace` or the path it was saved to.
            metric: ``(input, output) -> score | (score, feedback)`` (no target in production).

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
        from langtorch.tracing import Trace

        if not isinstance(trace, Trace):
            trace = Trace.load(trace)
        if not callable(metric):
            raise TypeError(f"metric must be a callable (input, output) -> score | (score, feedback), got "
                            f"{type(metric).__name__}")
        added = 0
        for span in trace.roots:
            if not span.inputs or not span.outputs:
                continue
            xs, ys = span.inputs[0].get("texts"), span.outputs[0].get("texts")
            if xs is None or ys is None or len(xs) != len(ys):
                continue
            for xi, yi in zip(xs, ys):
                value = metric(xi, yi)
                score, feedback = value if isinstance(value, tuple) else (value, "")
                self.examples.append({"input": str(xi), "output": str(yi), "score": float(score),
                                      "feedback": str(feedback)})
                added += 1
        return added

    # ------------------------------------------------------------------ persistence and views
    def state_dict(self) -> dict[str, Any]:
        """Adds the pool, the score/cost/token matrices, the lineage, the metric-call counter,
        the minibatch order, the merge counters, the trace examples and the random state — all
        plain data (``torch.load(..., weights_only=True)`` reads it)."""
        sd = super().state_dict()
        sd["gepa"] = json.loads(json.dumps({
            "pool": self.pool, "scores": self._scores, "costs": self._costs, "tokens": self._tokens,
            "lineage": self.lineage, "metric_calls": self.metric_calls, "order": self._order, "pos": self._pos,
            "merges_due": self._merges_due, "merges_done": self._merges_done, "tried_merges": self._tried_merges,
            "examples": self.examples}))
        sd["history"] = json.loads(json.dumps(sd["history"]))
        version, internal, gauss = self.rng.getstate()
        sd["rng"] = [version, list(internal), gauss]
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores everything :meth:`state_dict` saved; the module is set to the best candidate."""
        super().load_state_dict(state_dict)
        g = state_dict["gepa"]
        self.pool = json.loads(json.dumps(g["pool"]))
        self._scores, self._costs, self._tokens = (json.loads(json.dumps(g[k])) for k in ("scores", "costs", "tokens"))
        self.lineage = json.loads(json.dumps(g["lineage"]))
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
        import pandas as pd

        mask, counts = self.front()
        means, rows = self.scores.mean(axis=1) if self.pool else [], []
        for i, cand in enumerate(self.pool):
            lin = self.lineage[i]
            rows.append({"candidate": i, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in cand.items()},
                         "score": float(means[i]), "cost": float(np.mean(self._costs[i])),
                         "tokens": float(np.mean(self._tokens[i])), "front": bool(mask[i]), "leads": int(counts[i]),
                         "kind": lin["kind"], "parents": lin["parents"], "changed": lin["changed"],
                         "step": lin["step"], "metric_calls": lin["metric_calls"]})
        return pd.DataFrame(rows)

    def plot(self, path: Any = None) -> Any:
        """The best mean validation score and the front size per metric call (matplotlib);
        saved to ``path`` when given."""
        try:
            import matplotlib

            if path is not None:
                matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("plot() needs matplotlib: pip install matplotlib") from None
        fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
        calls = [h["metric_calls"] for h in self.history]
        a.step(calls, [h["score"] for h in self.history], where="post", marker="o")
        a.set_xlabel("metric calls")
        a.set_ylabel("best mean validation score")
        b.step(calls, [h["front_size"] for h in self.history], where="post", marker="o")
        b.set_xlabel("metric calls")
        b.set_ylabel("Pareto front size")
        fig.suptitle("GEPA")
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
            plt.close(fig)
        return fig
