"""Errors of the prompt tuner (all :class:`~langtorch.errors.LangTorchError`)."""

from langtorch.functional.errors import LangTorchError
from langtorch.functional.prompt_tuning import NonFiniteLossError

# One class for a bad adapter directory, whoever reads it (``LocalBackend(adapter=...)`` or
# ``PromptTuner.load_adapter``): the reader lives in ``langtorch.models.adapters``.
from langtorch.models.adapters import AdapterError

__all__ = ["PromptTuningError", "AdapterError", "CheckpointError", "NonFiniteLossError"]


class PromptTuningError(LangTorchError, ValueError):
    """Bad tuner input: labels that are not single tokens, targets outside the label set, an
    empty dataset, a prompt longer than the model's context.

    Example:
        >>> from langtorch.tuning import PromptTuningError
        >>> issubclass(PromptTuningError, ValueError)
        True
    """


class CheckpointError(LangTorchError, ValueError):
    """A training checkpoint cannot be read (truncated, corrupted, or from another setup).

    Example:
        >>> from langtorch.tuning import CheckpointError
        >>> issubclass(CheckpointError, ValueError)
        True
    """
