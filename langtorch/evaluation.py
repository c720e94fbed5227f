"""Evaluation grids and per-example Pareto fronts: :func:`evaluate` and :func:`pareto`.

``lt.evaluate(module, inputs, targets, metric)`` runs the module on every input and scores every
output with the metric; with ``candidates`` it runs *every candidate value* of the module's text
parameters against every input in **one** batched call through
:func:`langtorch.func.functional_call` (all requests concurrent, through the backends' cache,
inside an optional :class:`~langtorch.optim.Budget`). The result is an :class:`Evaluation`: the
per-entry ``scores`` (a float array: ``[N]``, ``[P, N]`` for one axis of candidates,
``[P, Q, N]`` for two parameters' candidates crossed), the metric's ``feedback`` texts, the
``outputs`` and the tokens / cost each entry used.

``lt.pareto(scores, dim=0)`` reads such a grid the way GEPA does: a candidate is on the
*per-example Pareto front* when it is best on at least one example (ties kept); ``counts`` says
how many examples it leads. With an objectives axis (e.g. score and minus cost stacked) "best"
means "not dominated on that example".

Example:
    >>> import langtorch as lt
    >>> m = lt.TLayer("{}")
    >>> ev = lt.evaluate(m, lt.TextTensor(["a", "b"]), lt.TextTensor(["a", "b!"]), "exact_match",
    ...                  candidates={"prompt": ["{}", "{}!"]})
    >>> ev.scores.tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    >>> mask, counts = lt.pareto(ev.scores)
    >>> mask.tolist(), counts.tolist()
    ([True, True], [1, 1])
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.autograd import no_grad
from langtorch.core.types import Usage
from langtorch.runtime import Budget, cost_of, price_for
from langtorch.tensor import TextParameter, TextTensor

__all__ = ["Evaluation", "evaluate", "pareto"]


def _metric_module(metric: Any) -> Any:
    from langtorch.nn import MetricLoss, TextLoss

    if isinstance(metric, (MetricLoss, TextLoss)):
        return metric
    if isinstance(metric, str) or callable(metric):
        return MetricLoss(metric)
    raise TypeError(f"metric must be a name ('exact_match', 'contains'), a callable (prediction, target) -> "
                    f"score | (score, feedback), or an lt.nn loss module; got {type(metric).__name__}")


def _as_data(x: Any, what: str) -> TextTensor:
    if isinstance(x, TextTensor):
        return x
    try:
        return TextTensor(x, template=False)
    except TypeError as e:
        raise TypeError(f"{what}: expected texts (a str, lists of str, a TextTensor): {e}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, TextTensor):
        return value.tolist()
    return value


class Evaluation:
    """The result of :func:`evaluate`: per-entry scores, feedback, outputs, tokens and cost.

    The leading axes are the candidate axes (none, one ``[P]`` axis, or one per parameter when
    candidates are crossed), the trailing axes those of the inputs.

    Attributes:
        scores: float array (higher is better).
        feedback: str array of the metric's per-entry feedback (same shape).
        outputs: the module's outputs (a TextTensor of the same shape).
        prompt_tokens, completion_tokens: int arrays — the tokens recorded on each output entry
            (the LLM call that produced it; a cache hit records 0).
        cost: float array — those tokens at the producing backend's price (0 without a price).
        axes: one name per candidate axis (``"candidate"`` for a list of candidates, the
            parameter name for a crossed axis).
        candidates: per candidate axis, the values (plain data) along it.
        calls, tokens, total_cost: what the whole evaluation sent (every LLM call of the
            pipeline and of an LLM-judge metric, retries included, cache hits not).

    Example:
        >>> import langtorch as lt
        >>> ev = lt.evaluate(lt.TLayer("{}!"), lt.TextTensor(["a", "b"]), lt.TextTensor(["a!", "c"]), "exact_match")
        >>> ev.scores.tolist(), ev.mean()
        ([1.0, 0.0], 0.5)
        >>> ev.feedback[1]
        "The output 'b!' is wrong: the expected answer is 'c'."
    """

    def __init__(self, scores: np.ndarray, feedback: np.ndarray, outputs: TextTensor, inputs: TextTensor,
                 targets: TextTensor, prompt_tokens: np.ndarray, completion_tokens: np.ndarray,
                 cost: np.ndarray, axes: Sequence[str], candidates: Sequence[list[Any]],
                 calls: int, tokens: int, total_cost: float):
        self.scores = scores
        self.feedback = feedback
        self.outputs = outputs
        self.inputs = inputs
        self.targets = targets
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cost = cost
        self.axes = tuple(axes)
        self.candidates = [list(c) for c in candidates]
        self.calls = calls
        self.tokens = tokens
        self.total_cost = total_cost

    @property
    def shape(self) -> tuple[int, ...]:
        """The grid's shape (candidate axes, then the inputs' axes)."""
        return self.scores.shape

    @property
    def usage(self) -> np.ndarray:
        """Tokens per entry (prompt + completion), an int array of the grid's shape."""
        return self.prompt_tokens + self.completion_tokens

    def mean(self, dim: int | tuple[int, ...] | None = None) -> Any:
        """The mean score over ``dim`` (all entries when ``None``: a float).

        Example:
            >>> import langtorch as lt
            >>> ev = lt.evaluate(lt.TLayer("{}"), ["a", "b"], ["a", "c"], "exact_match",
            ...                  candidates={"prompt": ["{}", "x"]})
            >>> ev.mean(-1).tolist()
            [0.5, 0.0]
        """
        out = self.scores.mean(axis=dim)
        return float(out) if np.ndim(out) == 0 else out

    def to_pandas(self) -> Any:
        """One row per entry: the candidate (per axis), the example index, input, target,
        output, score, feedback, tokens and cost.

        Example:
            >>> import langtorch as lt
            >>> ev = lt.evaluate(lt.TLayer("{}"), ["a", "b"], ["a", "c"], "exact_match")
            >>> ev.to_pandas()[["input", "output", "score"]].values.tolist()
            [['a', 'a', 1.0], ['b', 'b', 0.0]]
        """
        import pandas as pd

        k = len(self.axes)
        ex_shape = self.scores.shape[k:]
        x = np.broadcast_to(self.inputs.texts, ex_shape) if self.inputs.ndim else np.full(ex_shape, str(self.inputs))
        y = np.broadcast_to(self.targets.texts, ex_shape) if self.targets.ndim else np.full(ex_shape, str(self.targets))
        outs = self.outputs.texts if self.outputs.ndim else np.array(str(self.outputs))
        rows = []
        for idx in np.ndindex(*self.scores.shape):
            cand, ex = idx[:k], idx[k:]
            row: dict[str, Any] = {}
            for axis, name, i in zip(range(k), self.axes, cand):
                row[f"{name}_index"] = i
                value = self.candidates[axis][i]
                row[name] = value if isinstance(value, str) else repr(value)
            row["example"] = int(np.ravel_multi_index(ex, ex_shape)) if ex_shape else 0
            row.update(input=str(x[ex]), target=str(y[ex]), output=str(outs[idx]),
                       score=float(self.scores[idx]), feedback=str(self.feedback[idx]),
                       prompt_tokens=int(self.prompt_tokens[idx]),
                       completion_tokens=int(self.completion_tokens[idx]), cost=float(self.cost[idx]))
            rows.append(row)
        return pd.DataFrame(rows)

    def plot(self, path: Any = None) -> Any:
        """A heatmap of the scores: candidates (flattened) by examples (matplotlib); saved to
        ``path`` when given.

        Raises:
            ImportError: matplotlib is missing (``pip install matplotlib``).

        Example:
            >>> import langtorch as lt, tempfile, os
            >>> ev = lt.evaluate(lt.TLayer("{}"), ["a", "b"], ["a", "c"], "exact_match")
            >>> with tempfile.TemporaryDirectory() as d:
            ...     _ = ev.plot(os.path.join(d, "grid.png"))
            ...     os.path.exists(os.path.join(d, "grid.png"))
            True
        """
        try:
            import matplotlib

            if path is not None:
                matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("plot() needs matplotlib: pip install matplotlib") from None
        k = len(self.axes)
        rows = int(np.prod(self.scores.shape[:k])) if k else 1
        grid = self.scores.reshape(rows, -1)
        fig, ax = plt.subplots(figsize=(min(12, 2 + 0.35 * grid.shape[1]), min(10, 1.5 + 0.35 * rows)))
        image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(image, ax=ax, label="score")
        ax.set_xlabel("example")
        ax.set_ylabel(" x ".join(self.axes) if k else "")
        ax.set_yticks(range(rows))
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
            plt.close(fig)
        return fig

    def __repr__(self) -> str:
        return f"Evaluation(shape={self.shape}, mean={self.mean():.4g}, calls={self.calls})"


