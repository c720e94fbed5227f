"""``LocalBackend``: SmolLM2-135M-Instruct in JAX behind the same interface as the OpenAI backend.

Every request goes to the model's shared decode engine (:mod:`langtorch.models._engine`):
continuous batching over a fixed set of slots, decoded in jitted chunks. A request joins as
soon as a slot is free and leaves as soon as it is done (EOS, its ``max_tokens``, a stop
string), so a short request is never held by a long one; its text streams token by token
(:meth:`LocalBackend.stream_events`). Each request is validated and prefilled on its own: a bad
one fails alone with :class:`~langtorch.errors.BadRequestError` naming the parameter.

Soft prompts (prompt tuning) ride the same path: ``LocalBackend(adapter=...)`` puts a tuned
prompt in front of every request, ``adapters={"name": ...}`` offers several, chosen per
request with ``"adapter": "name"``.

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
import math
import numbers
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from langtorch.backends.base import Backend, Capabilities, Choice, Completion, Embeddings, Usage
from langtorch.errors import BackendError, BadRequestError

__all__ = ["LocalBackend", "StreamEvent"]

# Keys a local model can ignore without changing the answer's meaning (or that are read below).
_IGNORED = {"model", "messages", "n", "max_tokens", "max_completion_tokens", "temperature",
            "top_p", "seed", "stop", "stream", "stream_options", "user", "metadata", "store",
            "parallel_tool_calls", "service_tier", "prompt_cache_key", "safety_identifier",
            "adapter"}
_ROLES = {"system", "developer", "user", "assistant"}
MAX_N = 128


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """A piece of a streamed local answer.

    Attributes:
        index: the choice (``0 .. n-1``).
        text: new text of that choice (may be ``""`` on the final event).
        finish_reason: ``None`` while the choice runs; ``"stop"`` or ``"length"`` on its final
            event.

    Example:
        >>> from langtorch.backends import StreamEvent
        >>> StreamEvent(0, "Hel", None).text
        'Hel'
    """

    index: int
    text: str
    finish_reason: str | None = None


def _bad(param: str, message: str) -> BadRequestError:
    return BadRequestError(f"LocalBackend: {message}", param=param)


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise _bad("messages", f"{where}: expected content as a string or a list of text parts, "
                               f"got {type(content).__name__}.")
    # OpenAI content parts: keep the text parts, refuse images/audio rather than drop them.
    parts = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "text" and \
                isinstance(part.get("text", ""), str):
            parts.append(part.get("text", ""))
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise _bad("messages", f"{where}: expected text message content, got a {kind!r} "
                                   "part; the local model reads text only.")
    return "".join(parts)


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, (list, tuple)) or not value:
        raise _bad("messages", f"expected a non-empty list of messages, got "
                               f"{type(value).__name__ if value else value!r}.")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise _bad("messages", f"messages[{i}]: expected a mapping with 'role' and "
                                   f"'content', got {type(m).__name__}.")
        role = m.get("role", "user")
        if not isinstance(role, str) or role not in _ROLES:
            raise _bad("messages", f"messages[{i}]: expected role one of {sorted(_ROLES)}, got "
                                   f"{role!r}.")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _text_of(m.get("content"), f"messages[{i}]")})
    return out


def _int(request: Mapping[str, Any], key: str, default: Any, low: int, high: int | None = None):
    value = request.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _bad(key, f"expected {key} as an integer, got {value!r}.")
    value = int(value)
    if value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _bad(key, f"expected {key} {rng}, got {value}.")
    return value


def _float(request: Mapping[str, Any], key: str, default: float, low: float, high: float,
           low_open: bool = False) -> float:
    value = request.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _bad(key, f"expected {key} as a number, got {value!r}.")
    value = float(value)
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        rng = f"{'(' if low_open else '['}{low}, {high}]"
        raise _bad(key, f"expected {key} in {rng}, got {value}.")
    return value


def _check_keys(request: Mapping[str, Any]) -> None:
    for key, value in request.items():
        if key in _IGNORED:
            continue
        if key in ("frequency_penalty", "presence_penalty", "logit_bias", "logprobs",
                   "top_logprobs", "tools", "tool_choice", "functions") and not value:
            continue
        if key == "response_format" and isinstance(value, Mapping) and \
                value.get("type", "text") == "text":
            continue
        raise _bad(key, f"the request parameter {key}={value!r} is not supported by the local "
                        "model (supported: messages, n, max_tokens, temperature, top_p, seed, "
                        "stop, adapter). Remove it or use an OpenAI-compatible backend.")


def _adapter_prompt(source: Any) -> np.ndarray:
    """A ``[P, H]`` float32 prompt from a PromptTuner (PEZ-projected when trained with PEZ), a
    PEFT adapter directory, or an array."""
    prompt_for = getattr(source, "_prompt_for", None)
    if isinstance(source, (str, Path)):
        from langtorch.tuning._files import load_peft_adapter

        prompt, _ = load_peft_adapter(source)
        arr = np.asarray(prompt, np.float32)
    elif prompt_for is not None:
        arr = np.asarray(prompt_for("soft")[0], np.float32)
    else:
        arr = np.asarray(source, np.float32)
    # Every source is checked: a NaN in an adapter file would turn every answer into garbage.
    if arr.ndim != 2 or not np.isfinite(arr).all():
        raise ValueError(f"LocalBackend: expected an adapter as a PromptTuner, a PEFT adapter "
                         f"directory or a finite [P, H] array, got shape {arr.shape} with "
                         f"{int(np.size(arr) - np.isfinite(arr).sum())} non-finite values.")
    return arr


def _digest(prompt: np.ndarray) -> str:
    h = hashlib.sha256(str(prompt.shape).encode())
    h.update(np.ascontiguousarray(prompt, np.float32).tobytes())
    return h.hexdigest()[:16]


@dataclasses.dataclass
class _Job:
    ids: list
    seqs: list
    stops: list


class LocalBackend(Backend):
    """A local chat model (default SmolLM2-135M-Instruct) on the shared continuous-batching engine.

    Honours ``messages`` (system/user/assistant turns, rendered with the model's chat template),
    ``n``, ``max_tokens`` / ``max_completion_tokens``, ``temperature`` (OpenAI's default 1.0;
    0 = greedy; ``[0, 2]``), ``top_p`` (``(0, 1]``), ``seed`` (any integer: choice ``k`` of seed
    ``s`` never repeats another seed's sample), ``stop`` (no text from a stop string on is ever
    returned or streamed) and ``adapter``. Invalid values and parameters the model cannot honour
    (``tools``, a JSON ``response_format``, ``logprobs``, penalties) raise
    :class:`~langtorch.errors.BadRequestError` (status 400, not retryable, ``.param`` names the
    parameter). ``embed`` uses local all-MiniLM-L6-v2.

    **Adapters (soft prompts).** ``adapter`` is used for every request without an ``"adapter"``
    key; ``adapters`` maps names to adapters chosen with ``"adapter": "name"`` (or a request
    ``"model"`` equal to a name). An adapter is a :class:`~langtorch.tuning.PromptTuner` (its
    prompt as ``predict`` uses it, PEZ-projected when trained with ``pez=True``; a snapshot taken
    now), a PEFT ``PROMPT_TUNING`` adapter directory (ours or PEFT's ``save_pretrained``) or a
    ``[P, H]`` array. Its ``P`` virtual tokens go in front of the rendered chat; **usage counts
    them as prompt tokens** (``prompt_tokens`` = rendered chat tokens + ``P``, once per request).
    The cache namespace includes every adapter's digest, so cached answers never cross adapters.

    Args:
        model: a :class:`langtorch.models.SmolLM2`; default: the process-wide one
            (:func:`langtorch.models.default_llm`), loaded on first request.
        adapter: the default adapter (see above).
        adapters: named adapters.
        max_slots: sequences decoded together by the model's engine (used when this backend
            creates the engine; all callers of a model share one).
        default_max_tokens: ``max_tokens`` when a request has none (cut to the context left).
        mesh: ``None``, ``"auto"`` or a ``jax.sharding.Mesh``: the engine's decode batch is
            split along the mesh's ``data`` axis (used when this backend creates the engine;
            a model whose engine already runs on another mesh raises ``ValueError``).
        **options: :class:`~langtorch.backends.RuntimeOptions` fields (defaults here:
            ``max_concurrency=256`` so a call's entries reach the engine together,
            ``timeout=None`` because the first calls compile).

    Example:
        >>> from langtorch.backends import LocalBackend
        >>> LocalBackend(default_max_tokens=16).model
        'SmolLM2-135M-Instruct'
    """

    # What _check_keys lets through: no tools, JSON response_format or logprobs (yet).
    default_capabilities = Capabilities(multiple_choices=True, streaming=True, embeddings=True)

    def __init__(self, model: Any = None, *, adapter: Any = None,
                 adapters: Mapping[str, Any] | None = None, max_slots: int = 16,
                 default_max_tokens: int = 256, mesh: Any = None, **options: Any):
        options.setdefault("max_concurrency", 256)
        options.setdefault("timeout", None)
        super().__init__(getattr(model, "name", "SmolLM2-135M-Instruct"), **options)
        if isinstance(default_max_tokens, bool) or not isinstance(default_max_tokens, int) \
                or default_max_tokens < 1:
            raise ValueError(f"LocalBackend: expected default_max_tokens >= 1, got "
                             f"{default_max_tokens!r}.")
        if isinstance(max_slots, bool) or not isinstance(max_slots, int) or max_slots < 1:
            raise ValueError(f"LocalBackend: expected max_slots >= 1, got {max_slots!r}.")
        from langtorch.functional.sharding import resolve_mesh

        self.mesh = resolve_mesh(mesh)
        self._llm = model
        # A model given here is part of the cache namespace: two GGUFs (or dtypes) share the
        # class's name, and their cached answers must not cross. The default model is "".
        self._model_tag = "" if model is None else hashlib.sha256(repr((
            type(model).__name__, getattr(model, "name", None), str(getattr(model, "path", "")),
            getattr(model, "dtype", None), getattr(model, "kv_dtype", None),
            getattr(model, "prefill_dtype", None), getattr(model, "config", None),
        )).encode()).hexdigest()[:12]
        self.default_max_tokens = default_max_tokens
        self.max_slots = max_slots
        self._default = None if adapter is None else _adapter_prompt(adapter)
        self._adapters: dict[str, np.ndarray] = {}
        for name, source in (adapters or {}).items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"LocalBackend: expected adapter names as non-empty strings, "
                                 f"got {name!r}.")
            self._adapters[name] = _adapter_prompt(source)
        hidden = getattr(getattr(model, "config", None), "hidden_size", None)
        if hidden is not None:  # the model is known now: refuse an adapter of another model
            named = ([("adapter", self._default)] if self._default is not None else []) + [
                (f"adapters[{k!r}]", v) for k, v in self._adapters.items()]
            for where, prompt in named:
                if prompt.shape[1] != hidden:
                    raise ValueError(f"LocalBackend: {where} is {prompt.shape[1]} wide, the "
                                     f"model's embeddings are {hidden} (an adapter trained for "
                                     "another model?).")

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

    @property
    def cache_namespace(self) -> str:
        """``LocalBackend`` plus the digests of its adapters and of a model given to it (its
        class, name, GGUF path, dtypes and config), so cached answers never cross adapters or
        models; the default model adds nothing.

        Example:
            >>> import numpy as np
            >>> from langtorch.backends import LocalBackend
            >>> a = LocalBackend(adapter=np.zeros((2, 4))).cache_namespace
            >>> b = LocalBackend(adapter=np.ones((2, 4))).cache_namespace
            >>> a != b, LocalBackend().cache_namespace
            (True, 'LocalBackend')
        """
        parts = [f"model={self._model_tag}"] if self._model_tag else []
        if self._default is not None:
            parts.append(f"adapter={_digest(self._default)}")
        parts += [f"{k}={_digest(v)}" for k, v in sorted(self._adapters.items())]
        return "LocalBackend" + ("[" + ",".join(parts) + "]" if parts else "")

    @property
    def llm(self) -> Any:
        """The underlying :class:`langtorch.models.SmolLM2` (loaded on first use)."""
        if self._llm is None:
            from langtorch.models import default_llm

            self._llm = default_llm()
        return self._llm

    @property
    def engine(self) -> Any:
        """The model's shared decode engine."""
        from langtorch.models._engine import engine_for

        llm = self.llm
        opts = {"max_slots": self.max_slots}
        for key in ("chunk", "prefill_dtype", "kv_dtype"):
            if hasattr(llm, key):
                opts[key] = getattr(llm, key)
        mesh = self.mesh if self.mesh is not None else getattr(llm, "mesh", None)
        if mesh is not None:
            opts["mesh"] = mesh
        engine = engine_for(llm, **opts)
        if self.mesh is not None and engine.batch.mesh != self.mesh:
            raise ValueError(f"mesh: this model's engine already runs on "
                             f"{None if engine.batch.mesh is None else dict(engine.batch.mesh.shape)}"
                             f"; create the model with SmolLM2(mesh=...) (or this backend "
                             f"before any other caller uses the model).")
        return engine

    def warmup(self, batch_sizes: Sequence[int] | None = None,
               max_tokens: int | None = None) -> None:
        """Load the model and compile the engine's programs now (see ``SmolLM2.warmup``).

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend().warmup()  # doctest: +SKIP
        """
        _ = self.engine
        self.llm.warmup(batch_sizes=batch_sizes,
                        max_tokens=max_tokens or self.default_max_tokens)

    # ------------------------------------------------------------------ requests
    def _prefix(self, request: Mapping[str, Any]) -> np.ndarray | None:
        name = request.get("adapter")
        if name is None:
            model = request.get("model")
            if isinstance(model, str) and model in self._adapters:
                return self._adapters[model]
            return self._default
        if not isinstance(name, str) or name not in self._adapters:
            raise _bad("adapter", f"unknown adapter {name!r}; expected one of "
                                  f"{self.adapter_names}.")
        return self._adapters[name]

    def _prepare(self, request: Any) -> _Job:
        from langtorch.functional.engine import Sequence as Seq

        if not isinstance(request, Mapping):
            raise _bad("request", f"expected a request mapping, got {type(request).__name__}.")
        _check_keys(request)
        messages = _messages(request.get("messages"))
        n = _int(request, "n", 1, 1, MAX_N)
        key = "max_completion_tokens" if request.get("max_completion_tokens") is not None \
            else "max_tokens"
        explicit = request.get(key)  # {"max_completion_tokens": None, "max_tokens": 5} is 5
        max_tokens = _int(request, key, None, 1)
        temperature = _float(request, "temperature", 1.0, 0.0, 2.0)
        top_p = _float(request, "top_p", 1.0, 0.0, 1.0, low_open=True)
        seed = request.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise _bad("seed", f"expected seed as an integer, got {seed!r}.")
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(2, np.uint32).view(np.uint64)[0])
        stop = request.get("stop")
        stops = [stop] if isinstance(stop, str) else stop
        if stops is None:
            stops = []
        if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
            raise _bad("stop", f"expected stop as a string or a list of strings, got {stop!r}.")
        prefix = self._prefix(request)
        llm = self.llm
        if prefix is not None and prefix.shape[1] != llm.config.hidden_size:
            raise _bad("adapter", f"the adapter's width {prefix.shape[1]} does not match the "
                                  f"model's embedding width {llm.config.hidden_size}.")
        try:
            ids = list(llm.encode(llm.apply_chat_template(messages)))
        except Exception as exc:  # noqa: BLE001 - a template/tokenizer failure is this request's
            raise _bad("messages", f"could not render the messages with the chat template: "
                                   f"{type(exc).__name__}: {exc}") from None
        p = 0 if prefix is None else int(prefix.shape[0])
        context = int(llm.config.max_positions)
        if len(ids) + p >= context:
            raise _bad("messages", f"the prompt is {len(ids) + p} tokens ({p} virtual), which "
                                   f"leaves no room in the model's context of {context} tokens; "
                                   "shorten the messages.")
        if explicit is None:
            left = int(llm.config.max_positions) - len(ids) - p
            max_tokens = max(1, min(self.default_max_tokens, left))
        seqs = [Seq(ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                    seed=int(seed), choice=k, prefix=prefix) for k in range(n)]
        try:
            self.engine.check(seqs[0])
        except ValueError as exc:
            param, _, msg = str(exc).partition(": ")
            if param == "max_tokens" and explicit is None:
                param = "messages"
            if param == "prompt":
                param = "messages"
            raise _bad(param, msg or str(exc)) from None
        return _Job(ids, seqs, [s for s in stops if s])

    async def stream_events(self, request: dict[str, Any]) -> AsyncIterator[StreamEvent | Usage]:
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
        job = self._prepare(request)
        queue: asyncio.Queue = asyncio.Queue()

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        handle = self.engine.submit(
            job.seqs, stops=job.stops,
            on_delta=lambda i, t: put(StreamEvent(i, t, None)),
            on_finish=lambda i, r: put(StreamEvent(i, "", r)),
            on_done=lambda p, c: put(Usage(p, c)),
            on_error=put)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    if isinstance(item, BackendError):
                        raise item
                    if isinstance(item, ValueError):
                        param, _, msg = str(item).partition(": ")
                        raise _bad(param, msg or str(item))
                    raise BackendError(f"LocalBackend: generation failed: "
                                       f"{type(item).__name__}: {item}", retryable=False)
                yield item
                if isinstance(item, Usage):
                    return
        finally:
            handle.cancel()

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

    async def complete(self, request: dict[str, Any]) -> Completion:
        """Answer one chat-completions request (all ``n`` choices) on the shared engine.

        ``stream=True`` is refused here: use :meth:`stream_events` or :meth:`stream`.

        Example:
            >>> import asyncio
            >>> from langtorch.backends import LocalBackend
            >>> b = LocalBackend()
            >>> asyncio.run(b.complete({"messages": [], "max_tokens": 4}))  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            langtorch.functional.errors.BadRequestError: LocalBackend: expected a non-empty ...
        """
        if isinstance(request, Mapping) and request.get("stream"):
            raise _bad("stream", "complete() answers at once; for stream=True use "
                                 "stream_events() or stream() (token-by-token).")
        if isinstance(request, Mapping):
            _messages(request.get("messages"))  # cheap checks before loading the model
        texts: dict[int, str] = {}
        reasons: dict[int, str | None] = {}
        usage = Usage()
        async for ev in self.stream_events(request):
            if isinstance(ev, Usage):
                usage = ev
            else:
                texts[ev.index] = texts.get(ev.index, "") + ev.text
                if ev.finish_reason is not None:
                    reasons[ev.index] = ev.finish_reason
        n = len(texts)
        return Completion(tuple(Choice(texts[i], reasons.get(i)) for i in range(n)), usage,
                          self.model)

    async def embed(self, texts: Sequence[str], **params: Any) -> Embeddings:
        """Embed texts with local all-MiniLM-L6-v2 (384-d, unit length).

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
        from langtorch.models import default_embedder

        embedder = default_embedder()
        texts = list(texts)
        loop = asyncio.get_running_loop()
        vectors = await loop.run_in_executor(None, embedder.embed_texts, texts)
        tokens = sum(len(e.ids) for e in embedder.tokenizer.encode_batch(texts))
        return Embeddings(vectors, Usage(tokens, 0), embedder.name)

    def __repr__(self) -> str:
        extra = f", adapters={self.adapter_names}" if self._adapters else ""
        return f"LocalBackend(model={self.model!r}{extra})"
