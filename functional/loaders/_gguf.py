"""Read a llama-architecture GGUF file (weights dequantised with numpy, plus metadata)."""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

import numpy as np

from langtorch.functional.loaders._atomic import atomic_write
from langtorch.functional.models.llama import LlamaConfig

__all__ = [
    "GGUFModel",
    "dequantize_gguf",
    "llama_config_from_gguf",
    "load_gguf_decoder",
    "load_llama_gguf",
    "read_gguf_metadata",
]

# GGUF tensor name (per block) -> (our name, needs llama.cpp's q/k row permutation undone)
_BLOCK = {
    "attn_norm": ("attn_norm", None),
    "attn_q": ("wq", "q"),
    "attn_k": ("wk", "k"),
    "attn_v": ("wv", None),
    "attn_output": ("wo", None),
    "ffn_norm": ("mlp_norm", None),
    "ffn_gate": ("w_gate", None),
    "ffn_up": ("w_up", None),
    "ffn_down": ("w_down", None),
}
# Written into every weight cache and checked on read: a cache made by another loader version
# (whose dequantisation or param layout may differ) is rebuilt, never silently reused.
LOADER_VERSION = "2"

_METADATA_KEYS = (
    "general.architecture", "general.name", "tokenizer.ggml.model", "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
)


class GGUFModel(NamedTuple):
    """A loaded GGUF model: ``params`` (numpy pytree), static ``config`` and ``metadata`` dict.

    Example:
        >>> from langtorch.functional.loaders import GGUFModel
        >>> GGUFModel._fields
        ('params', 'config', 'metadata')
    """

    params: dict
    config: LlamaConfig
    metadata: dict


def _reader(path: str):
    import gguf

    return gguf.GGUFReader(os.fspath(path))


def read_gguf_metadata(path: str, reader: Any = None) -> dict[str, Any]:
    """The key/value metadata of a GGUF file as plain Python values.

    Example:
        >>> from langtorch.functional.loaders import read_gguf_metadata
        >>> meta = read_gguf_metadata("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
        >>> meta["llama.rope.freq_base"]  # doctest: +SKIP
        100000.0
    """
    reader = reader if reader is not None else _reader(path)
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # noqa: BLE001 - unusual field types are skipped, not fatal
            continue
    return out


