"""Atomic safetensors files with a content checksum; writing PEFT prompt-tuning adapters.

The adapter files are *read* by :func:`langtorch.models.adapters.load_peft_adapter` (below both
``backends`` and ``tuning``, so both read them one way); this module writes them with that
module's file names and manifest format, and re-exports the reader for ``langtorch.tuning``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from langtorch.core import user_path
from langtorch.functional.loaders import atomic_write, fsync_dir
from langtorch.models.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_MANIFEST,
    ADAPTER_WEIGHTS,
    MANIFEST_FORMAT,
    MANIFEST_FORMATS,
    AdapterClassifier,
    AdapterError,
    load_peft_adapter,
)
from langtorch.tuning._errors import CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "save_peft_adapter", "load_peft_adapter",
           "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "ADAPTER_MANIFEST", "AdapterError"]


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
                      init_text: str | None = None,
                      classifier: AdapterClassifier | None = None) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` as PEFT's prompt tuning.

    ``classifier`` (a label-mode ``PromptTuner.save_adapter`` passes its own) is recorded in the
    manifest, so ``langtorch serve`` and ``LocalBackend`` answer with one of its labels as
    ``predict`` does (docs/serving.md); PEFT's files are the same either way. ``directory`` may
    use ``~`` and environment variables.

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

    directory = user_path(directory, what="save_peft_adapter: directory")
    if classifier is not None and not isinstance(classifier, AdapterClassifier):
        raise TypeError(f"save_peft_adapter: expected classifier as a "
                        f"langtorch.models.AdapterClassifier or None, got "
                        f"{type(classifier).__name__}.")
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
    # /2 only where it matters: an older langtorch refuses a classifier's manifest (rather than
    # serve it as free text) but still reads an adapter without labels.
    manifest = {"format": MANIFEST_FORMAT if classifier is not None else MANIFEST_FORMATS[0],
                "sha256": {ADAPTER_WEIGHTS: _sha256(weights),
                           ADAPTER_CONFIG: _sha256(config_bytes)}}
    if classifier is not None:
        manifest["classifier"] = classifier.to_json()
    _replace_together(directory, {ADAPTER_MANIFEST: json.dumps(manifest, indent=2).encode(),
                                  ADAPTER_WEIGHTS: weights, ADAPTER_CONFIG: config_bytes},
                      ADAPTER_MANIFEST)
    return directory
