"""langtorch.interop — where torch and JAX meet.

DLPack exchange (:func:`to_jax`, :func:`to_torch`, :func:`embedding_to_torch`), the autograd
bridge (:func:`jax_function`), the generic ``(init, apply)`` -> ``nn.Module`` wrapper
(:class:`JaxModule`) and the torch modules built on it (:class:`SoftPrompt`,
:class:`MiniLMEncoder`, :class:`SmolLM2Decoder`). Imports torch, JAX and ``langtorch.functional``
only. See ``docs/interop.md``.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from langtorch.interop import jax_function
    >>> sin = jax_function(jnp.sin)
    >>> x = torch.zeros(3, requires_grad=True)
    >>> sin(x).sum().backward()
    >>> x.grad.tolist()
    [1.0, 1.0, 1.0]
"""

from langtorch.interop._bridge import JaxFunction, jax_function
from langtorch.interop._convert import to_jax, to_torch, x64_enabled
from langtorch.interop._embedding import embedding_to_torch
from langtorch.interop._errors import DoubleBackwardError, DtypeNarrowingError, InteropError
from langtorch.interop._models import MiniLMEncoder, SmolLM2Decoder, SoftPrompt
from langtorch.interop._module import JaxModule

__all__ = [
    "DoubleBackwardError",
    "DtypeNarrowingError",
    "InteropError",
    "JaxFunction",
    "JaxModule",
    "MiniLMEncoder",
    "SmolLM2Decoder",
    "SoftPrompt",
    "embedding_to_torch",
    "jax_function",
    "to_jax",
    "to_torch",
    "x64_enabled",
]