def llama_config_from_gguf(metadata: dict[str, Any]) -> LlamaConfig:
    """Build a :class:`LlamaConfig` from GGUF metadata (``llama.*`` keys).

    Example:
        >>> from langtorch.functional.loaders import llama_config_from_gguf
        >>> meta = {"general.architecture": "llama", "llama.block_count": 2,
        ...         "llama.embedding_length": 64, "llama.attention.head_count": 4,
        ...         "llama.attention.head_count_kv": 2, "llama.feed_forward_length": 128,
        ...         "tokenizer.ggml.tokens": ["a"] * 10}
        >>> llama_config_from_gguf(meta).head_dim
        16
    """
    arch = metadata.get("general.architecture", "llama")
    if arch != "llama":
        raise ValueError(f"expected a GGUF with general.architecture 'llama', got {arch!r}.")
    hidden = int(metadata["llama.embedding_length"])
    heads = int(metadata["llama.attention.head_count"])
    vocab = metadata.get("llama.vocab_size") or len(metadata["tokenizer.ggml.tokens"])
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        num_layers=int(metadata["llama.block_count"]),
        num_heads=heads,
        num_kv_heads=int(metadata.get("llama.attention.head_count_kv", heads)),
        head_dim=int(metadata.get("llama.rope.dimension_count", hidden // heads)),
        intermediate_size=int(metadata["llama.feed_forward_length"]),
        rope_theta=float(metadata.get("llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(metadata.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        max_positions=int(metadata.get("llama.context_length", 2048)),
        tie_embeddings=True,  # corrected by the loader when output.weight exists
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's converter interleaves the two rotary halves of each head's q/k rows (its RoPE
    # rotates adjacent pairs); undo it to get the Hugging Face "rotate half" layout back.
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize_gguf(path: str, reader: Any = None) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file dequantised to float32, keyed by its GGUF name.

    Shapes follow numpy/PyTorch order (``[out, in]`` for linear weights).

    Example:
        >>> from langtorch.functional.loaders import dequantize_gguf
        >>> w = dequantize_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
        >>> w["token_embd.weight"].shape  # doctest: +SKIP
        (49152, 576)
    """
    from gguf.quants import dequantize

    reader = reader if reader is not None else _reader(path)
    return {t.name: np.asarray(dequantize(t.data, t.tensor_type), np.float32)
            for t in reader.tensors}


def _params_from_tensors(tensors: dict[str, np.ndarray], config: LlamaConfig) -> dict:
    layers: dict[str, list[np.ndarray]] = {ours: [] for ours, _ in _BLOCK.values()}
    for i in range(config.num_layers):
        for gname, (ours, perm) in _BLOCK.items():
            w = tensors[f"blk.{i}.{gname}.weight"]
            if perm == "q":
                w = _unpermute(w, config.num_heads)
            elif perm == "k":
                w = _unpermute(w, config.num_kv_heads)
            layers[ours].append(w.T if w.ndim == 2 else w)  # [out, in] -> [in, out]
    params = {
        "embed": tensors["token_embd.weight"],
        "norm": tensors["output_norm.weight"],
        "layers": {k: np.ascontiguousarray(np.stack(v)) for k, v in layers.items()},
    }
    if "output.weight" in tensors:
        params["lm_head"] = np.ascontiguousarray(tensors["output.weight"].T)
    return params


def _flatten(params: dict) -> dict[str, np.ndarray]:
    flat = {}
    for k, v in params.items():
        if isinstance(v, dict):
            flat.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            flat[k] = v
    return flat


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
    params: dict = {}
    for k, v in flat.items():
        head, _, tail = k.partition(".")
        if tail:
            params.setdefault(head, {})[tail] = v
        else:
            params[head] = v
    return params


def load_llama_gguf(path: str, *, cache_path: str | None = None, dtype: Any = np.float32) -> GGUFModel:
    """Load a llama GGUF: dequantised params (optionally cached as safetensors), config, metadata.

    Args:
        path: the ``.gguf`` file.
        cache_path: optional ``.safetensors`` file for the dequantised params. When it exists it
            is read instead of dequantising again; when it does not, it is written. The caller
            chooses the path (e.g. keyed by the GGUF's hash) — this function keeps no state.
        dtype: numpy dtype of the returned weights (e.g. ``np.float32`` or ``ml_dtypes.bfloat16``).

    Example:
        >>> from langtorch.functional.loaders import load_llama_gguf
        >>> m = load_llama_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
        >>> m.config.num_layers, m.params["layers"]["wq"].shape  # doctest: +SKIP
        (30, (30, 576, 576))
    """
    params = metadata = None
    if cache_path is not None and os.path.exists(cache_path):
        params, metadata = _read_cache(cache_path)
    if params is None:
        # Parsing the GGUF header (100k tokenizer strings) costs seconds: the cache stores the
        # metadata next to the weights so a cached load never opens the GGUF.
        reader = _reader(path)
        metadata = {k: v for k, v in read_gguf_metadata(path, reader).items()
                    if k in _METADATA_KEYS or k.startswith("llama.")}
        config = llama_config_from_gguf(metadata)
        params = _params_from_tensors(dequantize_gguf(path, reader), config)
        if cache_path is not None:
            try:
                _write_cache(cache_path, params, metadata)
            except OSError as exc:  # an unwritable cache only costs the next load's time
                import warnings

                warnings.warn(f"load_llama_gguf: could not write the weight cache "
                              f"{cache_path}: {exc}; loading without it.", RuntimeWarning,
                              stacklevel=2)
    config = llama_config_from_gguf(metadata)
    if "lm_head" in params:
        config = config._replace(tie_embeddings=False)
    if np.dtype(dtype) != np.float32:
        params = _unflatten({k: v.astype(dtype) for k, v in _flatten(params).items()})
    return GGUFModel(params, config, metadata)


def _read_cache(cache_path: str, version: str | None = None
                ) -> tuple[dict | None, dict | None]:
    version = LOADER_VERSION if version is None else version
    from safetensors import safe_open

    try:
        with safe_open(cache_path, framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("loader_version") != version:
                return None, None
            metadata = json.loads(meta["gguf_metadata"])
            flat = {k: f.get_tensor(k) for k in f.keys()}
        return _unflatten(flat), metadata
    except Exception:  # noqa: BLE001 - a corrupt or old cache is rebuilt, not fatal
        return None, None


def _write_cache(cache_path: str, params: dict, metadata: dict,
                 version: str | None = None) -> None:
    version = LOADER_VERSION if version is None else version
    from safetensors.numpy import save_file

    # atomic_write: a unique sibling temp file (never PID-only), fsynced, renamed, removed on
    # any failure, so concurrent loaders never see a partial cache.
    atomic_write(cache_path, lambda tmp: save_file(
        _flatten(params), tmp, metadata={"gguf_metadata": json.dumps(metadata),
                                         "loader_version": version}))


# The generic loader's cache layout version (bumped whenever its dequantisation or param layout
# changes; written into and checked against every cache it makes).
DECODER_LOADER_VERSION = "d1"

_EXTRA_METADATA = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.add_eos_token",
                   "tokenizer.ggml.scores")


def _decoder_params(tensors: dict[str, np.ndarray], config: Any, path: str) -> dict:
    from langtorch.functional.errors import ModelFormatError
    from langtorch.functional.loaders._families import gguf_layer_names

    c = config
    h, f = c.hidden_size, c.intermediate_size
    qd, kd = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    gemma = c.norm_offset != 0.0

    def get(name, shape):
        if name not in tensors:
            raise ModelFormatError(f"{path}: tensor {name!r} is missing.")
        w = tensors[name]
        if tuple(w.shape) != tuple(shape):
            raise ModelFormatError(f"{path}: tensor {name!r} has shape {tuple(w.shape)}, "
                                   f"expected {tuple(shape)} from the metadata.")
        if gemma and name.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp stores Gemma's (1 + w) norms with the 1 added
        return w

    shapes = {"attn_norm": (h,), "mlp_norm": (h,), "post_attn_norm": (h,),
              "post_mlp_norm": (h,), "wq": (qd, h), "wk": (kd, h), "wv": (kd, h),
              "wo": (h, qd), "w_gate": (f, h), "w_up": (f, h), "w_down": (h, f),
              "bq": (qd,), "bk": (kd,), "bv": (kd,), "bo": (h,),
              "q_norm": (c.head_dim,), "k_norm": (c.head_dim,),
              "wqkv": (qd + 2 * kd, h), "w_gate_up": (2 * f, h)}
    split = {"wqkv": (("wq", 0, qd), ("wk", qd, qd + kd), ("wv", qd + kd, qd + 2 * kd)),
             "w_gate_up": (("w_gate", 0, f), ("w_up", f, 2 * f))}
    layers: dict[str, list] = {}
    for i in range(c.num_layers):
        for ours, gname in gguf_layer_names(c).items():
            w = get(f"blk.{i}.{gname}", shapes[ours])
            if c.architecture == "llama" and ours == "wq":
                w = _unpermute(w, c.num_heads)
            elif c.architecture == "llama" and ours == "wk":
                w = _unpermute(w, c.num_kv_heads)
            for name, lo, hi in split.get(ours, ((ours, 0, shapes[ours][0]),)):
                part = w[lo:hi]
                layers.setdefault(name, []).append(part.T if part.ndim == 2 else part)
    params = {"embed": get("token_embd.weight", (c.vocab_size, h)),
              "norm": get("output_norm.weight", (h,)),
              "layers": {k: np.ascontiguousarray(np.stack(v)) for k, v in layers.items()}}
    if not c.tie_embeddings:
        params["lm_head"] = np.ascontiguousarray(get("output.weight", (c.vocab_size, h)).T)
    return params


def _refuse_unused_tensors(names: set[str], config: Any, path: str) -> None:
    # A tensor the architecture does not read changes the maths we would skip (Phi-3 128k's
    # rope_factors_long/short: LongRoPE), or means the metadata does not describe the file.
    from langtorch.functional.errors import UnsupportedModelError
    from langtorch.functional.loaders._families import gguf_layer_names

    used = {"token_embd.weight", "output_norm.weight"} | (
        set() if config.tie_embeddings else {"output.weight"})
    used |= {f"blk.{i}.{n}" for i in range(config.num_layers)
             for n in gguf_layer_names(config).values()}
    extra = sorted(names - used)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise UnsupportedModelError(
            f"{path}: tensor {extra[0]!r}{more} is not read by our {config.architecture} "
            "decoder; it would change the maths (e.g. LongRoPE factors) or the metadata does "
            "not describe this file, so the model is refused.")


def load_gguf_decoder(path: str, *, cache_path: str | None = None,
                      dtype: Any = np.float32) -> GGUFModel:
    """Load a GGUF of any supported architecture (llama, qwen2, qwen3, gemma2, gemma3, phi3):
    every tensor type the ``gguf`` package dequantises, params in the decoder layout, its
    :class:`~langtorch.functional.models.decoder.DecoderConfig` and metadata.

    Args:
        path: the ``.gguf`` file.
        cache_path: optional ``.safetensors`` file for the dequantised params (read when it
            exists and was written by this loader version, else written; atomically).
        dtype: numpy dtype of the returned weights.

    Raises:
        UnsupportedModelError: an architecture or setting we do not implement.
        ModelFormatError: a missing tensor or one of the wrong shape.

    Example:
        >>> from langtorch.functional.loaders import load_gguf_decoder
        >>> m = load_gguf_decoder("gemma-3-270m-it-Q4_K_M.gguf")  # doctest: +SKIP
        >>> m.config.architecture, m.config.sliding_window  # doctest: +SKIP
        ('gemma3', 512)
    """
    from langtorch.functional.loaders._families import decoder_config_from_gguf

    params = metadata = None
    if cache_path is not None and os.path.exists(cache_path):
        params, metadata = _read_cache(cache_path, DECODER_LOADER_VERSION)
    if params is None:
        reader = _reader(path)
        full = read_gguf_metadata(path, reader)
        arch = full.get("general.architecture", "llama")
        metadata = {k: v for k, v in full.items()
                    if k in _METADATA_KEYS or k in _EXTRA_METADATA or k.startswith(f"{arch}.")}
        names = [t.name for t in reader.tensors]
        metadata["_tensor_names"] = names
        config = decoder_config_from_gguf(metadata, set(names), where=os.fspath(path))
        params = _decoder_params(dequantize_gguf(path, reader), config, os.fspath(path))
        if cache_path is not None:
            try:
                _write_cache(cache_path, params, metadata, DECODER_LOADER_VERSION)
            except OSError as exc:
                import warnings

                warnings.warn(f"load_gguf_decoder: could not write the weight cache "
                              f"{cache_path}: {exc}; loading without it.", RuntimeWarning,
                              stacklevel=2)
    names = set(metadata.get("_tensor_names", ()))
    config = decoder_config_from_gguf(metadata, names, where=os.fspath(path))
    _refuse_unused_tensors(names, config, os.fspath(path))
    if np.dtype(dtype) != np.float32:
        params = _unflatten({k: v.astype(dtype) for k, v in _flatten(params).items()})
    return GGUFModel(params, config, metadata)
