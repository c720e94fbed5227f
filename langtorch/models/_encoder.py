"""A sentence-transformers directory (BERT family) as a jitted JAX sentence embedder."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.core import user_path
from langtorch.functional import embedding as E
from langtorch.functional.errors import ModelFormatError, UnsupportedModelError

__all__ = ["Encoder"]

_POOLING = ("mean", "cls", "lasttoken")


def _read(path: Path) -> dict | list:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path}: could not read the JSON ({exc}).") from None


def _modules(root: Path) -> tuple[Path, str, bool]:
    """(transformer directory, pooling mode, normalise?) from modules.json."""
    mods = _read(root / "modules.json")
    transformer, pooling, normalize = None, None, False
    for m in mods:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        sub = root / m.get("path", "")
        if kind == "Transformer":
            transformer = sub
        elif kind == "Pooling":
            cfg = _read(sub / "config.json")
            if isinstance(cfg.get("pooling_mode"), str):  # sentence-transformers >= 6
                modes = [cfg["pooling_mode"].replace("_token", "").replace("_tokens", "")]
            else:  # pooling_mode_mean_tokens: true, ...
                modes = [k.removeprefix("pooling_mode_").removesuffix("_token")
                         .replace("_tokens", "")
                         for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
            if len(modes) != 1 or modes[0] not in _POOLING:
                raise UnsupportedModelError(
                    f"{sub / 'config.json'}: pooling {modes or 'none'} is not implemented "
                    f"(supported: one of {', '.join(_POOLING)}).")
            pooling = modes[0]
        elif kind == "Normalize":
            normalize = True
        else:
            raise UnsupportedModelError(f"{root / 'modules.json'}: module {m.get('type')!r} is "
                                        "not implemented (supported: Transformer, Pooling, "
                                        "Normalize).")
    if transformer is None or pooling is None:
        raise ModelFormatError(f"{root / 'modules.json'}: expected a Transformer and a Pooling "
                               "module.")
    return transformer, pooling, normalize


def _max_length(root: Path, tdir: Path) -> int:
    # sentence_bert_config.json's max_seq_length (sentence-transformers < 6), else the
    # tokenizer's model_max_length, else the model's positions (capped by the caller).
    st_cfg = root / "sentence_bert_config.json"
    if st_cfg.is_file():
        v = _read(st_cfg).get("max_seq_length")
        if v:
            return int(v)
    tc = tdir / "tokenizer_config.json"
    if tc.is_file():
        v = _read(tc).get("model_max_length")
        if isinstance(v, int) and 0 < v < 1_000_000:
            return v
    return 512


class Encoder:
    """A BERT-family sentence-transformers model (MiniLM, bge-small, e5-small, ...).

    Reads ``modules.json``: the Transformer module's ``config.json`` / ``model.safetensors`` /
    ``tokenizer.json``, the Pooling module's mode (mean, CLS or last token) and whether a
    Normalize module follows. Made by :func:`langtorch.models.load`. Texts are encoded as
    :class:`~langtorch.models.MiniLM` does (:func:`langtorch.functional.embedding.embed_texts`):
    several texts packed per row with segment-masked attention, rows of 64/128/256/max_length
    tokens, batches dispatched without waiting.

    Args:
        path: the sentence-transformers directory.
        dtype: ``"float32"`` or ``"bfloat16"``.
        name: the model's name (default: the directory name).
        max_length: truncation in tokens (default: the tokenizer's / ``max_seq_length``).
        batch_size: sets the tokens encoded per jitted call, ``batch_size * 64`` (default
            2,048 tokens: 32 rows of 64, 16 of 128, ...).

    Attributes:
        name, dim, pooling, normalize.

    Example:
        >>> import langtorch.models as M
        >>> enc = M.load("path/to/bge-small-en-v1.5")  # doctest: +SKIP
        >>> enc.embed(["a cat", "a dog"]).shape  # doctest: +SKIP
        (2, 384)
    """

    def __init__(self, path: str | os.PathLike, *, dtype: str = "float32",
                 name: str | None = None, max_length: int | None = None, batch_size: int = 32):
        from langtorch.functional.loaders import (
            bert_params_from_safetensors,
            read_hf_config,
            wordpiece_tokenizer,
        )

        root = user_path(path, what="Encoder: path")
        self.path = root
        self.name = name or root.name
        tdir, self.pooling, self.normalize = _modules(root)
        cfg = read_hf_config(str(tdir))
        if cfg.get("model_type", "bert") != "bert":
            raise UnsupportedModelError(
                f"{tdir / 'config.json'}: encoder architecture {cfg.get('model_type')!r} is not "
                "supported; supported: bert.")
        if not (tdir / "model.safetensors").is_file():
            raise ModelFormatError(f"{tdir}: expected model.safetensors (pickled checkpoints "
                                   "are refused).")
        if max_length is None:
            max_length = _max_length(root, tdir)
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"Encoder: expected dtype 'float32' or 'bfloat16', got {dtype!r}.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Encoder: expected batch_size an int >= 1, got {batch_size!r}.")
        params, self.config = bert_params_from_safetensors(str(tdir))
        self.max_length = min(int(max_length), self.config.max_positions)
        self.params = E.cast_params(jax.tree.map(jnp.asarray, params), dtype)
        self.tokenizer = wordpiece_tokenizer(str(tdir), max_length=self.max_length)
        self.dim = self.config.hidden_size
        self.dtype = dtype
        self.batch_size = int(batch_size)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings ``[N, dim]`` (float32) of ``texts``, as ``SentenceTransformer.encode``.

        Example:
            >>> import langtorch.models as M
            >>> M.load("path/to/all-MiniLM-L6-v2").embed(["hi"]).shape  # doctest: +SKIP
            (1, 384)
        """
        if isinstance(texts, str):
            raise TypeError("Encoder.embed: expected a list of texts, got one str; wrap it in "
                            "a list.")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return E.embed_texts(self.params, self.tokenizer, texts, config=self.config,
                             max_length=self.max_length, tokens_per_batch=self.batch_size * 64,
                             encode_fn=partial(E.embed_packed, pooling=self.pooling,
                                               normalize=self.normalize))

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Alias of :meth:`embed` (the embedder protocol of :class:`~langtorch.models.MiniLM`).

        Example:
            >>> import langtorch.models as M
            >>> M.load("path/to/model").embed_texts(["hi"]).shape  # doctest: +SKIP
            (1, 384)
        """
        return self.embed(texts)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed(texts)

    def __repr__(self) -> str:
        return f"Encoder({self.name!r}, pooling={self.pooling!r}, dim={self.dim})"
