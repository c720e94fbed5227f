"""``langtorch.models.load``: a Hugging Face directory or a GGUF file -> a JAX model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from langtorch.core import user_path
from langtorch.functional.errors import ModelFormatError
from langtorch.models._causal_lm import CausalLM
from langtorch.models._paths import cache_dir, file_sha256

__all__ = ["load"]

_DTYPES = ("float32", "bfloat16")


def _np_dtype(dtype: str):
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float32)


def _check_vocab(tokenizer: Any, config: Any, where: str, tensor: str) -> None:
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelFormatError(
            f"{where}: the tokenizer has {tokenizer.vocab_size} tokens but tensor {tensor!r} "
            f"has only {config.vocab_size} rows; the tokenizer does not belong to these weights.")


def load(path: str | os.PathLike, *, dtype: str = "float32", name: str | None = None) -> Any:
    """Load a model from a Hugging Face directory or a ``.gguf`` file.

    * A directory with ``config.json`` + safetensors (one file or shards with
      ``model.safetensors.index.json``) + ``tokenizer.json`` of a Llama, Mistral, Qwen2, Qwen3,
      Gemma 2, Gemma 3 (text) or Phi-3 model -> :class:`CausalLM`.
    * A sentence-transformers directory (``modules.json``, BERT family) -> :class:`Encoder`.
    * A ``.gguf`` file of a llama / qwen2 / qwen3 / gemma2 / gemma3 / phi3 model -> ``CausalLM``
      (every tensor type the ``gguf`` package dequantises; tokenizer and chat template from the
      metadata; the dequantised weights cached under :func:`cache_dir` keyed by the file's
      digest and the loader version).

    Args:
        path: the directory or file.
        dtype: ``"float32"`` (default; logits match transformers to 1e-4) or ``"bfloat16"``
            (half the memory).
        name: the model's name (default: the directory or file name).

    Raises:
        ModelFormatError: missing or inconsistent files (naming the file and tensor), a pickled
            ``pytorch_model.bin`` (refused, with the conversion command).
        UnsupportedModelError: an unknown architecture (the supported ones are listed) or a
            setting that changes the maths and is not implemented.

    Example:
        >>> import langtorch.models as M
        >>> lm = M.load("path/to/Llama-3.2-1B-Instruct", dtype="bfloat16")  # doctest: +SKIP
        >>> lm.architecture, lm.tokenizer.eos_ids  # doctest: +SKIP
        ('llama', (128001, 128008, 128009))
    """
    if dtype not in _DTYPES:
        raise ValueError(f"load: expected dtype 'float32' or 'bfloat16', got {dtype!r}.")
    p = user_path(path, what="load: path")
    if not p.exists():
        raise ModelFormatError(f"{p}: no such file or directory; expected a Hugging Face model "
                               "directory or a .gguf file.")
    if p.is_file():
        if p.suffix == ".gguf":
            return _load_gguf(p, dtype=dtype, name=name)
        if p.suffix in (".bin", ".pt", ".pth", ".pkl"):
            from langtorch.functional.loaders import TO_SAFETENSORS

            raise ModelFormatError(
                f"{p}: pickled PyTorch checkpoints are refused (unpickling runs arbitrary "
                f"code); convert it once to safetensors with:\n  {TO_SAFETENSORS}")
        raise ModelFormatError(f"{p}: expected a .gguf file or a model directory.")
    if (p / "modules.json").is_file():
        from langtorch.models._encoder import Encoder

        return Encoder(p, dtype=dtype, name=name)
    return _load_hf(p, dtype=dtype, name=name)


def _load_hf(p: Path, *, dtype: str, name: str | None) -> CausalLM:
    import jax.numpy as jnp

    from langtorch.functional.loaders import load_hf_decoder, load_hf_tokenizer

    name = name or p.name
    jdt = jnp.float32 if dtype == "float32" else jnp.bfloat16
    params, config = load_hf_decoder(str(p), dtype=_np_dtype(dtype),
                                     convert=lambda a: jnp.asarray(a, jdt))
    tokenizer = load_hf_tokenizer(str(p), name=name)
    _check_vocab(tokenizer, config, str(p / "tokenizer.json"), "model.embed_tokens.weight")
    return CausalLM(params, config, tokenizer, name=name, dtype=dtype, path=str(p))


def _load_gguf(p: Path, *, dtype: str, name: str | None) -> CausalLM:
    import jax
    import jax.numpy as jnp

    from langtorch.functional.loaders import (
        DECODER_LOADER_VERSION,
        load_gguf_decoder,
        tokenizer_from_gguf,
    )

    digest = file_sha256(p)[:24]
    cache = str(cache_dir() / "gguf" / f"{p.stem}-{digest}-{DECODER_LOADER_VERSION}.safetensors")
    model = load_gguf_decoder(str(p), cache_path=cache)
    name = name or str(model.metadata.get("general.name") or p.stem)
    jdt = jnp.float32 if dtype == "float32" else jnp.bfloat16
    params = jax.tree.map(lambda a: jnp.asarray(a, jdt), model.params)
    tokenizer = tokenizer_from_gguf(model.metadata, name=name)
    _check_vocab(tokenizer, model.config, str(p), "token_embd.weight")
    return CausalLM(params, model.config, tokenizer, name=name, dtype=dtype, path=str(p))
