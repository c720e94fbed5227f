"""Search (APE/OPRO) and FewShot (DSPy's BootstrapFewShot idea): candidates scored as one grid."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from langtorch.autograd import FeedbackEngine, as_feedback_engine, ask_feedback, no_grad
from langtorch.core import require_capabilities
from langtorch.core.sync import run_sync
from langtorch.errors import BatchError, BudgetExceededError, OptimizerError
from langtorch.optim._base import TextOptimizer
from langtorch.optim._data import Examples, split_step_args
from langtorch.optim._tgd import _fields
from langtorch.tensor import TextTensor

__all__ = ["FewShot", "Search", "evaluate_candidates"]


def _metric_module(metric: Any) -> Any:
    from langtorch.nn.losses import MetricLoss, TextLoss

    if isinstance(metric, (MetricLoss, TextLoss)):
        return metric
    if isinstance(metric, str) or callable(metric):
        return MetricLoss(metric)
    raise TypeError(f"metric must be a name, a callable (pred, target) -> score, or a loss module; got "
                    f"{type(metric).__name__}")


def calls_per_input(module: Any, metric: Any = None) -> int:
    """An upper estimate of the requests one input costs: one per LLM module the program holds
    (each assumed called once per entry), plus one for an LLM-judge metric.

    Example:
        >>> import langtorch as lt
        >>> calls_per_input(lt.TLayer("{}"))
        1
    """
    from langtorch.nn.llm import LLM
    from langtorch.nn.losses import TextLoss

    n = sum(1 for m in module.modules() if isinstance(m, LLM))
    return max(1, n) + (1 if isinstance(metric, TextLoss) else 0)


def evaluate_candidates(module: Any, name: str, candidates: Any, inputs: Any, targets: Any,
                        metric: Any) -> np.ndarray:
    """Mean score of each of ``P`` candidate values of parameter ``name`` on a batch: one
    ``functional_call`` over the ``[P] x [N]`` grid (all requests concurrent).

    Returns:
        float array of shape ``[P]`` (higher is better).

    Example:
        >>> import langtorch as lt
        >>> m = lt.TLayer("{}")
        >>> evaluate_candidates(m, "prompt", ["{}!", "{}"], lt.TextTensor(["a", "b"]), lt.TextTensor(["a", "b"]),
        ...                     "exact_match").tolist()
        [0.0, 1.0]
    """
    from langtorch.func import functional_call

    cands = candidates if isinstance(candidates, TextTensor) else TextTensor(list(candidates))
    x = inputs if isinstance(inputs, TextTensor) else TextTensor(inputs, template=False)
    y = targets if isinstance(targets, TextTensor) else TextTensor(targets, template=False)
    with no_grad():
        out = functional_call(module, {name: cands}, x)
        if out.shape[0] != cands.shape[0]:
            raise OptimizerError(f"the module's output has shape {out.shape}; expected a leading "
                                 f"candidates axis of {cands.shape[0]}", parameter=name)
        loss = _metric_module(metric)(out, y)
    scores = loss.metadata.column("score").astype(float)
    return scores.reshape(scores.shape[0], -1).mean(axis=1)


class Search(TextOptimizer):
    """Propose candidates, score the candidates x minibatch grid in one ``functional_call``, keep
    the best (APE / OPRO). 0-d parameters only (one prompt, one system prompt, one demos block).

    ``step()`` does, for each parameter: propose ``n_candidates`` new values (the proposer sees
    the current value and the best earlier values with their scores, OPRO-style), evaluate them
    *and the current value* on the step's batch of the examples given to the constructor, and
    keep the best; ties keep the current value. Cost of one step: ``(n_candidates + 1) * N``
    forward requests (minus cache hits) plus the proposer's one request (see :meth:`estimate`).
    ``step(closure)`` also calls ``closure()`` after the update and returns its score (see
    :class:`~langtorch.optim.TextOptimizer` for the contract).

    Args:
        params: TextParameters of ``module`` (or its ``named_text_parameters()``).
        proposer: a feedback engine (``lt.nn.LLM``, a Backend, or any
            :class:`~langtorch.autograd.FeedbackEngine`) asked for candidates in structured
            output (one that declares none raises :class:`~langtorch.errors.CapabilityError`
            here), or a callable ``(value: str, k: int, rng: random.Random) -> list[str]``
            (mutation).
        n_candidates: candidates per step.
        module: the module to evaluate (its parameters are substituted, not mutated, while
            scoring).
        metric: a metric name, a callable ``(pred, target) -> score``, or a loss module.
        inputs, targets: the examples candidates are scored on (DSPy's trainset).
        batch_size: score each step on the next minibatch of this many examples (seeded by
            ``seed``); ``None``: on all of them.
        seed: seeds the mutation proposer's random generator and the minibatches.
        calls_per_input: requests one input costs in ``module`` (default: an upper estimate
            from its LLM modules and the metric), for the budget pre-check.
        max_calls, max_tokens, max_cost: the budget; a step that cannot fit raises before any call.

    Example:
        >>> import langtorch as lt
        >>> m = lt.TLayer("{}?")
        >>> opt = lt.optim.Search(m.named_text_parameters(), lambda v, k, rng: ["{}", "{}!"], 2,
        ...                       module=m, metric="exact_match", inputs=["a", "b"], targets=["a", "b"])
        >>> opt.step()
        1.0
        >>> str(m.prompt)
        '{}'
    """

    def __init__(self, params: Any, proposer: Any, n_candidates: int = 4, *, module: Any, metric: Any,
                 inputs: Any = None, targets: Any = None, batch_size: int | None = None,
                 seed: int = 0, calls_per_input: int | None = None, max_calls: int | None = None,
                 max_tokens: int | None = None, max_cost: float | None = None):
        if not isinstance(n_candidates, int) or isinstance(n_candidates, bool) or n_candidates < 1:
            raise ValueError(f"n_candidates must be a positive int, got {n_candidates!r}")
        if isinstance(proposer, FeedbackEngine) or not callable(proposer):
            proposer = as_feedback_engine(proposer)  # a mutation function stays as it is
            require_capabilities(proposer, "structured_output", who="lt.optim.Search's LLM proposer", alternatives=[
                "a mutation proposer: a callable (value, k, rng) -> list[str] (it may call any "
                "LLM itself, e.g. lt.nn.LLM(LocalBackend(), n=k) rewriting the value in free text).",
                "a proposer over a backend with structured output, e.g. lt.nn.LLM(OpenAIBackend(\"gpt-4o-mini\")).",
            ])
        super().__init__(params, {"n_candidates": n_candidates}, max_calls=max_calls,
                         max_tokens=max_tokens, max_cost=max_cost)
        for p in self.parameters():
            if p.ndim != 0:
                raise ValueError(f"Search optimizes 0-d parameters; {self.name_of(p)!r} has shape {p.shape}")
        self.proposer = proposer
        self.module = module
        self.metric = _metric_module(metric)
        self.rng = random.Random(seed)
        self.examples = _examples("Search", inputs, targets, batch_size, seed)
        self.calls_per_input = calls_per_input
        named = {id(p): n for n, p in module.named_text_parameters()}
        self._module_names = {}
        for p in self.parameters():
            if id(p) not in named:
                raise ValueError(f"parameter {self.name_of(p)!r} is not a text parameter of the module")
            self._module_names[id(p)] = named[id(p)]

    def state_dict(self) -> dict[str, Any]:
        """Adds the proposer's random state (plain ints), so a resumed search continues it."""
        sd = super().state_dict()
        sd["rng"] = self.rng.getstate()
        return sd

    def load_state_dict(self, state_dict: Any) -> None:
        """Restores the random state too."""
        super().load_state_dict(state_dict)
        if "rng" in state_dict:
            version, internal, gauss = state_dict["rng"]
            self.rng.setstate((version, tuple(internal), gauss))

    def _llm_proposer(self) -> bool:
        return isinstance(self.proposer, FeedbackEngine)

    def estimate(self, inputs: Any = None) -> dict[str, int]:
        """Requests one ``step()`` can make (before cache hits): candidates x inputs x
        :func:`calls_per_input` (or the ``calls_per_input`` given), plus the proposer's; for a
        batch of ``inputs`` when given, else for the step's batch of the examples."""
        n = _batch_size(self.examples, inputs, "Search")
        per_input = self.calls_per_input or calls_per_input(self.module, self.metric)
        per = (self.param_groups[0]["n_candidates"] + 1) * n * per_input + (1 if self._llm_proposer() else 0)
        trainable = [p for p in self.parameters() if p.requires_grad]
        return {"calls": per * len(trainable)}

    def _propose(self, p: Any, k: int) -> list[str]:
        value = str(p)
        if not self._llm_proposer():
            out = self.proposer(value, k, self.rng)
            if not isinstance(out, (list, tuple)) or not all(isinstance(s, str) for s in out):
                raise OptimizerError("the mutation proposer must return a list of str", parameter=self.name_of(p))
            return [s for s in out if s.strip()][:k]
        past = sorted((h for h in self.history if h["param"] == self.name_of(p) and h["score"] is not None),
                      key=lambda h: -h["score"])[:8]
        lines = "\n".join(f"- score {h['score']:.3g}: <<<{h['value']}>>>" for h in past)
        fields = _fields(value)
        keep = (" Every candidate must keep exactly the placeholders "
                + ", ".join("{" + f + "}" for f in fields) + ".") if fields else ""
        user = (f"Current value:\n<<<\n{value}\n>>>\n\n" + (f"Earlier values and scores (higher is better):\n{lines}\n\n" if lines else "")
                + f"Write {k} new, diverse candidate values likely to score higher.{keep} "
                'Reply with JSON: {"candidates": ["...", ...]}')
        schema = {"type": "object", "properties": {"candidates": {"type": "array", "items": {"type": "string"}}},
                  "required": ["candidates"], "additionalProperties": False}
        prompt = [{"role": "system", "content": "You propose better prompts for a language-model pipeline."},
                  {"role": "user", "content": user}]
        answer = run_sync(ask_feedback(
            self.proposer, [prompt], response_format={"type": "json_schema", "json_schema": {"name": "candidates", "schema": schema}},
            token_room=1000, validate=lambda text: _candidates(text, fields) is not None))[0]
        cands = _candidates(answer.text, fields)
        if not cands:
            raise OptimizerError(f"the proposer gave no usable candidates for {self.name_of(p)!r}: "
                                 f"{answer.text[:200]!r}", parameter=self.name_of(p))
        return cands[:k]

    def step(self, closure: Callable[[], Any] | None = None, *data: Any, **named: Any) -> float:
        """Propose, score and keep the best, for every trainable parameter; returns the best
        mean score of the last parameter searched (the closure's score when one is given).

        ``step(inputs, targets)``, the form of earlier releases, still scores on that batch,
        with a DeprecationWarning.

        Raises:
            BudgetExceededError: the step cannot fit in the remaining budget (raised before any
                call); parameters unchanged.
            ValueError: no examples (give ``inputs=``/``targets=`` to the constructor).
        """
        closure, legacy = split_step_args("Search", closure, data, named, ("inputs", "targets"))
        inputs, targets = legacy or _batch(self.examples, self.step_count, "Search")
        need = self.estimate(inputs)["calls"]
        left = self.budget.remaining_calls()
        if left is not None and need > left:
            raise BudgetExceededError(f"Search.step needs up to {need} calls and the budget has {left} "
                                      "left; nothing was sent. Use a smaller batch or fewer candidates.")
        best_score = float("nan")
        with self.budget:
            for p in self.parameters():
                if not p.requires_grad:
                    continue
                current = str(p)
                proposals = [c for c in self._propose(p, self.param_groups[0]["n_candidates"]) if c != current]
                cands = [current] + list(dict.fromkeys(proposals))
                scores = evaluate_candidates(self.module, self._module_names[id(p)], cands, inputs, targets, self.metric)
                for c, s in zip(cands, scores):
                    self.history.append({"step": self.step_count, "param": self.name_of(p), "value": c,
                                         "score": float(s), "calls": self.budget.calls,
                                         "tokens": self.budget.tokens, "kept": False})
                best = int(np.argmax(scores))  # argmax picks the first maximum: ties keep the current
                p.data = cands[best]
                self.history[-len(cands) + best]["kept"] = True
                best_score = float(scores[best])
        self.step_count += 1
        return best_score if closure is None else self._closure_score(closure)


def _examples(owner: str, inputs: Any, targets: Any, batch_size: int | None, seed: int) -> Examples | None:
    if inputs is None and targets is None:
        if batch_size is not None:
            raise ValueError(f"{owner}: batch_size needs inputs= and targets=")
        return None
    if inputs is None or targets is None:
        raise ValueError(f"{owner} needs both inputs= and targets= (the examples it scores on), got only "
                         + ("targets" if inputs is None else "inputs"))
    examples = Examples(inputs, targets, batch_size=batch_size, seed=seed, owner=owner)
    x, y = examples.inputs.shape, examples.targets.shape
    try:
        pairs = np.broadcast_shapes(x, y) == x
    except ValueError:
        pairs = False
    if not pairs:
        # Caught here, not after a grid of requests whose scores cannot be computed.
        raise ValueError(f"{owner}: targets of shape {y} do not pair with inputs of shape {x}: give one "
                         "target per input (or one target for all of them)")
    return examples


def _batch(examples: Examples | None, i: int, owner: str) -> tuple[TextTensor, TextTensor]:
    if examples is None:
        raise ValueError(f"{owner}.step() has no examples to score on: give them to the constructor, "
                         f"{owner}(..., inputs=..., targets=...)")
    return examples.batch(i)


def _batch_size(examples: Examples | None, inputs: Any, owner: str) -> int:
    if inputs is not None:
        return (inputs if isinstance(inputs, TextTensor) else TextTensor(inputs)).size
    return _batch(examples, 0, owner)[0].size  # the first batch of an epoch is a full one


_CANDIDATES_OPEN = re.compile(r'\s*\{\s*"candidates"\s*:\s*\[')


def _complete_candidates(text: str) -> list[str]:
    """The complete strings of a ``{"candidates": [...`` answer cut off by the token budget (a
    small model's second candidate can run past ``max_tokens``): the ones before the cut."""
    m = _CANDIDATES_OPEN.match(text)
    if not m:
        return []
    dec, i, out = json.JSONDecoder(), m.end(), []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] != '"':
            return out
        try:
            item, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:  # the string the budget cut
            return out
        out.append(item)


