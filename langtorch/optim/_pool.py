"""GEPA's candidate pool as plain data: candidates, their validation rows, lineage, fronts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.evaluation import pareto

__all__ = ["CandidatePool", "get_entry", "put_entry"]


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def get_entry(value: Any, idx: tuple[int, ...] | None) -> Any:
    """Entry ``idx`` of a parameter's plain value (the value itself for ``None``).

    Example:
        >>> get_entry([["a", "b"]], (0, 1)), get_entry("x", None)
        ('b', 'x')
    """
    if idx is None:
        return value
    for i in idx:
        value = value[i]
    return value


def put_entry(cand: dict[str, Any], name: str, idx: tuple[int, ...] | None, new: str) -> None:
    """Set entry ``idx`` of parameter ``name`` in candidate ``cand`` (a copy of the nested lists
    is made, so candidates sharing a value are not changed together).

    Example:
        >>> c = {"p": ["a", "b"]}; put_entry(c, "p", (1,), "B"); c
        {'p': ['a', 'B']}
    """
    if idx is None:
        cand[name] = new
        return
    value = _plain(cand[name])
    at = value
    for i in idx[:-1]:
        at = at[i]
    at[idx[-1]] = new
    cand[name] = value


class CandidatePool:
    """Candidates (``{parameter name: value}``) with one validation row each: scores, costs and
    tokens per example, and a lineage record. Everything is plain data (:meth:`state_dict`).

    Example:
        >>> pool = CandidatePool(2, ("score", "tokens"))
        >>> pool.add({"p": "a"}, [1.0, 1.0], [0.0, 0.0], [90, 90], {"kind": "seed", "parents": []})
        0
        >>> pool.add({"p": "b"}, [1.0, 0.8], [0.0, 0.0], [10, 10], {"kind": "reflect", "parents": [0]})
        1
        >>> pool.best(), pool.cheapest(0.0), pool.cheapest(0.1), pool.front()[0].tolist()
        (0, 0, 1, [True, True])
    """

    def __init__(self, n_val: int, objectives: Sequence[str] = ("score",)):
        self.n_val = int(n_val)
        self.objectives = tuple(objectives)
        self.candidates: list[dict[str, Any]] = []
        self.lineage: list[dict[str, Any]] = []
        self._scores: list[list[float]] = []
        self._costs: list[list[float]] = []
        self._tokens: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.candidates)

    def add(self, cand: Mapping[str, Any], scores: Any, costs: Any, tokens: Any, info: Mapping[str, Any]) -> int:
        """Append a candidate with its validation row; returns its index."""
        self.candidates.append(_plain(dict(cand)))
        self._scores.append([float(s) for s in scores])
        self._costs.append([float(c) for c in costs])
        self._tokens.append([int(t) for t in tokens])
        self.lineage.append(_plain(dict(info)))
        return len(self.candidates) - 1

    # ------------------------------------------------------------------ views
    @property
    def scores(self) -> np.ndarray:
        """The score matrix ``[candidates, validation examples]``."""
        return np.array(self._scores, dtype=np.float64).reshape(len(self._scores), self.n_val)

    def row(self, key: str, i: int) -> np.ndarray:
        """Candidate ``i``'s per-example ``"scores"``, ``"costs"`` or ``"tokens"``."""
        return np.asarray({"scores": self._scores, "costs": self._costs, "tokens": self._tokens}[key][i])

    def objective_grid(self) -> np.ndarray:
        """``[candidates, examples, objectives]``, each higher-is-better (minus cost)."""
        cols = [self.scores]
        for o in self.objectives[1:]:
            grid = self._costs if o == "cost" else self._tokens
            cols.append(-np.array(grid, dtype=np.float64).reshape(self.scores.shape))
        return np.stack(cols, -1)

    def front(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mask, counts)`` of the per-example Pareto front over the objectives."""
        if not self.candidates:
            return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
        if len(self.objectives) == 1:
            return pareto(self.scores)
        return pareto(self.objective_grid(), objective_dim=-1)

    def leads(self) -> np.ndarray:
        """``[candidates, examples]``: whether a candidate is on an example's front."""
        grid = self.scores[..., None] if len(self.objectives) == 1 else self.objective_grid()
        ge = (grid[:, None] >= grid[None, :]).all(-1)
        gt = (grid[:, None] > grid[None, :]).any(-1)
        return ~(ge & gt).any(0)

    def parent_weights(self) -> np.ndarray:
        """How many validation examples each candidate leads once candidates that only share
        fronts are dropped (GEPA's dominated-program removal): visiting candidates from the
        lowest mean score up, one whose every example front also holds another remaining
        candidate is removed.

        Example:
            >>> pool = CandidatePool(3)
            >>> _ = pool.add({}, [0.0, 0.0, 0.0], [0.0] * 3, [0] * 3, {"parents": []})   # only ties
            >>> _ = pool.add({}, [1.0, 0.0, 0.0], [0.0] * 3, [0] * 3, {"parents": [0]})
            >>> pool.parent_weights().tolist()
            [0, 3]
        """
        leads = self.leads()
        means = self.scores.mean(axis=1)
        order = sorted(range(len(self)), key=lambda i: (means[i], -i))
        alive = set(range(len(self)))
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
        keep = np.zeros(len(self), dtype=bool)
        keep[list(alive)] = True
        return (leads & keep[:, None]).sum(axis=1).astype(np.int64)

    def mean_cost(self) -> np.ndarray:
        """Mean cost per candidate (``"cost"`` when an objective, else tokens)."""
        grid = self._costs if "cost" in self.objectives[1:] else self._tokens
        return np.array(grid, dtype=np.float64).reshape(self.scores.shape).mean(axis=1)

    def best(self) -> int:
        """The highest mean score; ties to the cheaper, then the older."""
        means, costs = self.scores.mean(axis=1), self.mean_cost()
        return int(min(range(len(self)), key=lambda i: (-means[i], costs[i], i)))

    def cheapest(self, epsilon: float = 0.0) -> int:
        """The cheapest candidate whose mean score is within ``epsilon`` of the best (ties to
        the higher score, then the older)."""
        means, costs = self.scores.mean(axis=1), self.mean_cost()
        ok = [i for i in range(len(self)) if means[i] >= means.max() - epsilon - 1e-12]
        return int(min(ok, key=lambda i: (costs[i], -means[i], i)))

    def ancestors(self, i: int) -> set[int]:
        """Every candidate that ``i`` descends from."""
        out, todo = set(), [i]
        while todo:
            for q in self.lineage[todo.pop()]["parents"]:
                if q not in out:
                    out.add(q)
                    todo.append(q)
        return out

    # ------------------------------------------------------------------ merge
    def merged(self, i: int, j: int, components: Sequence[tuple[str, Any]]) -> dict[str, Any] | None:
        """The component-wise merge of candidates ``i`` and ``j`` (``components``: ``(parameter
        name, entry index or None)`` pairs), or ``None`` when they do not qualify: from their most
        recent common ancestor, each component comes from the descendant that changed it (the one
        with the higher mean score when both did); both must contribute, and the merge must be new.

        Example:
            >>> pool = CandidatePool(1)
            >>> for c, parents in (({"a": "0", "b": "0"}, []), ({"a": "A", "b": "0"}, [0]), ({"a": "0", "b": "B"}, [0])):
            ...     _ = pool.add(c, [0.0], [0.0], [0], {"parents": parents})
            >>> pool.merged(1, 2, [("a", None), ("b", None)])
            {'a': 'A', 'b': 'B'}
        """
        ai, aj = self.ancestors(i), self.ancestors(j)
        common = ai & aj
        if not common or i in aj or j in ai:
            return None
        a = max(common)
        means = self.scores.mean(axis=1)
        pi, pj, pa = self.candidates[i], self.candidates[j], self.candidates[a]
        child = _plain(pi)
        took = {i: False, j: False}
        for pname, idx in components:
            vi, vj, va = (get_entry(c[pname], idx) for c in (pi, pj, pa))
            if vi == vj:
                continue
            src = j if vi == va else i if vj == va else (i if means[i] >= means[j] else j)
            took[src] = True
            put_entry(child, pname, idx, vi if src == i else vj)
        if not (took[i] and took[j]) or child in self.candidates:
            return None
        return child

    def merge_pair(self, components: Sequence[tuple[str, Any]], tried: Sequence[Sequence[int]]
                   ) -> tuple[int, int, dict[str, Any]] | None:
        """The first pair of front candidates (not in ``tried``) with a valid :meth:`merged`."""
        mask, _ = self.front()
        idx = [i for i in range(len(self)) if mask[i]]
        for a, i in enumerate(idx):
            for j in idx[a + 1:]:
                if [i, j] not in [list(t) for t in tried] and (child := self.merged(i, j, components)) is not None:
                    return i, j, child
        return None

    # ------------------------------------------------------------------ persistence and views
    def state_dict(self) -> dict[str, Any]:
        """Plain data: ``pool``, ``scores``, ``costs``, ``tokens``, ``lineage``."""
        return _plain({"pool": self.candidates, "scores": self._scores, "costs": self._costs,
                       "tokens": self._tokens, "lineage": self.lineage})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.candidates = _plain(state["pool"])
        self._scores, self._costs, self._tokens = (_plain(state[k]) for k in ("scores", "costs", "tokens"))
        self.lineage = _plain(state["lineage"])

    def to_pandas(self) -> Any:
        """One row per candidate: values, mean score / cost / tokens, front, leads, lineage."""
        import pandas as pd

        mask, counts = self.front()
        means = self.scores.mean(axis=1) if self.candidates else []
        rows = []
        for i, cand in enumerate(self.candidates):
            lin = self.lineage[i]
            rows.append({"candidate": i, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in cand.items()},
                         "score": float(means[i]), "cost": float(np.mean(self._costs[i])),
                         "tokens": float(np.mean(self._tokens[i])), "front": bool(mask[i]), "leads": int(counts[i]),
                         "kind": lin.get("kind"), "parents": lin.get("parents"), "changed": lin.get("changed"),
                         "step": lin.get("step"), "metric_calls": lin.get("metric_calls")})
        return pd.DataFrame(rows)
