"""langtorch.tuning — prompt tuning on local models: soft prompts, hard prompts, PEFT adapters.

* :class:`PromptTuner` — ``fit`` / ``evaluate`` / ``predict`` / ``hard_prompt`` /
  ``save_adapter`` / ``load_adapter`` / ``plot``; checkpoints and resume.
* :class:`SoftPromptLayer` — a tuned soft prompt as a ``TLayer`` for ``TChain``s.
* Errors: :class:`PromptTuningError`, :class:`AdapterError`, :class:`CheckpointError`,
  :class:`NonFiniteLossError`.

The numeric core is :mod:`langtorch.functional.prompt_tuning` and
:mod:`langtorch.functional.losses`.

Example:
    >>> from langtorch.tuning import PromptTuner, PromptTuningError
    >>> issubclass(PromptTuningError, ValueError)
    True
"""

from langtorch.tuning._errors import (
    AdapterError,
    CheckpointError,
    NonFiniteLossError,
    PromptTuningError,
)
from langtorch.tuning._files import load_peft_adapter, save_peft_adapter
from langtorch.tuning._tuner import PromptTuner


def __getattr__(name: str):
    # SoftPromptLayer needs torch: load it on first use only.
    if name == "SoftPromptLayer":
        from langtorch.tuning._layer import SoftPromptLayer

        return SoftPromptLayer
    raise AttributeError(f"module 'langtorch.tuning' has no attribute {name!r}")


__all__ = [
    "AdapterError",
    "CheckpointError",
    "NonFiniteLossError",
    "PromptTuner",
    "PromptTuningError",
    "SoftPromptLayer",
    "load_peft_adapter",
    "save_peft_adapter",
]