def _candidate_grid(module: Any, candidates: Any) -> tuple[dict[str, TextTensor], list[str], list[list[Any]], tuple[int, ...]]:
    """``(substitutions with one [C] leading axis, axis names, values per axis, candidate shape)``."""
    named = dict(module.named_text_parameters())

    def check_name(name: str) -> TextParameter:
        if name not in named:
            raise KeyError(f"{type(module).__name__} has no text parameter {name!r}; it has {sorted(named)}")
        if named[name].fields:
            # Plain values of keyed records are their rendered texts: put back, the fields are lost.
            raise ValueError(f"{name!r} holds keyed records (fields {list(named[name].fields)}, e.g. an "
                             "lt.nn.Demos pool); candidates can only replace text parameters of plain texts")
        return named[name]

    def value_of(name: str, v: Any) -> Any:
        p = check_name(name)
        t = v.data if isinstance(v, TextParameter) else v
        t = t if isinstance(t, TextTensor) else TextTensor(t)
        if t.shape != p.shape:
            raise ValueError(f"a candidate for {name!r} has shape {t.shape}; the parameter has shape {p.shape}")
        return t.tolist()

    if isinstance(candidates, Mapping):
        if not candidates:
            raise ValueError("candidates is an empty mapping; give {name: [values]} or leave it None")
        names = list(candidates)
        axes_values = []
        for name in names:
            vals = candidates[name]
            vals = vals.tolist() if isinstance(vals, TextTensor) else list(vals) if not isinstance(vals, str) else None
            if not vals:
                raise ValueError(f"candidates[{name!r}] must be a non-empty list of values, got {candidates[name]!r}")
            axes_values.append([value_of(name, v) for v in vals])
        combos = list(itertools.product(*axes_values))
        subs = {name: TextTensor([c[i] for c in combos]) for i, name in enumerate(names)}
        return subs, names, axes_values, tuple(len(v) for v in axes_values)
    if isinstance(candidates, Sequence) and not isinstance(candidates, str):
        if not candidates or not all(isinstance(c, Mapping) for c in candidates):
            raise TypeError("candidates must be a mapping {name: [values]} (one axis per name, crossed) or "
                            "a non-empty list of mappings {name: value} (one candidate each)")
        keys = sorted({k for c in candidates for k in c})
        plain = []
        for c in candidates:
            plain.append({k: value_of(k, c[k]) if k in c else check_name(k).tolist() for k in keys})
        subs = {k: TextTensor([c[k] for c in plain]) for k in keys}
        return subs, ["candidate"], [plain], (len(plain),)
    raise TypeError("candidates must be a mapping {name: [values]} (one axis per name, crossed) or a list of "
                    f"mappings {{name: value}} (one candidate each); got {type(candidates).__name__}")


