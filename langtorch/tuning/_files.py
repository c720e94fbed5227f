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

from langtorch.functional.loaders import atomic_write, fsync_dir
from langtorch.tuning._errors import AdapterError, CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "save_peft_adapter", "load_peft_adapter",
           "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "ADAPTER_MANIFEST"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_MANIFEST = "langtorch_adapter.json"
"""Written with the two PEFT files: their sha256 digests, so a torn pair is detected at load."""
_MANIFEST_FORMAT = "langtorch-adapter-pair/1"


def _digest(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(k.encode() + b"\0" + str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _replace_together(directory: Path, files: dict[str, bytes], manifest: str) -> None:
    """Put ``files`` (name -> bytes) into ``directory`` as one unit, ``manifest`` first.

    Everything is written and fsynced under a temporary folder inside ``directory`` before
    any real name changes; then the manifest (the digests of the *new* files) replaces the old
    one, then each file. A crash between two renames leaves files that disagree with the
    manifest, which :func:`load_peft_adapter` reports instead of loading a mixed pair.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".adapter-", suffix=".tmp", dir=directory))
    try:
        for name, data in files.items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(tmp)
        order = [manifest] + [n for n in files if n != manifest]
        for name in order:
            os.replace(tmp / name, directory / name)
        fsync_dir(directory)
    finally:
        for leftover in tmp.iterdir():
            leftover.unlink()
        tmp.rmdir()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(path: str | os.PathLike, arrays: Mapping[str, np.ndarray],
                    state: Mapping[str, Any]) -> Path:
    """Atomically write ``arrays`` and the JSON-able ``state`` to one safetensors file."""
    from safetensors.numpy import save_file

    path = Path(path)
    arrays = {k: np.ascontiguousarray(np.asarray(v)) for k, v in arrays.items()}
    meta = {"format": "langtorch-prompt-tuning-checkpoint/1",
            "state": json.dumps(state), "sha256": _digest(arrays)}
    atomic_write(path, lambda tmp: save_file(arrays, tmp, metadata=meta))
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

    The two files are replaced as a pair: both are written and fsynced in a temporary folder
    first, and a manifest (``langtorch_adapter.json``, their sha256 digests) goes in before
    them, so an interrupted save is detected by :func:`load_peft_adapter` instead of loading
    new weights with an old config. ``PeftModel.from_pretrained`` / ``load_adapter`` read the
    folder (``prompt_embeddings`` is the ``[P, H]`` float32 prompt; PEFT ignores the manifest).

    Example:
        >>> import tempfile, numpy as np
        >>> from langtorch.tuning import save_peft_adapter, load_peft_adapter
        >>> d = save_peft_adapter(tempfile.mkdtemp(), np.ones((3, 8), np.float32))
        >>> prompt, config = load_peft_adapter(d)
        >>> prompt.shape, config["peft_type"], config["num_virtual_tokens"]
        ((3, 8), 'PROMPT_TUNING', 3)
    """
    from safetensors.numpy import save

    directory = Path(directory)
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
    weights = save({"prompt_embeddings": prompt}, metadata={"format": "pt"})
    config_bytes = json.dumps(config, indent=2).encode()
    manifest = {"format": _MANIFEST_FORMAT,
                "sha256": {ADAPTER_WEIGHTS: _sha256(weights),
                           ADAPTER_CONFIG: _sha256(config_bytes)}}
    _replace_together(directory, {ADAPTER_MANIFEST: json.dumps(manifest, indent=2).encode(),
                                  ADAPTER_WEIGHTS: weights, ADAPTER_CONFIG: config_bytes},
                      ADAPTER_MANIFEST)
    return directory


_FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}


def _float_tensor(path: Path, entry: dict) -> np.ndarray:
    """A safetensors entry (``deserialize``) as float32; BF16 too (PEFT saves the prompt in
    the model's dtype, and numpy has no bfloat16: its bits are the top half of a float32)."""
    dtype, shape, data = entry["dtype"], tuple(entry["shape"]), entry["data"]
    if dtype == "BF16":
        bits = np.frombuffer(data, "<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    if dtype not in _FLOAT_DTYPES:
        raise AdapterError(f"{path}: expected prompt_embeddings in a float dtype (F32, F16, "
                           f"BF16, F64), got {dtype}.")
    return np.frombuffer(data, _FLOAT_DTYPES[dtype]).astype(np.float32).reshape(shape)


def _read_manifest(directory: Path) -> dict | None:
    """The digests recorded by :func:`save_peft_adapter` (``None``: written by another tool)."""
    man_path = directory / ADAPTER_MANIFEST
    try:
        raw = man_path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    try:
        manifest = json.loads(raw)
        digests = manifest["sha256"]
        if manifest.get("format") != _MANIFEST_FORMAT or not isinstance(digests, dict):
            raise ValueError(f"format {manifest.get('format')!r}")
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{man_path} is unreadable ({exc}); save the adapter again, or "
                           f"delete {ADAPTER_MANIFEST} if another tool wrote these files.") from exc
    return digests


def _check_pair(directory: Path, digests: dict | None, contents: dict[str, bytes]) -> None:
    """Verify the bytes that were parsed against the manifest (adapters written by PEFT have
    none)."""
    if digests is None:
        return
    for name, data in contents.items():
        if digests.get(name) != _sha256(data):
            raise AdapterError(
                f"adapter directory {directory}: {ADAPTER_WEIGHTS} and {ADAPTER_CONFIG} are not "
                f"the pair recorded in {ADAPTER_MANIFEST} ({name} differs): a save was "
                "interrupted or one file was replaced alone. Save the adapter again (or delete "
                f"{ADAPTER_MANIFEST} if another tool such as PEFT rewrote both files).")


def load_peft_adapter(directory: str | os.PathLike) -> tuple[np.ndarray, dict[str, Any]]:
    """Read a PEFT prompt-tuning adapter; return ``(prompt [P, H] float32, config)``.

    Raises:
        AdapterError: a missing file, invalid JSON, another ``peft_type``, an unreadable or
            inconsistent ``adapter_model.safetensors``, non-finite values, or two files that
            are not the pair the manifest records (an interrupted save).

    Example:
        >>> import tempfile
        >>> from langtorch.tuning import load_peft_adapter, AdapterError
        >>> try:
        ...     load_peft_adapter(tempfile.mkdtemp())
        ... except AdapterError as e:
        ...     print(str(e).split(":")[1].strip())
        expected adapter_config.json, not found. Save one with PromptTuner.save_adapter or PEFT's save_pretrained.
    """
    from safetensors import deserialize

    directory = Path(directory)
    cfg_path, w_path = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise AdapterError(f"adapter directory {directory}: expected {p.name}, not found. "
                               "Save one with PromptTuner.save_adapter or PEFT's "
                               "save_pretrained.")
    # Each file is read once, the manifest first, and the digests are those of the very bytes
    # parsed below: a save running meanwhile is reported, never loaded as a mixed pair.
    digests = _read_manifest(directory)
    cfg_bytes, w_bytes = cfg_path.read_bytes(), w_path.read_bytes()
    try:
        config = json.loads(cfg_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{cfg_path} is not valid JSON ({exc}); the adapter is "
                           "corrupted: save it again.") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "PROMPT_TUNING":
        got = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise AdapterError(f"{cfg_path}: expected peft_type 'PROMPT_TUNING', got {got!r}; "
                           "only prompt-tuning adapters hold a soft prompt.")
    try:
        tensors = dict(deserialize(w_bytes))
        if "prompt_embeddings" not in tensors:
            raise AdapterError(f"{w_path}: expected a tensor 'prompt_embeddings', found "
                               f"{sorted(tensors)}.")
        prompt = _float_tensor(w_path, tensors["prompt_embeddings"])
    except AdapterError:
        raise
    except Exception as exc:
        raise AdapterError(f"{w_path} is not a readable safetensors file ({type(exc).__name__}: "
                           f"{exc}); the adapter is corrupted: save it again.") from exc
    if prompt.ndim != 2:
        raise AdapterError(f"{w_path}: expected prompt_embeddings of shape [P, H], got shape "
                           f"{prompt.shape}.")
    n = config.get("num_virtual_tokens")
    if n is not None and int(n) * int(config.get("num_transformer_submodules") or 1) != \
            prompt.shape[0]:
        raise AdapterError(f"{cfg_path}: num_virtual_tokens={n} but prompt_embeddings has "
                           f"{prompt.shape[0]} rows; the adapter is inconsistent.")
    if not np.all(np.isfinite(prompt)):
        raise AdapterError(f"{w_path}: prompt_embeddings contains NaN or inf values.")
    _check_pair(directory, digests, {ADAPTER_WEIGHTS: w_bytes, ADAPTER_CONFIG: cfg_bytes})
    return prompt.astype(np.float32), config
