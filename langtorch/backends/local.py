"""``LocalBackend``: a local chat model in JAX (SmolLM2-135M-Instruct by default, or any model
``langtorch.models.load`` reads) behind the same interface as the OpenAI backend.

Every request goes to the model's decode engine (:func:`langtorch.models.engine_for`):
continuous batching over a fixed set of slots, decoded in jitted chunks. A request joins as
soon as a slot is free and leaves as soon as it is done (EOS, its ``max_tokens``, a stop
string), so a short request is never held by a long one; its text streams token by token
(:meth:`LocalBackend.stream_events`). Each request is validated and prefilled on its own: a bad
one fails alone with :class:`~langtorch.errors.BadRequestError` naming the parameter.

Soft prompts (prompt tuning) ride the same path: ``LocalBackend(adapter=...)`` puts a tuned
prompt in front of every request, ``adapters={"name": ...}`` offers several, chosen per
request with ``"adapter": "name"``. An adapter of a label-mode ``PromptTuner`` answers with
one of its labels, the one ``predict`` gives (``_local_classify``), unless the request asks
for free text or structure (``response_format``, ``guided_*``, ``tools``).

Example:
    >>> import asyncio
    >>> from langtorch.backends import LocalBackend
    >>> backend = LocalBackend()  # doctest: +SKIP
    >>> c = asyncio.run(backend.complete({"messages": [{"role": "user", "content": "Hi"}],
    ...                                   "temperature": 0, "max_tokens": 8}))  # doctest: +SKIP
    >>> c.choices[0].finish_reason in ("stop", "length")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.backends import _local_classify as LC
from langtorch.backends._local_request import (
    MAX_N,
)
from langtorch.backends._local_request import (
    bad as _bad,
)
from langtorch.backends._local_request import (
    check_keys as _check_keys,
)
from langtorch.backends._local_request import (
    checked as _checked,
)
from langtorch.backends._local_request import (
    output_constraint as _output_constraint,
)
from langtorch.backends._local_request import (
    prompt_ids as _prompt_ids,
)
from langtorch.backends._local_request import (
    read_messages as _read_messages,
)
from langtorch.backends._local_request import (
    read_tools as _read_tools,
)
from langtorch.backends._local_request import (
    tool_plan as _tool_plan,
)
from langtorch.backends.base import Backend, Capabilities, Choice, Completion, Embeddings, Usage
from langtorch.errors import BackendError, BadRequestError
from langtorch.functional.errors import SequenceError
from langtorch.functional.request import (
    SamplingParams,
    fold_tool_turns,
    normalize_messages,
    parse_tool_call,
)

__all__ = ["LocalBackend", "PreparedRequest", "StreamEvent"]


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """A piece of a streamed local answer.

    Attributes:
        index: the choice (``0 .. n-1``).
        text: new text of that choice (may be ``""`` on the final event).
        finish_reason: ``None`` while the choice runs; ``"stop"`` or ``"length"`` on its final
            event.
        logprobs: with ``logprobs=True``, OpenAI's ``logprobs.content`` entries
            (``{"token", "logprob", "bytes", "top_logprobs"}``) of the tokens this event's text
            came from, else ``None``.

    Example:
        >>> from langtorch.backends import StreamEvent
        >>> StreamEvent(0, "Hel", None).text
        'Hel'
    """

    index: int
    text: str
    finish_reason: str | None = None
    logprobs: tuple | None = None


def _vocabulary_of(llm: Any) -> Any:
    """A :class:`TokenVocabulary` for a loaded model: GGUF metadata (SmolLM2, GGUF loads) or its
    ``tokenizers.Tokenizer`` (HF directories); ``None`` when neither is readable."""
    from langtorch.functional.constrain import TokenVocabulary

    eos = [int(e) for e in getattr(llm, "eos_ids", (llm.eos_id,)) if int(e) >= 0]
    size = int(llm.config.vocab_size)
    meta = getattr(llm, "metadata", None)
    if isinstance(meta, Mapping) and "tokenizer.ggml.tokens" in meta:
        return TokenVocabulary.from_gguf_metadata(meta, size=size, eos_ids=eos, encode=llm.encode)
    tok = getattr(llm, "tokenizer", None)
    for inner in (tok, getattr(tok, "tokenizer", None), getattr(tok, "_tokenizer", None)):
        if inner is not None and hasattr(inner, "to_str") and hasattr(inner, "id_to_token"):
            return TokenVocabulary.from_tokenizer(inner, eos_ids=eos, size=size)
    meta = getattr(tok, "metadata", None)
    if isinstance(meta, Mapping) and "tokenizer.ggml.tokens" in meta:
        return TokenVocabulary.from_gguf_metadata(meta, size=size, eos_ids=eos, encode=llm.encode)
    return None


def _adapter_prompt(source: Any) -> tuple[np.ndarray, Any]:
    """``(prompt, classifier)``: a ``[P, H]`` float32 prompt from a PromptTuner (PEZ-projected
    when trained with PEZ), a PEFT adapter directory (``~`` and ``$VARS`` expanded), or an
    array; and the :class:`~langtorch.models.AdapterClassifier` of a label-mode tuner or of a
    directory that records one (``None`` otherwise)."""
    classifier = None
    if isinstance(source, (str, os.PathLike)):
        from langtorch.core import user_path
        from langtorch.models import load_peft_adapter

        prompt, _, classifier = load_peft_adapter(
            user_path(source, what="LocalBackend: adapter"), with_classifier=True)
        arr = np.asarray(prompt, np.float32)
    elif callable(getattr(source, "prompt_embeddings", None)):  # a PromptTuner (tuning is above)
        arr = np.asarray(source.prompt_embeddings(), np.float32)
        spec = getattr(source, "adapter_classifier", None)
        classifier = spec() if callable(spec) else None
        if classifier is not None:
            # prompt_embeddings() is already projected for a PEZ tuner: score it as it is.
            classifier = dataclasses.replace(classifier, pez=False)
    else:
        arr = np.asarray(source, np.float32)
    # Every source is checked: a NaN in an adapter file would turn every answer into garbage.
    if arr.ndim != 2 or not np.isfinite(arr).all():
        raise ValueError(f"LocalBackend: expected an adapter as a PromptTuner, a PEFT adapter "
                         f"directory or a finite [P, H] array, got shape {arr.shape} with "
                         f"{int(np.size(arr) - np.isfinite(arr).sum())} non-finite values.")
    return arr, classifier


def _digest(prompt: np.ndarray) -> str:
    h = hashlib.sha256(str(prompt.shape).encode())
    h.update(np.ascontiguousarray(prompt, np.float32).tobytes())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class PreparedRequest:
    """A chat request checked and tokenised once: what :meth:`LocalBackend.prepare` returns
    and :meth:`LocalBackend.stream_events` / :meth:`~LocalBackend.complete` accept in place of
    the request mapping (``langtorch serve`` prepares in a worker thread, so a long prompt is
    tokenised off the event loop, once).

    Attributes:
        messages: the normalised messages (:func:`langtorch.functional.request.normalize_messages`).
        params: the :class:`~langtorch.functional.request.SamplingParams`; ``max_tokens`` is
            resolved (the request's, or the backend's default cut to the context left).
        prompt_ids: the rendered chat's token ids.
        prefix: the adapter's ``[P, H]`` soft prompt, or ``None``.
        explicit_max_tokens: whether the request named ``max_tokens`` itself.
        constraint: the output constraint (:class:`~langtorch.functional.constrain.Constraint`
            from ``response_format`` / ``guided_*``), or ``None``.
        compiler: the model's :class:`~langtorch.functional.constrain.GrammarCompiler` when
            there is a constraint (each choice gets its own matcher from it).
        tool_call: whether the answer is a tool call (the constraint is the tools'): each
            choice's JSON is returned as OpenAI ``tool_calls``.
        classify: for a request a classifier adapter answers with a label (not decoded), the
            classifier and the ids it scores; else ``None``.

    Example:
        >>> from langtorch.backends.local import PreparedRequest
        >>> from langtorch.functional.request import SamplingParams
        >>> PreparedRequest([], SamplingParams(max_tokens=4), [1, 2, 3], None).prompt_tokens
        3
    """

    messages: list
    params: SamplingParams
    prompt_ids: list
    prefix: np.ndarray | None
    explicit_max_tokens: bool = True
    constraint: Any = None
    compiler: Any = None
    tool_call: bool = False
    classify: Any = None

    @property
    def prompt_tokens(self) -> int:
        """Prompt ids plus the adapter's virtual tokens (what usage reports)."""
        return len(self.prompt_ids) + (0 if self.prefix is None else int(self.prefix.shape[0]))

    def sequences(self) -> list:
        """Fresh engine sequences for the ``n`` choices (a sequence records its own output)."""
        from langtorch.functional.engine import Sequence as Seq

        p = self.params
        return [Seq(self.prompt_ids, max_tokens=p.max_tokens, temperature=p.temperature,
                    top_p=p.top_p, seed=p.seed, choice=k, prefix=self.prefix, top_k=p.top_k,
                    min_p=p.min_p, frequency_penalty=p.frequency_penalty,
                    presence_penalty=p.presence_penalty,
                    repetition_penalty=p.repetition_penalty, logit_bias=p.logit_bias,
                    top_logprobs=(p.top_logprobs or 0) if p.logprobs else None,
                    matcher=None if self.constraint is None else
                    self.compiler.matcher(self.constraint))
                for k in range(p.n)]


def _auto_layout(decode: str | None, quantized: str | None, model: Any) -> str:
    """The decode layout ``"auto"`` resolves to for a backend's decode dtype (as resolved),
    quantization and model, before the weights are loaded
    (:func:`langtorch.functional.engine.auto_decode_layout`)."""
    from langtorch.functional.engine import auto_decode_layout

    dtype = decode if decode in ("float32", "bfloat16") else getattr(model, "dtype", "float32")
    try:
        dtype = np.dtype(dtype).name
    except TypeError:
        dtype = str(dtype)
    return auto_decode_layout(quantized is None and dtype == "float32")


def _chat_model(model: Any) -> Any:
    """The chat model ``LocalBackend(model)`` names: ``None`` (the default SmolLM2, loaded on
    first use), a path (:func:`langtorch.models.load`), or a loaded chat model as it is (checked
    here: anything else is refused now, not at the first request)."""
    if model is None:
        return None
    from langtorch.models import resolve_model

    return resolve_model(model, decoder=True, chat=True, owner="LocalBackend")


def _embedder(embedder: Any) -> Any:
    """The encoder ``LocalBackend(embedder=...)`` names: ``None`` (MiniLM on first use), a path
    of a sentence-transformers directory, or a loaded encoder (``embed_texts`` and a
    ``tokenizer``)."""
    if embedder is None:
        return None
    if isinstance(embedder, (str, os.PathLike)):
        from langtorch.models import resolve_model

        embedder = resolve_model(embedder, owner="LocalBackend(embedder=...)")
    if not callable(getattr(embedder, "embed_texts", None)) or \
            not callable(getattr(getattr(embedder, "tokenizer", None), "encode_batch", None)):
        raise TypeError(f"LocalBackend: expected embedder= as a langtorch.models.Encoder (e.g. "
                        f"langtorch.models.load('path/to/bge-small-en-v1.5')), MiniLM or the "
                        f"path of a sentence-transformers directory, got "
                        f"{type(embedder).__name__}.")
    return embedder


class LocalBackend(Backend):
    """A local chat model (default SmolLM2-135M-Instruct) on the shared continuous-batching engine.

    Honours ``messages`` (system/user/assistant turns, rendered with the model's chat template),
    ``n``, ``max_tokens`` / ``max_completion_tokens``, ``temperature`` (OpenAI's default 1.0;
    0 = greedy; ``[0, 2]``), ``top_p`` (``(0, 1]``), ``seed`` (any integer: choice ``k`` of seed
    ``s`` never repeats another seed's sample), ``stop`` (no text from a stop string on is ever
    returned or streamed) and ``adapter``; ``response_format`` (JSON object / JSON schema) and
    vLLM's ``guided_regex`` / ``guided_choice`` / ``guided_json`` by grammar-constrained
    decoding; ``tools`` / ``tool_choice`` (a call decoded under the tools' schemas, returned as
    ``tool_calls``); ``logprobs`` / ``top_logprobs`` (the raw distribution); and
    ``frequency_penalty``, ``presence_penalty``, ``repetition_penalty``, ``logit_bias``,
    ``top_k``, ``min_p`` (see ``docs/local_models.md``). Invalid values and parameters the model
    cannot honour raise :class:`~langtorch.errors.BadRequestError` (status 400, not retryable,
    ``.param`` names the parameter). ``embed`` uses ``embedder`` (default: local all-MiniLM-L6-v2).

    **Adapters (soft prompts).** ``adapter`` is used for every request without an ``"adapter"``
    key; ``adapters`` maps names to adapters chosen with ``"adapter": "name"`` (or a request
    ``"model"`` equal to a name). An adapter is a :class:`~langtorch.tuning.PromptTuner` (its
    :meth:`~langtorch.tuning.PromptTuner.prompt_embeddings`, as ``predict`` uses them,
    PEZ-projected when trained with ``pez=True``; a snapshot taken now; any object with a
    ``prompt_embeddings()`` method will do), a PEFT ``PROMPT_TUNING`` adapter directory (ours or PEFT's ``save_pretrained``) or a
    ``[P, H]`` array. Its ``P`` virtual tokens go in front of the rendered chat; **usage counts
    them as prompt tokens** (``prompt_tokens`` = rendered chat tokens + ``P``, once per request).
    The cache namespace includes every adapter's digest, so cached answers never cross adapters.

    **Classifier adapters.** An adapter of a label-mode ``PromptTuner`` (the tuner itself, or a
    directory its :meth:`~langtorch.tuning.PromptTuner.save_adapter` wrote, which records the
    label set) answers every request with one of its labels: the one
    :meth:`~langtorch.tuning.PromptTuner.predict` gives for the request's input text (the one
    user message, or the completion ``prompt``), scored by the same label scorer, not decoded.
    ``logprobs`` gives the label's log-probability among the labels (``exp`` of it is
    ``predict``'s ``confidence``); sampling parameters do not change the answer. A request with
    ``response_format`` (``{"type": "text"}`` for free text), ``guided_*`` or ``tools`` is
    decoded as usual with the adapter's prompt (docs/serving.md).

    Args:
        model: the chat model: a :class:`langtorch.models.CausalLM` (any architecture
            :func:`langtorch.models.load` reads), a :class:`langtorch.models.SmolLM2`, or the
            path of a Hugging Face model directory or ``.gguf`` file (loaded now); default: the
            process-wide SmolLM2 (:func:`langtorch.models.default_llm`), loaded on first
            request. A float32 model decodes with a float32 KV cache (greedy equals
            transformers').
        embedder: the encoder behind :meth:`embed`: a :class:`langtorch.models.Encoder`, a
            ``MiniLM`` or the path of a sentence-transformers directory; default: the
            process-wide all-MiniLM-L6-v2.
        adapter: the default adapter (see above).
        adapters: named adapters.
        max_slots: sequences decoded together; default: the model's own (``SmolLM2(max_batch=)``,
            16). The backend uses the model's engine for these options (another ``max_slots``
            gives another engine, never silently the first caller's; see :attr:`engine`).
        default_max_tokens: ``max_tokens`` when a request has none (cut to the context left).
        mesh: ``None`` (the model's own), ``"auto"`` or a ``jax.sharding.Mesh``: the engine's
            decode batch is split along the mesh's ``data`` axis.
        decode_dtype: ``None`` (the model's own: for ``SmolLM2``, ``"auto"``, bf16 where the
            CPU multiplies bf16 in hardware; for a :func:`langtorch.models.load`-ed model its
            params' dtype), ``"auto"``, ``"bfloat16"``, ``"float32"`` (one dtype at every
            batch size, so a request's greedy answer never depends on the requests beside it)
            or ``"by_shape"`` (bf16 for decode chunks of many rows where that is faster here:
            answers that can change with the batch; see :class:`langtorch.models.Engine`).
            Part of the response cache's key.
        quantization: ``None`` (the model's own; default: its weights as they are) or
            ``"int8"``: the engine runs the model with int8 weights (one float32 scale per
            output channel): faster decoding, slightly different answers (those of the
            quantized model); see :class:`langtorch.models.Engine`. Part of the response
            cache's key.
        decode_layout: ``None`` (the model's own; default ``"auto"``: hidden states as
            columns on a CPU for float32 weights, else as rows), ``"auto"``, ``"rows"`` or
            ``"columns"``: how the decode steps lay out their products (see
            :class:`langtorch.models.Engine`). ``"rows"`` saves the copy of the layer matrices
            that ``"columns"`` keeps (425 MB for SmolLM2 in float32); ``"columns"`` is refused
            with int8 weights (given here or the model's own). A layout other than the one
            ``"auto"`` resolves to is part of the response cache's key (the two layouts sum
            in another order, so a near-tie can decode differently).
        **options: :class:`~langtorch.backends.RuntimeOptions` fields (defaults here:
            ``max_concurrency=256`` so a call's entries reach the engine together,
            ``timeout=None`` because the first calls compile).

    Example:
        >>> from langtorch.backends import LocalBackend
        >>> LocalBackend(default_max_tokens=16).model
        'SmolLM2-135M-Instruct'
    """

    # What _check_keys lets through (tests/langtorch/test_local_chatapi.py ties the two).
    default_capabilities = Capabilities(multiple_choices=True, streaming=True, embeddings=True,
                                        logprobs=True, structured_output=True, tools=True)

    def __init__(self, model: Any = None, *, adapter: Any = None,
                 adapters: Mapping[str, Any] | None = None, max_slots: int | None = None,
                 default_max_tokens: int = 256, mesh: Any = None, embedder: Any = None,
                 decode_dtype: str | None = None, quantization: str | None = None,
                 decode_layout: str | None = None, **options: Any):
        options.setdefault("max_concurrency", 256)
        options.setdefault("timeout", None)
        from langtorch.functional.engine import DECODE_LAYOUTS

        def known(layout: Any) -> bool:
            return layout is None or (isinstance(layout, str) and layout in DECODE_LAYOUTS)

        if not known(decode_layout):
            raise ValueError(f"LocalBackend: expected decode_layout None, "
                             f"{', '.join(map(repr, DECODE_LAYOUTS))}, got {decode_layout!r}.")
        model = _chat_model(model)
        self._embedder = _embedder(embedder)
        super().__init__(getattr(model, "name", "SmolLM2-135M-Instruct"), **options)
        if isinstance(default_max_tokens, bool) or not isinstance(default_max_tokens, int) \
                or default_max_tokens < 1:
            raise ValueError(f"LocalBackend: expected default_max_tokens >= 1, got "
                             f"{default_max_tokens!r}.")
        if max_slots is not None and (isinstance(max_slots, bool) or not isinstance(max_slots, int)
                                      or max_slots < 1):
            raise ValueError(f"LocalBackend: expected max_slots >= 1 (or None: the model's "
                             f"own), got {max_slots!r}.")
        from langtorch.functional.sharding import resolve_mesh

        self.mesh = resolve_mesh(mesh)
        self._llm = model
        # A model given here is part of the cache namespace: two GGUFs (or dtypes) share the
        # class's name, and their cached answers must not cross. The default model is "".
        from langtorch.models import DECODE_DTYPES, resolve_decode_dtype

        if decode_dtype not in DECODE_DTYPES:
            raise ValueError(f"LocalBackend: expected decode_dtype None, 'auto', 'bfloat16', "
                             f"'float32' or 'by_shape', got {decode_dtype!r}.")
        self.decode_dtype = decode_dtype
        from langtorch.functional.models.quant import QUANTIZATIONS

        if quantization not in (None, *QUANTIZATIONS):
            raise ValueError(f"LocalBackend: expected quantization None or "
                             f"{' or '.join(map(repr, QUANTIZATIONS))}, got {quantization!r}.")
        self.quantization = quantization
        quantized = quantization or getattr(model, "quantization", None)
        own_layout = getattr(model, "decode_layout", None)
        if not known(own_layout):
            raise ValueError(f"LocalBackend: the model's decode_layout is {own_layout!r}; "
                             f"expected None, {', '.join(map(repr, DECODE_LAYOUTS))}.")
        layout = decode_layout if decode_layout is not None else own_layout
        if layout == "columns" and quantized is not None:
            whose = "" if decode_layout is not None else " (the model's own)"
            raise ValueError(f"LocalBackend: decode_layout='columns'{whose} is for float "
                             f"weights; quantization={quantized!r} decodes as rows (use 'auto' "
                             "or 'rows').")
        self.decode_layout = decode_layout
        # The decode dtype as this machine resolves it ("auto" is bf16 on CPUs with bf16 dot
        # units, else the params' dtype): answers decoded with bf16 weights and with fp32
        # weights differ, so their cached answers must not cross — between machines, and
        # with the answers cached before "auto" became the default.
        own = decode_dtype if decode_dtype is not None else getattr(
            model, "decode_dtype", "auto")  # (a model without the attribute gets "auto")
        decode = resolve_decode_dtype(own, quantized)
        tag = (type(model).__name__, getattr(model, "name", None), str(getattr(model, "path", "")),
               getattr(model, "dtype", None), getattr(model, "kv_dtype", None),
               getattr(model, "prefill_dtype", None), getattr(model, "config", None), decode)
        if quantized is not None:  # (appended only when set: the other keys stay as they were)
            tag += (("quantization", quantized),)
        # The layout as it resolves here: a layout other than what "auto" resolves to decodes
        # in another summation order (a near-tie can flip), so its answers get their own
        # namespace; asking for the layout "auto" gives anyway changes nothing.
        auto = _auto_layout(decode, quantized, model)
        resolved = auto if layout in (None, "auto") else layout
        if resolved != auto:  # (likewise)
            tag += (("decode_layout", resolved),)
        # The default model (SmolLM2, fp32 params) decoding in fp32 keeps the namespace it
        # always had; decoding in bf16 (the default on CPUs with bf16 dot units) gets its own.
        self._model_tag = "" if model is None and decode in (None, "float32") \
            and quantization is None and resolved == auto \
            else hashlib.sha256(repr(tag).encode()).hexdigest()[:12]
        self.default_max_tokens = default_max_tokens
        self.max_slots = max_slots
        # Classifier adapters (a label-mode PromptTuner's): key None is the default adapter.
        self._classifiers: dict[str | None, Any] = {}
        self._default = None
        if adapter is not None:
            self._default, clf = _adapter_prompt(adapter)
            if clf is not None:
                self._classifiers[None] = clf
        self._adapters: dict[str, np.ndarray] = {}
        for name, source in (adapters or {}).items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"LocalBackend: expected adapter names as non-empty strings, "
                                 f"got {name!r}.")
            self._adapters[name], clf = _adapter_prompt(source)
            if clf is not None:
                self._classifiers[name] = clf
        self._scorer = LC.Scorer()
        self._tokens_checked: set[str | None] = set()
        if getattr(getattr(model, "config", None), "hidden_size", None) is not None:
            self.check_adapters()  # the model is known now: refuse an adapter of another model

    @property
    def adapter_names(self) -> list[str]:
        """The named adapters a request can select with ``"adapter": name``.

        Example:
            >>> import numpy as np
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend(adapters={"tuned": np.zeros((2, 576))}).adapter_names
            ['tuned']
        """
        return sorted(self._adapters)

    def adapter_labels(self, name: str | None = None) -> tuple[str, ...] | None:
        """The labels a classifier adapter answers with (``name``: a named adapter; ``None``:
        the default one), or ``None`` for an adapter without labels.

        Example:
            >>> import numpy as np
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend(adapters={"tuned": np.zeros((2, 576))}).adapter_labels("tuned") is None
            True
        """
        if name is not None and name not in self._adapters:
            raise KeyError(f"LocalBackend: no adapter named {name!r}; expected one of "
                           f"{self.adapter_names}.")
        c = self._classifiers.get(name)
        return None if c is None else c.labels

    def check_adapters(self) -> None:
        """Refuse adapters of another model: each adapter's width must be the model's embedding
        width, and a classifier adapter's label words must tokenize as they did for its tuner.

        Loads the model. ``LocalBackend(model, ...)`` checks at construction; a backend that
        loads its model on first use (no ``model`` given) would otherwise only refuse each
        request to a misfitting adapter (a 400), so ``langtorch serve`` calls this at startup.

        Raises:
            ValueError: naming the first adapter that does not fit.

        Example:
            >>> import numpy as np
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend(adapters={"x": np.zeros((2, 8))}).check_adapters()  # doctest: +SKIP
            Traceback (most recent call last):
            ValueError: LocalBackend: adapters['x'] is 8 wide, the model's embeddings are 576 ...
        """
        hidden = int(self.llm.config.hidden_size)
        named = ([("adapter", self._default)] if self._default is not None else []) + [
            (f"adapters[{k!r}]", v) for k, v in self._adapters.items()]
        for where, prompt in named:
            if prompt.shape[1] != hidden:
                raise ValueError(f"LocalBackend: {where} is {prompt.shape[1]} wide, the "
                                 f"model's embeddings are {hidden} (an adapter trained for "
                                 "another model?).")
        for key in list(self._classifiers):
            self._check_classifier(key)

    def _check_classifier(self, key: str | None) -> None:
        """Check once that the model tokenizes a classifier adapter's label words as its tuner
        did (a ValueError naming the adapter otherwise)."""
        if key in self._tokens_checked:
            return
        where = "adapter" if key is None else f"adapters[{key!r}]"
        LC.check_tokens(self.llm, self._classifiers[key], where)
        self._tokens_checked.add(key)

    @property
    def cache_namespace(self) -> str:
        """``LocalBackend`` plus the digests of its adapters and of a model given to it (its
        class, name, GGUF path, dtypes and config), so cached answers never cross adapters or
        models; the default model adds nothing when it decodes in fp32 in the decode layout
        ``"auto"`` resolves to (with bf16 decode weights, ``decode_dtype="auto"`` on a CPU with
        bf16 dot units, or another decode layout, it adds a digest).

        Example:
            >>> import numpy as np
            >>> from langtorch.backends import LocalBackend
            >>> a = LocalBackend(adapter=np.zeros((2, 4))).cache_namespace
            >>> b = LocalBackend(adapter=np.ones((2, 4))).cache_namespace
            >>> a != b, LocalBackend(decode_dtype="float32").cache_namespace
            (True, 'LocalBackend')
        """
        parts = [f"model={self._model_tag}"] if self._model_tag else []
        if self._embedder is not None:  # embeddings of another encoder must not be reused
            parts.append("embedder=" + hashlib.sha256(repr((
                type(self._embedder).__name__, getattr(self._embedder, "name", None),
                str(getattr(self._embedder, "path", "")), getattr(self._embedder, "dtype", None),
            )).encode()).hexdigest()[:12])
        def tag(key: str | None, prompt: np.ndarray) -> str:
            c = self._classifiers.get(key)  # a label answer is not a free-text answer
            return _digest(prompt) + ("" if c is None else f"+labels:{LC.classifier_digest(c)}")

        if self._default is not None:
            parts.append(f"adapter={tag(None, self._default)}")
        parts += [f"{k}={tag(k, v)}" for k, v in sorted(self._adapters.items())]
        return "LocalBackend" + ("[" + ",".join(parts) + "]" if parts else "")

    @property
    def llm(self) -> Any:
        """The underlying :class:`langtorch.models.SmolLM2` (loaded on first use)."""
        if self._llm is None:
            from langtorch.models import default_llm

            self._llm = default_llm()
        return self._llm

    @property
    def embedder(self) -> Any:
        """The encoder behind :meth:`embed`: the one given as ``embedder=`` (a
        :class:`langtorch.models.Encoder` or ``MiniLM``), else the process-wide MiniLM
        (:func:`langtorch.models.default_embedder`, loaded on first use).

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend().embedder.name  # doctest: +SKIP
            'all-MiniLM-L6-v2'
        """
        if self._embedder is None:
            from langtorch.models import default_embedder

            return default_embedder()
        return self._embedder

    @property
    def engine(self) -> Any:
        """The model's decode engine for this backend's options (:func:`langtorch.models.engine_for`
        with the model's own options, ``max_slots``, ``mesh``, ``decode_dtype``,
        ``quantization`` and ``decode_layout`` overridden where given here):
        shared with every caller asking for the same options, never one built for others.

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend(max_slots=64).engine.batch.max_slots  # doctest: +SKIP
            64
        """
        from langtorch.models import EngineOptions, engine_for

        llm = self.llm
        return engine_for(llm, EngineOptions.of(llm, max_slots=self.max_slots, mesh=self.mesh,
                                                decode_dtype=self.decode_dtype,
                                                quantization=self.quantization,
                                                decode_layout=self.decode_layout))

    def warmup(self, batch_sizes: Sequence[int] | None = None,
               max_tokens: int | None = None) -> None:
        """Load the model and compile this backend's engine's programs now (see
        :meth:`langtorch.models.Engine.warmup`).

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend().warmup()  # doctest: +SKIP
        """
        self.engine.warmup(batch_sizes, max_tokens=max_tokens or self.default_max_tokens)

    # ------------------------------------------------------------------ requests
    def _adapter_key(self, request: Mapping[str, Any]) -> str | None:
        """The adapter a request selects: a name, or ``None`` for the default adapter (or none)."""
        name = request.get("adapter")
        if name is None:
            model = request.get("model")
            if isinstance(model, str) and model in self._adapters:
                return model
            return None
        if not isinstance(name, str) or name not in self._adapters:
            raise _bad("adapter", f"unknown adapter {name!r}; expected one of "
                                  f"{self.adapter_names}.")
        return name

    def prepare(self, request: Any) -> PreparedRequest:
        """Check a request, render and tokenise its messages, and fit it to the model's context.

        Done once per request (blocking; ``langtorch serve`` calls it in a worker thread):
        :meth:`stream_events` and :meth:`complete` accept the result in place of the mapping.
        A request to a classifier adapter (one that does not ask for free text or structure)
        is prepared for a label answer: ``classify`` holds the ids ``PromptTuner.predict``
        scores for its input text.

        Raises:
            BadRequestError: ``.param`` names the field (``"messages[0].role"``, ``"top_p"``,
                ``"adapter"`` ...); a prompt that leaves no room in the context names
                ``"messages"`` (``.code == "context_length_exceeded"``).

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend().prepare({"messages": [{"role": "user", "content": "Hi"}],
            ...                         "max_tokens": 4}).params.max_tokens  # doctest: +SKIP
            4
        """
        if not isinstance(request, Mapping):
            raise _bad("request", f"expected a request mapping, got {type(request).__name__}.")
        _check_keys(request)
        tools, tool_choice = _read_tools(request)
        raw_messages, raw_prompt, messages = _read_messages(request)
        params = _checked(SamplingParams.from_request, request, max_n=MAX_N)
        if params.seed is None:
            seed = int(np.random.SeedSequence().generate_state(2, np.uint32).view(np.uint64)[0])
            params = dataclasses.replace(params, seed=seed)
        key = self._adapter_key(request)
        prefix = self._default if key is None else self._adapters[key]
        llm = self.llm
        if prefix is not None and prefix.shape[1] != llm.config.hidden_size:
            raise _bad("adapter", f"the adapter's width {prefix.shape[1]} does not match the "
                                  f"model's embedding width {llm.config.hidden_size}.")
        p = 0 if prefix is None else int(prefix.shape[0])
        context = int(llm.config.max_positions)
        classifier = self._classifiers.get(key)
        if classifier is not None and not LC.opts_out(request):
            return self._prepare_classification(key, classifier, messages, raw_prompt, params,
                                                prefix)
        tool_constraint, calling = _tool_plan(tools, tool_choice, raw_messages)
        ids = _prompt_ids(llm, messages, raw_prompt, tools)
        if len(ids) + p >= context:
            raise _bad("messages", f"the prompt has {len(ids) + p} tokens after the chat template "
                                   f"({p} virtual), which leaves no room in the model's context "
                                   f"of {context} tokens; shorten the messages.",
                       code="context_length_exceeded")
        constraint, compiler = _output_constraint(request, calling, tool_constraint, self)
        explicit = params.max_tokens is not None
        if not explicit:
            params = dataclasses.replace(
                params, max_tokens=max(1, min(self.default_max_tokens, context - len(ids) - p)))
        # The engine checks the sequences themselves (ids, ranges) when they are submitted.
        return PreparedRequest(messages, params, ids, prefix, explicit, constraint, compiler,
                               calling)

    def _prepare_classification(self, key: str | None, classifier: Any, messages: list,
                                raw_prompt: str | None, params: SamplingParams,
                                prefix: np.ndarray | None) -> PreparedRequest:
        """A request a classifier adapter answers with a label: its input text tokenised as
        ``PromptTuner.predict`` does, checked against the context."""
        try:
            self._check_classifier(key)
        except ValueError as exc:
            raise _bad("adapter", str(exc).removeprefix("LocalBackend: ")) from None
        llm = self.llm
        try:
            ids = LC.input_ids(llm, classifier, messages, raw_prompt)
        except BadRequestError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template/tokenizer failure is this request's
            raise _bad("messages", f"could not render the input with the chat template: "
                                   f"{type(exc).__name__}: {exc}") from None
        job = LC.Classification(classifier, tuple(ids))
        p = 0 if prefix is None else int(prefix.shape[0])
        context = int(llm.config.max_positions)
        if len(ids) + p + job.extra_tokens > context:
            raise _bad("messages", f"the input is {len(ids) + p} tokens with the template "
                                   f"({p} virtual) and {job.extra_tokens} label tokens are read "
                                   f"after it: more than the model's context of {context} "
                                   "tokens; shorten it.", code="context_length_exceeded")
        return PreparedRequest(messages, params, list(ids), prefix, params.max_tokens is not None,
                               classify=job)

    def classify_scores(self, request: Any) -> np.ndarray:
        """The ``[K]`` label scores a classifier-adapter request is answered from (each label
        word's log-probability after the prompt, the sum or mean of its tokens'; blocking).
        The answer is the label of the highest score; ``PromptTuner.predict`` computes the same
        scores with the same scorer (:func:`langtorch.models.label_logits`).

        Raises:
            BadRequestError: the request does not go to a classifier adapter (or asks for free
                text), or it is invalid.

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend(adapter="./my_classifier").classify_scores(
            ...     {"messages": [{"role": "user", "content": "I loved it"}]})  # doctest: +SKIP
            array([-4.1, -0.3], dtype=float32)
        """
        job = request if isinstance(request, PreparedRequest) else self.prepare(request)
        if job.classify is None:
            raise _bad("adapter", "this request is not answered by a classifier adapter (no "
                                  "adapter with labels selected, or the request asks for free "
                                  "text / structured output).")
        return self._scorer.scores(self.llm, job.classify, job.prefix)

    def _classification_events(self, job: PreparedRequest, scores: np.ndarray) -> list:
        """The stream events of a label answer: each of the ``n`` choices is the label of the
        highest score (whole, in one event), then the request's usage."""
        c = job.classify.classifier
        k = int(np.argmax(scores))
        logp = scores - np.logaddexp.reduce(scores)  # log-softmax over the K labels
        lp = None
        if job.params.logprobs:
            order = np.argsort(-logp, kind="stable")[: int(job.params.top_logprobs or 0)]
            lp = (LC.logprob_entry(c.labels[k], float(logp[k]),
                                   [(c.labels[i], float(logp[i])) for i in order]),)
        events: list = []
        for i in range(job.params.n):
            events.append(StreamEvent(i, c.labels[k], None, lp))
            events.append(StreamEvent(i, "", "stop", () if lp is not None else None))
        events.append(Usage(job.prompt_tokens, len(c.label_tokens[k]) * job.params.n))
        return events

    @staticmethod
    def _request_error(exc: SequenceError, prepared: PreparedRequest | None) -> BadRequestError:
        """The engine's refusal of a sequence, named by the request parameter it came from."""
        param = {"prompt": "messages", "prefix": "adapter"}.get(exc.param, exc.param)
        if param == "max_tokens" and prepared is not None and not prepared.explicit_max_tokens:
            param = "messages"  # the default max_tokens was cut to fit: the prompt is too long
        return _bad(param, exc.reason)

    async def stream_events(self, request: dict[str, Any] | PreparedRequest
                            ) -> AsyncIterator[StreamEvent | Usage]:
        """Stream a request: :class:`StreamEvent` text deltas per choice (each choice ends with
        an event carrying its ``finish_reason``), then one :class:`Usage`.

        Closing the iterator (``aclose``, ``break``, cancelling the task) cancels the request
        and frees its engine slots at the next chunk boundary.

        Example:
            >>> import asyncio
            >>> from langtorch.backends import LocalBackend
            >>> async def main():
            ...     req = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
            ...     return [e async for e in LocalBackend().stream_events(req)]
            >>> asyncio.run(main())[-1].completion_tokens <= 4  # doctest: +SKIP
            True
        """
        loop = asyncio.get_running_loop()
        if self._llm is None:
            await loop.run_in_executor(None, lambda: self.llm)
        job = request if isinstance(request, PreparedRequest) else self.prepare(request)
        if job.classify is not None:
            scores = await loop.run_in_executor(
                None, self._scorer.scores, self.llm, job.classify, job.prefix)
            for item in self._classification_events(job, scores):
                yield item
            return
        queue: asyncio.Queue = asyncio.Queue()

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        # The engine reports a token's logprobs just before the text it makes (same thread).
        pending: dict[int, list] = {}
        to_entry = self._logprob_entry

        def on_logprobs(i: int, entries: list) -> None:
            pending.setdefault(i, []).extend(to_entry(e) for e in entries)

        def event(i: int, text: str, reason: str | None) -> StreamEvent:
            lp = pending.pop(i, None)
            if lp is None and job.params.logprobs:
                lp = []
            return StreamEvent(i, text, reason, None if lp is None else tuple(lp))

        try:
            handle = self.engine.submit(
                job.sequences(), stops=job.params.stop,
                on_delta=lambda i, t: put(event(i, t, None)),
                on_finish=lambda i, r: put(event(i, "", r)),
                on_done=lambda p, c: put(Usage(p, c)),
                on_error=put, on_logprobs=on_logprobs if job.params.logprobs else None)
        except SequenceError as exc:  # checked before anything is queued
            raise self._request_error(exc, job) from None
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise self._worker_error(item, job)
                yield item
                if isinstance(item, Usage):
                    return
        finally:
            handle.cancel()

    def _logprob_entry(self, entry: tuple) -> dict:
        """One engine ``(token, logprob, top_ids, top_logprobs)`` record in OpenAI's shape."""
        tok, lp, ids, vals = entry

        def one(i: int, v: float) -> dict:
            b = self._token_bytes(i)
            return {"token": b.decode("utf-8", "replace"), "logprob": v, "bytes": list(b)}

        return {**one(tok, lp), "top_logprobs": [one(i, v) for i, v in zip(ids, vals)]}

    @property
    def grammar_compiler(self) -> Any:
        """The model's :class:`~langtorch.functional.constrain.GrammarCompiler` (one per model,
        over :attr:`vocabulary`; compiled grammars cached), or ``None`` without a vocabulary.

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend().grammar_compiler.words  # doctest: +SKIP
            1536
        """
        llm = self.llm
        hit = llm.__dict__.get("_langtorch_grammar_compiler")
        if hit is None:
            vocab = self.vocabulary
            if vocab is None:
                return None
            from langtorch.functional.constrain import GrammarCompiler

            hit = llm.__dict__.setdefault("_langtorch_grammar_compiler", GrammarCompiler(vocab))
        return hit

    def _token_bytes(self, token_id: int) -> bytes:
        vocab = self.vocabulary
        if vocab is not None and 0 <= token_id < len(vocab.tokens):
            return vocab.tokens[token_id]
        return self.llm.decode([token_id]).encode("utf-8")

    @property
    def vocabulary(self) -> Any:
        """The model's :class:`~langtorch.functional.constrain.TokenVocabulary` (token bytes,
        EOS and special ids: what grammars and logprobs read), built once per model; ``None``
        for a model whose tokenizer it cannot read.

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend().vocabulary.size  # doctest: +SKIP
            49152
        """
        llm = self.llm
        hit = llm.__dict__.get("_langtorch_vocabulary", False) if hasattr(llm, "__dict__") \
            else False
        if hit is False:
            hit = _vocabulary_of(llm)
            if hasattr(llm, "__dict__"):
                llm.__dict__["_langtorch_vocabulary"] = hit
        return hit

    def _worker_error(self, exc: BaseException, job: PreparedRequest) -> BaseException:
        """What a request's caller sees for an error the engine's worker reported: the
        engine's typed refusal of the request is a 400; anything else is a bug (500)."""
        if isinstance(exc, SequenceError):
            return self._request_error(exc, job)
        if isinstance(exc, BackendError):
            return exc
        err = BackendError(f"LocalBackend: internal error in the decode engine "
                           f"({type(exc).__name__}: {exc}); this is a bug, not a problem with "
                           f"the request: please report it.", status=500, retryable=False)
        err.__cause__ = exc
        return err

    async def stream(self, request: dict[str, Any]) -> AsyncIterator[str | Usage]:
        """The first choice's text deltas as they are decoded, then the request's Usage.

        Example:
            >>> import asyncio
            >>> from langtorch.backends import LocalBackend
            >>> async def main():
            ...     req = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
            ...     return [d async for d in LocalBackend().stream(req)]
            >>> isinstance(asyncio.run(main())[-1], object)  # doctest: +SKIP
            True
        """
        events = self.stream_events(request)
        try:
            async for ev in events:
                if isinstance(ev, Usage):
                    yield ev
                elif ev.index == 0 and ev.text:
                    yield ev.text
        finally:
            await events.aclose()

    async def complete(self, request: dict[str, Any] | PreparedRequest) -> Completion:
        """Answer one chat-completions request (all ``n`` choices) on the shared engine.

        ``stream=True`` is refused here: use :meth:`stream_events` or :meth:`stream`.

        Example:
            >>> import asyncio
            >>> from langtorch.backends import LocalBackend
            >>> b = LocalBackend()
            >>> asyncio.run(b.complete({"messages": [], "max_tokens": 4}))  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            langtorch.functional.errors.BadRequestError: LocalBackend: expected `messages` as ...
        """
        if isinstance(request, Mapping) and request.get("stream"):
            raise _bad("stream", "complete() answers at once; for stream=True use "
                                 "stream_events() or stream() (token-by-token).")
        if isinstance(request, Mapping):
            if request.get("messages") is not None or request.get("prompt") is None:
                # before loading the model
                _checked(normalize_messages, fold_tool_turns(request.get("messages")))
            if self._llm is None:
                await asyncio.get_running_loop().run_in_executor(None, lambda: self.llm)
            request = self.prepare(request)
        texts: dict[int, str] = {}
        reasons: dict[int, str | None] = {}
        logprobs: dict[int, list] = {}
        usage = Usage()
        async for ev in self.stream_events(request):
            if isinstance(ev, Usage):
                usage = ev
            else:
                texts[ev.index] = texts.get(ev.index, "") + ev.text
                if ev.logprobs is not None:
                    logprobs.setdefault(ev.index, []).extend(ev.logprobs)
                if ev.finish_reason is not None:
                    reasons[ev.index] = ev.finish_reason
        n = len(texts)
        tool_call = request.tool_call
        choices = []
        for i in range(n):
            lp = {"content": logprobs[i], "refusal": None} if i in logprobs else None
            call = parse_tool_call(texts[i], i) if tool_call and reasons.get(i) == "stop" else None
            if call is not None:
                choices.append(Choice("", "tool_calls", {"role": "assistant", "content": None,
                                                         "tool_calls": [call]}, lp))
            else:
                choices.append(Choice(texts[i], reasons.get(i), logprobs=lp))
        return Completion(tuple(choices), usage, self.model)

    async def embed(self, texts: Sequence[str], **params: Any) -> Embeddings:
        """Embed texts with :attr:`embedder` (default: local all-MiniLM-L6-v2, 384-d, unit
        length).

        Raises:
            BadRequestError: ``texts`` is not a list of strings (``param="input"``).

        Example:
            >>> import asyncio
            >>> from langtorch.backends import LocalBackend
            >>> e = asyncio.run(LocalBackend().embed(["hi"]))  # doctest: +SKIP
            >>> e.vectors.shape  # doctest: +SKIP
            (1, 384)
        """
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise _bad("input", f"expected a list of strings to embed, got "
                                f"{type(texts).__name__}.")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise _bad("input", f"input[{i}]: expected a string, got {type(t).__name__} "
                                    f"({t!r}).")
        embedder = self.embedder
        texts = list(texts)
        loop = asyncio.get_running_loop()
        vectors = await loop.run_in_executor(None, embedder.embed_texts, texts)
        tokens = sum(len(e.ids) for e in embedder.tokenizer.encode_batch(texts))
        return Embeddings(vectors, Usage(tokens, 0), embedder.name)

    def __repr__(self) -> str:
        extra = f", adapters={self.adapter_names}" if self._adapters else ""
        return f"LocalBackend(model={self.model!r}{extra})"
