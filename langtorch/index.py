"""``lt.Index``: a small vector index of passages for retrieval (RAG), on ``F.topk``.

An :class:`Index` holds texts, their embeddings (``[N, d]`` float32) and optional per-passage
metadata columns. ``search(queries, k)`` embeds the queries with the same embedder and returns
a ``queries.shape + (k,)`` TextTensor of passages (data, never templates) carrying ``score`` and
``index`` metadata, plus the passages' own metadata. Search is exact (brute force, streamed in
chunks by :func:`langtorch.functional.embedding.topk`), which is right up to millions of
passages on one machine.

Files: ``save(path)`` writes ``path/embeddings.safetensors`` (one tensor, ``embeddings``) and
``path/index.json`` (format tag, version, metric, dimension, texts, metadata columns). No pickle:
``load`` reads only these two files and checks that they agree before building the index.

Example:
    >>> import numpy as np, langtorch as lt
    >>> def embedder(texts):   # any callable list[str] -> [N, d] works; None = local MiniLM
    ...     return np.array([[t.count("a"), t.count("b"), 1.0] for t in texts], dtype=np.float32)
    >>> index = lt.Index(["aaa", "bbb", "ab"], embedder=embedder)
    >>> hits = index.search(["a"], k=2)
    >>> hits.shape, hits[0, 0].item(), hits.metadata["index"].tolist()
    ((1, 2), 'aaa', [[0, 2]])
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.core import user_path
from langtorch.functional.text import STRING_DTYPE
from langtorch.functional.text import TextTensor as _BaseTensor
from langtorch.tensor import TextTensor

__all__ = ["Index"]

_FORMAT = "langtorch.Index"
_VERSION = 1
_EMBEDDINGS = "embeddings.safetensors"
_JSON = "index.json"
_RESERVED = ("score", "index")  # metadata search() sets on every hit


def _embed_function(embedder: Any) -> Callable[[list[str]], np.ndarray]:
    """``list[str] -> [N, d] float32`` from: None (local MiniLM), a Backend (its embeddings
    endpoint through the runtime), an object with ``embed_texts``, or a callable."""
    if embedder is None:
        from langtorch.models import default_embedder

        return default_embedder().embed_texts
    from langtorch.backends.base import Backend

    if isinstance(embedder, Backend):
        from langtorch.runtime import embed

        return lambda texts: embed(embedder, texts)[0]
    fn = getattr(embedder, "embed_texts", embedder)
    if not callable(fn):
        raise TypeError(
            "Index(embedder=...) must be None (local all-MiniLM-L6-v2), a langtorch Backend, an "
            f"object with embed_texts(texts), or a callable texts -> [N, d] array; got {embedder!r}"
        )
    return fn


def _check_matrix(x: Any, n: int, what: str) -> np.ndarray:
    try:  # a copy: the caller's array may change later, the index must not
        arr = np.array(x, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} must be an [N, d] array of numbers ({e})") from None
    if arr.ndim != 2 or arr.shape[0] != n or arr.shape[1] == 0:
        raise ValueError(f"{what} must have shape [{n}, d] (d >= 1) for {n} texts, got {tuple(arr.shape)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} holds NaN or infinite values")
    return arr


def _json_value(v: Any, key: str) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or isinstance(v, (str, bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    raise TypeError(f"Index metadata column {key!r} holds {type(v).__name__}; only str, int, "
                    "float, bool and None can be saved")


def _column(values: list[Any]) -> np.ndarray:
    """A metadata column with its natural dtype (str, int, float, bool; float with ``None`` ->
    float with NaN), else object."""
    kinds = {type(v) for v in values}
    if kinds == {float, type(None)}:  # NaN is stored as None (JSON has no NaN): a float column again
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    if len(kinds) == 1 and kinds <= {str, int, float, bool}:
        arr = np.asarray(values)
        return arr.astype(STRING_DTYPE) if arr.dtype.kind == "U" else arr
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


class Index:
    """Texts + embeddings for top-``k`` retrieval; see the module docstring.

    Args:
        texts: the passages (``str``, list of ``str``, or a TextTensor whose metadata columns
            are kept per passage and whose ``.embedding``, if set, is used as is).
        embeddings: optional ``[N, d]`` vectors for ``texts`` (otherwise they are embedded).
        embedder: how texts become vectors: ``None`` (local all-MiniLM-L6-v2), a langtorch
            Backend (its embeddings endpoint), an object with ``embed_texts`` or a callable
            ``list[str] -> [N, d]``. Queries are embedded with it too.
        metric: ``"cosine"`` (default) or ``"dot"``.
        metadata: optional per-passage columns, ``{key: [N values]}`` (not ``"score"`` or
            ``"index"``: :meth:`search` sets those on every hit).

    Example:
        >>> import numpy as np, langtorch as lt
        >>> index = lt.Index(["x", "y"], embeddings=np.eye(2), embedder=lambda ts: np.eye(2)[:len(ts)])
        >>> len(index), index.dim
        (2, 2)
    """

    def __init__(self, texts: Any = None, embeddings: Any = None, *, embedder: Any = None,
                 metric: str = "cosine", metadata: Mapping[str, Any] | None = None):
        if metric not in ("cosine", "dot"):
            raise ValueError(f"Index(metric=...) must be 'cosine' or 'dot', got {metric!r}")
        self.metric = metric
        self.embedder = embedder
        self._embed_fn: Callable[[list[str]], np.ndarray] | None = None
        self._texts: list[str] = []
        self._vectors: np.ndarray | None = None
        self._metadata: dict[str, list[Any]] = {}
        self._arrays: tuple[np.ndarray, dict[str, np.ndarray]] | None = None  # search's, per add
        if texts is not None:
            self.add(texts, embeddings, metadata=metadata)
        elif embeddings is not None or metadata:
            raise ValueError("Index: embeddings/metadata were given without texts")

    # ------------------------------------------------------------------------------ building
    def _embed(self, texts: list[str]) -> np.ndarray:
        if self._embed_fn is None:
            self._embed_fn = _embed_function(self.embedder)
        return _check_matrix(self._embed_fn(texts), len(texts), "the embedder's output")

    def add(self, texts: Any, embeddings: Any = None, *, metadata: Mapping[str, Any] | None = None) -> Index:
        """Append passages (embedding them unless ``embeddings`` is given); returns the index.

        Metadata columns must be the same for every ``add`` (a column missing in a later call is
        an error, so no passage silently lacks a value).

        Example:
            >>> import numpy as np, langtorch as lt
            >>> index = lt.Index(embedder=lambda ts: np.ones((len(ts), 3)))
            >>> len(index.add(["a", "b"], metadata={"source": ["x", "y"]}))
            2
        """
        meta_in: dict[str, Any] = {}
        if isinstance(texts, _BaseTensor):
            t = texts.reshape(-1) if texts.ndim != 1 else texts
            if embeddings is None and t.embedding is not None:
                embeddings = np.asarray(t.embedding)
            meta_in.update({k: t.metadata.column(k).tolist() for k in t.metadata})
            items = t.tolist()
        elif isinstance(texts, str):
            items = [texts]
        elif isinstance(texts, Sequence) and all(isinstance(x, str) for x in texts):
            items = list(texts)
        else:
            raise TypeError("Index.add(texts): expected a str, a list of str or a TextTensor, got "
                            f"{type(texts).__name__}")
        if not items:
            return self
        meta_in.update(dict(metadata or {}))
        for k, v in meta_in.items():
            if not isinstance(k, str):
                raise TypeError(f"Index metadata keys must be str, got {k!r}")
            if k in _RESERVED:
                raise ValueError(f"Index metadata key {k!r} is reserved: search() sets 'score' and 'index' "
                                 "on every hit; rename the column")
            values = v.tolist() if isinstance(v, np.ndarray) else list(v) if isinstance(v, (list, tuple)) else [v] * len(items)
            if len(values) != len(items):
                raise ValueError(f"Index metadata column {k!r} has {len(values)} values for {len(items)} texts")
            meta_in[k] = [_json_value(x, k) for x in values]
        if self._texts and set(meta_in) != set(self._metadata):
            raise ValueError(f"Index.add: metadata columns {sorted(meta_in)} differ from the index's "
                             f"{sorted(self._metadata)}; give the same columns in every add")
        vecs = (_check_matrix(embeddings, len(items), "embeddings") if embeddings is not None
                else self._embed(items))
        if self._vectors is not None and vecs.shape[1] != self._vectors.shape[1]:
            raise ValueError(f"Index.add: embeddings of dimension {vecs.shape[1]} cannot join an index "
                             f"of dimension {self._vectors.shape[1]}")
        self._vectors = vecs if self._vectors is None else np.concatenate([self._vectors, vecs])
        self._texts.extend(items)
        for k, values in meta_in.items():
            self._metadata.setdefault(k, []).extend(values)
        self._arrays = None
        return self

    def _columns(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The passages and metadata columns as arrays, built once per ``add`` (not per search)."""
        if self._arrays is None:
            self._arrays = (np.array(self._texts, dtype=STRING_DTYPE),
                            {k: _column(v) for k, v in self._metadata.items()})
        return self._arrays

    # ----------------------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._texts)

    @property
    def dim(self) -> int | None:
        """The embedding dimension (``None`` while empty)."""
        return None if self._vectors is None else int(self._vectors.shape[1])

    @property
    def embeddings(self) -> np.ndarray:
        """The ``[N, d]`` float32 embeddings (read-only view)."""
        if self._vectors is None:
            return np.zeros((0, 0), np.float32)
        v = self._vectors.view()
        v.flags.writeable = False
        return v

    @property
    def texts(self) -> TextTensor:
        """The passages as a 1-d TextTensor (data) with their metadata."""
        return TextTensor(list(self._texts), template=False, metadata={
            k: _column(v) for k, v in self._metadata.items()})

    def __repr__(self) -> str:
        return f"Index({len(self)} passages, dim={self.dim}, metric={self.metric!r})"

    def search(self, queries: Any, k: int = 5) -> TextTensor:
        """The ``k`` best passages for every query, best first.

        Args:
            queries: a ``str``, nested lists of ``str`` or a TextTensor (its ``.embedding`` is
                used when set, otherwise its texts are embedded).
            k: passages per query, ``1 <= k <= len(index)``.

        Returns:
            A TextTensor of shape ``queries.shape + (k,)`` (data, never templates) with
            metadata ``score`` (float32 similarity), ``index`` (int64 passage number), the
            passages' own columns, and the queries' columns broadcast along ``k``.

        Example:
            >>> import numpy as np, langtorch as lt
            >>> index = lt.Index(["x", "y"], embeddings=np.eye(2))
            >>> q = lt.TextTensor("?", embedding=np.array([0.2, 1.0]))
            >>> index.search(q, k=1).tolist()
            ['y']
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"Index.search(k=...) must be an int, got {type(k).__name__}")
        if not len(self):
            raise ValueError("Index.search: the index is empty; add passages first")
        if not 1 <= k <= len(self):
            raise ValueError(f"Index.search: k must be between 1 and {len(self)} (the passages), got {k}")
        q = queries if isinstance(queries, _BaseTensor) else TextTensor(queries, template=False)
        if q.embedding is not None:
            qv = np.asarray(q.embedding, dtype=np.float32).reshape(-1, q.embedding.shape[-1])
        else:
            qv = self._embed(q.texts.reshape(-1).tolist()) if q.size else np.zeros((0, self.dim), np.float32)
        if not np.all(np.isfinite(qv)):
            raise ValueError("Index.search: the query embeddings hold NaN or infinite values")
        if qv.shape[-1] != self.dim:
            raise ValueError(f"Index.search: query embeddings have dimension {qv.shape[-1]} but the index "
                             f"has {self.dim}; embed queries with the index's embedder")
        from langtorch.functional.embedding import topk

        if q.size:
            scores, idx = topk(qv, self._vectors, int(k), metric=self.metric)
        else:
            scores, idx = np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        shape = q.shape + (int(k),)
        idx = np.asarray(idx, dtype=np.int64).reshape(shape)
        all_texts, columns = self._columns()
        out = TextTensor.from_arrays(np.asarray(all_texts[idx], dtype=STRING_DTYPE).reshape(shape))
        for key in q.metadata:
            out.metadata[key] = np.broadcast_to(q.metadata.column(key)[..., None], shape)
        for key, column in columns.items():
            out.metadata[key] = column[idx]
        out.metadata["score"] = np.asarray(scores, dtype=np.float32).reshape(shape)
        out.metadata["index"] = idx
        if isinstance(q, TextTensor):
            from langtorch.autograd import broadcast_index, record_node

            # Every passage of row (..., j) was retrieved for query (...): lineage to the query.
            src = broadcast_index(q.shape + (1,), shape)
            record_node("retrieve", out, [(q, src, "query")], attrs={"k": int(k), "passages": len(self)})
        return out

    # --------------------------------------------------------------------------- save / load
    def save(self, path: str | os.PathLike) -> None:
        """Write the index to the folder ``path`` (created if needed; ``~`` and environment
        variables are expanded): ``embeddings.safetensors`` and ``index.json``. The embedder is
        not saved; pass it again to :meth:`load`.

        Example:
            >>> import tempfile, numpy as np, langtorch as lt
            >>> index = lt.Index(["x", "y"], embeddings=np.eye(2))
            >>> with tempfile.TemporaryDirectory() as d:
            ...     index.save(d)
            ...     len(lt.Index.load(d))
            2
        """
        from safetensors.numpy import save_file

        if not len(self):
            raise ValueError("Index.save: the index is empty")
        doc = {"format": _FORMAT, "version": _VERSION, "metric": self.metric, "dim": self.dim,
               "count": len(self), "texts": self._texts, "metadata": self._metadata}
        try:  # encode before touching the folder: a text that cannot be written fails here
            data = json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"Index.save: a text or metadata value cannot be written as UTF-8 ({e})") from None
        path = user_path(path, what="Index.save: path")
        os.makedirs(path, exist_ok=True)
        # Write both files beside the old ones, then swap them in: a failed save leaves the
        # previous index in the folder readable.
        epath, jpath = os.path.join(path, _EMBEDDINGS), os.path.join(path, _JSON)
        save_file({"embeddings": np.ascontiguousarray(self._vectors)}, epath + ".tmp")
        with open(jpath + ".tmp", "wb") as f:
            f.write(data)
        os.replace(epath + ".tmp", epath)
        os.replace(jpath + ".tmp", jpath)

    @classmethod
    def load(cls, path: str | os.PathLike, *, embedder: Any = None) -> Index:
        """Read an index written by :meth:`save`, checking that the two files agree.

        Args:
            path: the folder (``~`` and environment variables are expanded).
            embedder: the embedder for new queries and passages (as in :class:`Index`); it must
                be the one the index was built with.

        Raises:
            FileNotFoundError: a file is missing.
            ValueError: the files are not a langtorch index, or disagree (counts, dimension,
                dtype, non-finite values, metadata lengths).

        Example:
            >>> import tempfile, numpy as np, langtorch as lt
            >>> with tempfile.TemporaryDirectory() as d:
            ...     lt.Index(["x", "y"], embeddings=np.eye(2)).save(d)
            ...     lt.Index.load(d).search(lt.TextTensor("q", embedding=np.array([1.0, 0])), k=1).item()
            'x'
        """
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        path = user_path(path, what="Index.load: path")
        jpath, epath = os.path.join(path, _JSON), os.path.join(path, _EMBEDDINGS)
        for p in (jpath, epath):
            if not os.path.isfile(p):
                raise FileNotFoundError(f"Index.load: {p} is missing (an index folder has {_JSON} and {_EMBEDDINGS})")
        try:
            with open(jpath, encoding="utf-8") as f:
                doc = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"Index.load: {jpath} is not valid JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise ValueError(f"Index.load: {jpath} is not a langtorch index file (no format tag {_FORMAT!r})")
        if doc.get("version") != _VERSION:
            raise ValueError(f"Index.load: unsupported index version {doc.get('version')!r} (this langtorch reads {_VERSION})")
        texts, meta, metric = doc.get("texts"), doc.get("metadata", {}), doc.get("metric")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("Index.load: 'texts' must be a list of str")
        if doc.get("count") != len(texts):
            raise ValueError(f"Index.load: 'count' is {doc.get('count')!r} but there are {len(texts)} texts")
        if metric not in ("cosine", "dot"):
            raise ValueError(f"Index.load: unknown metric {metric!r}")
        if not isinstance(meta, dict) or not all(
                isinstance(v, list) and len(v) == len(texts) for v in meta.values()):
            raise ValueError("Index.load: 'metadata' must map keys to lists of one value per text")
        try:
            tensors = load_file(epath)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"Index.load: {epath} is not a readable safetensors file ({e})") from None
        if set(tensors) != {"embeddings"}:
            raise ValueError(f"Index.load: {epath} must hold one tensor 'embeddings', found {sorted(tensors)}")
        vecs = tensors["embeddings"]
        if vecs.dtype not in (np.float32, np.float16) or vecs.ndim != 2:
            raise ValueError(f"Index.load: embeddings must be a 2-d float32/float16 array, got {vecs.dtype} {vecs.shape}")
        if vecs.shape != (len(texts), doc.get("dim")):
            raise ValueError(f"Index.load: embeddings have shape {vecs.shape} but the JSON says "
                             f"{len(texts)} texts of dimension {doc.get('dim')!r}")
        index = cls(embedder=embedder, metric=metric)
        try:  # add validates: finite vectors, metadata values and keys
            index.add(texts, vecs, metadata=meta)
        except (TypeError, ValueError) as e:  # e.g. NaN vectors, a metadata value that is a list
            raise ValueError(f"Index.load: {path}: {e}") from None
        return index
