"""The examples an optimizer scores on (DSPy's trainset), given once to its constructor."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from langtorch.tensor import TextTensor

__all__ = ["Examples", "split_step_args"]


def _as_tensor(x: Any) -> TextTensor:
    return x if isinstance(x, TextTensor) else TextTensor(x, template=False)


class Examples:
    """Inputs and targets, served whole, or in minibatches of ``batch_size`` pairs along the
    first axis.

    Batch ``i`` of a ``batch_size`` is slice ``i % per_epoch`` of epoch ``i // per_epoch``'s
    permutation, a permutation seeded by ``(seed, epoch)``: a resumed optimizer (its
    ``step_count`` restored) continues with the batch it would have drawn next.

    Example:
        >>> data = Examples(["a", "b", "c"], ["A", "B", "C"], batch_size=2, seed=0, owner="Search")
        >>> [len(data.batch(i)[0]) for i in range(3)]
        [2, 1, 2]
        >>> sorted(data.batch(0)[0].tolist() + data.batch(1)[0].tolist())
        ['a', 'b', 'c']
    """

    def __init__(self, inputs: Any, targets: Any, *, batch_size: int | None, seed: int, owner: str):
        self.inputs, self.targets = _as_tensor(inputs), _as_tensor(targets)
        n = self.inputs.shape[0] if self.inputs.ndim else 0
        if n == 0:
            raise ValueError(f"{owner}: inputs must be a non-empty batch (a list or a TextTensor with a "
                             f"leading examples axis), got shape {self.inputs.shape}")
        if batch_size is not None and self.targets.shape[:1] != (n,):
            raise ValueError(f"{owner}: expected one target per input along the first axis: {n} inputs, "
                             f"targets of shape {self.targets.shape}")
        if batch_size is not None and (not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"{owner}: batch_size must be a positive int or None (every step uses all "
                             f"examples), got {batch_size!r}")
        self.n, self.seed = n, int(seed)
        self.batch_size = None if batch_size is None or batch_size >= n else int(batch_size)

    def size(self) -> int:
        """Examples in one batch."""
        return self.n if self.batch_size is None else self.batch_size

    def batch(self, i: int) -> tuple[TextTensor, TextTensor]:
        """``(inputs, targets)`` of batch ``i`` (all examples without a ``batch_size``)."""
        if self.batch_size is None:
            return self.inputs, self.targets
        per_epoch = -(-self.n // self.batch_size)
        epoch, k = divmod(int(i), per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        idx = order[k * self.batch_size:(k + 1) * self.batch_size]
        return self.inputs[idx], self.targets[idx]


def split_step_args(owner: str, closure: Any, data: tuple[Any, ...], named: dict[str, Any],
                    names: tuple[str, ...]) -> tuple[Callable[[], Any] | None, tuple[Any, ...] | None]:
    """``(closure, data)`` of a ``step`` call: ``step(closure=None)``, or the data-in-step form
    of earlier releases, ``step(inputs, targets, ...)`` (``names``), with a DeprecationWarning."""
    if not data and not named and (closure is None or callable(closure)):
        return closure, None
    if callable(closure):
        raise TypeError(f"{owner}.step(closure) takes the closure only; give the data to the "
                        f"constructor ({owner}(..., inputs=..., targets=...))")
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise TypeError(f"{owner}.step() got unexpected keyword arguments {unknown}")
    args = list((closure, *data) if closure is not None else data)
    args += [None] * (len(names) - len(args))
    if len(args) > len(names):
        raise TypeError(f"{owner}.step() takes at most {len(names)} data arguments ({', '.join(names)}), "
                        f"got {len(args)}")
    for k, name in enumerate(names):
        if name in named:
            if args[k] is not None:
                raise TypeError(f"{owner}.step() got multiple values for argument {name!r}")
            args[k] = named[name]
    if args[0] is None or args[1] is None:
        raise TypeError(f"{owner}.step(inputs, targets) needs both inputs and targets")
    warnings.warn(f"{owner}.step(inputs, targets) is deprecated: give the data to the constructor "
                  f"({owner}(..., inputs=..., targets=...)) and call step(), the torch.optim contract",
                  DeprecationWarning, stacklevel=3)
    return None, tuple(args)
