"""TextTensor: an immutable n-d array of texts with numpy broadcasting.

Entries are stored in a numpy 2 ``StringDType`` array and all bulk work is done with vectorised
``np.strings`` ufuncs. A TextTensor optionally carries

* **fields** — keyed records: a mapping from field name to a text array of the tensor's shape,
  used to fill named placeholders (``TextTensor({"theme": [...], "style": "haiku"})``);
* **metadata** — per-entry, columnar: a mapping from key to an array of the tensor's shape
  (usage tokens, model, scores); it is mutable (``t.metadata["confidence"] = 0.65``) and every
  structural op (indexing, reshape, transpose, stack) carries it along;
* **embedding** — an array of shape ``shape + (d,)``, carried through indexing.

Whether entries are *templates* or *data* is tracked per tensor: texts a user writes are
templates; the result of a fill, of ``map`` or of a model call is data, which ``+`` only ever
concatenates, so model output is never parsed as a template. A tensor is checked when it is made
as a template, so a template tensor always parses: an unsafe field (``{x.__class__}``) or a
stray brace is refused at once, with the way to make the text data (``template=False``).

TextTensor is a JAX pytree whose only leaf is the embedding.

Example:
    >>> from langtorch.functional import TextTensor
    >>> prompt = TextTensor("Translate: {text}")
    >>> print(prompt + TextTensor("Hello, world!"))
    Translate: Hello, world!
    >>> grid = TextTensor([["A {}"], ["B {}"]]) + TextTensor(["x", "y", "z"])
    >>> grid.shape
    (2, 3)
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np
from numpy.dtypes import StringDType

from langtorch.functional.errors import ShapeError, TemplateError
from langtorch.functional.template import parse_template

__all__ = [
    "TextTensor", "Metadata", "MetadataColumn", "STRING_DTYPE", "as_text_array", "broadcast_shapes", "text_function",
]

STRING_DTYPE = StringDType()


# ----------------------------------------------------------------------- the dispatch protocol
def _handler_of(values: Any) -> Any:
    """The ``__text_function__`` handler of the first TextTensor (sub)class among ``values``
    (looking one level into lists, tuples and mappings), or ``None``."""
    for v in values:
        if isinstance(v, TextTensor):
            h = type(v).__text_function__
            if h is not None:
                return h
        elif isinstance(v, (list, tuple)):
            for w in v:
                if isinstance(w, TextTensor) and type(w).__text_function__ is not None:
                    return type(w).__text_function__
        elif isinstance(v, Mapping):
            for w in v.values():
                if isinstance(w, TextTensor) and type(w).__text_function__ is not None:
                    return type(w).__text_function__
    return None


def text_function(fn: Callable) -> Callable:
    """Make a TextTensor op observable by subclasses: the ``__text_function__`` protocol.

    Like numpy's ``__array_function__`` and torch's ``__torch_function__``: when an argument is
    an instance of a TextTensor subclass whose class defines ``__text_function__`` (a callable
    ``(op_name, impl, args, kwargs) -> result``), the op calls it instead of ``impl``; the
    handler runs ``impl(*args, **kwargs)`` itself and may annotate the result. The base class
    defines none, so the functional core stays pure: ``langtorch.TextTensor`` uses the hook to
    record the provenance graph and trace spans.

    Example:
        >>> class Logged(TextTensor):
        ...     __slots__ = ()
        ...     seen = []
        ...     @classmethod
        ...     def __text_function__(cls, name, impl, args, kwargs):
        ...         cls.seen.append(name)
        ...         return impl(*args, **kwargs)
        >>> _ = Logged(["a", "b"]).reshape(2, 1)
        >>> Logged.seen
        ['reshape']
    """
    name = fn.__name__.strip("_")

    @functools.wraps(fn)
    def dispatching(*args: Any, **kwargs: Any) -> Any:
        handler = _handler_of(args) if args else None
        if handler is None and kwargs:
            handler = _handler_of(kwargs.values())
        if handler is None:
            return fn(*args, **kwargs)
        return handler(name, fn, args, kwargs)

    dispatching.__text_impl__ = fn
    return dispatching


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast of shapes, raising :class:`ShapeError` that names every shape.

    Example:
        >>> broadcast_shapes((3, 1), (4,))
        (3, 4)
    """
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise ShapeError(
            f"cannot broadcast shapes {listed}: dimensions must be equal or 1 (numpy rules); "
            "reshape or unsqueeze one operand, e.g. templates of shape [P, 1] against inputs [N]"
        ) from None


def _bad_entry(obj: np.ndarray, ok: np.ndarray) -> Exception:
    index = tuple(int(i) for i in np.argwhere(~ok)[0])
    value = obj[index]
    if isinstance(value, (list, tuple)):
        return ShapeError(
            f"nested lists must be rectangular to form a TextTensor; the entry at index {index} "
            f"is a list of length {len(value)} where a text was expected. Pad the short rows "
            "or keep them as separate tensors"
        )
    return TypeError(
        f"TextTensor entries must be str; entry at index {index} is "
        f"{type(value).__name__} ({value!r:.60}). Convert it with str() first, or keep "
        "non-text values in metadata."
    )


def as_text_array(x: Any) -> np.ndarray:
    """Convert str / nested lists of str / a numpy string or object array to a StringDType array.

    Raises:
        TypeError: an entry is not a ``str`` (the message names its index and type).
        ShapeError: nested lists are ragged.

    Example:
        >>> as_text_array([["a", "b"], ["c", "d"]]).shape
        (2, 2)
    """
    if isinstance(x, str):
        return np.array(x, dtype=STRING_DTYPE)
    if isinstance(x, np.ndarray):
        if x.dtype == STRING_DTYPE:
            # A writable array could be changed behind the immutable tensor's back: copy it.
            return x.copy() if x.flags.writeable or x.base is not None else x
        if x.dtype.kind in "UT":
            return x.astype(STRING_DTYPE)
        if x.dtype != object:
            raise TypeError(
                f"TextTensor entries must be str; got a numpy array of dtype {x.dtype}. "
                "Convert with arr.astype(str) if you mean their decimal text."
            )
        obj = x
    else:
        if isinstance(x, (list, tuple)) and all(type(v) is str for v in x):
            return np.array(x, dtype=STRING_DTYPE).reshape(len(x))  # fast path: flat list of str
        try:
            obj = np.array(x, dtype=object)
        except ValueError as e:
            raise ShapeError(
                f"nested lists must be rectangular to form a TextTensor ({e}); pad the short "
                "rows or keep them as separate tensors"
            ) from None
        if obj.ndim == 0 and not isinstance(obj[()], str):
            v = obj[()]
            raise TypeError(
                f"TextTensor entries must be str; got {type(v).__name__} ({v!r:.60}). "
                "Convert it with str() first."
            )
    if obj.size:
        ok = np.frompyfunc(lambda v: isinstance(v, str), 1, 1)(obj).astype(bool)
        if not ok.all():
            raise _bad_entry(obj, ok)
    return obj.astype(STRING_DTYPE)


