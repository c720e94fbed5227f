"""The base class of text optimizers, with torch.optim's shape."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

import langtorch.nn  # noqa: F401 - loads the Backend -> FeedbackEngine adapter that optimizers use
from langtorch.runtime import Budget
from langtorch.tensor import TextParameter, TextTensor

__all__ = ["TextOptimizer"]


def _plain_value(p: TextParameter) -> Any:
    return p.tolist()


class TextOptimizer:
    """Base class: parameter groups, ``zero_grad()``, ``step()``, ``state_dict()``, budgets, history.

    **The step contract** (torch.optim's): every optimizer has ``step(closure=None)``, one
    update of its parameters. ``closure()``, when given, re-evaluates the program with the
    current parameters and returns a loss TextTensor (mean ``metadata["score"]``) or a float
    score, higher is better. TGD calls it before and after its update and reverts when the
    score drops; the optimizers that score candidates on examples (Search, FewShot,
    TokenSearch) take those examples in their constructor (``inputs=``, ``targets=``, and
    ``batch_size=`` for a new minibatch each step: DSPy's data flow) and call the closure once
    after the update. ``step`` returns the closure's score, or without a closure the
    optimizer's own score of the step (``None`` when it has none). The parameters' values live
    in the module; the optimizer's ``state_dict()`` holds plain data (history, step count,
    budget, per-parameter state). A new optimizer subclasses this class, calls
    ``super().__init__(params, defaults, max_calls=..., ...)`` and implements ``step``.

    Args:
        params: TextParameters, ``(name, TextParameter)`` pairs (e.g.
            ``module.named_text_parameters()``), or dicts ``{"params": [...], **options}``
            (parameter groups, as in torch).
        defaults: per-group options.
        max_calls, max_tokens, max_cost: the optimizer's :class:`~langtorch.optim.Budget`; every
            request it makes (and every request made inside ``with optimizer.budget:``) counts.

    Attributes:
        param_groups: list of dicts with ``"params"`` and the options.
        state: per-parameter state (plain data), keyed by parameter.
        history: list of dicts ``{"step", "param", "value", "score", "calls", "tokens"}``.
        budget: the :class:`~langtorch.optim.Budget`.

    Example:
        >>> import langtorch as lt
        >>> class Keep(lt.optim.TextOptimizer):
        ...     def step(self, closure=None):
        ...         self.step_count += 1
        >>> opt = Keep([lt.TextParameter("x")], {})
        >>> opt.step(); opt.state_dict()["step_count"]
        1
    """

    def __init__(self, params: Any, defaults: Mapping[str, Any], *, max_calls: int | None = None,
                 max_tokens: int | None = None, max_cost: float | None = None):
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self._names: dict[int, str] = {}
        if isinstance(params, (TextParameter, TextTensor)):
            raise TypeError("params must be an iterable of TextParameters (e.g. module.text_parameters()), "
                            f"got a single {type(params).__name__}; wrap it in a list")
        params = list(params) if isinstance(params, Iterable) else params
        if not isinstance(params, list):
            raise TypeError(f"params must be an iterable of TextParameters, got {type(params).__name__}")
        if not params:
            raise ValueError("the optimizer got an empty parameter list: pass module.text_parameters() "
                             "of a module that has TextParameters (e.g. lt.TLayer('...{}'))")
        groups = params if isinstance(params[0], Mapping) else [{"params": params}]
        for g in groups:
            self.add_param_group(g)
        self.state: dict[int, dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []
        self.budget = Budget(max_calls=max_calls, max_tokens=max_tokens, max_cost=max_cost)
        self.step_count = 0

    def add_param_group(self, group: Mapping[str, Any]) -> None:
        """Add a group ``{"params": [...], **options}`` (options default to the optimizer's).

        Raises:
            TypeError: an item is not a TextParameter.
            ValueError: a parameter is already in another group.
        """
        items = group["params"]
        items = [items] if isinstance(items, TextParameter) else list(items)
        ps = []
        for i, item in enumerate(items):
            name = None
            if isinstance(item, tuple) and len(item) == 2:
                name, item = item
            if not isinstance(item, TextParameter):
                raise TypeError(f"optimizer params must be TextParameters, got {type(item).__name__} at "
                                f"position {i}; use module.text_parameters() (torch parameters go to "
                                "torch.optim)")
            if any(item is q for g in self.param_groups for q in g["params"]):
                raise ValueError("a parameter appears in more than one parameter group")
            self._names[id(item)] = name or item.name or f"param{len(self._names)}"
            ps.append(item)
        self.param_groups.append({**self.defaults, **{k: v for k, v in group.items() if k != "params"},
                                  "params": ps})

    # ------------------------------------------------------------------------- torch shape
    def parameters(self) -> list[TextParameter]:
        """All parameters, in group order."""
        return [p for g in self.param_groups for p in g["params"]]

    def name_of(self, p: TextParameter) -> str:
        """The display name of a parameter (its attribute path when known)."""
        return self._names.get(id(p), "param")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's ``grad`` (as in torch)."""
        for p in self.parameters():
            p.grad = None

    def step(self, closure: Callable[[], Any] | None = None) -> float | None:  # pragma: no cover - abstract
        """One optimization step (see the class docstring); subclasses implement it."""
        raise NotImplementedError

    def _closure_score(self, closure: Callable[[], Any]) -> float:
        """The closure's score, its requests counted in this optimizer's budget."""
        with self.budget:
            return score_of(closure())

    def _record(self, p: TextParameter, score: float | None, **extra: Any) -> None:
        self.history.append({"step": self.step_count, "param": self.name_of(p), "value": _plain_value(p),
                             "score": None if score is None else float(score),
                             "calls": self.budget.calls, "tokens": self.budget.tokens, **extra})

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state as plain data (``torch.save`` it; loads with ``weights_only=True``):
        per-parameter state by position, group options, history, step count, budget counters.
        The parameters' values are in the *module's* ``state_dict()``."""
        index = {id(p): i for i, p in enumerate(self.parameters())}
        groups = []
        for g in self.param_groups:
            opts = {k: v for k, v in g.items() if k != "params" and _is_plain(v)}
            groups.append({**opts, "params": [index[id(p)] for p in g["params"]]})
        return {"shapes": [list(p.shape) for p in self.parameters()],
                "state": {i: copy.deepcopy(self.state[id(p)]) for p, i in
                          ((p, index[id(p)]) for p in self.parameters()) if id(p) in self.state},
                "param_groups": groups, "history": copy.deepcopy(self.history),
                "step_count": self.step_count, "budget": self.budget.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the optimizer must hold the same number of parameters).

        Raises:
            ValueError: the parameter count or group layout differs.
        """
        params = self.parameters()
        groups = state_dict.get("param_groups", [])
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("loaded state dict has a different parameter group layout: "
                             f"{[len(g['params']) for g in groups]} vs "
                             f"{[len(g['params']) for g in self.param_groups]}")
        shapes = state_dict.get("shapes")
        if shapes is not None and [tuple(s) for s in shapes] != [p.shape for p in params]:
            raise ValueError(f"loaded state dict is for parameters of shapes {[tuple(s) for s in shapes]}, "
                             f"this optimizer holds {[p.shape for p in params]}")
        for g, saved in zip(self.param_groups, groups):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {id(params[int(i)]): copy.deepcopy(s) for i, s in state_dict.get("state", {}).items()}
        self.history = copy.deepcopy(list(state_dict.get("history", [])))
        self.step_count = int(state_dict.get("step_count", 0))
        if "budget" in state_dict:
            self.budget.load_state_dict(state_dict["budget"])

    # ------------------------------------------------------------------------ conveniences
    def plot(self, path: Any = None) -> Any:
        """Plot the history's scores per step (matplotlib); saved to ``path`` when given.

        Raises:
            ImportError: matplotlib is missing (``pip install matplotlib``).
        """
        try:
            import matplotlib

            matplotlib.use("Agg") if path is not None else None
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("plot() needs matplotlib: pip install matplotlib") from None
        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = sorted({h["param"] for h in self.history})
        for name in names:
            rows = [h for h in self.history if h["param"] == name and h["score"] is not None]
            ax.plot([h["step"] for h in rows], [h["score"] for h in rows], marker="o", label=name)
        ax.set_xlabel("step")
        ax.set_ylabel("score")
        ax.set_title(type(self).__name__)
        if names:
            ax.legend()
        fig.tight_layout()
        if path is not None:
            fig.savefig(path)
            plt.close(fig)
        return fig

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k, v in sorted(g.items()):
                if k != "params" and _is_plain(v):
                    lines.append(f"    {k}: {v!r}")
        lines.append(f"    budget: {self.budget!r}")
        lines.append(")")
        return "\n".join(lines)


def _is_plain(v: Any) -> bool:
    if v is None or isinstance(v, (str, int, float, bool)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_is_plain(x) for x in v)
    if isinstance(v, Mapping):
        return all(isinstance(k, str) and _is_plain(x) for k, x in v.items())
    return False


def score_of(value: Any) -> float:
    """A float score from a closure's return: a loss TextTensor (mean ``score``) or a number."""
    if isinstance(value, TextTensor):
        if "score" not in value.metadata:
            raise TypeError("the closure returned a TextTensor without metadata['score']; return a loss "
                            "from lt.nn.MetricLoss/TextLoss or a float score (higher is better)")
        return float(np.mean(value.metadata.column("score").astype(float)))
    if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"the closure must return a loss TextTensor or a float score, got {type(value).__name__}")
