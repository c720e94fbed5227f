"""Read a Hugging Face decoder directory: ``config.json`` + (sharded) safetensors, memory-mapped
and converted tensor by tensor into the decoder's stacked parameter pytree.

Example:
    >>> from langtorch.functional.loaders import load_hf_decoder
    >>> params, config = load_hf_decoder("path/to/Qwen2.5-0.5B-Instruct")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from langtorch.functional.errors import ModelFormatError
from langtorch.functional.loaders._families import decoder_config_from_hf, hf_layer_names
from langtorch.functional.models.decoder import DecoderConfig

__all__ = ["SafetensorsFiles", "load_hf_decoder", "read_hf_config"]

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}

TO_SAFETENSORS = (
    "python -c \"import torch, safetensors.torch as s; "
    "s.save_file(torch.load('pytorch_model.bin', weights_only=True), 'model.safetensors', "
    "metadata={'format': 'pt'})\"")
"""The one-line conversion of a pickled checkpoint, quoted when one is refused."""


def read_hf_config(directory: str) -> dict[str, Any]:
    """``config.json`` of a model directory as a dict (a clear error when absent or invalid).

    Example:
        >>> from langtorch.functional.loaders import read_hf_config
        >>> read_hf_config("/nonexistent")
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.ModelFormatError: /nonexistent/config.json: expected a Hugging Face model directory with a config.json, found none.
    """
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ModelFormatError(f"{path}: expected a Hugging Face model directory with a "
                               "config.json, found none.")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path}: could not read the JSON ({exc}).") from None


class SafetensorsFiles:
    """The tensors of a directory's safetensors files, memory-mapped (nothing is read until a
    tensor is asked for, and then only its bytes).

    Args:
        directory: holding ``model.safetensors`` or ``model.safetensors.index.json`` + shards.

    Raises:
        ModelFormatError: no safetensors (a ``pytorch_model.bin`` is refused: pickle runs code),
            a shard listed in the index but absent, or a malformed header.

    Example:
        >>> from langtorch.functional.loaders import SafetensorsFiles
        >>> st = SafetensorsFiles("path/to/model")  # doctest: +SKIP
        >>> st.get("model.norm.weight").shape  # doctest: +SKIP
        (576,)
    """

    def __init__(self, directory: str):
        self.directory = directory
        index = os.path.join(directory, "model.safetensors.index.json")
        single = os.path.join(directory, "model.safetensors")
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map", {})
            files = sorted(set(weight_map.values()))
            for name in files:
                if not os.path.isfile(os.path.join(directory, name)):
                    some = next(k for k, v in weight_map.items() if v == name)
                    raise ModelFormatError(
                        f"{index}: shard {name!r} (holding e.g. tensor {some!r}) is listed but "
                        f"absent from {directory}; download it again.")
        elif os.path.isfile(single):
            files = ["model.safetensors"]
        else:
            pickled = [n for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")
                       if os.path.exists(os.path.join(directory, n))]
            if pickled:
                raise ModelFormatError(
                    f"{os.path.join(directory, pickled[0])}: pickled PyTorch checkpoints are "
                    "refused (unpickling runs arbitrary code); convert it once to safetensors "
                    f"in that directory with:\n  {TO_SAFETENSORS}")
            raise ModelFormatError(f"{directory}: expected model.safetensors or "
                                   "model.safetensors.index.json, found neither.")
        self._where: dict[str, tuple[str, dict]] = {}
        self._maps: dict[str, mmap.mmap] = {}
        for name in files:
            path = os.path.join(directory, name)
            header, offset = self._header(path)
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[path] = mm
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                self._where[key] = (path, {**info, "base": offset})

    @staticmethod
    def _header(path: str) -> tuple[dict, int]:
        try:
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if n <= 0 or n > 100_000_000:
                    raise ValueError(f"header length {n}")
                return json.loads(f.read(n)), 8 + n
        except (OSError, ValueError) as exc:
            raise ModelFormatError(f"{path}: not a safetensors file ({exc}).") from None

    def release(self) -> None:
        """Drop the mapped pages read so far from this process's memory (they are clean file
        pages: a later :meth:`get` reads them again), so that the mapped file does not add its
        whole size to the peak memory of a load."""
        for mm in self._maps.values():
            if hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)

    def __contains__(self, key: str) -> bool:
        return key in self._where

    def keys(self) -> list[str]:
        """Every tensor name."""
        return list(self._where)

    def file_of(self, key: str) -> str:
        """The file holding tensor ``key``."""
        return self._where[key][0]

    def get(self, key: str) -> np.ndarray:
        """Tensor ``key`` as a read-only numpy view of the mapped file (bf16 as
        ``ml_dtypes.bfloat16``).

        Raises:
            ModelFormatError: the tensor is absent (naming the directory) or has an unknown dtype.
        """
        if key not in self._where:
            raise ModelFormatError(f"{self.directory}: tensor {key!r} is missing from the "
                                   "safetensors files.")
        path, info = self._where[key]
        kind = info["dtype"]
        if kind == "BF16":
            import ml_dtypes

            dt = np.dtype(ml_dtypes.bfloat16)
        elif kind in _DTYPES:
            dt = np.dtype(_DTYPES[kind])
        else:
            raise ModelFormatError(f"{path}: tensor {key!r} has dtype {kind}, which is not "
                                   "supported.")
        start, end = info["data_offsets"]
        mm = self._maps[path]
        if not 0 <= start <= end <= len(mm) - info["base"]:
            raise ModelFormatError(f"{path}: tensor {key!r} lies outside the file ({start}:{end}); "
                                   "the file is truncated or corrupt.")
        raw = np.frombuffer(mm, np.uint8, count=end - start, offset=info["base"] + start)
        try:
            return raw.view(dt).reshape(info["shape"])
        except ValueError:
            raise ModelFormatError(
                f"{path}: tensor {key!r} holds {raw.size} bytes, which do not make a {kind} "
                f"tensor of shape {tuple(info['shape'])}; the file is truncated or corrupt."
            ) from None


def _check(arr: np.ndarray, shape: tuple, key: str, st: SafetensorsFiles) -> np.ndarray:
    if tuple(arr.shape) != tuple(shape):
        raise ModelFormatError(f"{st.file_of(key)}: tensor {key!r} has shape "
                               f"{tuple(arr.shape)}, expected {tuple(shape)} from config.json.")
    return arr


def _layer_shapes(c: DecoderConfig) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """``(shapes, split)``: each per-layer tensor's Hugging Face shape (``[out, in]`` or ``[n]``)
    under our name, and how Phi-3's fused tensors split into ours (``(name, lo, hi)`` rows)."""
    h, f = c.hidden_size, c.intermediate_size
    qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    # (our name, HF shape [out, in] or [n], transposed?)
    shapes = {"attn_norm": (h,), "mlp_norm": (h,), "post_attn_norm": (h,),
              "post_mlp_norm": (h,), "wq": (qd, h), "wk": (kd, h), "wv": (kd, h),
              "wo": (h, qd), "w_gate": (f, h), "w_up": (f, h), "w_down": (h, f),
              "bq": (qd,), "bk": (kd,), "bv": (kd,), "bo": (h,),
              "q_norm": (c.head_dim,), "k_norm": (c.head_dim,),
              "wqkv": (qd + 2 * kd, h), "w_gate_up": (2 * f, h)}
    split = {"wqkv": (("wq", 0, qd), ("wk", qd, qd + kd), ("wv", qd + kd, qd + 2 * kd)),
             "w_gate_up": (("w_gate", 0, f), ("w_up", f, 2 * f))}
    return shapes, split