# ------------------------------------------------------------------------ template validation
# A placeholder, or an attempt at one, once the {{ }} escapes are removed: "{}", "{name}", "{0}",
# a name followed by attribute access, indexing or a conversion ("{x.", "{x[", "{x!"), or a
# whole field with a format spec ("{x:>10}", "{amount:.2f}"; not "{a: 1}", literal text).
_FIELD_ATTEMPT = re.compile(r"\{(?:\}|\w+[}.\[!]|\w+:[^\s{}\"']*\})")


def _refused(text: str) -> TemplateError | None:
    """Why ``text`` cannot be a template (the parser's error), or ``None`` when it can be.

    A text that parses is a template. A text that does not parse is refused when it has a
    placeholder or an attempt at one — an unsafe field (``{x.__class__}``, ``{x[0]}``,
    ``{x!r}``), a format spec (``{x:>10}``), or a ``{name}`` beside an unescaped literal
    brace. A text whose braces are all literal (``'{"city": "Oslo"}'``, ``{a: 1}``, a lone
    ``{``) has no placeholder: it is kept as written (``+`` on it explains the braces when it
    is used as a template).
    """
    try:
        parse_template(text)
    except TemplateError as e:
        if _FIELD_ATTEMPT.search(text.replace("{{", "").replace("}}", "")):
            return e
    return None


def _first_refused(texts: np.ndarray | list[str]) -> tuple[int, TemplateError] | None:
    """The first entry (flat, row-major position) of ``texts`` (an array, or its entries as a
    flat list) refused as a template, with the parser's error; ``None`` when there is none. Only
    entries with a ``{`` are parsed (a C-level ``in`` per entry, faster than ``np.strings.find``
    on StringDType), and parsing is cached per distinct text."""
    flat = texts if isinstance(texts, list) else texts.reshape(-1).tolist()
    for i, text in enumerate(flat):
        if "{" in text:
            e = _refused(text)
            if e is not None:
                return i, e
    return None


def _template_ok(texts: np.ndarray) -> bool:
    """Whether ``texts`` may be a template tensor (an op's result built from templates stays a
    template only then; otherwise it is data, never parsed)."""
    return _first_refused(texts) is None


def _not_a_template(shape: tuple[int, ...], flat_pos: int, e: TemplateError) -> TemplateError:
    index = tuple(int(i) for i in np.unravel_index(flat_pos, shape)) if shape else ()
    which = f"entry {index} of this TextTensor" if shape else "this TextTensor"
    return TemplateError(
        f"{which} is made as a template and has a placeholder, but does not parse: {e}\n"
        "Text given to TextTensor(...) is a template: {name}, {} and {0} are placeholders that "
        "+ and * fill, and nothing else is (no attribute access, indexing, conversions or "
        "format specs such as {x:.2f}: templates may come from users; format the value "
        "before it fills the template). If other braces are literal text (JSON, code), double "
        "them ({{ and }}) to keep the placeholders; if the whole text is data (a model's "
        "answer, user input, a file), make it with lt.text(...) or TextTensor(..., "
        "template=False): data is never parsed and keeps its braces as written.",
        template=e.template, position=e.position, index=index,
    )


