"""langtorch.models — local models with defaults and caches: MiniLM embeddings, SmolLM2 chat.

The pure model functions live in ``langtorch.functional.models``; this package finds the
pip-installed weights, loads them once per process and offers convenient callables.

* :class:`MiniLM` / :func:`default_embedder` — ``embed_texts(list[str]) -> [N, 384]`` float32.
* :class:`SmolLM2` / :func:`default_llm` — batched jitted chat generation.
* :func:`load` — any Llama / Mistral / Qwen2 / Qwen3 / Gemma 2 / Gemma 3 / Phi-3 checkpoint (a
  Hugging Face directory or a GGUF file) as a :class:`CausalLM`, or a sentence-transformers
  directory as an :class:`Encoder` (docs/models.md).
* :func:`resolve_model` — the one rule for what names a local model (``None``, ``"smollm2"``,
  ``"minilm"``, a loaded model, a ``LocalBackend``, an ``lt.nn.LLM`` on one).
* :func:`label_logits` — the one jitted label-word scorer of a local decoder (one compile cache
  for ``PromptTuner``, ``LocalClassifier`` and ``TokenSearch``).
* :func:`engine_for` / :class:`Engine` / :class:`EngineOptions` — the decode engine of a model
  for given options (continuous batching on a worker thread); :class:`Generation` its result;
  :data:`DECODE_DTYPES` / :func:`resolve_decode_dtype` — the ``decode_dtype`` values and what
  ``"auto"`` means on this machine.
* :func:`load_peft_adapter` / :class:`AdapterError` — read a PEFT prompt-tuning adapter;
  :class:`AdapterClassifier` — the label set a classifier adapter carries.

Example:
    >>> from langtorch.models import default_embedder
    >>> vectors = default_embedder().embed_texts(["a cat", "a dog"])  # doctest: +SKIP
    >>> vectors.shape  # doctest: +SKIP
    (2, 384)
"""

from langtorch.models._causal_lm import CausalLM
from langtorch.models._encoder import Encoder
from langtorch.models._engine import (
    DECODE_DTYPES,
    Engine,
    EngineOptions,
    Generation,
    engine_for,
    resolve_decode_dtype,
)
from langtorch.models._load import load
from langtorch.models._minilm import MiniLM, default_embedder
from langtorch.models._paths import cache_dir, file_sha256, package_dir
from langtorch.models._resolve import ACCEPTED_MODELS, resolve_model
from langtorch.models._scoring import label_logits
from langtorch.models._smollm2 import SmolLM2, default_llm, enable_compilation_cache
from langtorch.models.adapters import AdapterClassifier, AdapterError, load_peft_adapter

__all__ = [
    "CausalLM",
    "DECODE_DTYPES",
    "Encoder",
    "ACCEPTED_MODELS",
    "AdapterClassifier",
    "AdapterError",
    "Engine",
    "EngineOptions",
    "Generation",
    "MiniLM",
    "SmolLM2",
    "cache_dir",
    "default_embedder",
    "default_llm",
    "enable_compilation_cache",
    "engine_for",
    "file_sha256",
    "load",
    "label_logits",
    "load_peft_adapter",
    "package_dir",
    "resolve_decode_dtype",
    "resolve_model",
]
