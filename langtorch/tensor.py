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

from langtorch import autograd
from langtorch.core import context as _context
from langtorch.functional import text as _text
from langtorch.functional import textops as _text_ops

__all__ = ["TextTensor", "TextParameter", "text"]


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
        if isinstance(data, Mapping) and (_context.active_trace.get() is not None or autograd.may_record(
                (), dict(data))):
            # Keyed records from tensors that record: a "records" op (same entries and fields).
            recorded = _text_ops.records(dict(data))
        super().__init__(data, **kwargs)
        if recorded is not None:
            self._grad_fn, self._cut = recorded._grad_fn, recorded._cut
        if isinstance(data, _text.TextTensor):
            # A TextTensor made from another keeps its provenance (same entries).
            self._grad_fn, self._cut = data._grad_fn, data._cut
            if self._grad_fn is None and autograd.requires_grad(data):
                autograd.record_node("copy", self, [(data, autograd.identity_index(self.shape), "input")])

    # Provenance: every op on a langtorch.TextTensor goes through this hook (see
    # langtorch.functional.text.text_function), which records the graph and op spans.
    __text_function__ = staticmethod(autograd.handle_text_function)

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
        return autograd.requires_grad(self)

    @property
    def is_leaf(self) -> bool:
        """True for tensors that do not require grad and for parameters (as in torch)."""
        return not self.requires_grad

    def backward(self, feedback_engine: Any = None, *, engine: Any = None, **kwargs: Any) -> None:
        """Propagate this tensor's feedback (a loss from ``lt.nn.TextLoss``/``MetricLoss``)
        back through the provenance graph into ``param.grad`` of the TextParameters used.

        ``feedback_engine`` is the critic that writes feedback through LLM calls (an
        ``lt.nn.LLM``, a Backend, any :class:`~langtorch.autograd.FeedbackEngine`);
        ``engine=`` is its deprecated name (it warns). See :func:`langtorch.autograd.backward`
        for the other arguments.

        Example:
            >>> import langtorch as lt
            >>> p = lt.TextParameter("Q: {}")
            >>> lt.nn.MetricLoss("exact_match")(p + "a", "A").backward()
            >>> p.grad.metadata["count"]
            1
        """
        if engine is not None:
            import warnings

            if feedback_engine is not None:
                raise TypeError("backward(): got both feedback_engine= and its deprecated name "
                                "engine=; pass feedback_engine= only.")
            warnings.warn("backward(): engine= is deprecated; pass feedback_engine= (the critic "
                          "that writes feedback; 'engine' names the decode engine).",
                          DeprecationWarning, stacklevel=2)
            feedback_engine = engine
        autograd.backward(self, feedback_engine, **kwargs)

    def reply(self, texts: Any) -> TextTensor:
        """The next turn of every conversation: ``texts`` (broadcast over the batch; strings are
        data, sent as written, a template TextTensor stays a template) as the user turns, this tensor's ``metadata["messages"]`` (an LLM answer's conversation, which ends
        with the assistant turn) as their history; ``metadata["system"]`` is kept. An entry
        without a conversation starts one with its text as the assistant turn.

        ``llm(llm(chat).reply("and then?"))`` continues every conversation; answers with
        ``n > 1`` samples continue each sample's own branch.

        Example:
            >>> import langtorch as lt
            >>> answer = lt.TextTensor(["4"], template=False)
            >>> answer.metadata["messages"] = [[{"role": "user", "content": "2+2?"},
            ...                                 {"role": "assistant", "content": "4"}]]
            >>> nxt = answer.reply("and times 3?")
            >>> nxt.tolist(), [m["content"] for m in nxt[0].metadata["messages"]]
            (['and times 3?'], ['2+2?', '4'])
        """
        import numpy as np

        user = texts if isinstance(texts, _text.TextTensor) else TextTensor(texts, template=False)
        shape = _text.broadcast_shapes(self.shape, user.shape)
        own = np.broadcast_to(self.texts, shape).reshape(-1).tolist()
        cols = self.metadata
        history = (np.broadcast_to(cols.column("messages"), shape).reshape(-1)
                   if "messages" in cols else [None] * len(own))
        messages = np.empty(len(own), dtype=object)
        for i, (text, past) in enumerate(zip(own, history)):
            messages[i] = ([dict(m) for m in past] if past is not None
                           else [{"role": "assistant", "content": text}])
        # Strings are data (sent as written); a template TextTensor stays one, so the LLM resolves
        # its escapes and refuses its unfilled placeholders as it does for any template input.
        out = TextTensor(np.array(np.broadcast_to(user.texts, shape)), template=user.is_template)
        out.metadata["messages"] = messages.reshape(shape)
        if "system" in cols:
            out.metadata["system"] = np.broadcast_to(cols.column("system"), shape)
        return out

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
            import inspect

            try:
                params = inspect.signature(fn).parameters.values()
            except (TypeError, ValueError):  # no signature to inspect: let the call decide
                params = None
            if params is not None and not any(
                    p.name == "mesh" or p.kind is p.VAR_KEYWORD for p in params):
                raise TypeError(f"mesh: this embedder ({type(model).__name__}) takes no mesh= "
                                f"argument; only local models (e.g. MiniLM) shard on a mesh.")
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


    # ------------------------------------------------------------------------------ tables
    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` with one row per entry: ``text``, the record fields and the
        metadata columns (see :meth:`to_records`). A tensor of 2 or more dimensions gets a
        ``MultiIndex`` with levels ``dim0, dim1, ...``; :meth:`from_pandas` reads it back.

        Raises:
            ImportError: pandas is not installed (``pip install langtorch-jax[pandas] (or pandas)``).

        Example:
            >>> import langtorch as lt
            >>> t = lt.TextTensor(["4", "5"], metadata={"score": [0.5, 1.0]})
            >>> t.to_pandas().columns.tolist()
            ['text', 'score']
        """
        pd = _pandas("to_pandas")
        df = pd.DataFrame.from_records(self.to_records(), columns=["text", *self.fields, *self.metadata])
        if self.ndim >= 2:
            df.index = pd.MultiIndex.from_product([range(n) for n in self.shape],
                                                  names=[f"dim{i}" for i in range(self.ndim)])
        return df

    @classmethod
    def from_pandas(cls, df: Any, *, text: str = "text", fields: Any = None,
                    template: bool = False) -> TextTensor:
        """A TextTensor from a ``pandas.DataFrame``: column ``text`` holds the entries, the
        others become metadata columns (``fields`` names columns that are record fields
        instead). A ``MultiIndex`` named ``dim0, dim1, ...`` that covers a full grid (as
        :meth:`to_pandas` writes it) restores the shape; otherwise the result is 1-d.

        Texts read from a table are data (never parsed as templates) unless ``template=True``.
        A missing value (``NaN``, ``pd.NA``, ``None``) in a str or mixed column becomes ``None``,
        as in merged metadata (see :func:`langtorch.where`); float columns keep ``NaN``.

        Raises:
            ImportError: pandas is not installed (``pip install langtorch-jax[pandas] (or pandas)``).
            KeyError: the ``text`` column (without ``fields``) or a ``fields`` column is missing.
            ValueError: two columns have the same name.
            TypeError: a text or field value is not a ``str`` (names the row).

        Example:
            >>> import langtorch as lt
            >>> t = lt.TextTensor(["4", "5"], metadata={"score": [0.5, 1.0]})
            >>> back = lt.TextTensor.from_pandas(t.to_pandas())
            >>> back.tolist(), back.metadata["score"].tolist()
            (['4', '5'], [0.5, 1.0])
        """
        import numpy as np

        pd = _pandas("from_pandas")
        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"from_pandas expected a pandas.DataFrame, got {type(df).__name__}")
        fields = list(fields or ())
        dup = df.columns[df.columns.duplicated()].tolist()
        if dup:
            raise ValueError(f"from_pandas: duplicated column names {dup}; rename them first")
        for col in fields or [text]:  # records are rebuilt from their fields: no text column needed
            if col not in df.columns:
                raise KeyError(f"from_pandas: no column {col!r}; the columns are {list(df.columns)}")
        shape: tuple[int, ...] = (len(df),)
        names = list(df.index.names)
        if isinstance(df.index, pd.MultiIndex) and names == [f"dim{i}" for i in range(len(names))]:
            grid = tuple(len(level) for level in df.index.levels)
            full = pd.MultiIndex.from_product([range(n) for n in grid])
            if int(np.prod(grid)) == len(df) and list(df.index) == list(full):
                shape = grid

        def texts_of(col: str) -> np.ndarray:
            values = df[col].tolist()
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:
                raise TypeError(f"from_pandas: column {col!r} row {bad} holds "
                                f"{type(values[bad]).__name__} ({values[bad]!r:.40}), not str")
            return np.array(values, dtype=_text.STRING_DTYPE).reshape(shape)

        if fields:
            out = cls({f: texts_of(f) for f in fields}, template=template)
        else:
            out = cls(texts_of(text), template=template)
        for col in df.columns:
            if col == text or col in fields:
                continue
            values = df[col].to_numpy()
            if values.dtype == object:
                missing = np.asarray(pd.isna(values), dtype=bool)
                if missing.any():  # NaN / pd.NA that pandas put in a str or mixed column: None
                    values = values.copy()
                    values[missing] = None
                elif all(isinstance(v, str) for v in values):
                    values = values.astype(_text.STRING_DTYPE)
            out.metadata[str(col)] = values.reshape(shape)
        return out


_text.register_pytree(TextTensor)


def _pandas(what: str) -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(f"TextTensor.{what} needs pandas, which is not installed: pip install langtorch-jax[pandas] (or pandas)") from None
    return pandas


def text(data: Any = "", **kwargs: Any) -> TextTensor:
    """A TextTensor whose entries are **data**: never parsed as templates, so braces stay literal.

    Use it for text that comes from outside your code — a model's answer you turned into a
    ``str``, a file, user input, a search result — before combining it with ``+``:
    ``lt.TextTensor(s)`` would make ``s`` a template whose ``{...}`` the next ``+`` fills. Same
    arguments as :class:`TextTensor` (``metadata``, ``embedding``); a TextTensor passed in keeps
    its metadata and provenance.

    Example:
        >>> import langtorch as lt
        >>> answer = "The {Prize} is awarded in October."
        >>> (lt.text(answer) + " (source: model)").item()
        'The {Prize} is awarded in October. (source: model)'
        >>> (lt.TextTensor(answer) + " (source: model)").item()  # a template: {Prize} is filled
        'The  (source: model) is awarded in October.'
    """
    if "template" in kwargs:
        raise TypeError("lt.text() always makes data; use lt.TextTensor(..., template=...) to choose")
    return TextTensor(data, template=False, **kwargs)


class TextParameter(TextTensor):
    """A trainable text held by a :class:`~langtorch.TModule` (the text analogue of
    ``nn.Parameter``): registered on assignment, listed by ``text_parameters()``, saved in
    ``state_dict()`` and restored by ``load_state_dict()``.

    Unlike a TextTensor it is mutable through ``.data`` (what a text optimizer updates). Ops on
    it return plain TextTensors. Its entries are templates, checked when made or set: a
    placeholder that does not parse (``{x.__class__}``, ``{q[0]}``, ``{q}`` beside an unescaped
    ``{``) raises :class:`~langtorch.errors.TemplateError` and leaves the parameter unchanged.

    Args:
        data: the initial text(s).
        requires_grad: whether optimizers may change it.

    Attributes:
        name: the attribute name it was first registered under in a ``TModule`` (``None``
            before; settable): how traces, optimizers and backward prompts call it.

    Example:
        >>> import langtorch as lt
        >>> p = lt.TextParameter("Answer briefly: {q}")
        >>> p.data = lt.TextTensor("Answer in one word: {q}")
        >>> (p + lt.TextTensor("why?")).item()
        'Answer in one word: why?'
    """

    __slots__ = ("requires_grad", "grad", "name")

    # Tells the provenance graph (langtorch.autograd, below this module) that instances are
    # parameters: leaves that feedback accumulates into.
    __text_parameter__ = True

    def __init__(self, data: Any = "", requires_grad: bool = True):
        if isinstance(data, TextParameter):
            data = data.data
        super().__init__(data, template=True)
        self._grad_fn = self._cut = None  # a parameter is a leaf
        self.requires_grad = bool(requires_grad)
        self.grad: TextTensor | None = None
        self.name: str | None = None

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
        out.name = None
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
        return (_rebuild_parameter, (self.data, self.requires_grad, self.grad, self.name))

    def _tree_flatten(self):
        children, aux = super()._tree_flatten()
        return children, (aux, self.requires_grad)

    @staticmethod
    def _tree_unflatten(aux, children):
        inner, requires_grad = aux
        out = _text.TextTensor._tree_unflatten(inner, children)
        out.requires_grad = requires_grad
        out.grad = None
        out.name = None
        return out


_text.register_pytree(TextParameter)


def _rebuild_parameter(data: Any, requires_grad: bool, grad: Any = None, name: Any = None) -> TextParameter:
    p = TextParameter(data, requires_grad)
    p.grad, p.name = grad, name
    return p
