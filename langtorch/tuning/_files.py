"""Atomic safetensors files with a content checksum; PEFT prompt-tuning adapters."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from langtorch.tuning._errors import AdapterError, CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "save_peft_adapter", "load_peft_adapter",
           "ADAPTER_CONFIG", "ADAPTER_WEIGHTS"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _digest(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(k.encode() + b"\0" + str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _atomic_write(path: Path, write) -> None:
    # Write a sibling temp file, fsync it, then rename over the target: a crash at any point
    # leaves either the old file or the new one, never a half-written file under the real name.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def save_checkpoint(path: str | os.PathLike, arrays: Mapping[str, np.ndarray],
                    state: Mapping[str, Any]) -> Path:
    """Atomically write ``arrays`` and the JSON-able ``state`` to one safetensors file."""
    from safetensors.numpy import save_file

    path = Path(path)
    arrays = {k: np.ascontiguousarray(np.asarray(v)) for k, v in arrays.items()}
    meta = {"format": "langtorch-prompt-tuning-checkpoint/1",
            "state": json.dumps(state), "sha256": _digest(arrays)}
    _atomic_write(path, lambda tmp: save_file(arrays, tmp, metadata=meta))
    return path


def load_checkpoint(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a checkpoint written by :func:`save_checkpoint`; verify its checksum."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}
    except FileNotFoundError:
        raise
    except Exception as exc:  # safetensors raises its own error types for every corruption
        raise CheckpointError(
            f"checkpoint {path} is not a readable safetensors file ({type(exc).__name__}: "
            f"{exc}); expected a file written by PromptTuner. Delete it or point to another "
            "checkpoint.") from exc
    if meta.get("format") != "langtorch-prompt-tuning-checkpoint/1":
        raise CheckpointError(f"checkpoint {path}: expected format "
                              f"'langtorch-prompt-tuning-checkpoint/1', got {meta.get('format')!r}.")
    if meta.get("sha256") != _digest(arrays):
        raise CheckpointError(f"checkpoint {path} is corrupted: its tensors do not match the "
                              "stored sha256. Delete it or resume from another checkpoint.")
    try:
        state = json.loads(meta["state"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path}: its training state is unreadable "
                              f"({exc}).") from exc
    return arrays, state


def save_peft_adapter(directory: str | os.PathLike, prompt: np.ndarray, *,
                      task_type: str = "CAUSAL_LM", base_model: str | None = None,
                      num_layers: int | None = None, num_heads: int | None = None,
                      init_text: str | None = None) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` as PEFT's prompt tuning.

    Both files are written atomically; ``PeftModel.from_pretrained`` / ``load_adapter`` read
    them (``prompt_embeddings`` is the ``[P, H]`` float32 prompt).

    Example:
        >>> import tempfile, numpy as np
        >>> from langtorch.tuning import save_peft_adapter, load_peft_adapter
        >>> d = save_peft_adapter(tempfile.mkdtemp(), np.ones((3, 8), np.float32))
        >>> prompt, config = load_peft_adapter(d)
        >>> prompt.shape, config["peft_type"], config["num_virtual_tokens"]
        ((3, 8), 'PROMPT_TUNING', 3)
    """
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    prompt = np.ascontiguousarray(np.asarray(prompt, np.float32))
    config = {
        "peft_type": "PROMPT_TUNING",
        "task_type": task_type,
        "num_virtual_tokens": int(prompt.shape[0]),
        "token_dim": int(prompt.shape[1]),
        "num_transformer_submodules": 1,
        "num_attention_heads": num_heads,
        "num_layers": num_layers,
        "prompt_tuning_init": "TEXT" if init_text else "RANDOM",
        "prompt_tuning_init_text": init_text,
        "tokenizer_name_or_path": base_model if init_text else None,
        "tokenizer_kwargs": None,
        "base_model_name_or_path": base_model,
        "inference_mode": True,
        "revision": None,
        "auto_mapping": None,
        "modules_to_save": None,
    }
    _atomic_write(directory / ADAPTER_WEIGHTS,
                  lambda tmp: save_file({"prompt_embeddings": prompt}, tmp,
                                        metadata={"format": "pt"}))
    _atomic_write(directory / ADAPTER_CONFIG,
                  lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2)))
    return directory


def load_peft_adapter(directory: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    """Read a PEFT prompt-tuning adapter; return ``(prompt [P, H] float32, config)``.

    Raises:
        AdapterError: a missing file, invalid JSON, another ``peft_type``, an unreadable or
            inconsistent ``adapter_model.safetensors``, or non-finite values.

    Example:
        >>> import tempfile
        >>> from langtorch.tuning import load_peft_adapter, AdapterError
        >>> try:
        ...     load_peft_adapter(tempfile.mkdtemp())
        ... except AdapterError as e:
        ...     print(str(e).split(":")[1].strip())
        expected adapter_config.json, not found. Save one with PromptTuner.save_adapter or PEFT's save_pretrained.
    """
    from safetensors import safe_open

    directory = Path(directory)
    cfg_path, w_path = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise AdapterError(f"adapter directory {directory}: expected {p.name}, not found. "
                               "Save one with PromptTuner.save_adapter or PEFT's "
                               "save_pretrained.")
    try:
        config = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{cfg_path} is not valid JSON ({exc}); the adapter is "
                           "corrupted: save it again.") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "PROMPT_TUNING":
        got = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise AdapterError(f"{cfg_path}: expected peft_type 'PROMPT_TUNING', got {got!r}; "
                           "only prompt-tuning adapters hold a soft prompt.")
    try:
        with safe_open(str(w_path), framework="numpy") as f:
            keys = list(f.keys())
            if "prompt_embeddings" not in keys:
                raise AdapterError(f"{w_path}: expected a tensor 'prompt_embeddings', found "
                                   f"{keys}.")
            prompt = f.get_tensor("prompt_embeddings")
    except AdapterError:
        raise
    except Exception as exc:
        raise AdapterError(f"{w_path} is not a readable safetensors file ({type(exc).__name__}: "
                           f"{exc}); the adapter is corrupted: save it again.") from exc
    if prompt.dtype.kind == "V" or prompt.ndim != 2:  # bfloat16 arrives as raw void bytes
        raise AdapterError(f"{w_path}: expected prompt_embeddings of shape [P, H] in a float "
                           f"dtype, got shape {prompt.shape} dtype {prompt.dtype}.")
    n = config.get("num_virtual_tokens")
    if n is not None and int(n) * int(config.get("num_transformer_submodules") or 1) != \
            prompt.shape[0]:
        raise AdapterError(f"{cfg_path}: num_virtual_tokens={n} but prompt_embeddings has "
                           f"{prompt.shape[0]} rows; the adapter is inconsistent.")
    if not np.all(np.isfinite(prompt)):
        raise AdapterError(f"{w_path}: prompt_embeddings contains NaN or inf values.")
    return prompt.astype(np.float32), config
