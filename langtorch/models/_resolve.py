"""Which objects name a local model: one rule for every tool that reads a model's weights.

``PromptTuner``, ``LocalClassifier`` and ``TokenSearch`` take a ``model`` argument and need the
weights behind it (gradients, logits), so they all resolve it with :func:`resolve_model`. A
backend or an ``lt.nn.LLM`` module is recognised by duck typing (this package sits below
``backends`` and ``nn`` and imports neither).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

__all__ = ["ACCEPTED_MODELS", "resolve_model"]

ACCEPTED_MODELS = (
    "None or 'smollm2' (the process-wide SmolLM2), 'minilm' (the process-wide MiniLM), the "
    "path of a Hugging Face model directory or a .gguf file (loaded with "
    "langtorch.models.load), a loaded local model (a langtorch.models.CausalLM or Encoder, "
    "SmolLM2 or MiniLM, or any object with `config` and `params` holding decoder ('embed') or "
    "BERT ('embeddings') weights), a LocalBackend (its `.llm`), or an lt.nn.LLM module on a "
    "LocalBackend (its `.backend`)")
"""What :func:`resolve_model` accepts, as its error messages say it."""

_DECODER_METHODS = ("encode", "decode")


def _weights(obj: Any) -> Mapping | None:
    params = getattr(obj, "params", None)
    return params if isinstance(params, Mapping) and hasattr(obj, "config") else None


def _unwrap(model: Any) -> tuple[Any, list[str]]:
    """Follow ``.backend`` (an ``lt.nn.LLM``) and ``.llm`` (a ``LocalBackend``) to the model;
    also return the chain of type names walked, for the error message."""
    chain = [type(model).__name__]
    for attr in ("backend", "llm"):
        if _weights(model) is not None:
            break
        inner = getattr(model, attr, None)
        if inner is not None and not isinstance(inner, str):
            model = inner
            chain.append(f".{attr}: {type(model).__name__}")
    return model, chain


def _load_path(model: Any) -> Any:
    """The model loaded from ``model`` when it is a string or path naming an existing file or
    directory, else ``model`` as it is."""
    if isinstance(model, os.PathLike) or isinstance(model, str):
        from langtorch.core import user_path

        try:
            path = user_path(model)
        except ValueError:  # an unset $VARIABLE or "": no path, refused below
            path = None
        if path is not None and path.exists():
            from langtorch.models._load import load

            return load(path)
    return model


def _problem(model: Any, resolved: Any, params: Any, decoder: bool, chat: bool) -> str | None:
    """Why ``resolved`` (what ``model`` unwrapped to) does not serve, or ``None`` when it does."""
    if isinstance(model, (str, os.PathLike)):
        return ("not a local model's name ('smollm2', 'minilm') nor the path of an existing "
                "model directory or .gguf file")
    if params is None or not ("embed" in params or "embeddings" in params):
        return "no `config` and `params` with Llama or BERT weights"
    if decoder and "embed" not in params:
        return "an encoder; a decoder (Llama weights) is needed"
    needed = _DECODER_METHODS * decoder + ("apply_chat_template",) * chat
    missing = [m for m in needed if not callable(getattr(resolved, m, None))]
    if missing:
        return f"missing {', '.join(missing)}" + (
            " (chat rendering is on: turn it off to use the prompts as they are)"
            if "apply_chat_template" in missing else "")
    return None


def resolve_model(model: Any = None, *, decoder: bool = False, chat: bool = False,
                  owner: str = "langtorch") -> Any:
    """The local JAX model that ``model`` names, for a tool that reads its weights.

    The one rule (:data:`ACCEPTED_MODELS`), in order:

    1. ``None`` or ``"smollm2"``: :func:`~langtorch.models.default_llm`; ``"minilm"``:
       :func:`~langtorch.models.default_embedder`.
    2. Any other string or ``os.PathLike`` that names an existing file or directory:
       :func:`~langtorch.models.load` (a Hugging Face directory or a ``.gguf`` file; ``~`` is
       expanded).
    3. A loaded local model (:class:`~langtorch.models.CausalLM`,
       :class:`~langtorch.models.Encoder`, ``SmolLM2``, ``MiniLM``): an object with ``config`` and a ``params`` mapping that holds
       Llama (``"embed"``) or BERT (``"embeddings"``) weights, returned as it is.
    4. A wrapper of one, unwrapped by duck typing: an ``lt.nn.LLM`` module through its
       ``.backend``, a ``LocalBackend`` through its ``.llm``.

    Anything else — an API backend, a string that is no model name nor an existing path — is
    refused: these tools need the
    weights, so run them on a local model and use the text they produce with any backend.

    Args:
        model: what the caller was given.
        decoder: also require a decoder (Llama weights, ``encode`` and ``decode``).
        chat: also require ``apply_chat_template`` (the caller renders chats).
        owner: the caller's name, which starts the error message.

    Returns:
        The model object (``params``, ``config`` and its tokenizer methods).

    Raises:
        TypeError: ``model`` is none of the above; the message lists what is accepted.

    Example:
        >>> from langtorch.models import resolve_model
        >>> class Tiny:
        ...     params, config = {"embed": None}, "cfg"
        ...     def encode(self, text): return [1]
        ...     def decode(self, ids): return "a"
        >>> class Backend:
        ...     llm = Tiny()
        >>> type(resolve_model(Backend(), decoder=True)).__name__
        'Tiny'
        >>> try:
        ...     resolve_model("gpt-4o", owner="MyTool")
        ... except TypeError as e:
        ...     print(str(e).split(":")[0])
        MyTool needs a local JAX model (it reads the weights), got 'gpt-4o'
    """
    if model is None or (isinstance(model, str) and model == "smollm2"):
        from langtorch.models._smollm2 import default_llm

        return default_llm()
    if isinstance(model, str) and model == "minilm":
        from langtorch.models._minilm import default_embedder

        return default_embedder()
    model = _load_path(model)
    resolved, chain = _unwrap(model) if not isinstance(model, (str, os.PathLike)) else (
        model, [repr(model)])
    params = _weights(resolved)
    problem = _problem(model, resolved, params, decoder, chat)
    if problem is None:
        return resolved
    got = " (".join(chain) + ")" * (len(chain) - 1)
    raise TypeError(
        f"{owner} needs a local JAX model (it reads the weights), got {got}: {problem}. Expected "
        f"{ACCEPTED_MODELS}. API backends have no weights to read: run {owner} on a local "
        "model and use the text it produces with any backend.")