def _candidates(text: str, fields: tuple[str, ...] | None) -> list[str] | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        value = {"candidates": _complete_candidates(text)} if isinstance(text, str) else None
        if value is None:
            return None
    if not isinstance(value, dict) or not isinstance(value.get("candidates"), list):
        return None
    out = [c.strip() for c in value["candidates"] if isinstance(c, str) and c.strip()]
    if fields is not None:
        out = [c for c in out if _fields(c) == fields]
    return out or None


class FewShot(TextOptimizer):
    """Bootstrap demonstrations from the module's own runs that pass the metric, into a demos
    TextParameter (DSPy's BootstrapFewShot idea, with random search over demo sets).

    ``step()`` runs the module on the step's training batch (no grad), keeps the (input,
    output) pairs whose score reaches ``threshold``, formats each with ``demo_template`` and
    evaluates ``n_candidates`` random sets of ``k`` demos — plus the current value — as one
    ``[P] x [N]`` ``functional_call`` grid on the validation examples (the training batch when
    none are given); the best set is written into the demos parameter. The examples are given
    to the constructor; ``step(closure)`` also calls ``closure()`` after the update and returns
    its score (see :class:`~langtorch.optim.TextOptimizer` for the contract).

    **Per-input demonstrations** (nearest neighbours): pass the ``pool`` parameter of an
    :class:`lt.nn.Demos <langtorch.nn.Demos>` module that the program uses for its ``{demos}``
    field. The step then puts every passing run (at most ``max_pool``) into the pool, and each
    input gets its ``k`` most similar demonstrations (local MiniLM); the new pool is kept unless
    it scores lower on the validation batch than the old one.

    Args:
        params: the demos TextParameter(s) of ``module`` (0-d; the module's prompt inserts it,
            e.g. ``"{demos}\\n\\nInput: {x}\\nOutput:"``).
        metric: a metric name, a callable ``(pred, target) -> score``, or a loss module.
        k: demonstrations per set.
        module: the module to bootstrap from and evaluate.
        inputs, targets: the training examples runs are bootstrapped from (DSPy's trainset).
        val_inputs, val_targets: the validation examples demo sets are scored on (DSPy's
            valset); default: the step's training batch.
        batch_size: bootstrap each step from the next minibatch of this many training examples
            (seeded by ``seed``); ``None``: from all of them.
        demo_template: how one demonstration is written (fields ``{input}``, ``{output}``).
        separator: between demonstrations.
        n_candidates: demo sets tried per step.
        threshold: the score a run needs to become a demonstration.
        max_pool: most demonstrations kept in a ``Demos`` pool.
        seed: seeds the sampling of demo sets and the minibatches.
        max_calls, max_tokens, max_cost: the budget.

    Example:
        >>> import langtorch as lt
        >>> class Upper(lt.TModule):   # answers right only when shown a demonstration
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.demos = lt.TextParameter("")
        ...     def forward(self, x):
        ...         seen = (self.demos + "|" + x).map(lambda s: s.split("|")[1].upper() if s.startswith("Input") else s.split("|")[1])
        ...         return seen
        >>> m = Upper()
        >>> opt = lt.optim.FewShot(m.named_text_parameters(), lambda p, t: float(p == t or t == "A"), k=1, module=m,
        ...                        inputs=["a", "b"], targets=["A", "B"])
        >>> opt.step()
        1.0
        >>> str(m.demos)
        'Input: a\\nOutput: a'
    """

    def __init__(self, params: Any, metric: Any, k: int = 4, *, module: Any, inputs: Any = None,
                 targets: Any = None, val_inputs: Any = None, val_targets: Any = None,
                 batch_size: int | None = None, demo_template: str = "Input: {input}\nOutput: {output}", separator: str = "\n\n",
                 n_candidates: int = 4, threshold: float = 1.0, seed: int = 0, max_pool: int = 256,
                 max_calls: int | None = None, max_tokens: int | None = None, max_cost: float | None = None):
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if not isinstance(n_candidates, int) or n_candidates < 1:
            raise ValueError(f"n_candidates must be a positive int, got {n_candidates!r}")
        if not isinstance(max_pool, int) or isinstance(max_pool, bool) or max_pool < 1:
            raise ValueError(f"max_pool must be a positive int, got {max_pool!r}")
        if _fields(demo_template) is None or not set(_fields(demo_template) or ()) <= {"input", "output"}:
            raise ValueError("demo_template must be a template using {input} and/or {output}, got "
                             f"{demo_template!r}")
        super().__init__(params, {"k": k}, max_calls=max_calls, max_tokens=max_tokens, max_cost=max_cost)
        self.metric = _metric_module(metric)
        self.module = module
        self.demo_template = demo_template
        self.separator = separator
        self.n_candidates = n_candidates
        self.threshold = float(threshold)
        self.rng = random.Random(seed)
        self.examples = _examples("FewShot", inputs, targets, batch_size, seed)
        if (val_inputs is None) != (val_targets is None):
            raise ValueError("FewShot needs both val_inputs= and val_targets=, or neither")
        self.val_inputs, self.val_targets = val_inputs, val_targets
        from langtorch.nn.demos import Demos

        self._knn = {id(m.pool): m for m in module.modules() if isinstance(m, Demos)}
        self.max_pool = int(max_pool)
        named = {id(p): n for n, p in module.named_text_parameters()}
        self._module_names = {}
        for p in self.parameters():
            if p.ndim != 0 and id(p) not in self._knn:
                raise ValueError(f"FewShot needs 0-d demos parameters or the pool of an lt.nn.Demos "
                                 f"module; {self.name_of(p)!r} has shape {p.shape}")
            if id(p) not in named:
                raise ValueError(f"parameter {self.name_of(p)!r} is not a text parameter of the module")
            self._module_names[id(p)] = named[id(p)]
        self.pool: list[tuple[str, str]] = []

    def estimate(self, inputs: Any = None, val_inputs: Any = None) -> dict[str, int]:
        """Requests one step can make: the bootstrap run plus the candidates x validation grid
        (for these batches when given, else for the step's batches of the examples)."""
        n = _batch_size(self.examples, inputs, "FewShot")
        val_inputs = self.val_inputs if val_inputs is None and inputs is None else val_inputs
        v = n if val_inputs is None else (val_inputs if isinstance(val_inputs, TextTensor) else TextTensor(val_inputs)).size
        k = calls_per_input(self.module, self.metric)
        per = [2 * v if id(p) in self._knn else (self.n_candidates + 1) * v for p in self.parameters()]
        return {"calls": (n + sum(per)) * k}

    def _demo(self, x: str, y: str) -> str:
        from langtorch.functional.textops import fill

        return str(fill(TextTensor(self.demo_template), {"input": TextTensor(x, template=False),
                                                        "output": TextTensor(y, template=False)}, strict=False))

    def step(self, closure: Callable[[], Any] | None = None, *data: Any, **named: Any) -> float:
        """Bootstrap, search demo sets, keep the best; returns its validation score (the
        closure's score when one is given).

        ``step(inputs, targets, val_inputs=None, val_targets=None)``, the form of earlier
        releases, still works on those batches, with a DeprecationWarning.
        """
        closure, legacy = split_step_args("FewShot", closure, data, named,
                                          ("inputs", "targets", "val_inputs", "val_targets"))
        if legacy is None:
            inputs, targets = _batch(self.examples, self.step_count, "FewShot")
            val_inputs, val_targets = self.val_inputs, self.val_targets
        else:
            inputs, targets, val_inputs, val_targets = legacy
            if (val_inputs is None) != (val_targets is None):
                raise ValueError("FewShot.step needs both val_inputs and val_targets, or neither")
        x = inputs if isinstance(inputs, TextTensor) else TextTensor(inputs, template=False)
        y = targets if isinstance(targets, TextTensor) else TextTensor(targets, template=False)
        need = self.estimate(x, val_inputs)["calls"]
        left = self.budget.remaining_calls()
        if left is not None and need > left:
            raise BudgetExceededError(f"FewShot.step needs up to {need} calls and the budget has {left} left; "
                                      "nothing was sent.")
        vx = x if val_inputs is None else val_inputs
        vy = y if val_targets is None else val_targets
        best_score = float("nan")
        with self.budget:
            with no_grad():
                try:
                    out = self.module(x)
                except BatchError as e:  # keep the runs that completed
                    out = e.results
                if out.shape != x.shape:
                    raise OptimizerError(
                        f"FewShot pairs each input with its output, so the module's output must have "
                        f"the input's shape {x.shape}; it has {out.shape} (e.g. n > 1 samples)")
                scores = self.metric(out, y).metadata.column("score").reshape(-1)
                if scores.size != x.size:
                    raise OptimizerError(f"targets of shape {y.shape} do not match inputs of shape {x.shape}")
            xs, outs = x.texts.reshape(-1).tolist(), out.texts.reshape(-1).tolist()
            for xi, oi, s in zip(xs, outs, scores):
                if float(s) >= self.threshold and (xi, oi) not in self.pool:
                    self.pool.append((xi, oi))
            for p in self.parameters():
                if not p.requires_grad:
                    continue
                if id(p) in self._knn:
                    best_score = self._step_knn(p, vx, vy)
                    continue
                k = self.param_groups[0]["k"]
                sets = [str(p)]
                if self.pool:
                    for _ in range(self.n_candidates):
                        chosen = self.rng.sample(self.pool, min(k, len(self.pool)))
                        sets.append(self.separator.join(self._demo(a, b) for a, b in chosen))
                sets = list(dict.fromkeys(sets))
                if len(sets) == 1:
                    continue
                scores_p = evaluate_candidates(self.module, self._module_names[id(p)], sets, vx, vy, self.metric)
                best = int(np.argmax(scores_p))
                p.data = sets[best]
                for c, s in zip(sets, scores_p):
                    self.history.append({"step": self.step_count, "param": self.name_of(p), "value": c,
                                         "score": float(s), "calls": self.budget.calls,
                                         "tokens": self.budget.tokens, "kept": c == sets[best]})
                best_score = float(scores_p[best])
        self.step_count += 1
        return best_score if closure is None else self._closure_score(closure)

    def _score(self, x: Any, y: Any) -> float:
        x = x if isinstance(x, TextTensor) else TextTensor(x, template=False)
        y = y if isinstance(y, TextTensor) else TextTensor(y, template=False)
        with no_grad():
            try:
                out = self.module(x)
            except BatchError as e:
                out = e.results
            loss = self.metric(out, y)
        scores = loss.metadata.column("score")
        if out.shape != x.shape or scores.size != x.size:
            raise OptimizerError(f"FewShot validation: inputs of shape {x.shape}, outputs of shape "
                                 f"{out.shape} and targets of shape {y.shape} do not pair entry by entry")
        return float(np.mean(scores.astype(float)))

    def _step_knn(self, p: Any, vx: Any, vy: Any) -> float:
        demos = self._knn[id(p)]
        old = demos.pairs()
        new = list(dict.fromkeys(old + self.pool))[-self.max_pool:]
        if new == old:
            return float("nan")
        before = self._score(vx, vy)
        demos.set_pool(new)
        try:
            after = self._score(vx, vy)
        except BaseException:
            demos.set_pool(old)  # an unevaluated pool is not kept
            raise
        keep = after >= before
        if not keep:
            demos.set_pool(old)
        for value, s, kept in ((old, before, not keep), (new, after, keep)):
            self.history.append({"step": self.step_count, "param": self.name_of(p),
                                 "value": [list(pair) for pair in value], "score": s,
                                 "calls": self.budget.calls, "tokens": self.budget.tokens, "kept": kept})
        return max(before, after)

    def state_dict(self) -> dict[str, Any]:
        """Adds the bootstrapped pool (pairs of str) to the base state."""
        sd = super().state_dict()
        sd["pool"] = [list(pair) for pair in self.pool]
        sd["rng"] = self.rng.getstate()
        return sd

    def load_state_dict(self, state_dict: Any) -> None:
        """Restores the pool too."""
        super().load_state_dict(state_dict)
        self.pool = [tuple(pair) for pair in state_dict.get("pool", [])]
        if "rng" in state_dict:
            version, internal, gauss = state_dict["rng"]
            self.rng.setstate((version, tuple(internal), gauss))
