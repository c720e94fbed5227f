"""langtorch.functional — the pure core of langtorch.

TextTensor and its ops, the safe template engine, and the JAX numerics (embedding math, models,
soft prompts). Nothing here imports torch, touches the network or keeps global mutable state.

Example:
    >>> import langtorch.functional as F
    >>> F.fill("Hello {name}", ["Ada", "Alan"]).tolist()
    ['Hello Ada', 'Hello Alan']
"""

from langtorch.functional.embedding import cosine_similarity, normalize, topk
from langtorch.functional.errors import (
    BackendError,
    BatchError,
    LangTorchError,
    ParseError,
    ShapeError,
    TemplateError,
)
from langtorch.functional.template import Template, parse_template
from langtorch.functional.text import Metadata, TextTensor, broadcast_shapes, register_pytree
from langtorch.functional.textops import (
    add,
    cat,
    concat,
    fill,
    join,
    records,
    split,
    stack,
    where,
)

__all__ = [
    "BackendError",
    "BatchError",
    "LangTorchError",
    "Metadata",
    "ParseError",
    "ShapeError",
    "Template",
    "TemplateError",
    "TextTensor",
    "add",
    "broadcast_shapes",
    "cat",
    "concat",
    "cosine_similarity",
    "fill",
    "join",
    "normalize",
    "parse_template",
    "records",
    "register_pytree",
    "split",
    "stack",
    "topk",
    "where",
]
