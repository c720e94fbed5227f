"""DLPack exchange of tensors and pytrees of tensors between torch and JAX.

Both directions share memory when the buffer allows it (same device, a dtype both sides know, and
for JAX an aligned data pointer — a slice starting mid-element-block is copied by JAX itself).

Why each step of ``to_jax`` exists:

* ``detach()``: JAX cannot see torch's autograd graph; gradients cross through
  :func:`langtorch.interop.jax_function` instead.
* ``resolve_conj()`` / ``resolve_neg()``: torch may represent ``x.conj()`` or ``-x`` lazily as a
  flag on a view of the same memory; DLPack has no such flag, so JAX would read the wrong values.
* ``contiguous()``: XLA buffers are dense row-major; a transposed or strided view is copied.
* 64-bit check: with ``jax_enable_x64`` off, JAX canonicalises int64/float64 to 32 bits *by
  copying*, which silently truncates token ids above 2**31 and loses precision. We refuse instead.

``to_torch`` is ``torch.from_dlpack``: JAX's ``__dlpack__`` blocks until the array is computed (or,
on GPU, makes torch's current stream wait for it), so torch never reads a buffer JAX is still
writing.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from langtorch.interop._errors import DtypeNarrowingError, InteropError

__all__ = ["to_jax", "to_torch", "x64_enabled"]

# Fast path for CPU tensors: the public jax.dlpack.from_dlpack spends ~2/3 of its ~40 us on
# device lookups and a dtype canonicalisation that is a no-op for the dtypes we let through.
# We call the same jaxlib entry point it uses, and fall back to the public API whenever this
# private one is missing or its signature changed (checked once, below).
try:
    from jax._src.lib import _jax as _jaxlib
    from jax._src.lib import jaxlib_extension_version as _jaxlib_version

    _FAST = _jaxlib_version >= 467 and hasattr(_jaxlib, "dlpack_managed_tensor_to_buffer")
except ImportError:  # pragma: no cover - depends on the installed jaxlib
    _FAST = False
try:
    from jaxlib._jax import ArrayImpl as _ArrayImpl
except ImportError:  # pragma: no cover
    _ArrayImpl = None
_CPU_DEVICE: list = []  # filled lazily (creating the backend at import would be a side effect)
_KDLCPU = 1

_WIDE_TORCH = {
    torch.int64: "int64",
    torch.float64: "float64",
    torch.complex128: "complex128",
    torch.uint64: "uint64",
}


def x64_enabled() -> bool:
    """Whether JAX 64-bit types are on (globally or inside ``with jax.enable_x64(True):``).

    Example:
        >>> import jax
        >>> from langtorch.interop import x64_enabled
        >>> with jax.enable_x64(True):
        ...     x64_enabled()
        True
    """
    return bool(jax.config.jax_enable_x64)


def narrowing_error(what: str, shape: tuple, name: str) -> DtypeNarrowingError:
    """The error for a 64-bit value that JAX (x64 off) would silently narrow to 32 bits."""
    narrow = name.replace("128", "64") if name.startswith("complex") else name.replace("64", "32")
    return DtypeNarrowingError(
        f"to_jax got {what} of shape {shape} but JAX 64-bit types are off, so JAX would silently "
        f"narrow it to {narrow}. Either cast it explicitly (e.g. to {narrow}), or enable x64: set "
        "JAX_ENABLE_X64=1 before starting Python, call jax.config.update('jax_enable_x64', True), "
        "or use `with jax.enable_x64(True):`."
    )


def _tensor_to_jax(t: torch.Tensor, copy: bool) -> jax.Array:
    if t.layout is not torch.strided:
        raise InteropError(
            f"to_jax expects a dense (strided) tensor, got layout {t.layout}; "
            "call .to_dense() first."
        )
    if t.dtype in _WIDE_TORCH and not x64_enabled():
        raise narrowing_error(f"a torch.{_WIDE_TORCH[t.dtype]} tensor", tuple(t.shape),
                              _WIDE_TORCH[t.dtype])
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    if _FAST and not copy and t.device.type == "cpu":
        return _fast_cpu_from_dlpack(t)
    # copy=None lets JAX share the buffer when it can (and copy an unaligned one).
    return jax.dlpack.from_dlpack(t, copy=True if copy else None)


def _fast_cpu_from_dlpack(t: torch.Tensor) -> jax.Array:
    global _FAST
    if not _CPU_DEVICE:
        _CPU_DEVICE.append(jax.devices("cpu")[0])
    try:
        # copy=None: share the buffer when aligned, else XLA copies it
        return _jaxlib.dlpack_managed_tensor_to_buffer(
            t.__dlpack__(), _CPU_DEVICE[0], None, None, _KDLCPU)
    except TypeError:  # pragma: no cover - private signature changed: use the public API
        _FAST = False
        return jax.dlpack.from_dlpack(t)


def _array_to_torch(a: jax.Array, copy: bool) -> torch.Tensor:
    if a.dtype.kind == "V" and a.dtype == jax.dtypes.float0:  # bfloat16 is kind "V" too
        # float0 is JAX's "no gradient" marker (cotangent of an integer); it has no DLPack code.
        return torch.zeros(a.shape, dtype=torch.bool)
    try:
        t = torch.from_dlpack(a)
    except Exception as e:  # noqa: BLE001 - re-raised with the likely cause
        n = len(a.devices())
        if n != 1:
            raise InteropError(
                f"to_torch expects a JAX array on one device, got one sharded over {n} devices; "
                "gather it first (jax.device_get or a single-device jax.device_put)."
            ) from e
        raise
    return t.clone() if copy else t


def _is_jax_array(x: Any) -> bool:
    return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)


def to_jax(x: Any, *, copy: bool = False) -> Any:
    """Convert a torch tensor, or every tensor leaf of a pytree, to a JAX array.

    Shares memory (zero-copy via DLPack) when the buffer allows; other leaves are returned as they
    are. The result is detached: use :func:`jax_function` to differentiate through JAX.

    Args:
        x: a ``torch.Tensor`` or a pytree (dicts, lists, tuples, ...) whose leaves may be tensors.
        copy: always copy instead of sharing memory.

    Returns:
        The same structure with ``jax.Array`` leaves in place of tensors.

    Raises:
        DtypeNarrowingError: a 64-bit tensor while JAX x64 is disabled.
        InteropError: a sparse tensor.

    Example:
        >>> import torch
        >>> from langtorch.interop import to_jax
        >>> t = torch.arange(4.0)
        >>> a = to_jax(t)
        >>> a.unsafe_buffer_pointer() == t.data_ptr()
        True
        >>> tree = to_jax({"w": t, "n": 3})
        >>> type(tree["w"]).__name__ != "Tensor", tree["n"]
        (True, 3)
    """
    if isinstance(x, torch.Tensor):
        return _tensor_to_jax(x, copy)
    return jax.tree_util.tree_map(
        lambda leaf: _tensor_to_jax(leaf, copy) if isinstance(leaf, torch.Tensor) else leaf, x
    )


def to_torch(x: Any, *, copy: bool = False) -> Any:
    """Convert a JAX array, or every JAX-array leaf of a pytree, to a torch tensor.

    Shares memory via DLPack and waits until JAX has finished computing the array (JAX dispatches
    asynchronously). JAX treats its arrays as immutable: do not write into a shared result while
    the JAX array is still in use, or pass ``copy=True``.

    Args:
        x: a ``jax.Array`` or a pytree whose leaves may be JAX arrays (numpy arrays are converted
            with ``torch.from_numpy``, also zero-copy); other leaves are returned as they are.
        copy: return tensors that own their memory.

    Returns:
        The same structure with ``torch.Tensor`` leaves.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.interop import to_torch
        >>> a = jnp.arange(3.0)
        >>> t = to_torch(a)
        >>> t.data_ptr() == a.unsafe_buffer_pointer(), t.tolist()
        (True, [0.0, 1.0, 2.0])
    """

    def conv(leaf):
        if _is_jax_array(leaf):
            return _array_to_torch(leaf, copy)
        if isinstance(leaf, np.ndarray):
            t = torch.from_numpy(leaf)
            return t.clone() if copy else t
        if isinstance(leaf, jax.core.Tracer):
            raise InteropError(
                "to_torch got a JAX tracer: it was called inside jax.jit/grad/vmap, where values "
                "are abstract. Convert after the transformed function returns, or wrap the torch "
                "side with jax.pure_callback."
            )
        return leaf

    if type(x) is _ArrayImpl:  # the common case, without the ABC isinstance checks
        return _array_to_torch(x, copy)
    if _is_jax_array(x) or isinstance(x, (np.ndarray, jax.core.Tracer)):
        return conv(x)
    return jax.tree_util.tree_map(conv, x)