def _frozen(arr: np.ndarray) -> np.ndarray:
    """A read-only view: columns shared between tensors must not be changed in place (assign a
    whole new column instead)."""
    if isinstance(arr, np.ndarray) and arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def _object_column(value: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """Per-entry Python objects given as nested lists of exactly ``shape`` (e.g. message lists)."""
    out = np.empty(shape, dtype=object)

    def fill(v, idx, depth):
        if depth == len(shape):
            out[idx] = v
            return True
        if not isinstance(v, (list, tuple)) or len(v) != shape[depth]:
            return False
        return all(fill(item, idx + (i,), depth + 1) for i, item in enumerate(v))

    return out if fill(value, (), 0) else None


class MetadataColumn(np.ndarray):
    """A metadata column read from a batch: a numpy array whose truth value is refused.

    ``t.metadata[key]`` on a tensor with dimensions returns the column as this ndarray subclass
    (a view: no copy); everything numpy and torch do with arrays works as before, reductions
    give numpy scalars, and ``np.asarray(col)`` is a plain ndarray. Only ``bool()`` differs when
    the column holds more than one value: ``if t.metadata["confidence"] >= 0.7:`` on a batch asks
    one question of many entries, so it raises :class:`~langtorch.functional.errors.ShapeError`
    (a ``ValueError``, as numpy's own error is) naming the ways to branch per entry —
    ``lt.where``, ``masked_scatter``, or a loop over the entries — instead of numpy's "truth
    value of an array is ambiguous". A column of one value answers ``bool()`` as numpy does.

    Example:
        >>> from langtorch.functional import TextTensor
        >>> t = TextTensor(["a", "b"], metadata={"confidence": [0.9, 0.2]})
        >>> low = t.metadata["confidence"] < 0.7
        >>> low.tolist(), bool(low.any())
        ([False, True], True)
        >>> if low:
        ...     pass
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.ShapeError: the truth value of metadata['confidence'] ...
    """

    # The metadata key the column was read under, carried through ufuncs for the message.
    _key: str | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self._key = getattr(obj, "_key", None)

    def __array_wrap__(self, arr: np.ndarray, context: Any = None, return_scalar: bool = False) -> Any:
        if return_scalar:  # a full reduction: a numpy scalar, as for a plain ndarray
            return arr[()]
        out = super().__array_wrap__(arr, context, return_scalar)
        if isinstance(out, MetadataColumn):
            out._key = self._key
        return out

    def __bool__(self) -> bool:
        if self.size == 1:
            return bool(self.reshape(-1)[0])
        name = f"metadata[{self._key!r}]" if self._key is not None else "a metadata column"
        raise ShapeError(
            f"the truth value of {name} (or of a comparison of it) is ambiguous on a batch: it "
            f"holds {self.size} values (shape {self.shape}), one per entry, and `if` needs one. "
            "Branch per entry instead:\n"
            "  * lt.where(cond, a, b): a where cond is True, b elsewhere (both computed), e.g. "
            "lt.where(t.metadata['confidence'] >= 0.7, answer, fallback);\n"
            "  * t.masked_scatter(mask, branch(t[mask])): run a branch only on the selected "
            "entries and put the results back;\n"
            "  * or iterate: for entry in t: if entry.metadata[key] >= 0.7: ... (one entry at "
            "a time, as the single-question example does).\n"
            "To ask about the whole batch, use .any() or .all()."
        )


class Metadata(MutableMapping):
    """Per-entry metadata of a TextTensor: key -> array with the tensor's shape (columnar).

    A scalar (or any broadcastable array) assigned is broadcast to the tensor's shape. On a 0-d
    tensor, reading a key returns the single value itself, so ``t.metadata["confidence"] >= 0.7``
    and ``f"{t.metadata['confidence']:.2f}"`` work as written. On a batch it returns the column
    as a :class:`MetadataColumn` (a numpy array), whose ``bool()`` refuses to pick one answer
    for many entries and names ``lt.where`` / ``masked_scatter`` instead.

    Example:
        >>> from langtorch.functional import TextTensor
        >>> t = TextTensor(["a", "b"])
        >>> t.metadata["score"] = [0.5, 0.9]
        >>> t[1].metadata["score"]
        0.9
    """

    __slots__ = ("_shape", "_cols")

    def __init__(self, shape: tuple[int, ...], columns: Mapping[str, Any] | None = None):
        self._shape = tuple(shape)
        self._cols: dict[str, np.ndarray] = {}
        for k, v in (columns or {}).items():
            self[k] = v

    @classmethod
    def _trusted(cls, shape: tuple[int, ...], cols: dict[str, np.ndarray]) -> Metadata:
        m = cls.__new__(cls)
        m._shape = tuple(shape)
        m._cols = cols
        return m

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape every column has (the tensor's shape).

        Example:
            >>> Metadata((2, 3)).shape
            (2, 3)
        """
        return self._shape

    def _column(self, value: Any) -> np.ndarray:
        if self._shape == () and not isinstance(value, np.ndarray):
            arr = np.asarray(value) if isinstance(value, (int, float, bool, np.generic)) else None
            if arr is None or arr.dtype == object:
                arr = np.empty((), dtype=object)
                arr[()] = value
            return arr
        try:
            arr = np.asarray(value)
        except ValueError:  # ragged nested lists: per-entry Python objects
            arr = None
        if arr is not None:
            if arr.dtype.kind == "U":
                arr = arr.astype(STRING_DTYPE)
            try:
                # Always a copy: metadata owns its columns.
                return np.array(np.broadcast_to(arr, self._shape))
            except ValueError:
                pass
        objects = _object_column(value, self._shape)
        if objects is not None:
            return objects
        got = arr.shape if arr is not None else "ragged nested lists"
        raise ShapeError(
            f"metadata value of shape {got} cannot be broadcast to the tensor's shape "
            f"{self._shape}; give one value per entry (nested lists of the tensor's shape) or a "
            "single value for all"
        )

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"metadata keys must be str, got {type(key).__name__}")
        self._cols[key] = self._column(value)

    def __getitem__(self, key: str) -> Any:
        col = self._cols[key]
        if col.ndim:
            # A view whose bool() explains batch branching (see MetadataColumn); no copy.
            view = col.view(MetadataColumn)
            view._key = key
            return view
        return col[()] if col.dtype == object else col.item()

    def column(self, key: str) -> np.ndarray:
        """The raw column array (always of the tensor's shape, also on 0-d tensors).

        Example:
            >>> from langtorch.functional import TextTensor
            >>> t = TextTensor("x"); t.metadata["n"] = 3
            >>> t.metadata.column("n").shape
            ()
        """
        return self._cols[key]

    def with_column(self, key: str, values: np.ndarray) -> Metadata:
        """A new Metadata with this one's columns (shared, not copied) plus ``key`` = ``values``.

        ``values`` must already have the metadata's shape; it is used as is (no copy), so this
        is cheap for a tensor with many or large columns. The original is not changed.

        Raises:
            ShapeError: ``values`` does not have the metadata's shape.

        Example:
            >>> import numpy as np
            >>> m = Metadata((2,), {"a": [1, 2]})
            >>> m2 = m.with_column("b", np.array([3, 4]))
            >>> sorted(m), sorted(m2), m2.column("a") is m.column("a")
            (['a'], ['a', 'b'], True)
        """
        if not isinstance(key, str):
            raise TypeError(f"metadata keys must be str, got {type(key).__name__}")
        values = np.asarray(values)
        if values.shape != self._shape:
            raise ShapeError(f"with_column({key!r}): values of shape {values.shape} do not have the "
                             f"metadata's shape {self._shape}; broadcast them first")
        return Metadata._trusted(self._shape, {**self._cols, key: values})

    def __delitem__(self, key: str) -> None:
        del self._cols[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def __len__(self) -> int:
        return len(self._cols)

    def __repr__(self) -> str:
        return repr({k: ((v.tolist() if v.dtype != object else v) if v.ndim else self[k])
                     for k, v in self._cols.items()})

    def _map(self, fn: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...]) -> Metadata:
        return Metadata._trusted(shape, {k: _frozen(fn(v)) for k, v in self._cols.items()})

    def _snapshot(self) -> Metadata:
        """An independent copy (new mapping, copied columns) for the static part of a pytree."""
        return Metadata._trusted(self._shape, {k: _frozen(v.copy()) for k, v in self._cols.items()})

    def copy(self) -> Metadata:
        """An independent copy (new mapping, copied columns).

        Example:
            >>> m = Metadata((), {"a": 1}); m2 = m.copy(); m2["b"] = 2
            >>> sorted(m), sorted(m2)
            (['a'], ['a', 'b'])
        """
        return Metadata._trusted(self._shape, {k: v.copy() for k, v in self._cols.items()})


def _expand_index(index: Any, ndim: int) -> tuple:
    """Normalise an index to a tuple without Ellipsis (so trailing embedding dims stay whole).

    Torch / JAX index tensors (e.g. top-k results) are converted to numpy without importing torch.
    """
    if not isinstance(index, tuple):
        index = (index,)
    items = []
    for it in index:
        if hasattr(it, "detach") and hasattr(it, "cpu"):  # a torch tensor, possibly on a device
            it = it.detach().cpu().numpy()
        elif hasattr(it, "__jax_array__") or type(it).__module__.startswith("jax"):
            it = np.asarray(it)
        elif isinstance(it, list):
            it = np.asarray(it) if it else np.asarray(it, dtype=np.intp)
        if isinstance(it, TextTensor):
            raise TypeError("a TextTensor cannot index a TextTensor; use a bool or int array")
        items.append(it)
    consumed = 0
    for it in items:
        if it is None or it is Ellipsis:
            continue
        consumed += it.ndim if isinstance(it, np.ndarray) and it.dtype == bool else 1
    if consumed > ndim:
        raise IndexError(f"too many indices for a TextTensor of {ndim} dimensions")
    out = []
    seen_ellipsis = False
    for it in items:
        if it is Ellipsis:
            if seen_ellipsis:
                raise IndexError("an index can only have a single ellipsis ('...')")
            seen_ellipsis = True
            out.extend([slice(None)] * (ndim - consumed))
        else:
            out.append(it)
    if not seen_ellipsis:
        out.extend([slice(None)] * (ndim - consumed))
    return tuple(out)


class _Aux:
    """Static (non-leaf) part of a TextTensor pytree; hashable so it can cross ``jax.jit``."""

    __slots__ = ("cls", "texts", "fields", "metadata", "template", "has_embedding")

    def __init__(self, cls, texts, fields, metadata, template, has_embedding):
        self.cls, self.texts, self.fields = cls, texts, fields
        self.metadata, self.template, self.has_embedding = metadata, template, has_embedding

    def _key(self):
        return (self.cls, self.texts.shape, self.template, self.has_embedding,
                tuple(self.fields or ()), tuple(self.metadata))

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Aux) or self._key() != other._key():
            return False
        if self.texts is not other.texts and not np.array_equal(self.texts, other.texts):
            return False
        for k in self.fields or ():
            if not np.array_equal(self.fields[k], other.fields[k]):
                return False
        for k in self.metadata:
            a, b = self.metadata.column(k), other.metadata.column(k)
            if a is not b:
                try:
                    if not bool(np.all(a == b)):
                        return False
                except Exception:  # incomparable objects: treat as different (retrace)
                    return False
        return True


class TextTensor:
    """An immutable n-d array of texts with numpy broadcasting, templates, metadata, embeddings.

    Args:
        data: a ``str``; nested lists of ``str``; a numpy string array; another TextTensor; a
            ``dict`` of field name -> text(s) (keyed records, values broadcast together); or a
            list of dicts with the same keys (one record per entry).
        metadata: optional mapping key -> value(s) broadcastable to the tensor's shape.
        embedding: optional array of shape ``shape + (d,)``.
        template: whether the entries are templates (default) or data. ``+`` fills a template's
            placeholders but only concatenates data; outputs of fills and model calls are data.
            A template is checked when it is made: an entry with a placeholder that does not
            parse is refused (below). Text whose braces are literal and that has no
            placeholder (JSON) is kept as written; data that may hold placeholder-like braces
            is made with ``template=False`` (``lt.text(...)``). Keyed records whose rendering
            would be refused are data (their fields are values, never parsed).

    Raises:
        TemplateError: an entry made as a template has an unsafe field (``{x.__class__}``,
            ``{x[0]}``, ``{x!r}``) or a placeholder beside an unescaped literal brace (the
            message names the entry and the ways out: ``{{``/``}}`` or ``lt.text(...)``).
        TypeError: an entry is not a ``str`` (the message names its index and type).
        ShapeError: ragged nested lists, records of mismatched shapes, or an embedding whose
            shape does not start with the tensor's shape.

    Example:
        >>> t = TextTensor([["a", "b"], ["c", "d"]])
        >>> t.shape, t.ndim, len(t)
        ((2, 2), 2, 2)
        >>> t.T.tolist()
        [['a', 'c'], ['b', 'd']]
        >>> r = TextTensor({"theme": ["spring", "autumn"], "form": "haiku"})
        >>> (TextTensor("a {form} about {theme}") * r).tolist()
        ['a haiku about spring', 'a haiku about autumn']
    """

    __slots__ = (
        "_texts", "_fields", "_metadata", "_embedding", "_template", "_pylist", "_grad_fn", "_cut",
        "__weakref__",
    )
    # Let TextTensor win mixed operations with numpy arrays (np_array + t calls t.__radd__).
    __array_ufunc__ = None
    # The dispatch protocol (see :func:`text_function`): none in the pure core.
    __text_function__ = None

    def __init__(
        self,
        data: Any = "",
        *,
        metadata: Mapping[str, Any] | None = None,
        embedding: Any = None,
        template: bool | None = None,
    ):
        fields = None
        src_meta = None
        src_embedding = None
        is_template = True
        # How the entries are checked as templates when the tensor is one: "raise" for text given
        # as a template (explicitly, or as plain text); "infer" for records whose template flag is
        # inferred (their fields are values: a rendering that does not parse makes data); None
        # for entries of a template tensor (valid already).
        check: str | None = "raise"
        self._pylist = None
        # Provenance slots, filled by subclasses that record a graph (langtorch.TextTensor).
        self._grad_fn = None
        self._cut = None
        if isinstance(data, TextTensor):
            self._pylist = data._pylist
            texts, fields = data._texts, data._fields
            src_meta, src_embedding, is_template = data._metadata, data._embedding, data._template
            check = None if data._template else "raise"
        elif isinstance(data, Mapping):
            texts, fields = _records_from_dict(data)
            # Records are templates only if every value is (model output stays data).
            is_template = all(v._template for v in data.values() if isinstance(v, TextTensor))
            check = "infer"
        elif isinstance(data, (list, tuple)) and data and all(isinstance(d, Mapping) for d in data):
            texts, fields = _records_from_list(data)
            check = "infer"
        elif isinstance(data, (list, tuple)) and data and all(isinstance(d, TextTensor) for d in data):
            from langtorch.functional.textops import stack

            stacked = stack(list(data))
            texts, fields = stacked._texts, stacked._fields
            src_meta, src_embedding = stacked._metadata, stacked._embedding
            is_template = stacked._template
            check = None if stacked._template else "raise"
        elif isinstance(data, list) and all(type(v) is str for v in data):
            texts = np.array(data, dtype=STRING_DTYPE).reshape(len(data))
            # Keep the validated Python strings: join/tolist/requests reuse them.
            self._pylist = list(data)
        else:
            texts = as_text_array(data)
        if texts.flags.writeable:
            texts = texts.view()
            texts.flags.writeable = False
        self._texts = texts
        self._fields = fields
        self._template = is_template if template is None else bool(template)
        if self._template and check is not None:
            # A template is checked when it is made, wherever it goes next (a fill, an LLM call,
            # a parameter), so an unsafe field such as {x.__class__} never gets that far.
            bad = _first_refused(self._pylist if self._pylist is not None else texts)
            if bad is not None:
                if check == "infer" and template is None:
                    self._template = False
                else:
                    raise _not_a_template(texts.shape, *bad)
        self._metadata = src_meta.copy() if src_meta is not None else Metadata(texts.shape)
        for k, v in (metadata or {}).items():
            self._metadata[k] = v
        self._embedding = None
        emb = embedding if embedding is not None else src_embedding
        if emb is not None:
            self._embedding = self._check_embedding(emb)

    # ----------------------------------------------------------------- construction internals
    @classmethod
    def from_arrays(cls, texts: np.ndarray, *, fields: Any = None, metadata: Any = None,
                    embedding: Any = None, template: bool = False):
        """Build from arrays that are already consistent, without re-validating them: for library
        code that moves entries it took from TextTensors (``texts`` a string array, ``fields`` the
        record field names or None, ``metadata`` a :class:`Metadata` of the same shape).

        Example:
            >>> import numpy as np
            >>> TextTensor.from_arrays(np.array(["a", "b"], dtype=STRING_DTYPE)).shape
            (2,)
        """
        return cls._wrap(np.asarray(texts, dtype=STRING_DTYPE), fields, metadata, embedding, template)

    @classmethod
    def _wrap(cls, texts, fields=None, metadata=None, embedding=None, template=False):
        """Build without validation (internal: inputs are already consistent)."""
        out = object.__new__(cls)
        if texts.flags.writeable:
            texts = texts.view()
            texts.flags.writeable = False
        out._texts = texts
        out._fields = fields
        out._metadata = metadata if metadata is not None else Metadata._trusted(texts.shape, {})
        out._embedding = embedding
        out._template = template
        out._pylist = None
        out._grad_fn = None
        out._cut = None
        return out

    def _flat_list(self) -> list[str]:
        """All entries as a flat Python list (row-major), computed once and memoised."""
        if self._pylist is None:
            self._pylist = self._texts.reshape(-1).tolist()
        return self._pylist

    @classmethod
    def _result_class(cls) -> type:
        """The class that ops on this class return (TextParameter returns a plain tensor)."""
        return cls

    def _like(self, texts, fields=None, metadata=None, embedding=None, template=None):
        return self._result_class()._wrap(
            texts, fields, metadata, embedding, self._template if template is None else template
        )

    def _check_embedding(self, emb: Any) -> Any:
        shape = tuple(getattr(emb, "shape", ()))
        if shape[:-1] != self.shape or len(shape) != self.ndim + 1:
            raise ShapeError(
                f"an embedding must have shape tensor.shape + (d,) = {self.shape} + (d,); got "
                f"{shape}"
            )
        return emb

    # ------------------------------------------------------------------------------ properties
    @property
    def texts(self) -> np.ndarray:
        """The entries as a read-only numpy ``StringDType`` array (records: their rendering).

        Example:
            >>> TextTensor(["a", "b"]).texts.dtype
            StringDType()
        """
        return self._texts

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape, a tuple of ints.

        Example:
            >>> TextTensor("x").shape
            ()
        """
        return self._texts.shape

    @property
    def ndim(self) -> int:
        """The number of dimensions.

        Example:
            >>> TextTensor([["a"]]).ndim
            2
        """
        return self._texts.ndim

    @property
    def size(self) -> int:
        """The number of entries.

        Example:
            >>> TextTensor([["a", "b"], ["c", "d"]]).size
            4
        """
        return self._texts.size

    @property
    def fields(self) -> tuple[str, ...]:
        """The record field names (empty for plain texts).

        Example:
            >>> TextTensor({"q": "why?", "lang": "en"}).fields
            ('q', 'lang')
        """
        return tuple(self._fields) if self._fields else ()

    @property
    def is_template(self) -> bool:
        """Whether ``+`` treats the entries as templates (True) or as data (False).

        Example:
            >>> t = TextTensor("{x}") + TextTensor("1")
            >>> t.is_template
            False
        """
        return self._template

    @property
    def metadata(self) -> Metadata:
        """Per-entry metadata (mutable, columnar); see :class:`Metadata`.

        Example:
            >>> t = TextTensor("answer"); t.metadata["confidence"] = 0.65
            >>> t.metadata.get("confidence", 0.0)
            0.65
        """
        return self._metadata

    @property
    def embedding(self) -> Any:
        """The attached embedding (``shape + (d,)``) or ``None``.

        Example:
            >>> import numpy as np
            >>> TextTensor(["a", "b"], embedding=np.zeros((2, 4))).embedding.shape
            (2, 4)
        """
        return self._embedding

    @text_function
    def with_embedding(self, embedding: Any) -> TextTensor:
        """A new tensor with the same texts and metadata and the given embedding.

        Example:
            >>> import numpy as np
            >>> TextTensor("a").with_embedding(np.ones(3)).embedding.shape
            (3,)
        """
        out = self._like(self._texts, self._fields, self._metadata.copy(), None, self._template)
        out._embedding = out._check_embedding(embedding) if embedding is not None else None
        return out

    @text_function
    def with_metadata(self, **columns: Any) -> TextTensor:
        """A new tensor with extra (or replaced) metadata columns.

        Example:
            >>> TextTensor(["a", "b"]).with_metadata(model="m").metadata["model"].tolist()
            ['m', 'm']
        """
        meta = self._metadata.copy()
        for k, v in columns.items():
            meta[k] = v
        return self._like(self._texts, self._fields, meta, self._embedding, self._template)

    @text_function
    def embed(self, model: Callable[[list[str]], Any]) -> TextTensor:
        """Embed every entry with ``model`` (texts list -> ``[N, d]`` array) and attach it.

        ``langtorch.TextTensor.embed()`` also works without a model (the local default).

        Example:
            >>> import numpy as np
            >>> def count_model(texts):
            ...     return np.array([[len(t), t.count(" ")] for t in texts], dtype=np.float32)
            >>> TextTensor([["a b", "c"]]).embed(count_model).embedding.tolist()
            [[[3.0, 1.0], [1.0, 0.0]]]
        """
        if not callable(model):
            raise TypeError(f"embed(model) needs a callable texts -> [N, d] array, got {model!r}")
        flat = self._flat_list()
        vecs = model(flat)
        n = getattr(vecs, "shape", (None,))[0]
        if n != len(flat) or len(vecs.shape) != 2:
            raise ShapeError(
                f"the embedding model must return an array of shape [{len(flat)}, d] for "
                f"{len(flat)} texts; got {getattr(vecs, 'shape', type(vecs).__name__)}"
            )
        return self.with_embedding(vecs.reshape(self.shape + (vecs.shape[-1],)))

    # --------------------------------------------------------------------- conversion / repr
    def tolist(self) -> Any:
        """Nested Python lists of ``str`` (a ``str`` for a 0-d tensor).

        Example:
            >>> TextTensor([["a", "b"]]).tolist()
            [['a', 'b']]
        """
        if self.ndim == 1:
            return list(self._flat_list())
        return self._texts.tolist()

    def item(self) -> str:
        """The text of a one-entry tensor.

        Raises:
            ValueError: the tensor has more than one entry.

        Example:
            >>> TextTensor([["only"]]).item()
            'only'
        """
        if self.size != 1:
            raise ValueError(
                f"item() needs a tensor with one entry; this one has shape {self.shape} "
                f"({self.size} entries). Index it first, e.g. t[0].item()"
            )
        return str(self._texts.reshape(-1)[0])

    def __str__(self) -> str:
        if self.ndim == 0:
            return str(self._texts[()])
        return self.__repr__()

    def __repr__(self) -> str:
        name = type(self).__name__
        if self.ndim == 0:
            body = repr(str(self._texts[()]))
        else:
            body = np.array2string(
                self._texts, separator=", ", threshold=50, edgeitems=3,
                prefix=name + "(", formatter={"all": lambda s: repr(str(s))},
            )
        extras = []
        if self._fields:
            extras.append(f"fields={list(self._fields)}")
        if len(self._metadata):
            extras.append(f"metadata={list(self._metadata)}")
        if self._embedding is not None:
            extras.append(f"embedding=[{self._embedding.shape[-1]}]")
        return f"{name}({body}{', ' if extras else ''}{', '.join(extras)})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __array__(self, dtype=None, copy=None):
        arr = np.array(self._texts, copy=True)
        return arr if dtype is None else arr.astype(dtype)

    # ------------------------------------------------------------------- structure: indexing
    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d TextTensor; it holds a single text (use str(t))")
        return self.shape[0]

    def __iter__(self) -> Iterator[TextTensor]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d TextTensor; use str(t) for its text")
        for i in range(self.shape[0]):
            yield self[i]

    @text_function
    def __getitem__(self, index: Any) -> TextTensor:
        if isinstance(index, str):
            if not self._fields or index not in self._fields:
                raise KeyError(
                    f"no record field {index!r}; this tensor's fields are {list(self.fields)}"
                )
            return self._like(self._fields[index], None, self._metadata.copy(), None)
        # A trailing Ellipsis makes numpy return 0-d arrays (not scalars) for all-int indices.
        idx = _expand_index(index, self.ndim) + (Ellipsis,)
        try:
            texts = self._texts[idx]
        except IndexError as e:
            raise IndexError(f"{e} (TextTensor of shape {self.shape})") from None
        return self._apply_structural(lambda a: a[idx], texts.shape, texts=texts)

    def _apply_structural(self, fn, shape, *, texts=None, emb_fn=None):
        """Apply the same leading-dims transform to texts, fields, metadata and embedding."""
        texts = fn(self._texts) if texts is None else texts
        fields = {k: fn(v) for k, v in self._fields.items()} if self._fields else None
        meta = self._metadata._map(fn, shape)
        emb = self._embedding
        if emb is not None:
            emb = emb_fn(emb) if emb_fn is not None else fn(emb)
        return self._like(texts, fields, meta, emb)

    @text_function
    def reshape(self, *shape: int | tuple[int, ...]) -> TextTensor:
        """Reshape (numpy rules, ``-1`` allowed); metadata and embedding follow.

        Example:
            >>> TextTensor(["a", "b", "c", "d"]).reshape(2, -1).shape
            (2, 2)
        """
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        try:
            texts = self._texts.reshape(shape)
        except ValueError:
            raise ShapeError(
                f"cannot reshape a TextTensor of shape {self.shape} ({self.size} entries) into "
                f"shape {tuple(shape)}"
            ) from None
        new = texts.shape
        return self._apply_structural(
            lambda a: a.reshape(new), new, texts=texts,
            emb_fn=lambda e: e.reshape(new + (e.shape[-1],)),
        )

    def flatten(self) -> TextTensor:
        """A 1-d view of all entries (row-major).

        Example:
            >>> TextTensor([["a", "b"], ["c", "d"]]).flatten().tolist()
            ['a', 'b', 'c', 'd']
        """
        return self.reshape(-1)

    @text_function
    def transpose(self, *axes: int) -> TextTensor:
        """Permute dimensions (reverse them when no axes are given).

        Example:
            >>> TextTensor([["a", "b"]]).transpose().shape
            (2, 1)
        """
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        perm = tuple(range(self.ndim))[::-1] if not axes else tuple(operator.index(a) for a in axes)
        nd = self.ndim
        if len(perm) != nd or sorted(a % nd for a in perm) != list(range(nd)):
            raise ShapeError(f"axes {perm} are not a permutation of the {nd} dimensions")
        perm = tuple(a % nd for a in perm)
        texts = self._texts.transpose(perm)
        return self._apply_structural(
            lambda a: a.transpose(perm), texts.shape, texts=texts,
            emb_fn=lambda e: e.transpose(perm + (nd,)),
        )

    @property
    def T(self) -> TextTensor:
        """The transpose (all dimensions reversed).

        Example:
            >>> TextTensor([["a"], ["b"]]).T.tolist()
            [['a', 'b']]
        """
        return self.transpose()

    @text_function
    def squeeze(self, axis: int | tuple[int, ...] | None = None) -> TextTensor:
        """Remove size-1 dimensions (all, or the given ones).

        Example:
            >>> TextTensor([["a"], ["b"]]).squeeze().shape
            (2,)
        """
        try:
            texts = self._texts.squeeze(axis)
        except ValueError:
            raise ShapeError(
                f"cannot squeeze axis {axis} of shape {self.shape}: its size is not 1"
            ) from None
        new = texts.shape
        return self._apply_structural(
            lambda a: a.reshape(new), new, texts=texts,
            emb_fn=lambda e: e.reshape(new + (e.shape[-1],)),
        )

    @text_function
    def unsqueeze(self, dim: int) -> TextTensor:
        """Insert a size-1 dimension at ``dim`` (torch semantics; negative counts from the end).

        Example:
            >>> TextTensor(["a", "b"]).unsqueeze(-1).shape
            (2, 1)
        """
        nd = self.ndim + 1
        if not -nd <= dim < nd:
            raise IndexError(f"unsqueeze dim {dim} out of range for a result of {nd} dimensions")
        dim = dim % nd
        new = self.shape[:dim] + (1,) + self.shape[dim:]
        return self._apply_structural(
            lambda a: a.reshape(new), new, emb_fn=lambda e: e.reshape(new + (e.shape[-1],))
        )

    @text_function
    def detach(self) -> TextTensor:
        """A new tensor with the same texts, a copy of the metadata mapping, and the embedding
        cut from any JAX/torch autograd trace.

        Example:
            >>> t = TextTensor("a"); d = t.detach(); d.metadata["k"] = 1
            >>> "k" in t.metadata
            False
        """
        emb = self._embedding
        if emb is not None:
            if hasattr(emb, "detach"):
                emb = emb.detach()
            elif not isinstance(emb, np.ndarray):
                import jax

                emb = jax.lax.stop_gradient(emb)
        return self._like(self._texts, self._fields, self._metadata.copy(), emb)

    # ------------------------------------------------------------------------ text operations
    @text_function
    def map(self, fn: Callable[[str], str]) -> TextTensor:
        """Apply a Python function ``str -> str`` to every entry; the result is data.

        Raises:
            TypeError: ``fn`` returned something other than ``str`` (names the entry index).

        Example:
            >>> TextTensor(["a", "b"]).map(str.upper).tolist()
            ['A', 'B']
        """
        out = [fn(s) for s in self._flat_list()]
        for i, v in enumerate(out):
            if not isinstance(v, str):
                idx = tuple(int(j) for j in np.unravel_index(i, self.shape)) if self.ndim else ()
                raise TypeError(
                    f"map(fn) must return str; it returned {type(v).__name__} for the entry at "
                    f"index {idx}"
                )
        texts = np.array(out, dtype=STRING_DTYPE).reshape(self.shape)
        result = self._like(texts, None, self._metadata.copy(), None, template=False)
        result._pylist = out
        return result

    def format(self, *args: Any, **kwargs: Any) -> TextTensor:
        """Fill placeholders like ``str.format``, safely: ``{}``/``{0}`` from ``args``, ``{name}``
        from ``kwargs``; values may be texts or TextTensors (broadcast). Extra values are ignored.

        Example:
            >>> TextTensor("{greet}, {}!").format("world", greet="Hello").item()
            'Hello, world!'
        """
        from langtorch.functional.textops import fill, records

        values = records({**{str(i): a for i, a in enumerate(args)}, **kwargs})
        return fill(self, values, strict=False)

    def join(self, sep: str = "", axis: int | None = -1) -> TextTensor:
        """Join entries along ``axis`` with ``sep`` (all entries when ``axis=None``); linear time.

        Example:
            >>> TextTensor([["a", "b"], ["c", "d"]]).join(", ").tolist()
            ['a, b', 'c, d']
        """
        from langtorch.functional.textops import join

        return join(self, sep, axis)

    def split(self, sep: str | None = None, maxsplit: int = -1, *, pad: str | None = None) -> TextTensor:
        """Split every entry by ``sep``; the pieces form a new last dimension.

        Entries must split into the same number of pieces unless ``pad`` is given.

        Example:
            >>> TextTensor(["a,b", "c,d"]).split(",").tolist()
            [['a', 'b'], ['c', 'd']]
        """
        from langtorch.functional.textops import split

        return split(self, sep, maxsplit, pad=pad)

    # ----------------------------------------------------------------- functional updates
    def where(self, cond: Any, other: Any) -> TextTensor:
        """This tensor where ``cond`` is True, ``other`` elsewhere (torch's ``Tensor.where``);
        see :func:`langtorch.functional.textops.where`.

        Example:
            >>> TextTensor(["a", "b"]).where([True, False], "x").tolist()
            ['a', 'x']
        """
        from langtorch.functional.textops import where

        return where(cond, self, other)

    def masked_scatter(self, mask: Any, values: Any) -> TextTensor:
        """A new tensor with the entries where ``mask`` is True replaced by ``values`` in order;
        see :func:`langtorch.functional.textops.masked_scatter`.

        Example:
            >>> t = TextTensor(["a", "b", "c"])
            >>> t.masked_scatter(t == "b", TextTensor(["B"])).tolist()
            ['a', 'B', 'c']
        """
        from langtorch.functional.textops import masked_scatter

        return masked_scatter(self, mask, values)

    def index_put(self, index: Any, values: Any) -> TextTensor:
        """A new tensor with ``self[index]`` replaced by ``values``; see
        :func:`langtorch.functional.textops.index_put`.

        Example:
            >>> TextTensor(["a", "b", "c"]).index_put([0, 2], TextTensor(["A", "C"])).tolist()
            ['A', 'b', 'C']
        """
        from langtorch.functional.textops import index_put

        return index_put(self, index, values)

    # ------------------------------------------------------------------------------ tables
    def to_records(self) -> list[dict[str, Any]]:
        """One dict per entry (row-major): ``"text"``, then the record fields, then the metadata
        columns, as Python values (numpy scalars converted).

        Raises:
            ValueError: a metadata key is ``"text"`` or a record field's name (rename it).

        Example:
            >>> t = TextTensor(["a", "b"], metadata={"score": [0.5, 1.0]})
            >>> t.to_records()
            [{'text': 'a', 'score': 0.5}, {'text': 'b', 'score': 1.0}]
        """
        clash = [k for k in self._metadata if k == "text" or k in self.fields]
        if clash:
            raise ValueError(
                f"to_records: metadata key {clash[0]!r} has the name of a column already used "
                "(the text or a record field); rename it, e.g. t.with_metadata(...)"
            )
        n = self.size
        columns: dict[str, list[Any]] = {"text": self._flat_list()}
        for k, v in (self._fields or {}).items():
            columns[k] = v.reshape(-1).tolist()
        for k in self._metadata:
            col = self._metadata.column(k).reshape(-1)
            columns[k] = list(col) if col.dtype == object else col.tolist()
        return [{k: c[i] for k, c in columns.items()} for i in range(n)]

    # ------------------------------------------------------------------------------ operators
    def __add__(self, other: Any) -> TextTensor:
        from langtorch.functional.textops import add

        return add(self, other)

    def __radd__(self, other: Any) -> TextTensor:
        from langtorch.functional.textops import add

        return add(other, self)

    def __mul__(self, other: Any) -> TextTensor:
        from langtorch.functional.textops import fill

        return fill(self, other, strict=True)

    def __rmul__(self, other: Any) -> TextTensor:
        from langtorch.functional.textops import fill

        return fill(other, self, strict=True)

    def __eq__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        other_texts = other._texts if isinstance(other, TextTensor) else as_text_array(other)
        broadcast_shapes(self.shape, other_texts.shape)
        return np.equal(self._texts, other_texts)

    def __ne__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        return ~self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __contains__(self, text: Any) -> bool:
        return bool(np.any(self._texts == as_text_array(text)))

    def __setstate__(self, state: Any) -> None:
        # pickle / copy.deepcopy: restore the slots, then make the texts read-only again.
        _, slots = state if isinstance(state, tuple) else (None, state)
        # A copy is a new leaf: the provenance graph (if any) is not copied along.
        object.__setattr__(self, "_grad_fn", None)
        object.__setattr__(self, "_cut", None)
        for k, v in slots.items():
            if k not in ("_grad_fn", "_cut"):
                object.__setattr__(self, k, v)
        if self._texts.flags.writeable:
            self._texts = self._texts.view()
            self._texts.flags.writeable = False

    def __bool__(self) -> bool:
        raise TypeError(
            "the truth value of a TextTensor is ambiguous; compare its text explicitly, e.g. "
            "str(t) != '' or (t == '').any()"
        )

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(
            "TextTensor is immutable; build a new one (e.g. with map, cat or a fill). Metadata "
            "is the mutable part: t.metadata[key] = value"
        )

    # -------------------------------------------------------------------------------- pytree
    def _tree_flatten(self):
        children = (self._embedding,) if self._embedding is not None else ()
        aux = _Aux(type(self), self._texts, self._fields, self._metadata._snapshot(),
                   self._template, self._embedding is not None)
        return children, aux

    @staticmethod
    def _tree_unflatten(aux: _Aux, children):
        emb = children[0] if aux.has_embedding else None
        return aux.cls._wrap(aux.texts, aux.fields, aux.metadata.copy(), emb, aux.template)


def register_pytree(cls: type) -> type:
    """Register a TextTensor (sub)class as a JAX pytree (embedding leaf, everything else static).

    Example:
        >>> import jax, numpy as np
        >>> t = TextTensor(["a"], embedding=np.ones((1, 2)))
        >>> jax.tree_util.tree_leaves(t)[0].shape
        (1, 2)
    """
    import jax

    jax.tree_util.register_pytree_node(cls, cls._tree_flatten, cls._tree_unflatten)
    return cls


register_pytree(TextTensor)


# ---------------------------------------------------------------------------- record building
def _render_records(fields: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """The text of a record entry: one ``key: value`` line per field."""
    out = None
    for k, v in fields.items():
        piece = np.strings.add(k + ": ", np.broadcast_to(v, shape))
        out = piece if out is None else np.strings.add(np.strings.add(out, "\n"), piece)
    return np.array(out if out is not None else np.full(shape, "", dtype=STRING_DTYPE), dtype=STRING_DTYPE)


def _records_from_dict(data: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    if not data:
        raise ValueError("a record needs at least one field; got an empty dict")
    cols = {}
    for k, v in data.items():
        if not isinstance(k, str):
            raise TypeError(f"record field names must be str, got {type(k).__name__} ({k!r})")
        if isinstance(v, TextTensor):
            if v._fields:
                raise TypeError(f"record field {k!r} holds records itself; nesting is not supported")
            cols[k] = v._texts
        else:
            try:
                cols[k] = as_text_array(v)
            except TypeError as e:
                raise TypeError(f"record field {k!r}: {e}") from None
    shape = broadcast_shapes(*(c.shape for c in cols.values()))
    fields = {k: np.array(np.broadcast_to(c, shape), dtype=STRING_DTYPE) for k, c in cols.items()}
    return _render_records(fields, shape), fields


def _records_from_list(data) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    keys = list(data[0].keys())
    for i, d in enumerate(data):
        if list(d.keys()) != keys and set(d.keys()) != set(keys):
            raise ValueError(
                f"every record must have the same fields; record 0 has {keys} but record {i} has "
                f"{list(d.keys())}"
            )
    cols = {}
    for k in keys:
        col = [d[k] for d in data]
        try:
            cols[k] = as_text_array(col)
        except TypeError as e:
            raise TypeError(f"record field {k!r}: {e}") from None
    shape = (len(data),)
    return _render_records(cols, shape), cols
