"""Reading PEFT prompt-tuning adapters (a soft prompt ``[P, H]`` and its config).

The reader lives here, below both ``backends`` (``LocalBackend(adapter=dir)``) and ``tuning``
(``PromptTuner.load_adapter``), so both load an adapter the same way; ``langtorch.tuning``
writes them (``save_peft_adapter``) with the file names and manifest format defined here
(``ADAPTER_CONFIG``, ``ADAPTER_WEIGHTS``, ``ADAPTER_MANIFEST``, ``MANIFEST_FORMAT``).

An adapter saved from a classifier (a label-mode ``PromptTuner``) also carries its label set
and how the labels are scored, in the manifest (:class:`AdapterClassifier`, read by
``load_peft_adapter(dir, with_classifier=True)``): ``langtorch serve`` and ``LocalBackend``
answer a request to it with the label ``PromptTuner.predict`` gives. PEFT's two files stay as
PEFT writes them.

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

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from langtorch.core import user_path
from langtorch.functional.errors import LangTorchError

__all__ = ["ADAPTER_CONFIG", "ADAPTER_MANIFEST", "ADAPTER_WEIGHTS", "MANIFEST_FORMAT",
           "MANIFEST_FORMATS", "AdapterClassifier", "AdapterError", "load_peft_adapter"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_MANIFEST = "langtorch_adapter.json"
"""Written with the two PEFT files: their sha256 digests, so a torn pair is detected at load."""
MANIFEST_FORMAT = "langtorch-adapter-pair/2"
"""What :func:`langtorch.tuning.save_peft_adapter` writes for a classifier: ``/1`` (the digests)
plus a ``"classifier"`` entry (:class:`AdapterClassifier`). Older langtorch versions refuse a
``/2`` manifest rather than serve a classifier adapter as free text; an adapter without labels
is still written as ``/1``, which they read."""
MANIFEST_FORMATS = ("langtorch-adapter-pair/1", MANIFEST_FORMAT)
"""The manifest formats this version reads (``/1``: saved before adapters carried labels)."""


class AdapterError(LangTorchError, ValueError):
    """A PEFT adapter directory is missing, corrupted, or does not fit the model.

    Example:
        >>> from langtorch.models import AdapterError
        >>> str(AdapterError("bad adapter"))
        'bad adapter'
    """


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class AdapterClassifier:
    """How a classifier adapter turns an input text into one of its labels: what
    ``PromptTuner.predict`` does, recorded in the adapter's manifest so a server does the same.

    The input text is put into ``template`` (its one ``{}``); with ``chat`` the result is the
    user turn of the model's chat template (after a ``system`` turn when there is one),
    otherwise it is read as it is. Each label is scored by the log-probabilities of its label
    word's tokens (``label_tokens``, the ids of ``label_words``) after that prompt, with the
    adapter's soft prompt in front (projected onto the vocabulary first when ``pez``): their
    sum, or with ``reduction="mean"`` their mean, computed with the weights in ``dtype``. The
    answer is the label of the highest score.

    Attributes:
        labels: the label set, as ``predict`` returns them.
        label_words: the text scored for each label (``" positive"``, or ``"positive"`` with
            ``chat``).
        label_tokens: the token ids of each label word, as the tuner's tokenizer gave them (a
            server checks its own tokenizer gives the same).
        template: the tuner's template, one ``{}``.
        chat: whether the filled template is a chat turn.
        system: the system turn with ``chat`` (``None``: the chat template's default).
        reduction: ``"sum"`` or ``"mean"``.
        dtype: ``"float32"`` or ``"bfloat16"``: the weights the tuner scored with.
        pez: the prompt is projected onto the nearest vocabulary embeddings (a PEZ tuner).

    Example:
        >>> from langtorch.models import AdapterClassifier
        >>> c = AdapterClassifier(labels=("no", "yes"), label_words=(" no", " yes"),
        ...                       label_tokens=((913,), (3365,)), template="Q: {}\\nA:")
        >>> AdapterClassifier.from_json(c.to_json()) == c
        True
    """

    labels: tuple[str, ...]
    label_words: tuple[str, ...]
    label_tokens: tuple[tuple[int, ...], ...]
    template: str = "{}"
    chat: bool = False
    system: str | None = None
    reduction: str = "sum"
    dtype: str = "float32"
    pez: bool = False

    def __post_init__(self) -> None:
        _check_classifier(self, "AdapterClassifier")

    def to_json(self) -> dict[str, Any]:
        """The manifest's ``"classifier"`` entry (JSON types only).

        Example:
            >>> from langtorch.models import AdapterClassifier
            >>> AdapterClassifier(("a", "b"), ("a", "b"), ((1,), (2,))).to_json()["labels"]
            ['a', 'b']
        """
        d = dataclasses.asdict(self)
        d["labels"], d["label_words"] = list(self.labels), list(self.label_words)
        d["label_tokens"] = [list(t) for t in self.label_tokens]
        return d

    @classmethod
    def from_json(cls, data: Any, where: str = "classifier") -> AdapterClassifier:
        """Read a manifest's ``"classifier"`` entry; :class:`AdapterError` (naming ``where``
        and the field) when it is not one.

        Example:
            >>> from langtorch.models import AdapterClassifier, AdapterError
            >>> try:
            ...     AdapterClassifier.from_json({"labels": "yes", "label_words": ["yes"],
            ...                                  "label_tokens": [[1]]})
            ... except AdapterError as e:
            ...     print(e)
            classifier: expected labels as a list of strings, got 'yes'.
        """
        if not isinstance(data, Mapping):
            raise AdapterError(f"{where}: expected an object with the label set, got "
                               f"{type(data).__name__}.")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise AdapterError(f"{where}: unknown field {unknown[0]!r} (expected "
                               f"{sorted(names)}).")
        for need in ("labels", "label_words", "label_tokens"):
            if need not in data:
                raise AdapterError(f"{where}: the field {need!r} is missing.")

        def strings(key: str) -> tuple[str, ...]:
            v = data[key]
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise AdapterError(f"{where}: expected {key} as a list of strings, got {v!r:.80}.")
            return tuple(v)

        toks = data["label_tokens"]
        if not isinstance(toks, list) or not all(
                isinstance(t, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                            for i in t) for t in toks):
            raise AdapterError(f"{where}: expected label_tokens as a list of lists of token "
                               f"ids, got {toks!r:.80}.")
        kw = {k: data[k] for k in ("template", "chat", "system", "reduction", "dtype", "pez")
              if k in data}
        try:
            return cls(labels=strings("labels"), label_words=strings("label_words"),
                       label_tokens=tuple(tuple(t) for t in toks), **kw)
        except AdapterError as exc:  # name the file, not the class
            raise AdapterError(str(exc).replace("AdapterClassifier", where, 1)) from None


def _check_classifier(c: AdapterClassifier, where: str) -> None:
    """Refuse a label set no classifier can answer with (as ``PromptTuner`` refuses it)."""
    k = len(c.labels)
    if k < 2 or len(set(c.labels)) != k:
        raise AdapterError(f"{where}: expected at least two distinct labels, got "
                           f"{list(c.labels)!r:.120}.")
    if len(c.label_words) != k or len(c.label_tokens) != k:
        raise AdapterError(f"{where}: expected one label word and one token list per label "
                           f"({k}), got {len(c.label_words)} words and {len(c.label_tokens)} "
                           "token lists.")
    if any(not t for t in c.label_tokens) or len(set(c.label_tokens)) != k:
        raise AdapterError(f"{where}: expected a non-empty, distinct token list per label, got "
                           f"{[list(t) for t in c.label_tokens]!r:.120}.")
    if any(i < 0 for t in c.label_tokens for i in t):
        raise AdapterError(f"{where}: label token ids must be >= 0.")
    if not isinstance(c.template, str) or c.template.count("{}") != 1:
        raise AdapterError(f"{where}: expected a template with exactly one '{{}}', got "
                           f"{c.template!r:.80}.")
    if not isinstance(c.chat, bool) or not isinstance(c.pez, bool):
        raise AdapterError(f"{where}: expected chat and pez as booleans.")
    if c.system is not None and not isinstance(c.system, str):
        raise AdapterError(f"{where}: expected system as a string or null, got {c.system!r:.60}.")
    if c.reduction not in ("sum", "mean"):
        raise AdapterError(f"{where}: expected reduction 'sum' or 'mean', got {c.reduction!r}.")
    if c.dtype not in ("float32", "bfloat16"):
        raise AdapterError(f"{where}: expected dtype 'float32' or 'bfloat16', got {c.dtype!r}.")


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


def _read_manifest(directory: Path) -> tuple[dict | None, AdapterClassifier | None]:
    """The digests recorded by :func:`langtorch.tuning.save_peft_adapter` and the classifier
    entry (``(None, None)``: written by another tool; a ``/1`` manifest has no classifier)."""
    man_path = directory / ADAPTER_MANIFEST
    try:
        raw = man_path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None, None
    try:
        manifest = json.loads(raw)
        digests = manifest["sha256"]
        if manifest.get("format") not in MANIFEST_FORMATS or not isinstance(digests, dict):
            raise ValueError(f"format {manifest.get('format')!r}, expected one of "
                             f"{list(MANIFEST_FORMATS)}")
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise AdapterError(f"{man_path} is unreadable ({exc}); save the adapter again, or "
                           f"delete {ADAPTER_MANIFEST} if another tool wrote these files.") from exc
    entry = manifest.get("classifier")
    if entry is None:
        return digests, None
    return digests, AdapterClassifier.from_json(
        entry, f"{man_path}: the classifier entry (the adapter's label set; save the adapter "
               "again from its PromptTuner)")


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


def load_peft_adapter(directory: str | os.PathLike, *, with_classifier: bool = False
                      ) -> tuple[np.ndarray, dict[str, Any]] | tuple[
                          np.ndarray, dict[str, Any], AdapterClassifier | None]:
    """Read a PEFT prompt-tuning adapter; return ``(prompt [P, H] float32, config)``, and with
    ``with_classifier=True`` ``(prompt, config, classifier)``: the :class:`AdapterClassifier`
    of an adapter saved from a label-mode ``PromptTuner`` (read from the same manifest as the
    digests), else ``None``. ``~`` and environment variables in ``directory`` are expanded.

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

    directory = user_path(directory, what="adapter directory")
    cfg_path, w_path = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise AdapterError(f"adapter directory {directory}: expected {p.name}, not found. "
                               "Save one with PromptTuner.save_adapter or PEFT's "
                               "save_pretrained.")
    # Each file is read once, the manifest first, and the digests are those of the very bytes
    # parsed below: a save running meanwhile is reported, never loaded as a mixed pair.
    digests, classifier = _read_manifest(directory)
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
    if with_classifier:
        return prompt.astype(np.float32), config, classifier
    return prompt.astype(np.float32), config
