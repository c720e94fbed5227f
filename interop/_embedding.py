"""``TextTensor.embedding`` as a torch tensor in one call."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch

from langtorch.interop._convert import to_torch
from langtorch.interop._errors import InteropError

__all__ = ["embedding_to_torch"]


def embedding_to_torch(t: Any, *, dtype: torch.dtype | None = None,
                       device: str | torch.device | None = None) -> torch.Tensor:
    """The embedding of a TextTensor (shape ``t.shape + (d,)``) as a torch tensor.

    A JAX embedding is shared zero-copy through DLPack; a writable numpy embedding through
    ``torch.from_numpy``; a read-only numpy array is copied (torch cannot mark a tensor
    read-only). ``dtype``/``device`` convert afterwards (a copy only when they differ).

    Args:
        t: a ``TextTensor`` (anything with an ``.embedding`` attribute) whose embedding is set.
        dtype: optional torch dtype of the result.
        device: optional torch device of the result.

    Raises:
        InteropError: the tensor has no embedding yet.

    Example:
        >>> import jax.numpy as jnp
        >>> from langtorch.functional import TextTensor
        >>> from langtorch.interop import embedding_to_torch
        >>> tt = TextTensor(["a", "b"]).with_embedding(jnp.ones((2, 3)))
        >>> e = embedding_to_torch(tt)
        >>> e.shape, e.data_ptr() == tt.embedding.unsafe_buffer_pointer()
        (torch.Size([2, 3]), True)
    """
    emb = getattr(t, "embedding", None)
    if emb is None:
        raise InteropError(
            f"embedding_to_torch expected a TextTensor with an embedding, got "
            f"{type(t).__name__} with embedding=None; fill it first (t.embed() or "
            "t.with_embedding(array))."
        )
    if isinstance(emb, torch.Tensor):
        out = emb
    elif isinstance(emb, jax.Array):
        out = to_torch(emb)
    else:
        arr = np.asarray(emb)
        out = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    if dtype is not None or device is not None:
        out = out.to(device=device, dtype=dtype)
    return out
