"""Pure TextTensor operations: fill, concat, add (fill-or-concat), join, split, stack, cat.

All of them are vectorised over entries: a fill parses each *distinct* template once and builds
the output with ``np.strings.add`` over whole columns; ``join`` is one ``str.join`` per output
entry (linear time). Broadcasting follows numpy; a mismatch raises :class:`ShapeError` naming both
shapes.

Metadata: ``fill``, ``concat`` and ``add`` broadcast both operands' metadata to the result shape
(on a key present in both, the right operand's value wins); ``stack``/``cat`` keep the keys all
operands share; ``join`` and ``split`` drop metadata (entries are merged or cut apart). Embeddings
are dropped by every op that changes text.

Example:
    >>> import langtorch.functional as F
    >>> t = F.TextTensor([["Q: {}"], ["Question: {}"]])
    >>> F.fill(t, F.TextTensor(["a", "b", "c"])).shape
    (2, 3)
    >>> F.join(F.TextTensor(["x", "y"]), "-").item()
    'x-y'
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.functional.errors import ShapeError, TemplateError
from langtorch.functional.template import Template, parse_template
from langtorch.functional.text import (
    STRING_DTYPE,
    Metadata,
    TextTensor,
    _frozen,
    _records_from_dict,
    _template_ok,
    broadcast_shapes,
    text_function,
)

__all__ = [
    "add", "cat", "concat", "fill", "index_put", "join", "masked_scatter", "records", "split", "stack",
    "where",
]


# ------------------------------------------------------------------------------------- helpers
def _tensor(x: Any, name: str = "operand", *, template: bool = False) -> TextTensor:
    """``x`` as a TextTensor. Raw text is a template when it parses as one; in the ``template``
    role (the template of a fill, the left of ``+``) text that does not parse is an error, in
    any other role it is data (values are never parsed)."""
    if isinstance(x, TextTensor):
        return x
    try:
        try:
            return TextTensor(x)
        except TemplateError:
            if template:
                raise
            return TextTensor(x, template=False)
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None


def _result_class(*tensors: TextTensor) -> type:
    cls = max((type(t) for t in tensors), key=lambda c: len(c.__mro__))
    return cls._result_class()


@text_function
def records(mapping: Mapping[str, Any]) -> TextTensor:
    """Keyed records from a mapping of field name -> text(s); the values broadcast together.

    Args:
        mapping: e.g. ``{"theme": ["spring", "summer"], "form": "haiku"}``.

    Returns:
        A TextTensor of records with the broadcast shape of the values.

    Example:
        >>> r = records({"theme": ["spring", "summer"], "form": "haiku"})
        >>> r.shape, r.fields
        ((2,), ('theme', 'form'))
    """
    if not mapping:
        return TextTensor._wrap(np.array("", dtype=STRING_DTYPE), {}, template=False)
    metas = [v for v in mapping.values() if isinstance(v, TextTensor)]
    texts, fields = _records_from_dict(mapping)
    meta = _merge_metadata(texts.shape, metas)
    return _result_class(TextTensor(""), *metas)._wrap(texts, fields, meta, None, False)


def _merge_metadata(shape: tuple[int, ...], tensors: Sequence[TextTensor]) -> Metadata:
    cols: dict[str, np.ndarray] = {}
    for t in tensors:
        for k in t.metadata:
            col = t.metadata.column(k)
            # Shared with the operand: read-only (np.broadcast_to views already are).
            cols[k] = _frozen(col) if col.shape == shape else np.broadcast_to(col, shape)
    return Metadata._trusted(shape, cols)


def _index_of(flat_pos: int, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    if not shape:
        return ()
    if flat_pos >= int(np.prod(shape)):
        return None  # an empty tensor has no entry to point at
    return tuple(int(i) for i in np.unravel_index(flat_pos, shape))


def _as_array(x: Any) -> np.ndarray:
    # A ufunc on 0-d inputs returns a Python str; wrap it at once, since a str operand would be
    # converted to a fixed-width 'U' scalar that drops trailing NUL characters.
    return x if isinstance(x, np.ndarray) else np.array(x, dtype=STRING_DTYPE)


def _build(tpl: Template, columns: list[np.ndarray]) -> np.ndarray:
    """``literals[0] + col0 + literals[1] + ...`` with whole-column string adds."""
    out = None
    for lit, col in zip(tpl.literals, columns + [None]):
        if lit:
            # As a StringDType array: a plain str would become a fixed-width 'U' scalar, which
            # drops trailing NUL characters.
            lit = np.array(lit, dtype=STRING_DTYPE)
            out = lit if out is None else _as_array(np.strings.add(out, lit))
        if col is not None:
            out = col if out is None else _as_array(np.strings.add(out, col))
    # ufuncs on 0-d inputs return a Python scalar: always hand back an array (without the copy
    # np.asarray(..., dtype=) would make of an existing StringDType array).
    return out if isinstance(out, np.ndarray) else np.array("" if out is None else out, dtype=STRING_DTYPE)


# ----------------------------------------------------------------------------------- fill / add
def _fill(template: TextTensor, values: TextTensor, mode: str) -> TextTensor:
    """The fill engine. ``mode``: "strict" (``*``), "add" (``+``) or "format" (``.format``)."""
    shape = broadcast_shapes(template.shape, values.shape)
    n_out = int(np.prod(shape)) if shape else 1
    groups = _template_groups(template, shape)
    vidx = None

    def column(arr: np.ndarray, positions) -> np.ndarray:
        nonlocal vidx
        if positions is None:
            return arr
        if vidx is None:
            vidx = np.broadcast_to(np.arange(values.size).reshape(values.shape), shape).reshape(-1)
        return arr.reshape(-1)[vidx[positions]]

    pieces = []
    for text, positions in groups:
        if len(groups) > 1 and len(positions) == 0:
            continue
        first = _index_of(0 if positions is None else int(positions[0]), shape)
        tpl, cols = _fill_columns(str(text), values, mode, first, functools.partial(column, positions=positions))
        pieces.append((positions, _build(tpl, cols)))

    if len(pieces) == 1 and pieces[0][0] is None:
        out = pieces[0][1]
        if out.shape != shape:
            out = np.array(np.broadcast_to(out, shape), dtype=STRING_DTYPE)
    else:
        flat = np.empty(n_out, dtype=STRING_DTYPE)
        for positions, built in pieces:
            flat[positions] = built
        out = flat.reshape(shape)
    meta = _merge_metadata(shape, [template, values])
    return _result_class(template, values)._wrap(out, None, meta, None, False)


def _template_groups(template: TextTensor, shape: tuple[int, ...]) -> list[tuple[Any, Any]]:
    """``(template text, flat output positions)`` per distinct template text, so each is parsed
    once; positions ``None`` when there is a single template for every output entry."""
    if template.size == 1:
        return [(template.texts.reshape(-1)[0], None)]
    uniq, inverse = np.unique(template.texts.reshape(-1), return_inverse=True)
    tidx = np.broadcast_to(np.arange(template.size).reshape(template.shape), shape).reshape(-1)
    group_of = inverse[tidx]
    order = np.argsort(group_of, kind="stable")
    bounds = np.searchsorted(group_of[order], np.arange(len(uniq) + 1))
    return [(uniq[g], order[bounds[g] : bounds[g + 1]]) for g in range(len(uniq))]


def _fill_columns(text: str, values: TextTensor, mode: str, first: Any,
                  column: Any) -> tuple[Template, list[np.ndarray]]:
    """One distinct template, parsed, and the value columns for its placeholders (``column``
    picks a value array's entries for this template's output positions). Every error names the
    first output index the template is used at."""
    vfields = values._fields
    try:
        tpl = parse_template(text)
    except TemplateError as e:
        raise TemplateError(
            f"{e}\n(template entry used at output index {first}.) This text is used as a "
            "template but does not parse as one. If its braces are literal text and it is not a "
            "template (a prompt with JSON or code, a model's answer), make it data with "
            "lt.text(...) or TextTensor(..., template=False): lt.text(prompt) + value appends "
            "the value, and the braces stay as written (or use langtorch.functional.concat). "
            "If it is a template, write its literal braces as {{ and }}.",
            template=e.template, position=e.position, index=first,
        ) from None
    if not tpl.has_fields:
        if mode == "strict":
            raise TemplateError(
                f"template {tpl.text!r} (output index {first}) has no placeholders to fill; "
                "`*` is the strict fill. Use `+` or langtorch.functional.concat to append text",
                template=tpl.text, index=first,
            )
        if mode == "format":
            return tpl, []
        # "add": a template without placeholders concatenates the value
        return Template(tpl.text, (tpl.literals[0], ""), ("",), ("",)), [column(values.texts)]
    if vfields is None:
        if len(tpl.names) > 1:
            raise TemplateError(
                f"template {tpl.text!r} has {len(tpl.names)} fields {list(tpl.names)} but the "
                f"value at output index {first} is a single text; pass keyed records, e.g. "
                f"TextTensor({{{', '.join(repr(n) + ': ...' for n in tpl.names)}}})",
                template=tpl.text, field=tpl.names[1], index=first,
            )
        return tpl, [column(values.texts)] * len(tpl.fields)
    cols = []
    for name in tpl.fields:
        if name not in vfields:
            raise TemplateError(
                f"template {tpl.text!r} needs field {{{name}}} but the values at output "
                f"index {first} have only the fields {list(vfields)}; add {name!r} to the "
                "records",
                template=tpl.text, field=name, index=first,
            )
        cols.append(column(vfields[name]))
    if mode == "strict":
        unused = [k for k in vfields if k not in tpl.names]
        if unused:
            raise TemplateError(
                f"fields {unused} are not used by template {tpl.text!r} (output index "
                f"{first}); `*` is strict: drop them or use `+`",
                template=tpl.text, field=unused[0], index=first,
            )
    return tpl, cols


@text_function
def fill(template: Any, values: Any, *, strict: bool = True) -> TextTensor:
    """Fill the placeholders of ``template`` with ``values`` (broadcast, numpy rules).

    A single text fills a template with one distinct field (whatever its name); keyed records fill
    by name. The result is data: values are inserted once and never parsed again.

    Args:
        template: templates (str, lists, TextTensor).
        values: texts or keyed records (str, lists, dict, TextTensor).
        strict: when True (the ``*`` operator), a template without placeholders and record fields
            the template does not use are errors. When False (``.format``), a template without
            placeholders is returned as is and extra fields are ignored.

    Raises:
        TemplateError: malformed template, missing field (names the field and the output index),
            or a strict-mode violation; also when ``template`` is data (``template=False``).
        ShapeError: shapes cannot be broadcast.

    Example:
        >>> fill("Write a poem about {theme}", ["spring", "autumn"]).tolist()
        ['Write a poem about spring', 'Write a poem about autumn']
        >>> fill("{a}-{b}", {"a": "1", "b": "{b}"}).item()  # braces in data survive
        '1-{b}'
    """
    t = _tensor(template, "template", template=True)
    if not t.is_template:
        raise TemplateError(
            "the template operand holds data (e.g. a model's output or a previous fill), which "
            "is never parsed as a template; build a template with TextTensor(text) explicitly"
        )
    return _fill(t, _tensor(values, "values"), "strict" if strict else "format")


@text_function
def add(a: Any, b: Any) -> TextTensor:
    """``a + b``: fill ``a``'s placeholders with ``b`` where ``a`` has any, concatenate otherwise.

    This is the seed article's ``prompt + user_input``. The decision is made per distinct
    template entry. When ``a`` is data (model output, a previous fill), ``b`` is appended.

    Example:
        >>> add("Translate: {input}", "Hello").item()
        'Translate: Hello'
        >>> add("Model, please answer: ", "why is the sky blue?").item()
        'Model, please answer: why is the sky blue?'
    """
    ta, tb = _tensor(a, "left operand", template=True), _tensor(b, "right operand")
    if not add_fills(ta):
        return concat(ta, tb)
    return _fill(ta, tb, "add")


def add_fills(a: Any) -> bool:
    """Whether ``add(a, b)`` fills ``a``'s placeholders (``a`` is a template) rather than
    concatenating (``a`` is data). The one place this rule lives: :func:`add` follows it, and so
    does the provenance graph when it names the operands template/values or left/right.

    Example:
        >>> add_fills("Q: {}"), add_fills(TextTensor("an answer", template=False))
        (True, False)
    """
    return _tensor(a, "left operand", template=True).is_template


@text_function
def concat(a: Any, b: Any, sep: str = "") -> TextTensor:
    """Elementwise ``a + sep + b`` with broadcasting; nothing is parsed.

    The result is a template only if both operands are templates and it would not be refused as
    one (raw text refused as a template is data here: nothing is parsed).

    Example:
        >>> concat(["a", "b"], "!", sep=" ").tolist()
        ['a !', 'b !']
    """
    ta, tb = _tensor(a, "left operand"), _tensor(b, "right operand")
    if not isinstance(sep, str):
        raise TypeError(f"sep must be str, got {type(sep).__name__}")
    shape = broadcast_shapes(ta.shape, tb.shape)
    left = np.strings.add(ta.texts, np.array(sep, dtype=STRING_DTYPE)) if sep else ta.texts
    out = np.strings.add(left, tb.texts)
    if not isinstance(out, np.ndarray):
        out = np.array(out, dtype=STRING_DTYPE)
    if out.shape != shape:
        out = np.array(np.broadcast_to(out, shape), dtype=STRING_DTYPE)
    meta = _merge_metadata(shape, [ta, tb])
    # Two templates concatenate into one unless the result would be refused (e.g. "{}" + "{0}").
    template = ta.is_template and tb.is_template and _template_ok(out)
    return _result_class(ta, tb)._wrap(out, None, meta, None, template)


# ------------------------------------------------------------------------------- join / split
def _norm_axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{what} axis {axis} is out of range for a tensor of {ndim} dimensions")
    return axis % ndim


@text_function
def join(t: Any, sep: str = "", axis: int | None = -1) -> TextTensor:
    """Join entries along ``axis`` with ``sep``; ``axis=None`` joins all entries into one text.

    Linear time: one C-level ``str.join`` per output entry. Metadata is dropped. Joined
    templates are a template unless the result would be refused as one (then data).

    Example:
        >>> join([["a", "b"], ["c", "d"]], "+", axis=0).tolist()
        ['a+c', 'b+d']
        >>> join([["a", "b"], ["c", "d"]], "", axis=None).item()
        'abcd'
    """
    t = _tensor(t)
    if not isinstance(sep, str):
        raise TypeError(f"sep must be str, got {type(sep).__name__}")
    cls = _result_class(t)

    def result(out: np.ndarray) -> TextTensor:
        # Joined templates stay a template unless the result would be refused ("{}" with "{0}").
        return cls._wrap(out, template=t.is_template and _template_ok(out))

    if axis is None or t.ndim == 0:
        text = sep.join(t._flat_list()) if t.ndim else str(t)
        return result(np.array(text, dtype=STRING_DTYPE))
    ax = _norm_axis(axis, t.ndim, "join")
    if t.ndim == 1:
        return result(np.array(sep.join(t._flat_list()), dtype=STRING_DTYPE))
    moved = np.moveaxis(t.texts, ax, -1)
    rows = moved.reshape(int(np.prod(moved.shape[:-1])), moved.shape[-1]).tolist()
    out = np.array([sep.join(r) for r in rows], dtype=STRING_DTYPE).reshape(moved.shape[:-1])
    return result(out)


@text_function
def split(t: Any, sep: str | None = None, maxsplit: int = -1, *, pad: str | None = None) -> TextTensor:
    """Split every entry by ``sep`` (``None``: runs of whitespace); pieces form a new last axis.

    Args:
        t: the texts.
        sep: the separator (non-empty) or ``None``.
        maxsplit: at most this many splits per entry (``-1``: no limit).
        pad: when entries split into different numbers of pieces, pad the short ones with this
            text; without it that is a :class:`ShapeError`.

    Example:
        >>> split(["a b", "c d"]).shape
        (2, 2)
        >>> split(["a,b,c", "d"], ",", pad="").tolist()
        [['a', 'b', 'c'], ['d', '', '']]
    """
    t = _tensor(t)
    if sep is not None and (not isinstance(sep, str) or sep == ""):
        raise ValueError(f"sep must be a non-empty str or None, got {sep!r}")
    parts = [s.split(sep, maxsplit) for s in t._flat_list()]
    counts = {len(p) for p in parts}
    width = max(counts) if counts else 0
    if len(counts) > 1:
        if pad is None:
            first_short = next(i for i, p in enumerate(parts) if len(p) != width)
            raise ShapeError(
                f"entries split into different numbers of pieces ({sorted(counts)}), e.g. entry "
                f"{_index_of(first_short, t.shape)} into {len(parts[first_short])}; pass pad='' "
                "to pad the short ones, or maxsplit to cap the count"
            )
        parts = [p + [pad] * (width - len(p)) for p in parts]
    flat = [s for p in parts for s in p]
    out = np.array(flat, dtype=STRING_DTYPE).reshape(t.shape + (width,))
    # Pieces of templates stay templates unless one would be refused (a cut inside "{x.y}").
    return _result_class(t)._wrap(out, template=t.is_template and _template_ok(out))


# ------------------------------------------------------------------------------ stack / cat
def _common(tensors: Sequence[Any], what: str) -> list[TextTensor]:
    if isinstance(tensors, (str, TextTensor)) or not isinstance(tensors, Sequence) or not tensors:
        raise TypeError(f"{what} expects a non-empty list of TextTensors, got {type(tensors).__name__}")
    ts = [_tensor(x, f"{what} item {i}") for i, x in enumerate(tensors)]
    kinds = {bool(t.fields) for t in ts}
    if len(kinds) > 1 or (ts[0].fields and any(set(t.fields) != set(ts[0].fields) for t in ts)):
        raise ShapeError(f"{what}: records must all have the same fields; got {[list(t.fields) for t in ts]}")
    has_emb = {t.embedding is not None for t in ts}
    if len(has_emb) > 1:
        raise ShapeError(f"{what}: either every tensor has an embedding or none does")
    return ts


def _combine(ts: list[TextTensor], fn, shape) -> TextTensor:
    texts = fn([t.texts for t in ts])
    fields = {k: fn([t._fields[k] for t in ts]) for k in ts[0].fields} if ts[0].fields else None
    shared = [k for k in ts[0].metadata if all(k in t.metadata for t in ts[1:])]

    def combine_column(k):
        cols = [t.metadata.column(k) for t in ts]
        try:
            return fn(cols)
        except (TypeError, ValueError):  # dtypes that do not promote (e.g. text and numbers)
            return fn([c.astype(object) for c in cols])

    meta = Metadata._trusted(shape, {k: combine_column(k) for k in shared})
    emb = None
    if ts[0].embedding is not None:
        embs = [t.embedding for t in ts]
        if len({e.shape[-1] for e in embs}) > 1:
            raise ShapeError(f"embedding sizes differ: {[e.shape[-1] for e in embs]}")
        if all(isinstance(e, np.ndarray) for e in embs):
            emb = fn(embs)
        else:
            import jax.numpy as jnp

            emb = fn(embs, jnp)
    return _result_class(*ts)._wrap(texts, fields, meta, emb, all(t.is_template for t in ts))


@text_function
def stack(tensors: Sequence[Any], axis: int = 0) -> TextTensor:
    """Stack same-shape tensors along a new axis; metadata keys shared by all are kept.

    Example:
        >>> stack([TextTensor(["a", "b"]), TextTensor(["c", "d"])], axis=1).tolist()
        [['a', 'c'], ['b', 'd']]
    """
    ts = _common(tensors, "stack")
    shapes = {t.shape for t in ts}
    if len(shapes) > 1:
        raise ShapeError(f"stack needs tensors of one shape; got shapes {[t.shape for t in ts]}")
    nd = ts[0].ndim + 1
    ax = _norm_axis(axis, nd, "stack")

    def fn(arrs, xp=np):
        return xp.stack(arrs, axis=ax)

    shape = ts[0].shape[:ax] + (len(ts),) + ts[0].shape[ax:]
    return _combine(ts, fn, shape)


@text_function
def cat(tensors: Sequence[Any], axis: int = 0) -> TextTensor:
    """Concatenate tensors along an existing axis (all other dimensions must match).

    Example:
        >>> cat([TextTensor(["a"]), TextTensor(["b", "c"])]).tolist()
        ['a', 'b', 'c']
    """
    ts = _common(tensors, "cat")
    nd = ts[0].ndim
    if nd == 0 or any(t.ndim != nd for t in ts):
        raise ShapeError(
            f"cat needs tensors with the same number (>= 1) of dimensions; got shapes "
            f"{[t.shape for t in ts]}"
        )
    ax = _norm_axis(axis, nd, "cat")
    rest = {t.shape[:ax] + t.shape[ax + 1 :] for t in ts}
    if len(rest) > 1:
        raise ShapeError(f"cat along axis {ax}: other dimensions differ in shapes {[t.shape for t in ts]}")

    def fn(arrs, xp=np):
        return xp.concatenate(arrs, axis=ax)

    shape = ts[0].shape[:ax] + (sum(t.shape[ax] for t in ts),) + ts[0].shape[ax + 1 :]
    return _combine(ts, fn, shape)


# ------------------------------------------------------------ batch control flow: where / scatter
def _as_bool_array(x: Any, name: str) -> np.ndarray:
    """A bool numpy array from a bool, nested lists, numpy / torch / JAX bool arrays."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, possibly on a device
        x = x.detach().cpu().numpy()
    elif hasattr(x, "__jax_array__") or type(x).__module__.startswith("jax"):
        x = np.asarray(x)
    if isinstance(x, TextTensor):
        raise TypeError(
            f"{name} must be a bool array, got a TextTensor; compare it first, e.g. t == 'yes' "
            "or t.metadata['confidence'] < 0.5"
        )
    arr = np.asarray(x)
    if arr.size == 0 and isinstance(x, (list, tuple)):  # an empty batch's [] has no dtype to check
        arr = arr.astype(bool)
    if arr.dtype != bool:
        raise TypeError(
            f"{name} must be a bool array (numpy, torch or JAX), got dtype {arr.dtype}; build "
            "it with a comparison, e.g. t.metadata['confidence'] < 0.5"
        )
    return arr


