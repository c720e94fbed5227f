"""int8 weights for a decoder: per-channel symmetric int8 matrices and exact int8 products.

A decode step reads every weight once, and on a CPU with int8 dot units (VNNI, AMX) int8 x
int8 -> int32 products are the fastest there are: in a decode loop of SmolLM2's shapes, 1.6x
(one row) to 3.2x (16-64 rows) faster than fp32 (measured on an AMX Xeon,
``tests/benchmarks/profile_quant.py``). XLA:CPU does not fuse an int8 -> float
convert into a float product: it materialises a float copy of the weight, which made int8
*weights* with float products slower than fp32 weights (measured). So both operands go to the
product as int8:

* weights: each matrix's output channel (column of ``[K, N]``) gets one float32 scale,
  ``max|w| / 127``, and ``q = round(w / scale)``; the embedding table one scale per token row
  (it is also the tied LM head, whose output channels are those rows). Layer matrices are
  stored transposed (``[N, K]``, like the table): with both operands contracted along their
  last axis XLA:CPU's int8 product ran 8-28% faster at decode sizes;
* activations: each row ``x`` of a product (one token) is scaled by ``max|x| / 127`` and split
  into an int8 part and an int8 remainder (``x / s ~= hi + lo / 254``): ~15 bits per row, so
  the result is that of the int8 *weights* to ~1e-5 (activation rounding alone cost a tenth of
  SmolLM2-135M's greedy top-1 agreement when measured with 8 bits); both halves go through one
  product (twice the rows: a decode step is bound by reading the weights, not by its rows);
* the int32 sums are exact, so a product's row does not depend on the rows computed beside it
  or on how XLA blocks the product (float products change a row's summation order with the
  row count).

The model computed is the one with weights ``q * scale``
(:meth:`QuantizedMatrix.dequantize`), which is what the tests check it against (transformers
with those weights). Its answers differ from the float model's: on SmolLM2-135M (already a
4-bit GGUF) teacher-forced top-1 agreement with the fp32 model was 94.6% (bf16 weights:
98.8%), mean KL 0.005 (bf16: 0.0008); see ``docs/local_models.md``, "int8 weights".

A :class:`QuantizedMatrix` is a pytree (``q`` int8, ``scale`` float32; its compute ``dtype``
static) that :func:`~langtorch.functional.models.matmul.dense`,
:func:`~langtorch.functional.models.decoder.embed_tokens` and
:func:`~langtorch.functional.models.decoder.lm_head` accept wherever a weight goes.

* :func:`quantize` quantizes one matrix along its contraction axis;
* :func:`quantize_params` every matrix of a decoder's params (the layers' seven projections, the
  embedding table, an untied LM head); norms and biases stay float;
* :func:`quantized_dot` is the product;
* :func:`cast` changes a params tree's compute dtype; quantized matrices keep their int8
  storage (a bf16 and an fp32 view share it).

Example:
    >>> import jax.numpy as jnp
    >>> from langtorch.functional.models import quant
    >>> w = jnp.array([[1.0, -2.0], [0.5, 4.0]])
    >>> m = quant.quantize(w)
    >>> m.q.tolist(), m.scale.shape  # one scale per output column: max|w| / 127
    ([[127, -64], [64, 127]], (1, 2))
    >>> bool(jnp.abs(m.dequantize() - w).max() <= m.scale.max() / 2)
    True
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["QuantizedMatrix", "quantize", "quantize_params", "quantized_dot", "cast",
           "with_products", "is_quantized", "leaves", "QUANTIZATIONS", "PRODUCTS",
           "LAYER_MATRICES", "FUSED"]

PRODUCTS = ("int8", "float")
"""How a :class:`QuantizedMatrix` multiplies (its static ``products``): ``"int8"`` (default)
quantizes each row of the input and accumulates exactly in int32 (batch-invariant, and the
fastest where the CPU's int8 dot units are: AMX); ``"float"`` converts the int8 values (exactly)
to the compute dtype and runs a float product with float32 accumulation, then scales the
columns (faster where int8 products are slow, e.g. many-row prefill on a CPU with bf16 but
without AMX; the input is not quantized, so it is rounded only to the compute dtype)."""

QUANTIZATIONS = ("int8",)
"""The weight formats :func:`quantize_params` makes."""

LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
"""A decoder layer's matrices (``[K, N]``, contraction first) that :func:`quantize_params`
quantizes."""

FUSED = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}
"""The quantized matrices :func:`quantize_params` joins along their output columns (they
multiply the same input): one product (and one activation quantization) instead of three and
two. Per-column scales and exact int32 sums make each column's result the same bits as the
separate matrix's in the forward pass, so joining changes nothing but the time (90 fewer
products per step for 30 layers; measured about even: single stream +4%, 16 rows -2%).
Gradients through a joined matrix sum in another order (float rounding differs)."""

_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)
_LO = 254.0  # a row's remainder after its int8 part, in units of 1/254 of the int8 step
_TINY = float(jnp.finfo(jnp.float32).tiny)


def _check_products(products: Any, where: str) -> None:
    if not isinstance(products, str) or products not in PRODUCTS:
        raise ValueError(f"{where}: expected products {' or '.join(map(repr, PRODUCTS))}, got "
                         f"{products!r}.")


def _float_dtype(dtype: Any, where: str) -> Any:
    dt = jnp.dtype(dtype)
    if dt not in [jnp.dtype(d) for d in _FLOATS]:
        raise ValueError(f"{where}: expected a compute dtype float32, bfloat16 or float16, got "
                         f"{dt}.")
    return dt


@jax.tree_util.register_pytree_node_class
class QuantizedMatrix:
    """An int8 matrix with float32 scales: the weight ``q * scale``, computed in ``dtype``.

    Args:
        q: int8 values in ``[-127, 127]``: ``[..., K, N]``, or ``[..., N, K]`` when
            ``transposed`` (the storage of a ``[K, N]`` weight that XLA:CPU's int8 product reads
            fastest: both operands contracted along their last axis).
        scale: float32, broadcastable against ``q`` with size 1 along the quantized
            (contraction) axis: ``[..., 1, N]`` for a ``[K, N]`` weight (``[..., N, 1]``
            transposed), ``[..., V, 1]`` for a ``[V, H]`` embedding table.
        dtype: the dtype products and gathered rows come out in (float32 or bfloat16); static.
        transposed: ``q`` and ``scale`` hold the matrix transposed; static. ``shape`` and
            :meth:`dequantize` are the matrix's own (``[K, N]``) either way.
        products: ``"int8"`` (default) or ``"float"``: how :func:`quantized_dot` multiplies by
            it (:data:`PRODUCTS`); static. The same storage either way.

    ``shape``, ``ndim`` and ``dtype`` read like an array's, so code that inspects a weight
    (shapes, the compute dtype) works unchanged; indexing a stacked ``[L, K, N]`` matrix
    (``m[i]``) gives layer ``i``'s.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional.models.quant import quantize
        >>> m = quantize(jnp.ones((3, 2)))
        >>> m.shape, m.dtype, m.astype(jnp.bfloat16).q is m.q
        ((3, 2), dtype('float32'), True)
        >>> t = quantize(jnp.ones((3, 2)), transposed=True)
        >>> t.shape, t.q.shape, t.scale.shape
        ((3, 2), (2, 3), (2, 1))
    """

    __slots__ = ("q", "scale", "_dtype", "_transposed", "_products")

    def __init__(self, q: Any, scale: Any, dtype: Any = jnp.float32, transposed: bool = False,
                 products: str = "int8"):
        if not isinstance(transposed, bool):
            raise ValueError(f"QuantizedMatrix: expected transposed True or False, got "
                             f"{transposed!r}.")
        _check_products(products, "QuantizedMatrix")
        self.q = q
        self.scale = scale
        self._dtype = _float_dtype(dtype, "QuantizedMatrix")
        self._transposed = transposed
        self._products = products

    # pytree: the arrays are children; the compute dtype, the storage order and the kind of
    # product are static.
    def tree_flatten(self):
        return (self.q, self.scale), (self._dtype, self._transposed, self._products)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.q, obj.scale = children
        obj._dtype, obj._transposed, obj._products = aux
        return obj

    @property
    def dtype(self) -> Any:
        return self._dtype

    @property
    def transposed(self) -> bool:
        """Whether ``q`` and ``scale`` are stored transposed (``[..., N, K]``)."""
        return self._transposed

    @property
    def products(self) -> str:
        """``"int8"`` or ``"float"``: how :func:`quantized_dot` multiplies (:data:`PRODUCTS`)."""
        return self._products

    def with_products(self, products: str) -> QuantizedMatrix:
        """The same storage multiplied with ``products`` (``"int8"`` or ``"float"``).

        Example:
            >>> import jax.numpy as jnp
            >>> m = quantize(jnp.ones((3, 2)))
            >>> m.with_products("float").products, m.with_products("float").q is m.q
            ('float', True)
        """
        _check_products(products, "QuantizedMatrix.with_products")
        return QuantizedMatrix(self.q, self.scale, self._dtype, self._transposed, products)

    @property
    def shape(self) -> tuple[int, ...]:
        s = tuple(self.q.shape)
        return (*s[:-2], s[-1], s[-2]) if self._transposed else s

    @property
    def ndim(self) -> int:
        return len(self.q.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.q.shape)) + 4 * int(np.prod(self.scale.shape))

    def astype(self, dtype: Any) -> QuantizedMatrix:
        """The same storage computed in ``dtype`` (float32, bfloat16 or float16)."""
        return QuantizedMatrix(self.q, self.scale, _float_dtype(dtype, "QuantizedMatrix.astype"),
                               self._transposed, self._products)

    def __getitem__(self, i: Any) -> QuantizedMatrix:
        if self.ndim < 3:
            raise IndexError(f"QuantizedMatrix: only a stack [L, K, N] is indexed (one layer's "
                             f"matrix); this one has shape {self.shape}.")
        if isinstance(i, tuple):  # would reach the matrix axes (of the storage, maybe [N, K])
            raise IndexError(f"QuantizedMatrix: index the stack axis only (m[i] or m[a:b]), "
                             f"got {i!r} for shape {self.shape}.")
        return QuantizedMatrix(self.q[i], self.scale[i], self._dtype, self._transposed,
                               self._products)

    def dequantize(self) -> jax.Array:
        """The weight ``q * scale`` as an array of ``dtype`` (shape :attr:`shape`)."""
        w = (self.q.astype(jnp.float32) * self.scale).astype(self._dtype)
        return jnp.swapaxes(w, -1, -2) if self._transposed else w

    def __repr__(self) -> str:
        stored = ", stored transposed" if self._transposed else ""
        float_products = ", float products" if self._products == "float" else ""
        return (f"QuantizedMatrix(shape={self.shape}, int8{stored}{float_products}, "
                f"dtype={self._dtype.name})")


def quantized_dot(x: jax.Array, w: QuantizedMatrix, *, transpose: bool = False) -> jax.Array:
    """``x [..., K] @ w`` as float32 for a quantized ``w``: ``[K, N]`` (one scale per column),
    or with ``transpose=True`` a ``[N, K]`` table such as a tied embedding (one scale per row)
    contracted along its last axis, giving ``x @ w.T``.

    Each row of ``x`` is quantized to int8 with its own scale (``max|row| / 127``; 1 for an
    all-zero row) and the product accumulates exactly in int32, then is scaled by (row scale x
    channel scale). Integer sums do not depend on their order, so a row's result has the same
    bits whatever rows are computed beside it (batch-invariant by construction), and XLA:CPU
    runs int8 x int8 -> int32 products on the CPU's int8 dot units (VNNI/AMX; 1.6-3.2x fp32 in
    a decode loop, ``tests/benchmarks/profile_quant.py``; one row alone would
    take XLA's slow one-row path, but its two halves make two rows). A NaN in a row makes that
    row's result NaN (never other rows').

    A matrix with ``products="float"`` (:data:`PRODUCTS`) is multiplied instead as ``x`` in
    its compute dtype (float32 or bfloat16; float16 is refused: ``x`` would overflow) times
    the int8 values converted to it (exact), accumulated in float32, then scaled per channel:
    no rounding of ``x`` beyond the compute dtype, and no batch invariance by construction (a
    float product's summation order may change with the rows). Its gradient is the same as
    the int8 product's.

    Differentiable in ``x`` (reverse mode): the gradient is that of ``x @ w.dequantize()``
    (straight through the rounding of ``x``), the weight is a constant.

    Example:
        >>> import jax.numpy as jnp
        >>> w = quantize(jnp.array([[1.0, 0.0], [0.0, 2.0]]))
        >>> quantized_dot(jnp.array([[3.0, 1.0]]), w).round(2).tolist()
        [[3.0, 2.0]]
    """
    if not isinstance(w, QuantizedMatrix) or w.ndim != 2:
        raise ValueError(f"quantized_dot: expected a 2-D QuantizedMatrix, got {w!r}.")
    k, n = w.shape[::-1] if transpose else w.shape
    # The storage's contraction axis: 1 when q is held [N, K] (a table used transposed, or a
    # [K, N] weight stored transposed), else 0.
    last = transpose != w.transposed
    want = (n, 1) if last else (1, n)
    if tuple(w.scale.shape) != want:
        what = "[N, K] table (transpose=True)" if transpose else "[K, N] weight"
        raise ValueError(f"quantized_dot: a {what}{' stored transposed' if w.transposed else ''}"
                         f" needs scales of shape {want} (quantize(..., axis="
                         f"{-1 if transpose else -2})), got {tuple(w.scale.shape)}.")
    if jnp.ndim(x) < 1 or jnp.shape(x)[-1] != k:
        raise ValueError(f"quantized_dot: expected x [..., {k}], got shape {jnp.shape(x)}.")
    if w.products == "float":
        if w.dtype == jnp.float16:  # x would be cast to float16 and overflow above 65504
            raise ValueError("quantized_dot: float products compute in float32 or bfloat16; "
                             "this matrix computes in float16 (use products='int8').")
        return _fdot(x, w.q, w.scale.reshape(-1), last, w.dtype)
    return _qdot(x, w.q, w.scale.reshape(-1), last)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fdot(x, q, scale, last, dtype):
    return _fdot_fwd(x, q, scale, last, dtype)[0]


def _fdot_fwd(x, q, scale, last, dtype):
    # products="float": the int8 values are exact in float32 and bfloat16 (|q| <= 127), so
    # this is x @ (q * scale) up to the compute dtype's rounding of x and float32 summation.
    # XLA:CPU materialises the converted weight (fine for many rows, where the product
    # dominates). The gradient is the int8 path's (_qdot_bwd): float32, the weight constant.
    xd = jnp.asarray(x).astype(dtype)
    out = jax.lax.dot_general(xd, q.astype(dtype), (((xd.ndim - 1,), (1 if last else 0,)),
                                                    ((), ())),
                              preferred_element_type=jnp.float32)
    return out * scale, (q, scale, jnp.zeros((0,), jnp.asarray(x).dtype))


def _fdot_bwd(last, dtype, res, g):
    return _qdot_bwd(last, res, g)


_fdot.defvjp(_fdot_fwd, _fdot_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(3,))
def _qdot(x, q, scale, last):
    return _qdot_fwd(x, q, scale, last)[0]


def _qdot_fwd(x, q, scale, last):
    # last: q is [N, K] (contracted along its last axis), else [K, N].
    k = q.shape[1] if last else q.shape[0]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).astype(jnp.float32)
    rows = x2.shape[0]
    amax = jnp.max(jnp.abs(x2), axis=-1, keepdims=True)
    # amax == 0: scale 1 (the row is zeros); NaN stays NaN (and makes the row's output NaN);
    # a scale below float32's smallest normal would flush to zero.
    xs = jnp.where(amax == 0, 1.0, jnp.maximum(amax / 127.0, _TINY))
    v = x2 / xs  # in [-127, 127]
    hi = jnp.clip(jnp.round(v), -127, 127)
    lo = jnp.round((v - hi) * _LO)  # the remainder, in [-127, 127]
    xi = jnp.concatenate([hi, lo]).astype(jnp.int8)  # one product for both halves
    acc = jax.lax.dot_general(xi, q, (((1,), (1 if last else 0,)), ((), ())),
                              preferred_element_type=jnp.int32).astype(jnp.float32)
    # (xs * scale) first: acc * xs could overflow where the scaled result does not.
    out = (acc[:rows] + acc[rows:] * (1.0 / _LO)) * (xs * scale[None, :])
    return out.reshape(*lead, out.shape[-1]), (q, scale, jnp.zeros((0,), x.dtype))


def _qdot_bwd(last, res, g):
    q, scale, like = res
    g2 = g.reshape(-1, g.shape[-1]).astype(jnp.float32) * scale[None, :]
    w = q.astype(jnp.float32)
    dx = g2 @ (w if last else w.T)
    return (dx.reshape(*g.shape[:-1], dx.shape[-1]).astype(like.dtype),
            np.zeros(q.shape, jax.dtypes.float0), jnp.zeros_like(scale))


_qdot.defvjp(_qdot_fwd, _qdot_bwd)


def is_quantized(x: Any) -> bool:
    """Whether ``x`` is a :class:`QuantizedMatrix` (the ``is_leaf`` of tree maps that must not
    cast its int8 storage).

    Example:
        >>> import jax.numpy as jnp
        >>> is_quantized(jnp.ones(2)), is_quantized(quantize(jnp.ones((2, 2))))
        (False, True)
    """
    return isinstance(x, QuantizedMatrix)


@jax.jit
def _quantize_last_but_one(w):
    w = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w), axis=-2, keepdims=True)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    return jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8), scale


def quantize(w: Any, *, axis: int = -2, dtype: Any = None,
             transposed: bool = False) -> QuantizedMatrix:
    """Quantize a float matrix (or a stack ``[..., K, N]``) to int8 with one scale per slice
    along ``axis``, the contraction axis: ``scale = max|w| / 127`` over it (1 for an all-zero
    channel), ``q = round(w / scale)``; every entry is then within ``scale / 2`` of ``w``.

    Args:
        w: a float array with at least 2 axes, finite.
        axis: ``-2`` (default: a ``[K, N]`` weight, one scale per output column) or ``-1``
            (a ``[V, H]`` embedding table, one scale per row).
        dtype: the compute dtype (default: ``w``'s).
        transposed: store a ``[K, N]`` weight transposed (``q [..., N, K]``, ``scale
            [..., N, 1]``): the same matrix, in the storage XLA:CPU's int8 product reads
            fastest at decode sizes (``tests/benchmarks/profile_quant.py``). Only with
            ``axis=-2``.

    Raises:
        ValueError: ``w`` is not a float array of 2 or more axes, has non-finite entries,
            ``axis`` is not -1 or -2, or ``transposed`` is asked of a table (``axis=-1``).

    Example:
        >>> import jax.numpy as jnp
        >>> m = quantize(jnp.array([[0.0, 2.0], [0.0, -1.0]]))
        >>> m.q.tolist(), m.scale.tolist()
        ([[0, 127], [0, -64]], [[1.0, 0.015748031437397003]])
    """
    if axis not in (-1, -2):
        raise ValueError(f"quantize: expected axis -1 or -2, got {axis!r}.")
    if transposed is not False and (transposed is not True or axis != -2):
        raise ValueError(f"quantize: transposed=True stores a [K, N] weight (axis=-2) "
                         f"transposed; got transposed={transposed!r} with axis={axis}.")
    if isinstance(w, QuantizedMatrix):
        raise ValueError("quantize: the matrix is already quantized.")
    w = jnp.asarray(w)
    if w.ndim < 2 or w.dtype not in [jnp.dtype(d) for d in _FLOATS]:
        raise ValueError(f"quantize: expected a float array of 2 or more axes, got dtype "
                         f"{w.dtype} and shape {w.shape}.")
    if not bool(jnp.isfinite(w).all()):
        raise ValueError("quantize: the matrix has non-finite entries (NaN or inf).")
    dtype = w.dtype if dtype is None else jnp.dtype(dtype)
    if axis == -1:
        q, s = _quantize_last_but_one(jnp.swapaxes(w, -1, -2))
        return QuantizedMatrix(jnp.swapaxes(q, -1, -2), jnp.swapaxes(s, -1, -2), dtype)
    q, s = _quantize_last_but_one(w)
    if transposed:
        return QuantizedMatrix(jnp.swapaxes(q, -1, -2), jnp.swapaxes(s, -1, -2), dtype, True)
    return QuantizedMatrix(q, s, dtype)


def quantize_params(params: dict, quantization: str = "int8") -> dict:
    """A decoder's params with its matrices quantized (see the module docstring): each layer's
    ``wq, wk, wv, wo, w_gate, w_up, w_down`` per output column (``wq, wk, wv`` then joined into
    ``wqkv`` and ``w_gate, w_up`` into ``w_gate_up``: :data:`FUSED`), the embedding table per
    token row (it is also the tied LM head, whose outputs are those rows), an untied ``lm_head``
    per vocabulary column. The layers' matrices and an untied head are stored transposed
    (``quantize(..., transposed=True)``: faster int8 products at decode sizes). Stacked
    (``[L, K, N]``) and per-layer params both work; the compute dtype stays the params' own.
    Already-quantized matrices are kept (a layer matrix the caller quantized in ``[K, N]``
    storage is moved to the transposed one: one storage per tree, so layers stack).

    Raises:
        ValueError: an unknown ``quantization``, or params without ``embed`` and ``layers``.

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama, quant
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = quant.quantize_params(llama.random_params(jax.random.key(0), cfg))
        >>> p["layers"]["wqkv"], p["norm"].dtype  # wq, wk, wv joined: 8 + 4 + 4 columns
        (QuantizedMatrix(shape=(1, 8, 16), int8, stored transposed, dtype=float32), dtype('float32'))
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantize_params: expected quantization "
                         f"{' or '.join(map(repr, QUANTIZATIONS))}, got {quantization!r}.")
    if not isinstance(params, dict) or "embed" not in params or "layers" not in params:
        raise ValueError("quantize_params: expected decoder params with 'embed' and 'layers'.")

    def q(w, axis=-2):
        if not isinstance(w, QuantizedMatrix):
            return quantize(w, axis=axis, transposed=axis == -2)
        if axis == -1 or w.transposed:
            return w
        if w.scale.shape[-2] != 1:
            raise ValueError(f"quantize_params: a layer matrix must be a [K, N] weight with one "
                             f"scale per output column; got {w!r} with scales "
                             f"{tuple(w.scale.shape)}.")
        # A weight the caller quantized in [K, N] storage: every layer matrix is stored
        # transposed (one storage per tree: stacking layers needs equal pytree metadata).
        return QuantizedMatrix(*_as_transposed(w), w.dtype, True, w.products)

    def layer(p):
        out = {k: q(v) if k in LAYER_MATRICES else v for k, v in p.items()}
        for joined, parts in FUSED.items():
            if all(k in out for k in parts):
                ms = [out.pop(k) for k in parts]
                if len({m.products for m in ms}) > 1:
                    raise ValueError(f"quantize_params: {', '.join(parts)} are joined into "
                                     f"{joined} but multiply with different products "
                                     f"({[m.products for m in ms]}).")
                out[joined] = QuantizedMatrix(  # output columns: storage axis -2
                    jnp.concatenate([m.q for m in ms], axis=-2),
                    jnp.concatenate([m.scale for m in ms], axis=-2), ms[0].dtype, True,
                    ms[0].products)
        return out

    layers = params["layers"]
    out = {**params, "embed": q(params["embed"], axis=-1),
           "layers": tuple(map(layer, layers)) if isinstance(layers, (list, tuple))
           else layer(layers)}
    if "lm_head" in params:
        out["lm_head"] = q(params["lm_head"])
    return out


def _as_transposed(m: QuantizedMatrix) -> tuple:
    """``(q, scale)`` of ``m`` in transposed storage."""
    if m.transposed:
        return m.q, m.scale
    return jnp.swapaxes(m.q, -1, -2), jnp.swapaxes(m.scale, -1, -2)


def cast(tree: Any, dtype: Any) -> Any:
    """``tree`` with its float arrays cast to ``dtype`` and its quantized matrices computing in
    ``dtype`` (their int8 storage shared, not copied).

    Example:
        >>> import jax.numpy as jnp
        >>> t = cast({"w": quantize(jnp.ones((2, 2))), "b": jnp.ones(2)}, jnp.bfloat16)
        >>> t["w"].dtype, t["b"].dtype
        (dtype(bfloat16), dtype(bfloat16))
    """
    def one(a):
        return a.astype(dtype) if isinstance(a, QuantizedMatrix) else jnp.asarray(a, dtype)

    return jax.tree.map(one, tree, is_leaf=is_quantized)


def with_products(params: dict, products: str) -> dict:
    """Decoder ``params`` whose layer matrices (the quantized ones under ``params["layers"]``)
    multiply with ``products`` (:data:`PRODUCTS`), sharing their storage. The embedding table
    and an untied LM head keep theirs: a ``"float"`` product converts the whole matrix on every
    call, which for a ``[V, H]`` head costs more than its few rows of logits.

    Raises:
        ValueError: an unknown ``products``, or params without ``layers``.

    Example:
        >>> import jax
        >>> from langtorch.functional.models import llama, quant
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = quant.with_products(quant.quantize_params(
        ...     llama.random_params(jax.random.key(0), cfg)), "float")
        >>> p["layers"]["wqkv"].products, p["embed"].products
        ('float', 'int8')
    """
    _check_products(products, "with_products")
    if not isinstance(params, dict) or "layers" not in params:
        raise ValueError("with_products: expected decoder params with 'layers'.")

    def one(a):
        return a.with_products(products) if isinstance(a, QuantizedMatrix) else a

    return {**params, "layers": jax.tree.map(one, params["layers"], is_leaf=is_quantized)}


def leaves(tree: Any) -> list:
    """The tree's arrays, with each quantized matrix as one leaf (its ``dtype`` the compute
    dtype).

    Example:
        >>> import jax.numpy as jnp
        >>> [a.dtype for a in leaves({"w": quantize(jnp.ones((2, 2)))})]
        [dtype('float32')]
    """
    return jax.tree.leaves(tree, is_leaf=is_quantized)
