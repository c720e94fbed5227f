"""A tuned soft prompt as a text module."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from langtorch.nn.modules import TLayer
from langtorch.tensor import TextTensor

__all__ = ["SoftPromptLayer"]


class SoftPromptLayer(TLayer):
    """A ``TLayer`` that answers with the local model steered by a soft prompt.

    ``forward(x)`` is exactly ``tuner.predict(x, soft_prompt=<the parameter>)``: labels, or
    generations from the model's shared decode engine (the ``LocalBackend`` path), with the
    prompt as the tuner uses it (PEZ-projected for a ``pez=True`` tuner). ``soft_prompt`` is a
    torch ``nn.Parameter`` of shape ``[P, H]``, so it is in ``state_dict()`` and loads with
    ``torch.load(..., weights_only=True)``. Use it inside ``TChain``s next to other text
    modules; for chat-style use with sampling, ``n``, stop strings or streaming, put the tuner
    in ``nn.LLM(LocalBackend(adapter=tuner))`` instead (a label-mode tuner answers there with
    its labels too; ``response_format={"type": "text"}`` asks for free text).

    Args:
        tuner: a :class:`~langtorch.tuning.PromptTuner` (its model, template and labels).

    Example:
        >>> import langtorch as lt
        >>> from langtorch.tuning import PromptTuner
        >>> tuner = PromptTuner(n_tokens=8, labels=["negative", "positive"])   # doctest: +SKIP
        >>> chain = lt.TChain(lt.TFunction(lambda x: x.map(str.strip)), tuner.as_module())  # doctest: +SKIP
        >>> chain(lt.TextTensor(["  Loved it!  "])).tolist()                 # doctest: +SKIP
        ['positive']
    """

    def __init__(self, tuner: Any):
        super().__init__()
        self.tuner = tuner
        self.soft_prompt = nn.Parameter(torch.from_numpy(np.array(tuner.prompt, np.float32)))

    def forward(self, x: Any) -> TextTensor:
        x = x if isinstance(x, TextTensor) else TextTensor(x, template=False)
        weights = self.soft_prompt.detach().cpu().numpy()
        return self.tuner.predict(x, soft_prompt=weights)

    def extra_repr(self) -> str:
        return f"tuner={self.tuner!r}, n_tokens={self.soft_prompt.shape[0]}"