def _refuse_unused(st: Any, used: set[str], c: DecoderConfig) -> None:
    """Refuse a checkpoint with tensors the loader did not read."""
    # A tensor nothing reads means config.json and the weights disagree (e.g. biases with
    # attention_bias false, more layers than num_hidden_layers): refuse rather than drop it.
    ignorable = {"lm_head.weight"} if c.tie_embeddings else set()
    extra = sorted(k for k in st.keys() if k not in used and k not in ignorable
                   and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ModelFormatError(
            f"{st.file_of(extra[0])}: tensor {extra[0]!r}{more} is not used by the "
            f"{c.architecture} architecture that config.json describes; the config and the "
            "weights do not match (a setting we do not read, or another model's weights).")


def load_hf_decoder(directory: str, *, dtype: Any = np.float32,
                    convert: Callable[[np.ndarray], Any] | None = None,
                    ) -> tuple[dict, DecoderConfig]:
    """The decoder params and config of a Hugging Face directory.

    Tensors are read one at a time from the memory-mapped files, cast to ``dtype`` and written
    into preallocated stacked ``[L, ...]`` arrays; each finished array is passed through
    ``convert`` (e.g. ``jnp.asarray``) and the numpy copy dropped, so peak memory stays near
    the final weights plus one stacked array.

    Args:
        directory: the model directory.
        dtype: numpy dtype of the weights (``np.float32`` or ``ml_dtypes.bfloat16``).
        convert: applied to each finished array (default: identity).

    Raises:
        ModelFormatError: missing files or tensors, a tensor of the wrong shape.
        UnsupportedModelError: an architecture or setting we do not implement.

    Example:
        >>> from langtorch.functional.loaders import load_hf_decoder
        >>> params, cfg = load_hf_decoder("path/to/model")  # doctest: +SKIP
        >>> params["layers"]["wq"].shape  # doctest: +SKIP
        (24, 896, 896)
    """
    directory = os.fspath(directory)
    where = os.path.join(directory, "config.json")
    config = decoder_config_from_hf(read_hf_config(directory), where=where)
    st = SafetensorsFiles(directory)
    conv = convert or (lambda a: a)
    c = config
    prefix = "model."
    if f"{prefix}embed_tokens.weight" not in st and "embed_tokens.weight" in st:
        prefix = ""
    h, n = c.hidden_size, c.num_layers
    used: set[str] = set()

    def tensor(key, shape):
        used.add(key)
        return _check(st.get(key), shape, key, st)

    params: dict[str, Any] = {}
    params["embed"] = conv(np.ascontiguousarray(
        tensor(f"{prefix}embed_tokens.weight", (c.vocab_size, h)), dtype=dtype))
    st.release()
    params["norm"] = conv(np.asarray(tensor(f"{prefix}norm.weight", (h,)), dtype=dtype))
    if not c.tie_embeddings:
        key = "lm_head.weight"
        params["lm_head"] = conv(np.ascontiguousarray(tensor(key, (c.vocab_size, h)).T,
                                                      dtype=dtype))
        st.release()
    shapes, split = _layer_shapes(c)
    layers: dict[str, Any] = {}
    for ours, suffix in hf_layer_names(c).items():
        shape = shapes[ours]
        parts = split.get(ours, ((ours, 0, shape[0]),))
        out = {name: np.empty((n, *((shape[1], hi - lo) if len(shape) == 2 else (hi - lo,))),
                              dtype) for name, lo, hi in parts}
        for i in range(n):
            w = tensor(f"{prefix}layers.{i}.{suffix}", shape)
            for name, lo, hi in parts:
                out[name][i] = (w[lo:hi].T if w.ndim == 2 else w[lo:hi])
        for name in out:
            layers[name] = conv(out[name])
        del out
        st.release()
    params["layers"] = layers
    _refuse_unused(st, used, c)
    return params, config