def _entry_cost(module: Any, out: TextTensor, pt: np.ndarray, ct: np.ndarray) -> np.ndarray:
    from langtorch.nn import LLM

    prices = [m.backend.options.price for m in module.modules() if isinstance(m, LLM)]
    prices = [p for p in prices if p is not None]
    cost = np.zeros(pt.shape, dtype=np.float64)
    if not prices:
        return cost
    models = (np.broadcast_to(np.asarray(out.metadata.column("model"), dtype=object).reshape(out.shape), pt.shape)
              if "model" in out.metadata else np.full(pt.shape, "", dtype=object))
    for idx in np.ndindex(*pt.shape):
        price = next((pr for p in prices if (pr := price_for(p, str(models[idx]))) is not None), None)
        cost[idx] = cost_of(Usage(int(pt[idx]), int(ct[idx])), price)
    return cost


def _tokens(out: TextTensor, key: str, shape: tuple[int, ...]) -> np.ndarray:
    if key not in out.metadata:
        return np.zeros(shape, dtype=np.int64)
    col = np.asarray(out.metadata.column(key), dtype=object).reshape(-1)
    vals = np.array([int(v) if v is not None and v == v else 0 for v in col], dtype=np.int64)
    return np.broadcast_to(vals.reshape(out.shape), shape).copy()


