"""The user-facing :class:`TextTensor` and :class:`TextParameter`.

``langtorch.TextTensor`` is :class:`langtorch.functional.TextTensor` plus the conveniences that
need defaults or torch: ``embed()`` with no argument uses the local default embedding model, and
``embedding_torch()`` hands the embedding to torch without a copy.

Example:
    >>> import langtorch as lt
    >>> prompt = lt.TextTensor("Translate into French: {input}")
    >>> print(prompt + lt.TextTensor("Hello, world!"))
    Translate into French: Hello, world!
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from langtorch import _context
from langtorch.autograd import _graph
from langtorch.functional import text as _text
from langtorch.functional import textops as _text_ops

__all__ = ["TextTensor", "TextParameter"]


class TextTensor(_text.TextTensor):
    """An immutable n-d array of texts; see :class:`langtorch.functional.TextTensor`.

    Example:
        >>> import langtorch as lt
        >>> batch = lt.TextTensor(["Write a poem about {theme}"] * 3)
        >>> (batch + lt.TextTensor(["spring", "summer", "autumn"])).tolist()[1]
        'Write a poem about summer'
    """

    __slots__ = ()

    def __init__(self, data: Any = "", **kwargs: Any):
        if isinstance(data, (list, tuple)) and data and all(isinstance(d, _text.TextTensor) for d in data):
            data = _text_ops.stack(list(data))  # recorded once, as a stack op
        recorded = None
        if isinstance(data, Mapping) and (_context.active_trace.get() is not None or _graph._may_record(
                (), dict(data))):
            # Keyed records from tensors that record: a "records" op (same entries and fields).
            recorded = _text_ops.records(dict(data))
        super().__init__(data, **kwargs)
        if recorded is not None:
            self._grad_fn, self._cut = recorded._grad_fn, recorded._cut
        if isinstance(data, _text.TextTensor):
            # A TextTensor made from another keeps its provenance (same entries).
            self._grad_fn, self._cut = data._grad_fn, data._cut
            if self._grad_fn is None and _graph.requires_grad(data):
                from langtorch.autograd._graph import identity_index, record_node

                record_node("copy", self, [(data, identity_index(self.shape), "input")])

    # Provenance: every op on a langtorch.TextTensor goes through this hook (see
    # langtorch.functional.text.text_function), which records the graph and op spans.
    __text_function__ = staticmethod(_graph.handle_text_function)

    @property
    def grad_fn(self) -> Any:
        """The :class:`~langtorch.autograd.Node` that made this tensor from a TextParameter that
        requires grad, or ``None`` (as in torch). Nodes recorded only for a trace's graph view
        are in ``trace.nodes``.

        Example:
            >>> import langtorch as lt
            >>> (lt.TextParameter("Q: {}") + "why?").grad_fn.op
            'add'
        """
        node = self._grad_fn
        return node if node is not None and node.requires_grad else None

    @property
    def requires_grad(self) -> bool:
        """Whether feedback can flow back from this tensor into a TextParameter.

        Example:
            >>> import langtorch as lt
            >>> lt.TextTensor("x").requires_grad
            False
        """
        return _graph.requires_grad(self)

    @property
    def is_leaf(self) -> bool:
        """True for tensors that do not require grad and for parameters (as in torch)."""
        return not self.requires_grad

    def backward(self, engine: Any = None, **kwargs: Any) -> None:
        """Propagate this tensor's feedback (a loss from ``lt.nn.TextLoss``/``MetricLoss``)
        back through the provenance graph into ``param.grad`` of the TextParameters used.

        See :func:`langtorch.autograd.backward` for the arguments.
        """
        from langtorch.autograd import backward

        backward(self, engine=engine, **kwargs)

    def embed(self, model: Any = None, *, mesh: Any = None) -> TextTensor:
        """Embed every entry and attach the result as ``.embedding`` (``shape + (d,)``).

        Args:
            model: a callable ``list[str] -> [N, d] array``, an object with an ``embed_texts``
                method, or ``None`` for the local default model (all-MiniLM-L6-v2, d = 384).
            mesh: ``"auto"`` or a ``jax.sharding.Mesh``, passed to the model's ``embed_texts``
                (local models shard their batches along the mesh's ``data`` axis).

        Example:
            >>> import numpy as np, langtorch as lt
            >>> lt.TextTensor(["a", "bb"]).embed(lambda xs: np.ones((len(xs), 2))).embedding.shape
            (2, 2)
        """
        if model is None:
            from langtorch.models import default_embedder

            model = default_embedder()
        fn = getattr(model, "embed_texts", model)
        if mesh is not None:
            fn = functools.partial(fn, mesh=mesh)
        return super().embed(fn)

    def embedding_torch(self, *, dtype: Any = None, device: Any = None) -> Any:
        """The embedding as a ``torch.Tensor`` sharing memory with it (DLPack, no copy).

        A JAX or writable numpy embedding is shared without a copy; a read-only numpy one is
        copied. ``dtype``/``device`` convert afterwards (see ``langtorch.interop.embedding_to_torch``).

        Raises:
            ValueError: the tensor has no embedding (call ``embed()`` first).

        Example:
            >>> import numpy as np, langtorch as lt
            >>> t = lt.TextTensor(["a"], embedding=np.ones((1, 3), dtype=np.float32))
            >>> t.embedding_torch().shape
            torch.Size([1, 3])
        """
        if self.embedding is None:
            raise ValueError("this TextTensor has no embedding; call t.embed() first")
        from langtorch.interop import embedding_to_torch

        return embedding_to_torch(self, dtype=dtype, device=device)


_text.register_pytree(TextTensor)


class TextParameter(TextTensor):
    """A trainable text held by a :class:`~langtorch.TModule` (the text analogue of
    ``nn.Parameter``): registered on assignment, listed by ``text_parameters()``, saved in
    ``state_dict()`` and restored by ``load_state_dict()``.

    Unlike a TextTensor it is mutable through ``.data`` (what a text optimizer updates). Ops on
    it return plain TextTensors. Its entries are templates.

    Args:
        data: the initial text(s).
        requires_grad: whether optimizers may change it.

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Answer briefly: {q}")
        >>> p.data = lt.TextTensor("Answer in one word: {q}")
        >>> (p + lt.TextTensor("why?")).item()
        'Answer in one word: why?'
    """

    __slots__ = ("requires_grad", "grad", "_name")

    def __init__(self, data: Any = "", requires_grad: bool = True):
        if isinstance(data, TextParameter):
            data = data.data
        super().__init__(data, template=True)
        self._grad_fn = self._cut = None  # a parameter is a leaf
        self.requires_grad = bool(requires_grad)
        self.grad: TextTensor | None = None
        self._name: str | None = None

    @property
    def is_leaf(self) -> bool:
        """Always True: a parameter is a leaf of the graph."""
        return True

    @classmethod
    def _result_class(cls) -> type:
        return TextTensor

    @classmethod
    def _wrap(cls, texts, fields=None, metadata=None, embedding=None, template=True):
        out = super()._wrap(texts, fields, metadata, embedding, template)
        out.requires_grad = True
        out.grad = None
        out._name = None
        return out

    @property
    def data(self) -> TextTensor:
        """The current value as an (immutable) TextTensor; assign to replace it in place.

        Example:
            >>> import langtorch as lt
            >>> p = lt.TextParameter("a"); p.data = "b"; str(p)
            'b'
        """
        return TextTensor._wrap(self._texts, self._fields, self.metadata.copy(), None, True)

    @data.setter
    def data(self, value: Any) -> None:
        if isinstance(value, TextParameter):
            value = value.data
        new = TextTensor(value, template=True)
        self._texts, self._fields = new._texts, new._fields
        self._metadata, self._embedding, self._pylist = new._metadata, None, None

    def __repr__(self) -> str:
        return "TextParameter containing:\n" + repr(self.data) + (
            "" if self.requires_grad else " (frozen)"
        )

    def __reduce_ex__(self, protocol):
        # Through the TextTensor value, so record fields and metadata survive copies and pickles;
        # the gradient and the registered name come along (as torch keeps .grad on deepcopy).
        return (_rebuild_parameter, (self.data, self.requires_grad, self.grad, self._name))

    def _tree_flatten(self):
        children, aux = super()._tree_flatten()
        return children, (aux, self.requires_grad)

    @staticmethod
    def _tree_unflatten(aux, children):
        inner, requires_grad = aux
        out = _text.TextTensor._tree_unflatten(inner, children)
        out.requires_grad = requires_grad
        out.grad = None
        out._name = None
        return out


_text.register_pytree(TextParameter)


def _rebuild_parameter(data: Any, requires_grad: bool, grad: Any = None, name: Any = None) -> TextParameter:
    p = TextParameter(data, requires_grad)
    p.grad, p._name = grad, name
    return p
