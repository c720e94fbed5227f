"""Device-mesh helpers shared by the mesh-aware entry points (embeddings, top-k, tuning, decode).

Everything here is plain JAX sharding: a :class:`jax.sharding.Mesh` with a ``data`` axis (and
optionally a ``model`` axis), :class:`~jax.sharding.NamedSharding` placements, and XLA doing the
collectives. ``mesh="auto"`` means every local device on one ``data`` axis.

Example:
    >>> import numpy as np
    >>> from langtorch.functional import sharding as S
    >>> mesh = S.resolve_mesh("auto")
    >>> S.data_size(mesh) == len(mesh.devices.reshape(-1))
    True
    >>> x, n = S.pad_to_multiple(np.arange(5), 4)
    >>> x.tolist(), n
    ([0, 1, 2, 3, 4, 0, 0, 0], 5)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "DATA",
    "MODEL",
    "resolve_mesh",
    "data_size",
    "pad_to_multiple",
    "data_sharding",
    "replicated",
    "shard_batch",
    "replicate",
    "shard_params",
    "check_placement",
    "check_local",
]

DATA = "data"
"""Name of the mesh axis that batches (rows, corpus rows, decode slots) are split along."""
MODEL = "model"
"""Name of the optional mesh axis that frozen weights may be split along."""


def resolve_mesh(mesh: Any, *, name: str = "mesh") -> Mesh | None:
    """``None`` -> ``None``; ``"auto"`` -> all local devices on a ``data`` axis; a Mesh is checked.

    Args:
        mesh: ``None``, ``"auto"`` or a :class:`jax.sharding.Mesh` that has a ``data`` axis.
        name: the parameter name used in error messages.

    Raises:
        TypeError: ``mesh`` is none of these.
        ValueError: a Mesh without a ``data`` axis.

    Example:
        >>> from langtorch.functional.sharding import resolve_mesh
        >>> resolve_mesh(None) is None
        True
        >>> resolve_mesh("auto").axis_names
        ('data',)
    """
    if mesh is None:
        return None
    if isinstance(mesh, str):
        if mesh != "auto":
            raise ValueError(f"{name}: expected a jax.sharding.Mesh, 'auto' or None, got {mesh!r}.")
        return Mesh(np.array(jax.local_devices()), (DATA,))
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{name}: expected a jax.sharding.Mesh, 'auto' or None, "
                        f"got {type(mesh).__name__}.")
    if DATA not in mesh.axis_names:
        raise ValueError(f"{name}: the mesh needs a {DATA!r} axis, got axes {mesh.axis_names}.")
    return mesh


def data_size(mesh: Mesh | None) -> int:
    """Number of shards along the ``data`` axis (1 without a mesh).

    Example:
        >>> from langtorch.functional.sharding import data_size
        >>> data_size(None)
        1
    """
    return 1 if mesh is None else int(mesh.shape[DATA])


def pad_to_multiple(x: Any, multiple: int, *, axis: int = 0, value: Any = 0) -> tuple[np.ndarray, int]:
    """Pad ``x`` along ``axis`` with ``value`` up to a multiple of ``multiple``.

    Returns ``(padded, original_length)``; a length already divisible is returned unchanged, and
    an empty axis stays empty.

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.sharding import pad_to_multiple
        >>> pad_to_multiple(np.ones((3, 2)), 2)[0].shape
        (4, 2)
    """
    if multiple < 1:
        raise ValueError(f"pad_to_multiple: expected multiple >= 1, got {multiple}.")
    x = np.asarray(x)
    n = x.shape[axis]
    extra = (-n) % multiple
    if extra == 0:
        return x, n
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return np.pad(x, widths, constant_values=value), n


def data_sharding(mesh: Mesh, ndim: int, *, axis: int = 0) -> NamedSharding:
    """A NamedSharding that splits dimension ``axis`` of an ``ndim``-d array along ``data``.

    Example:
        >>> from langtorch.functional.sharding import data_sharding, resolve_mesh
        >>> tuple(data_sharding(resolve_mesh("auto"), 2).spec)
        ('data', None)
    """
    spec = [None] * ndim
    spec[axis] = DATA
    return NamedSharding(mesh, PartitionSpec(*spec))


def replicated(mesh: Mesh) -> NamedSharding:
    """The fully replicated NamedSharding on ``mesh``.

    Example:
        >>> from langtorch.functional.sharding import replicated, resolve_mesh
        >>> tuple(replicated(resolve_mesh("auto")).spec)
        ()
    """
    return NamedSharding(mesh, PartitionSpec())


def _describe(sharding: Any) -> str:
    if isinstance(sharding, NamedSharding):
        devs = sorted(d.id for d in sharding.mesh.devices.reshape(-1))
        return f"NamedSharding(spec={sharding.spec}, mesh axes={dict(sharding.mesh.shape)}, devices={devs})"
    return repr(sharding)


def check_placement(x: Any, mesh: Mesh, *, name: str, want: Any = None) -> None:
    """Raise if ``x`` is a JAX array explicitly placed on devices outside ``mesh``.

    Uncommitted arrays (``jnp.asarray`` results) and numpy inputs are free to move; a committed
    array (``jax.device_put(x, device)`` or a sharded array) must live on exactly the mesh's
    devices, otherwise mixing the two placements is ambiguous and we refuse it.

    Raises:
        ValueError: naming the parameter, the array's sharding and the mesh's sharding.

    Example:
        >>> import jax, numpy as np
        >>> from langtorch.functional.sharding import check_placement, resolve_mesh
        >>> check_placement(np.ones(3), resolve_mesh("auto"), name="corpus")  # numpy: fine
    """
    if not isinstance(x, jax.Array) or not getattr(x, "committed", False):
        return
    mesh_devices = set(mesh.devices.reshape(-1).tolist())
    if set(x.sharding.device_set) == mesh_devices:
        return
    want = want if want is not None else data_sharding(mesh, max(x.ndim, 1))
    raise ValueError(
        f"{name}: the array is explicitly placed with {_describe(x.sharding)}, but mesh= asks for "
        f"{_describe(want)}. Pass a numpy array (or an uncommitted jnp array), place it on the "
        f"mesh's devices, or drop mesh=.")


def check_local(mesh: Mesh, *, name: str = "mesh") -> None:
    """Raise if ``mesh`` holds devices of other processes (a multi-host global mesh).

    The embedding and top-k entry points return host (numpy) arrays, which JAX cannot fetch
    from an array split over devices this process cannot address; each process uses a mesh of
    its own devices (``"auto"``) and the results are combined across processes on the host
    (``langtorch.distributed.gather`` / ``langtorch.distributed.topk``).

    Raises:
        ValueError: naming the parameter and the other processes.

    Example:
        >>> from langtorch.functional.sharding import check_local, resolve_mesh
        >>> check_local(resolve_mesh("auto"))  # local devices: fine
    """
    here = jax.process_index()
    others = sorted({int(d.process_index) for d in mesh.devices.reshape(-1)} - {here})
    if others:
        raise ValueError(
            f"{name}: the mesh spans devices of other processes {others} (this is process "
            f"{here}); results come back as host arrays, which JAX cannot fetch from devices "
            f"of other processes. Give each process a mesh of its own devices (mesh='auto') "
            f"and combine the results with langtorch.distributed.gather / topk.")


def shard_batch(x: Any, mesh: Mesh, *, name: str = "batch", axis: int = 0,
                value: Any = 0) -> tuple[jax.Array, int]:
    """Pad ``x`` along ``axis`` to a multiple of the ``data`` size and place it split along ``data``.

    Returns ``(sharded_array, original_length)``. The padding rows are real rows to whoever
    reads the array: pass ``original_length`` on (``topk(..., rows=n)``) or slice them off.

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.sharding import resolve_mesh, shard_batch
        >>> arr, n = shard_batch(np.arange(3), resolve_mesh("auto"))
        >>> n, tuple(arr.sharding.spec)
        (3, ('data',))
    """
    check_placement(x, mesh, name=name)
    padded, n = pad_to_multiple(np.asarray(x), data_size(mesh), axis=axis, value=value)
    return jax.device_put(padded, data_sharding(mesh, padded.ndim, axis=axis)), n


def replicate(tree: Any, mesh: Mesh, *, name: str = "params", memo: dict | None = None) -> Any:
    """Place every array of a pytree fully replicated on ``mesh``.

    ``memo`` (a dict kept by the caller across calls) places an array that several trees share
    once: trees that share arrays before (e.g. an fp32 and a bf16 view of one int8 matrix)
    share their replicated copies after.

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.sharding import replicate, resolve_mesh
        >>> tuple(replicate({"w": np.ones(2)}, resolve_mesh("auto"))["w"].sharding.spec)
        ()
    """
    rep = replicated(mesh)

    def put(a):
        if memo is not None and id(a) in memo:
            return memo[id(a)][1]
        check_placement(a, mesh, name=name, want=rep)
        placed = jax.device_put(a, rep)
        if memo is not None:
            memo[id(a)] = (a, placed)  # (the source kept alive: its id stays unique)
        return placed

    return jax.tree.map(put, tree)


def shard_params(tree: Any, mesh: Mesh, *, name: str = "params") -> Any:
    """Split frozen weights along the mesh's ``model`` axis (replicated along ``data``).

    Each array with at least two dimensions is split on its largest dimension that the
    ``model`` axis size divides; the others (vectors, scalars, indivisible shapes) are
    replicated. Without a ``model`` axis everything is replicated (:func:`replicate`). XLA's
    SPMD partitioner inserts the collectives a sharded matmul needs.

    Example:
        >>> import numpy as np
        >>> from langtorch.functional.sharding import resolve_mesh, shard_params
        >>> tuple(shard_params({"w": np.ones((4, 2))}, resolve_mesh("auto"))["w"].sharding.spec)
        ()
    """
    if MODEL not in mesh.axis_names or mesh.shape[MODEL] == 1:
        return replicate(tree, mesh, name=name)
    m = int(mesh.shape[MODEL])

    def put(a):
        check_placement(a, mesh, name=name, want=replicated(mesh))
        shape = np.shape(a)
        dims = [d for d in sorted(range(len(shape)), key=lambda d: -shape[d])
                if len(shape) >= 2 and shape[d] % m == 0]
        if not dims:
            return jax.device_put(a, replicated(mesh))
        spec = [None] * len(shape)
        spec[dims[0]] = MODEL
        return jax.device_put(a, NamedSharding(mesh, PartitionSpec(*spec)))

    return jax.tree.map(put, tree)
