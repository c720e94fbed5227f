"""Reading PEFT prompt-tuning adapters (a soft prompt ``[P, H]`` and its config).

The reader lives here, below both ``backends`` (``LocalBackend(adapter=dir)``) and ``tuning``
(``PromptTuner.load_adapter``), so both load an adapter the same way; ``langtorch.tuning``
writes them (``save_peft_adapter``) with the file names and manifest format defined here
(``ADAPTER_CONFIG``, ``ADAPTER_WEIGHTS``, ``ADAPTER_MANIFEST``, ``MANIFEST_FORMAT``).

Example:
    >>> import tempfile
    >>> from langtorch.models import AdapterError, load_peft_adapter
    >>> try:
    ...     load_peft_adapter(tempfile.mkdtemp())
    ... except AdapterError as e:
    ...     print("expected adapter_config.json" in str(e))
    True
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from langtorch.functional.errors import LangTorchError

__all__ = ["ADAPTER_CONFIG", "ADAPTER_MANIFEST", "ADAPTER_WEIGHTS", "MANIFEST_FORMAT",
           "AdapterError", "load_peft_adapter"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_MANIFEST = "langtorch_adapter.json"
"""Written with the two PEFT files: their sha256 digests, so a torn pair is detected at load."""
MANIFEST_FORMAT = "langtorch-adapter-pair/1"


class AdapterError(LangTorchError, ValueError):
    """A PEFT adapter directory is missing, corrupted, or does not fit the model.

    Example:
        >>> from langtorch.models import AdapterError
        >>> str(AdapterError("bad adapter"))
        'bad adapter'
    """


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    """The digests recorded by :func:`langtorch.tuning.save_peft_adapter` (``None``: written by another tool)."""
    man_path = directory / ADAPTER_MANIFEST
    try:
        raw = man_path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    try:
        manifest = json.loads(raw)
        digests = manifest["sha256"]
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(digests, dict):
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
        >>> from langtorch.models import load_peft_adapter, AdapterError
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