def _missing_fill(col: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A column of ``shape`` meaning "no value here": NaN for float columns, None otherwise."""
    if col.dtype.kind in "fc":
        return np.full(shape, np.nan, dtype=col.dtype)
    return np.full(shape, None, dtype=object)


def _select_column(take_b: np.ndarray, a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray:
    """``b`` where ``take_b`` else ``a`` (both of the result shape; ``None``: key absent there)."""
    shape = take_b.shape
    if a is None:  # never used where take_b holds everywhere
        a = b if take_b.all() else _missing_fill(b, shape)
    if b is None:
        b = _missing_fill(a, shape) if take_b.any() else a
    if a.dtype != b.dtype and not (a.dtype.kind in "biuf" and b.dtype.kind in "biuf"):
        a, b = a.astype(object), b.astype(object)
    try:
        return np.where(take_b, b, a)
    except TypeError:  # dtypes that do not promote
        return np.where(take_b, b.astype(object), a.astype(object))


def _select(take_b: np.ndarray, a: TextTensor, b: TextTensor, b_at: Any) -> TextTensor:
    """The entries of ``b`` where ``take_b`` and of ``a`` elsewhere, metadata merged.

    ``a``'s arrays broadcast to ``take_b.shape``; ``b_at(arr)`` lays an array of ``b`` out at the
    result's shape (``arr`` may have trailing dimensions, as an embedding has).
    """
    shape = take_b.shape

    def a_at(arr: np.ndarray) -> np.ndarray:
        return np.broadcast_to(arr, shape + arr.shape[a.ndim:])

    if set(a.fields) != set(b.fields):
        raise ShapeError(
            f"both operands must be plain texts or records with the same fields; got fields "
            f"{list(a.fields)} and {list(b.fields)}"
        )
    texts = np.array(np.where(take_b, b_at(b.texts), a_at(a.texts)), dtype=STRING_DTYPE)
    fields = None
    if a._fields:
        fields = {k: np.array(np.where(take_b, b_at(b._fields[k]), a_at(a._fields[k])),
                              dtype=STRING_DTYPE) for k in a._fields}
    cols: dict[str, np.ndarray] = {}
    for k in list(a.metadata) + [k for k in b.metadata if k not in a.metadata]:
        ac = a_at(a.metadata.column(k)) if k in a.metadata else None
        bc = b_at(b.metadata.column(k)) if k in b.metadata else None
        cols[k] = _frozen(_select_column(take_b, ac, bc))
    emb = None
    ea, eb = a.embedding, b.embedding
    if ea is not None and eb is not None and ea.shape[-1] == eb.shape[-1]:
        emb = np.where(take_b[..., None], b_at(np.asarray(eb)), a_at(np.asarray(ea)))
    out = _result_class(a, b)._wrap(texts, fields, Metadata._trusted(shape, cols), emb,
                                    a.is_template and b.is_template)
    return out


@text_function
def where(cond: Any, a: Any, b: Any) -> TextTensor:
    """Entry-wise choice: ``a`` where ``cond`` is True, ``b`` elsewhere (numpy/torch ``where``).

    ``cond``, ``a`` and ``b`` broadcast together (numpy rules). ``cond`` is a bool array —
    numpy, torch or JAX, or a comparison of a metadata column such as
    ``t.metadata["confidence"] < 0.5``. Metadata is merged: a key both operands have takes the
    chosen side's value; a key only one side has is missing (``NaN`` in a float column, ``None``
    otherwise) where the other side was chosen. Embeddings are kept when both sides have one of
    the same size. The result is a template only if both operands are.

    Both branches must already be computed; to run a branch only for some entries, compute it on
    ``t[mask]`` and put it back with :func:`masked_scatter`.

    Raises:
        TypeError: ``cond`` is not a bool array.
        ShapeError: shapes cannot be broadcast, or the operands' record fields differ.

    Example:
        >>> import numpy as np
        >>> a = TextTensor(["kept", "kept", "kept"], metadata={"confidence": [0.9, 0.2, 0.8]})
        >>> out = where(a.metadata["confidence"] >= 0.5, a, "searched")
        >>> out.tolist()
        ['kept', 'searched', 'kept']
        >>> out.metadata["confidence"].tolist()
        [0.9, nan, 0.8]
    """
    c = _as_bool_array(cond, "where(cond, a, b): cond")
    ta, tb = _tensor(a, "where: a"), _tensor(b, "where: b")
    shape = broadcast_shapes(c.shape, ta.shape, tb.shape)
    take_b = np.array(np.broadcast_to(~c, shape))

    def b_at(arr: np.ndarray) -> np.ndarray:
        return np.broadcast_to(arr, shape + arr.shape[tb.ndim:])

    return _select(take_b, ta, tb, b_at)


def _scatter(t: TextTensor, positions: np.ndarray, values: TextTensor) -> TextTensor:
    """``t`` with the flat entries ``positions`` (any shape) replaced by ``values`` (broadcast to
    ``positions.shape``); later duplicates win, as in numpy assignment."""
    shape = t.shape
    n = t.size if t.ndim else 1
    flat_pos = positions.reshape(-1)
    take_b = np.zeros(n, dtype=bool)
    take_b[flat_pos] = True
    take_b = take_b.reshape(shape)
    vshape = positions.shape

    def b_at(arr: np.ndarray) -> np.ndarray:
        trailing = arr.shape[values.ndim:]
        src = np.broadcast_to(arr, vshape + trailing).reshape((-1,) + trailing)
        out = np.empty((n,) + trailing, dtype=arr.dtype)
        out[flat_pos] = src
        return out.reshape(shape + trailing)

    return _select(take_b, t, values, b_at)


@text_function
def masked_scatter(t: Any, mask: Any, values: Any) -> TextTensor:
    """A new tensor: ``t`` with the entries where ``mask`` is True replaced, in row-major order,
    by the entries of ``values`` (torch's ``masked_scatter``, without mutation).

    The usual use: run a branch only on the selected entries and put the results back,
    ``t.masked_scatter(mask, branch(t[mask]))``. ``mask`` broadcasts to ``t.shape``; ``values``
    has exactly one entry per True (any shape) or a single entry for all. Metadata is merged as in
    :func:`where` (a key only one side has is ``NaN``/``None`` where the other side's entries are).

    Raises:
        TypeError: ``mask`` is not a bool array.
        ShapeError: ``mask`` does not broadcast to ``t.shape``, or ``values`` has the wrong
            number of entries.

    Example:
        >>> t = TextTensor(["a", "b", "c", "d"])
        >>> mask = [False, True, False, True]
        >>> masked_scatter(t, mask, TextTensor(["B", "D"])).tolist()
        ['a', 'B', 'c', 'D']
    """
    tt = _tensor(t, "masked_scatter: t")
    m = _as_bool_array(mask, "masked_scatter: mask")
    try:
        m = np.broadcast_to(m, tt.shape)
    except ValueError:
        raise ShapeError(f"masked_scatter: mask of shape {m.shape} does not broadcast to the tensor's "
                         f"shape {tt.shape}") from None
    tv = _tensor(values, "masked_scatter: values")
    k = int(m.sum())
    positions = np.flatnonzero(m)
    if tv.size == 1 and k != 1:
        tv = tv.reshape(())
    elif tv.size != k:
        raise ShapeError(
            f"masked_scatter: the mask selects {k} entries but values has {tv.size} (shape "
            f"{tv.shape}); give one value per selected entry, e.g. f(t[mask])"
        )
    else:
        tv = tv.reshape(k)
    return _scatter(tt, positions, tv)


@text_function
def index_put(t: Any, index: Any, values: Any) -> TextTensor:
    """A new tensor: ``t`` with ``t[index]`` replaced by ``values`` (torch's ``index_put``,
    without mutation). ``index`` is anything that indexes a TextTensor (ints, slices, int or
    bool arrays incl. torch/JAX ones, tuples of them); ``values`` broadcasts to ``t[index].shape``.
    Metadata is merged as in :func:`where`.

    Raises:
        IndexError: ``index`` is out of range.
        ShapeError: ``values`` does not broadcast to ``t[index].shape``.

    Example:
        >>> t = TextTensor([["a", "b"], ["c", "d"]])
        >>> index_put(t, (0, 1), "B").tolist()
        [['a', 'B'], ['c', 'd']]
        >>> index_put(t, (slice(None), 0), TextTensor(["A", "C"])).tolist()
        [['A', 'b'], ['C', 'd']]
    """
    from langtorch.functional.text import _expand_index

    tt = _tensor(t, "index_put: t")
    tv = _tensor(values, "index_put: values")
    n = tt.size if tt.ndim else 1
    idx = _expand_index(index, tt.ndim)
    try:
        positions = np.arange(n, dtype=np.intp).reshape(tt.shape)[idx]
    except IndexError as e:
        raise IndexError(f"index_put: {e} (TextTensor of shape {tt.shape})") from None
    positions = np.asarray(positions)
    try:
        np.broadcast_shapes(tv.shape, positions.shape)
        if np.broadcast_shapes(tv.shape, positions.shape) != positions.shape:
            raise ValueError
    except ValueError:
        raise ShapeError(f"index_put: values of shape {tv.shape} do not broadcast to the indexed "
                         f"shape {positions.shape}") from None
    return _scatter(tt, positions, tv)
