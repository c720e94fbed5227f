"""Matrix products that keep bf16 fast on CPU: bf16 operands, float32 accumulation.

Measured on this project's CPUs (XLA:CPU, same process): a bf16 x bf16 product whose *result*
is bf16 runs at or below the fp32 rate (e.g. 139 vs 155 GFLOP/s at [672, 576] x [576, 1536]),
while the same product with ``preferred_element_type=float32`` runs 5-6x faster (934 GFLOP/s),
and JAX's default backward pass of a bf16 weight product converts the weight to float32 every
step. :func:`dense` is ``x @ w`` with float32 accumulation and a custom VJP whose backward
products are bf16 x bf16 -> float32 too (no weight converts); for float32 operands it is a
plain ``x @ w``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from langtorch.functional.models.matmul import dense
    >>> x = jnp.ones((2, 3), jnp.bfloat16); w = jnp.full((3, 4), 0.5, jnp.bfloat16)
    >>> y = dense(x, w)
    >>> y.dtype, y.tolist()[0]
    (dtype(bfloat16), [1.5, 1.5, 1.5, 1.5])
    >>> jax.grad(lambda x: dense(x, w).astype(jnp.float32).sum())(x).tolist()[0]
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional.models.quant import QuantizedMatrix, quantized_dot

__all__ = ["dense", "dense_f32", "padded_rows_product", "product_min_rows"]


def _product(x, w, out_dtype, transposed):
    if transposed:  # w is [N, K]
        return jnp.einsum("...k,nk->...n", x, w, preferred_element_type=out_dtype)
    return jnp.matmul(x, w, preferred_element_type=out_dtype)


# Row counts the probe of product_min_rows compares (a row's result at each against 64 rows).
_PROBE_ROWS = (1, 2, 3, 4, 8, 16, 64)
_PROBE_LOCK = threading.Lock()
_PROBED: list[int] = []  # the probe's answer, once found


def product_min_rows() -> int:
    """The fewest rows from which a bf16 x bf16 -> float32 product computes a row bit for bit
    alike at every larger row count on this machine's CPU (at least 2), the count
    :func:`padded_rows_product` pads a bf16 product's rows up to.

    Found once per process by a bitwise probe, not a timing, so it does not move with the
    machine's load: row 0 of a ``[M, 576] x [576, 1536]`` product at M = 1, 2, 3, 4, 8, 16
    against the same row at 64 rows. Measured: on a Zen 4 and a Zen 5 class CPU (AVX512-BF16,
    no AMX) one row rounds differently and 2..64 rows alike (2); on an AMX Xeon (2026-12-07)
    one and two rows each round differently and 3..1,024 alike (3). On another backend: 2
    (unprobed; an accelerator rounds per its own kernels).

    Example:
        >>> from langtorch.functional.models.matmul import product_min_rows
        >>> product_min_rows() >= 2
        True
    """
    if jax.default_backend() != "cpu":
        return 2
    if not _PROBED:
        with _PROBE_LOCK:  # concurrent first products probe once; the others wait for it
            if not _PROBED:
                _PROBED.append(_probe_min_rows())
    return _PROBED[0]


def _probe_min_rows() -> int:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((_PROBE_ROWS[-1], 576)).astype(np.float32)
    w = (rng.standard_normal((576, 1536)) * 0.05).astype(np.float32)
    # Called while a model's product is being traced: the probe itself runs eagerly, and moves
    # its own arrays whatever transfer guard the caller set.
    # Its own jitted function: the seven programs go with it (resident memory).
    product = jax.jit(lambda x, w: _product(x, w, jnp.float32, False)[0])
    with jax.ensure_compile_time_eval(), jax.transfer_guard("allow"):
        wb = jnp.asarray(w, jnp.bfloat16)
        row = {m: np.asarray(product(jnp.asarray(x[:m], jnp.bfloat16), wb))
               for m in _PROBE_ROWS}
    del product
    # The smallest probed count from which every larger probed count agrees with 64 rows.
    differ = [m for m in _PROBE_ROWS if not np.array_equal(row[m], row[_PROBE_ROWS[-1]])]
    least = min(m for m in _PROBE_ROWS if m > max(differ, default=0))
    if least > 4:
        logging.getLogger(__name__).warning(
            "bf16 products compute a row alike only from %d rows on this CPU: fewer rows are "
            "padded up to it.", least)
    return max(2, least)


def padded_rows_product(x: jax.Array, w: jax.Array, out_dtype=jnp.float32, *,
                        transposed: bool = False) -> jax.Array:
    """``x [..., K] @ w [K, N]`` (``w [N, K]`` with ``transposed=True``) with ``out_dtype``
    accumulation; a bf16 product of fewer rows than :func:`product_min_rows` runs padded with
    zero rows up to it, an fp16 one of one row as two (see below). Other dtypes, and a 1-D
    ``x``, go straight to the product.

    Example:
        >>> import jax.numpy as jnp
        >>> x, w = jnp.ones((1, 2), jnp.bfloat16), jnp.ones((2, 3), jnp.bfloat16)
        >>> padded_rows_product(x, w).tolist()
        [[2.0, 2.0, 2.0]]
    """
    # XLA:CPU runs a bf16 x bf16 -> f32 product with ONE row on a slow generic path (measured on
    # a Zen 4: 30 products [1, 576] x [576, 1536] 32.7 ms, vs 3.8 ms with two rows), and a bf16
    # row's result at a few rows differs in the last bits from the same row's result in a
    # product of more rows (product_min_rows: from 2 rows alike on a Zen 4, from 3 on an AMX
    # Xeon). Fewer rows are padded with zero rows, so the product is fast and a bf16 row's
    # result does not depend on how many rows share it (a decode step's rows, a prefill call's
    # logits). fp16 rows keep the speed only: on the AMX Xeon they differed up to 16 rows.
    lead = x.shape[:-1]
    if not lead or x.dtype not in (jnp.bfloat16, jnp.float16):
        return _product(x, w, out_dtype, transposed)
    rows = int(np.prod(lead))
    least = product_min_rows() if x.dtype == jnp.bfloat16 else 2
    if rows == 0 or rows >= least:
        return _product(x, w, out_dtype, transposed)
    flat = x.reshape(rows, x.shape[-1])
    padded = jnp.concatenate([flat, jnp.zeros((least - rows, x.shape[-1]), x.dtype)], axis=0)
    out = _product(padded, w, out_dtype, transposed)[:rows]
    return out.reshape(*lead, out.shape[-1])


def _acc32(x: jax.Array, w: jax.Array) -> jax.Array:
    return padded_rows_product(x, w, jnp.float32).astype(x.dtype)


@jax.custom_vjp
def _dense_lowp(x: jax.Array, w: jax.Array) -> jax.Array:
    return _acc32(x, w)


def _dense_fwd(x, w):
    return _acc32(x, w), (x, w)


def _dense_bwd(res, g):
    x, w = res
    g = g.astype(x.dtype)
    dx = _acc32(g, w.T)
    # Unused (and removed by XLA) when only activations or a prompt are differentiated.
    dw = jnp.einsum("...i,...j->ij", x, g, preferred_element_type=jnp.float32).astype(w.dtype)
    return dx, dw


_dense_lowp.defvjp(_dense_fwd, _dense_bwd)


@jax.custom_vjp
def _dense_lowp_f32(x: jax.Array, w: jax.Array) -> jax.Array:
    return padded_rows_product(x, w, jnp.float32)


def _dense_f32_fwd(x, w):
    return _dense_lowp_f32(x, w), (x, w)


def _dense_f32_bwd(res, g):
    x, w = res
    # The cotangent goes back to the operands' precision before the products, so they stay on
    # the fast bf16 x bf16 -> f32 path (an f32 cotangent would upcast the weight every step).
    return _dense_bwd(res, g.astype(x.dtype))


_dense_lowp_f32.defvjp(_dense_f32_fwd, _dense_f32_bwd)


def _check(name: str, x: jax.Array, w: jax.Array) -> None:
    # The custom VJPs transpose ``w`` and sum the weight gradient over every leading axis of
    # ``x``: they are only right for a single [K, N] matrix (batched weights would work in the
    # forward pass and fail, or be wrong, in the backward one, and only in bf16).
    if jnp.ndim(w) != 2 or jnp.ndim(x) < 1 or jnp.shape(x)[-1] != jnp.shape(w)[0]:
        raise ValueError(f"{name}: expected x [..., K] and w [K, N], got x shape "
                         f"{jnp.shape(x)} and w shape {jnp.shape(w)}.")


def dense_f32(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x [..., K] @ w [K, N]`` as float32 (e.g. logits); bf16/fp16 operands stay low
    precision in the backward products too.

    Example:
        >>> import jax.numpy as jnp
        >>> dense_f32(jnp.ones((1, 2), jnp.bfloat16), jnp.ones((2, 2), jnp.bfloat16)).dtype
        dtype('float32')
    """
    _check("dense_f32", x, w)
    if isinstance(w, QuantizedMatrix):
        return quantized_dot(x, w)
    if x.dtype == w.dtype and x.dtype in (jnp.bfloat16, jnp.float16):
        return _dense_lowp_f32(x, w)
    return jnp.matmul(x, w, preferred_element_type=jnp.float32)


def dense(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x [..., K] @ w [K, N]`` in ``x``'s dtype; bf16/fp16 operands accumulate in float32.

    ``w`` may be a :class:`~langtorch.functional.models.quant.QuantizedMatrix`: each row of
    ``x`` is then quantized to int8 too (one scale per row) and the product accumulates
    exactly in int32 (see :mod:`~langtorch.functional.models.quant`).

    ``w`` must be one matrix (``vmap`` over a stack of them works). The bf16/fp16 path has a
    custom VJP: reverse mode (``grad``, ``vjp``, grad-of-grad) works, forward mode
    (``jvp``, ``jacfwd``) does not. Raises ``ValueError`` for other shapes.

    Example:
        >>> import jax.numpy as jnp
        >>> dense(jnp.ones((1, 2)), jnp.ones((2, 2))).tolist()
        [[2.0, 2.0]]
    """
    _check("dense", x, w)
    if isinstance(w, QuantizedMatrix):
        return quantized_dot(x, w).astype(x.dtype)
    if x.dtype == w.dtype and x.dtype in (jnp.bfloat16, jnp.float16):
        return _dense_lowp(x, w)
    return x @ w
