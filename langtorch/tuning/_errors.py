"""Errors of the prompt tuner (all :class:`~langtorch.errors.LangTorchError`)."""

from langtorch.functional.errors import LangTorchError
from langtorch.functional.prompt_tuning import NonFiniteLossError

__all__ = ["PromptTuningError", "AdapterError", "CheckpointError", "NonFiniteLossError"]


class PromptTuningError(LangTorchError, ValueError):
    """Bad tuner input: labels that are not single tokens, targets outside the label set, an
    empty dataset, a prompt longer than the model's context.

    Example:
        >>> from langtorch.tuning import PromptTuningError
        >>> issubclass(PromptTuningError, ValueError)
        True
    """


class AdapterError(LangTorchError, ValueError):
    """A PEFT adapter directory is missing, corrupted, or does not fit the model.

    Example:
        >>> from langtorch.tuning import AdapterError
        >>> str(AdapterError("bad adapter"))
        'bad adapter'
    """


class CheckpointError(LangTorchError, ValueError):
    """A training checkpoint cannot be read (truncated, corrupted, or from another setup).

    Example:
        >>> from langtorch.tuning import CheckpointError
        >>> issubclass(CheckpointError, ValueError)
        True
    """
