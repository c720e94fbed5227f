"""langtorch.functional — the pure core: TextTensor, templates, and (later) JAX model math.

Nothing here imports torch or touches the network.
"""

from langtorch.functional.errors import (
    BackendError,
    BatchError,
    LangTorchError,
    ParseError,
    ShapeError,
    TemplateError,
)

__all__ = [
    "BackendError",
    "BatchError",
    "LangTorchError",
    "ParseError",
    "ShapeError",
    "TemplateError",
]
