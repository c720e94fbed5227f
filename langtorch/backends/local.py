"""``LocalBackend``: SmolLM2-135M-Instruct in JAX behind the same interface as the OpenAI backend.

Requests that arrive together (the runtime sends the entries of a call concurrently) are
collected by one worker thread into a batch and decoded in a single jitted KV-cache loop, so a
100-entry call costs a few batched decodes rather than 100 sequential ones.

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
import concurrent.futures
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from langtorch.backends.base import Backend, Choice, Completion, Embeddings, Usage
from langtorch.errors import BackendError

__all__ = ["LocalBackend"]

# Keys a local model can ignore without changing the answer's meaning.
_IGNORED = {"model", "messages", "n", "max_tokens", "max_completion_tokens", "temperature",
            "top_p", "seed", "stop", "stream", "stream_options", "user", "metadata", "store",
            "parallel_tool_calls", "service_tier", "prompt_cache_key", "safety_identifier"}


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # OpenAI content parts: keep the text parts, refuse images/audio rather than drop them.
    parts = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise BackendError(f"LocalBackend: expected text message content, got a {kind!r} "
                               "part; the local model reads text only.", status=400,
                               retryable=False)
    return "".join(parts)


def _check_request(request: Mapping[str, Any]) -> None:
    for key, value in request.items():
        if key in _IGNORED:
            continue
        if key in ("frequency_penalty", "presence_penalty") and not value:
            continue
        if key in ("logit_bias",) and not value:
            continue
        if key in ("logprobs",) and not value:
            continue
        if key == "response_format" and (value or {}).get("type", "text") == "text":
            continue
        if key in ("tools", "tool_choice", "functions") and not value:
            continue
        raise BackendError(
            f"LocalBackend: the request parameter {key}={value!r} is not supported by the local "
            "model (supported: messages, n, max_tokens, temperature, top_p, seed, stop). Remove "
            "it or use an OpenAI-compatible backend.", status=400, retryable=False)
    if not request.get("messages"):
        raise BackendError("LocalBackend: expected a non-empty `messages` list, got none.",
                           status=400, retryable=False)


class LocalBackend(Backend):
    """A local chat model (default SmolLM2-135M-Instruct) with batched jitted decoding.

    Honours ``messages`` (system/user/assistant turns, rendered with the model's chat template),
    ``n``, ``max_tokens`` / ``max_completion_tokens``, ``temperature`` (OpenAI's default 1.0;
    0 = greedy), ``top_p``, ``seed`` and ``stop``; parameters the model cannot honour (``tools``,
    a JSON ``response_format``, ``logprobs``, penalties) raise a non-retryable
    :class:`~langtorch.errors.BackendError`. ``embed`` uses local all-MiniLM-L6-v2.

    Args:
        model: a :class:`langtorch.models.SmolLM2`; default: the process-wide one
            (:func:`langtorch.models.default_llm`), loaded on first request.
        default_max_tokens: ``max_tokens`` when a request has none.
        batch_window: seconds the worker waits after the first request for others to join it.
        **options: :class:`~langtorch.backends.RuntimeOptions` fields (defaults here:
            ``max_concurrency=256`` so a call's entries reach the batcher together,
            ``timeout=None`` because the first batch compiles).

    Example:
        >>> from langtorch.backends import LocalBackend
        >>> LocalBackend(default_max_tokens=16).model
        'SmolLM2-135M-Instruct'
    """

    def __init__(self, model: Any = None, *, default_max_tokens: int = 256,
                 batch_window: float = 0.005, **options: Any):
        options.setdefault("max_concurrency", 256)
        options.setdefault("timeout", None)
        super().__init__(getattr(model, "name", "SmolLM2-135M-Instruct"), **options)
        self._llm = model
        self.default_max_tokens = default_max_tokens
        self.batch_window = batch_window
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def llm(self) -> Any:
        """The underlying :class:`langtorch.models.SmolLM2` (loaded on first use)."""
        if self._llm is None:
            from langtorch.models import default_llm

            self._llm = default_llm()
        return self._llm

    def warmup(self, batch_sizes: Sequence[int] = (1,), max_tokens: int | None = None) -> None:
        """Load the model and compile the decode loop for these batch sizes now.

        Example:
            >>> from langtorch.backends import LocalBackend
            >>> LocalBackend().warmup()  # doctest: +SKIP
        """
        self.llm.warmup(batch_sizes=batch_sizes,
                        max_tokens=max_tokens or self.default_max_tokens)

    # ------------------------------------------------------------------ batching worker
    def _ensure_worker(self) -> None:
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="langtorch-local",
                                                daemon=True)
                self._worker.start()

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            items = [first]
            deadline = time.monotonic() + self.batch_window
            while True:
                remaining = deadline - time.monotonic()
                try:
                    items.append(self._queue.get(timeout=max(0.0, remaining))
                                 if remaining > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
            self._run(items)

    def _run(self, items: list[tuple[dict, concurrent.futures.Future]]) -> None:
        live = [(r, f) for r, f in items if f.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            llm = self.llm
            rows, owners = [], []
            for j, (req, _) in enumerate(live):
                ids = llm.encode(llm.apply_chat_template(req["messages"]))
                n = int(req.get("n") or 1)
                seed = req.get("seed")
                base = int(seed) if seed is not None else int(np.random.randint(0, 2**31 - 1))
                stop = req.get("stop")
                stops = [stop] if isinstance(stop, str) else list(stop or [])
                max_tokens = (req.get("max_completion_tokens") or req.get("max_tokens")
                              or self.default_max_tokens)
                temperature = req.get("temperature")
                for k in range(n):
                    rows.append(dict(ids=ids, max_tokens=int(max_tokens),
                                     temperature=1.0 if temperature is None else float(temperature),
                                     top_p=float(req.get("top_p") if req.get("top_p") is not None
                                                 else 1.0),
                                     seed=(base + k) % (2**32), stops=stops))
                    owners.append(j)
            gens = llm.generate_ids(
                [r["ids"] for r in rows],
                max_tokens=[r["max_tokens"] for r in rows],
                temperature=[r["temperature"] for r in rows],
                top_p=[r["top_p"] for r in rows],
                seed=[r["seed"] for r in rows],
                stops=[r["stops"] for r in rows])
        except BaseException as exc:  # noqa: BLE001 - delivered to every waiting request
            err = exc if isinstance(exc, BackendError) else BackendError(
                f"LocalBackend: generation failed: {type(exc).__name__}: {exc}", retryable=False)
            for _, f in live:
                f.set_exception(err)
            return
        per_request: dict[int, list] = {}
        for j, g in zip(owners, gens):
            per_request.setdefault(j, []).append(g)
        for j, (_, f) in enumerate(live):
            gs = per_request[j]
            usage = Usage(gs[0].prompt_tokens, sum(g.completion_tokens for g in gs))
            f.set_result(Completion(tuple(Choice(g.text, g.finish_reason) for g in gs),
                                    usage, self.model))

    # ------------------------------------------------------------------ Backend interface
    async def complete(self, request: dict[str, Any]) -> Completion:
        """Answer one chat-completions request; concurrent calls are decoded as one batch.

        Example:
            >>> import asyncio
            >>> from langtorch.backends import LocalBackend
            >>> b = LocalBackend()
            >>> asyncio.run(b.complete({"messages": [], "max_tokens": 4}))  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            langtorch.functional.errors.BackendError: LocalBackend: expected a non-empty ...
        """
        _check_request(request)
        messages = [{"role": str(m.get("role", "user")), "content": _text_of(m.get("content"))}
                    for m in request["messages"]]
        req = {**request, "messages": messages}
        n = int(req.get("n") or 1)
        if n < 1:
            raise BackendError(f"LocalBackend: expected n >= 1, got {n}.", status=400,
                               retryable=False)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._ensure_worker()
        self._queue.put((req, fut))
        return await asyncio.wrap_future(fut)

    async def embed(self, texts: Sequence[str], **params: Any) -> Embeddings:
        """Embed texts with local all-MiniLM-L6-v2 (384-d, unit length).

        Example:
            >>> import asyncio
            >>> from langtorch.backends import LocalBackend
            >>> e = asyncio.run(LocalBackend().embed(["hi"]))  # doctest: +SKIP
            >>> e.vectors.shape  # doctest: +SKIP
            (1, 384)
        """
        from langtorch.models import default_embedder

        embedder = default_embedder()
        texts = [str(t) for t in texts]
        loop = asyncio.get_running_loop()
        vectors = await loop.run_in_executor(None, embedder.embed_texts, texts)
        tokens = sum(len(e.ids) for e in embedder.tokenizer.encode_batch(texts))
        return Embeddings(vectors, Usage(tokens, 0), embedder.name)

    def __repr__(self) -> str:
        return f"LocalBackend(model={self.model!r})"
