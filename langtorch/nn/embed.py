"""Embeddings as a text module: :class:`Embed`."""

from __future__ import annotations

from typing import Any

from langtorch import tracing
from langtorch.backends.base import Backend
from langtorch.core.sync import run_sync
from langtorch.nn._requests import as_text_tensor
from langtorch.nn.modules import TModule
from langtorch.runtime import aembed
from langtorch.tensor import TextTensor

__all__ = ["Embed"]


class Embed(TModule):
    """Embeddings as a text module: ``Embed(backend)(x)`` returns ``x`` with ``.embedding`` set.

    Inputs are sent many per request (``backend.options.embed_batch_size``), distinct texts
    only, concurrently under the backend's limits and retries. ``backend=None`` uses the local
    default embedding model (all-MiniLM-L6-v2 through ``langtorch.models``), with no network.

    Args:
        backend: a :class:`~langtorch.backends.Backend` with an embeddings endpoint, or ``None``.
        **params: extra embeddings parameters (``dimensions``, ...).

    Example:
        >>> import langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> with OpenAIServer(embedding_dim=4) as server:
        ...     embed = lt.nn.Embed(OpenAIBackend("e", base_url=server.url, api_key="sk-test1234"))
        ...     embed(lt.TextTensor([["a", "b", "c"]])).embedding.shape
        (1, 3, 4)
    """

    _trace_kind = None  # opens its own "embed" span

    def __init__(self, backend: Backend | None = None, **params: Any):
        super().__init__()
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"Embed expected a langtorch.backends.Backend or None, got {type(backend).__name__}.")
        self.backend = backend
        self.params = dict(params)
        self.last_usage = None

    async def acall(self, x: Any) -> TextTensor:
        """Asynchronous forward."""
        x = as_text_tensor(x)
        if self.backend is None:
            return self._local(x)
        tokens = self._enter_scope()
        try:
            return await self._aembed(x)
        finally:
            self._exit_scope(tokens)

    async def _aembed(self, x: TextTensor) -> TextTensor:
        model = str(self.params.get("model") or self.backend.model)
        with tracing.span("embed", "Embed", inputs=[x], attrs={"model": model}, backend=self.backend) as span:
            vectors, usage = await aembed(self.backend, x.texts.reshape(-1).tolist(), **self.params)
            self.last_usage = usage
            if span is not None:
                span.usage = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": 0}
                span.attrs["dimensions"] = int(vectors.shape[-1])
            out = x.with_embedding(vectors.reshape(x.shape + vectors.shape[-1:]))
            tracing.set_outputs(span, out, metadata=False)
            return out

    def _local(self, x: TextTensor) -> TextTensor:
        with tracing.span("embed", "Embed", inputs=[x], attrs={"model": "all-MiniLM-L6-v2 (local)"}) as span:
            out = x.embed() if hasattr(x, "embed") else TextTensor(x).embed()
            if span is not None:
                span.attrs["dimensions"] = int(out.embedding.shape[-1])
            tracing.set_outputs(span, out, metadata=False)
            return out

    def forward(self, x: Any) -> TextTensor:
        """Embed every entry of ``x``; returns ``x`` with ``.embedding`` of shape ``shape + (d,)``."""
        x = as_text_tensor(x)
        if self.backend is None:
            return self._local(x)
        return run_sync(self.acall(x))
