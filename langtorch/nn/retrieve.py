"""``lt.nn.Retrieve``: retrieval from an :class:`~langtorch.Index` as a text module (RAG).

Example:
    >>> import numpy as np, langtorch as lt
    >>> def embedder(texts):
    ...     return np.array([[t.count("cat"), t.count("dog"), 0.1] for t in texts], dtype=np.float32)
    >>> index = lt.Index(["cats purr", "dogs bark", "fish swim"], embedder=embedder)
    >>> retrieve = lt.nn.Retrieve(index, k=1)
    >>> retrieve(lt.TextTensor(["a cat?", "a dog?"])).tolist()
    [['cats purr'], ['dogs bark']]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from langtorch.index import Index
from langtorch.nn.modules import TModule
from langtorch.tensor import TextTensor

__all__ = ["Retrieve"]


class Retrieve(TModule):
    """``Retrieve(index, k)(queries)`` -> the ``k`` best passages per query, shape
    ``queries.shape + (k,)``, with ``score`` and ``index`` metadata (see :meth:`Index.search`).

    Join the passages into one context per query with ``.join("\\n\\n")`` and fill a prompt:

        context = retrieve(questions).join("\\n\\n")
        answers = llm(prompt * lt.TextTensor({"context": context, "question": questions}))

    The passages are data: braces in them are never parsed as template fields.

    Args:
        index: the :class:`~langtorch.Index` to search.
        k: passages per query (``1 <= k``; at most the index's size when called).

    Example:
        >>> import numpy as np, langtorch as lt
        >>> index = lt.Index(["x", "y"], embeddings=np.eye(2))
        >>> q = lt.TextTensor(["?"], embedding=np.array([[0.0, 1.0]]))
        >>> lt.nn.Retrieve(index, k=2)(q).metadata["index"].tolist()
        [[1, 0]]
    """

    def __init__(self, index: Index, k: int = 5):
        super().__init__()
        if not isinstance(index, Index):
            raise TypeError(f"Retrieve(index=...) must be a langtorch.Index, got {type(index).__name__}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"Retrieve(k=...) must be a positive int, got {k!r}")
        self.index = index
        self.k = int(k)

    def forward(self, queries: Any) -> TextTensor:
        """The ``k`` best passages for every query entry (``queries.shape + (k,)``)."""
        return self.index.search(queries, self.k)

    def extra_repr(self) -> str:
        return f"{self.index!r}, k={self.k}"