_REDUCERS = {"mean": np.mean, "sum": np.sum, "min": np.min, "max": np.max}


def _check_args(module: Any, inputs: Any, targets: Any, metric: Any,
                reduce: str | None) -> tuple[Any, TextTensor, TextTensor]:
    """:func:`evaluate`'s arguments checked before anything is sent: ``(loss_fn, inputs, targets)``."""
    from langtorch.nn import TModule

    if not isinstance(module, TModule):
        raise TypeError(f"evaluate expected a langtorch TModule, got {type(module).__name__}")
    if reduce is not None and reduce not in _REDUCERS:
        raise ValueError(f"reduce must be None or one of {sorted(_REDUCERS)}, got {reduce!r}")
    loss_fn = _metric_module(metric)
    x = _as_data(inputs, "inputs")
    y = _as_data(targets, "targets")
    try:
        np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise ValueError(f"targets of shape {y.shape} do not broadcast with inputs of shape {x.shape}; give one "
                         "target per input (or one for all)") from None
    return loss_fn, x, y


def evaluate(module: Any, inputs: Any, targets: Any, metric: Any, *, candidates: Any = None,
             reduce: str | None = None, budget: Budget | None = None) -> Any:
    """Score ``module`` (or every candidate value of its text parameters) on every example.

    One batched call: the candidates are substituted with :func:`langtorch.func.functional_call`
    (the module is not mutated), so ``P`` candidates x ``N`` inputs send ``P * N`` requests at once
    (each LLM stage of the module once per entry), through the backends' cache and rate limits.

    Args:
        module: a :class:`~langtorch.TModule`.
        inputs: the examples' inputs (a TextTensor or texts; any shape ``S``).
        targets: the references, broadcastable to the inputs (what the metric compares with).
        metric: ``"exact_match"``, ``"contains"``, a callable ``(prediction, target) -> score |
            (score, feedback)``, or an ``lt.nn.MetricLoss`` / ``lt.nn.TextLoss``.
        candidates: ``None`` (the module as it is: scores of shape ``S``); a mapping
            ``{name: [values]}`` (one axis per name, crossed: ``{"a": [P], "b": [Q]}`` gives
            ``[P, Q] + S``); or a list of mappings ``{name: value}`` (one full candidate each —
            names left out keep the module's value — giving ``[P] + S``).
        reduce: ``None`` returns the :class:`Evaluation`; ``"mean"``, ``"sum"``, ``"min"`` or
            ``"max"`` returns the scores reduced over the inputs' axes (a float array of the
            candidate shape, or a float).
        budget: an :class:`~langtorch.optim.Budget` to run inside (an attempt that would exceed
            it is not sent and raises :class:`~langtorch.errors.BudgetExceededError`).

    Returns:
        An :class:`Evaluation` (or the reduced scores).

    Raises:
        KeyError: a candidate names an unknown parameter.
        ValueError: a candidate value has the wrong shape, or replaces a parameter of keyed
            records; targets that do not broadcast with the inputs; an unknown ``reduce``
            (all raised before anything is sent).

    Example:
        >>> import langtorch as lt
        >>> m = lt.TLayer("{}")
        >>> lt.evaluate(m, ["a", "b"], ["a", "b!"], "exact_match",
        ...             candidates={"prompt": ["{}", "{}!"]}, reduce="mean").tolist()
        [0.5, 0.5]
    """
    from langtorch.func import functional_call

    loss_fn, x, y = _check_args(module, inputs, targets, metric, reduce)
    meter = Budget()
    if candidates is None:
        subs, axes, values, cshape = {}, [], [], ()
    else:
        subs, axes, values, cshape = _candidate_grid(module, candidates)
    with contextlib.ExitStack() as stack:
        stack.enter_context(meter)
        if budget is not None:
            stack.enter_context(budget)
        stack.enter_context(no_grad())
        out = functional_call(module, subs, x) if subs else module(x)
        if cshape and (out.ndim < 1 or out.shape[0] != int(np.prod(cshape))):
            raise ValueError(f"the module's output has shape {out.shape}; expected a leading candidates axis of "
                             f"{int(np.prod(cshape))}")
        if cshape:
            out = out.reshape(cshape + out.shape[1:])
        loss = loss_fn(out, y)
    scores = np.asarray(loss.metadata.column("score"), dtype=np.float64)
    shape = scores.shape
    feedback = np.empty(shape, dtype=object)  # python str entries
    feedback[...] = np.asarray(loss.texts if loss.ndim else np.array(str(loss)), dtype=object)
    feedback = np.vectorize(str, otypes=[object])(feedback) if feedback.size else feedback
    pt, ct = _tokens(out, "prompt_tokens", shape), _tokens(out, "completion_tokens", shape)
    ev = Evaluation(scores, feedback, out, x, y, pt, ct, _entry_cost(module, out, pt, ct), axes, values,
                    meter.calls, meter.tokens, meter.cost)
    if reduce is None:
        return ev
    k = len(axes)
    red = _REDUCERS[reduce](scores, axis=tuple(range(k, scores.ndim))) if scores.ndim > k else scores
    return float(red) if np.ndim(red) == 0 else np.asarray(red, dtype=np.float64)


def pareto(scores: Any, dim: int = 0, *, objective_dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The per-example Pareto front of candidates: ``(mask, counts)``.

    Candidate ``p`` *leads* example ``n`` when no other candidate is better on it — for one
    objective, when it has the example's best score (ties: every tied candidate leads); with
    several objectives (stacked on ``objective_dim``, each higher-is-better, e.g. score and
    minus cost), when no candidate dominates it there (at least as good on every objective and
    better on one).

    Args:
        scores: an array (numpy, or anything ``np.asarray`` takes) with the candidates on
            ``dim``; every other axis except ``objective_dim`` is an example axis.
        dim: the candidates axis.
        objective_dim: the axis of stacked objectives, or ``None`` for one objective.

    Returns:
        ``mask``: bool array ``[P]``, candidates that lead at least one example; ``counts``: int
        array ``[P]``, how many examples each leads.

    Raises:
        ValueError: NaN scores, or axes that do not exist.
        TypeError: an axis that is not an int.

    Example:
        >>> import numpy as np, langtorch as lt
        >>> s = np.array([[1, 1, 0, 0], [0, 0, 1, 0], [0.5, 0.5, 0.5, 0.5]])   # mean: 0.5, 0.25, 0.5
        >>> mask, counts = lt.pareto(s)
        >>> mask.tolist(), counts.tolist()
        ([True, True, True], [2, 1, 1])
        >>> cost = np.array([[2.0] * 4, [1.0] * 4, [1.0] * 4])
        >>> lt.pareto(np.stack([s, -cost], -1), objective_dim=-1)[1].tolist()
        [2, 1, 3]
    """
    for name, axis in (("dim", dim), ("objective_dim", objective_dim)):
        if axis is not None and (not isinstance(axis, (int, np.integer)) or isinstance(axis, bool)):
            raise TypeError(f"pareto: {name} must be an int axis, got {axis!r}")
    a = np.asarray(scores, dtype=np.float64)
    if a.ndim == 0:
        raise ValueError("pareto needs an array with a candidates axis, got a scalar")
    if np.isnan(a).any():
        raise ValueError("pareto: scores contain NaN; score every (candidate, example) first")
    dim = dim % a.ndim if -a.ndim <= dim < a.ndim else None
    if dim is None:
        raise ValueError(f"dim is out of range for scores of shape {a.shape}")
    if objective_dim is not None:
        if not -a.ndim <= objective_dim < a.ndim or objective_dim % a.ndim == dim:
            raise ValueError(f"objective_dim={objective_dim} must be an axis of {a.shape} other than dim={dim}")
        a = np.moveaxis(a, (dim, objective_dim % a.ndim), (0, -1))
    else:
        a = np.moveaxis(a, dim, 0)[..., None]
    p, k = a.shape[0], a.shape[-1]
    if p == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
    a = a.reshape(p, -1, k)  # [P, N, K]
    if k == 1:
        leads = a[..., 0] >= a[..., 0].max(axis=0, keepdims=True)
    else:
        ge = (a[:, None] >= a[None, :]).all(-1)  # [q, p, n]: q at least as good as p everywhere
        gt = (a[:, None] > a[None, :]).any(-1)
        leads = ~(ge & gt).any(0)
    counts = leads.sum(axis=1).astype(np.int64)
    return counts > 0, counts
