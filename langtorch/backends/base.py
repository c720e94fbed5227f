"""The one interface every model backend implements (OpenAI-compatible servers, local JAX models).

A backend answers **one request at a time**: ``await backend.complete(request)`` sends one
chat-completions request and returns a :class:`Completion`. Everything that concerns *many*
requests — concurrency cap, rate limits, retries, timeouts, de-duplication, the response cache,
usage and cost accounting — lives in the runtime (``langtorch.runtime``), which reads the policy
from ``backend.options`` (:class:`RuntimeOptions`). A backend therefore stays small:

* ``complete(request)``: ``request`` is an OpenAI chat-completions body as a plain dict
  (``{"model": ..., "messages": [...], "temperature": ..., "n": ..., ...}``). The backend
  honours every key it understands and passes the rest through (an HTTP backend sends the body
  as is). ``n`` > 1 returns ``n`` choices.
* ``embed(texts, **params)``: many inputs in one call; returns an :class:`Embeddings`.
* ``stream(request)``: optional; an async iterator of text deltas. The default completes the
  request and yields its text once.

Errors are raised, never returned as text: subclasses of
:class:`langtorch.errors.BackendError` (``AuthenticationError``, ``RateLimitError`` with
``retry_after``, ``BackendTimeoutError``, ``BadResponseError``). The runtime retries an error
whose ``retryable`` attribute is true and gives up at once otherwise.

The runtime calls ``complete`` concurrently for the entries of a call (at most
``options.max_concurrency`` at once), so a backend that computes in batches (a local model) can
collect the calls that arrive together into one batch.

Example:
    >>> import asyncio
    >>> from langtorch.backends.base import Backend, Choice, Completion, Usage
    >>> class Echo(Backend):
    ...     async def complete(self, request):
    ...         text = request["messages"][-1]["content"]
    ...         return Completion(choices=(Choice(text),), usage=Usage(3, 1), model=self.model)
    >>> b = Echo("echo-1")
    >>> c = asyncio.run(b.complete({"model": "echo-1",
    ...                             "messages": [{"role": "user", "content": "hi"}]}))
    >>> c.text, c.usage.total_tokens
    ('hi', 4)
"""

from __future__ import annotations

import abc
import collections
import collections.abc
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar

from langtorch.core.capabilities import Capabilities
from langtorch.core.types import Choice, Completion, Embeddings, Usage

__all__ = ["Backend", "Capabilities", "Choice", "Completion", "Embeddings", "RuntimeOptions", "Usage"]


@dataclasses.dataclass
class RuntimeOptions:
    """How the runtime drives a backend: limits, retries, cache, budget.

    Attributes:
        max_concurrency: requests in flight at once, per event loop.
        requests_per_minute: client-side request rate limit (token bucket); ``None`` = off.
        tokens_per_minute: client-side token rate limit (estimated before a call, reconciled from
            the reported usage); ``None`` = off.
        timeout: seconds per request attempt; ``None`` = no limit.
        max_retries: retries after the first attempt for retryable errors (429, 5xx, timeouts,
            dropped connections, malformed bodies); 400/401/403/404 are never retried.
        backoff_base: first retry delay in seconds; doubles each retry, with jitter.
        backoff_max: cap on one retry delay (a server's ``Retry-After`` is honoured above it).
        max_retry_after: the longest ``Retry-After`` the runtime waits; a server asking for more
            ends the request with its ``RateLimitError`` / ``BackendError`` instead of sleeping.
        cache: ``None`` (off), ``True`` (the default file, see ``langtorch.runtime.default_cache_path``),
            a path, or a ``langtorch.runtime.ResponseCache``.
        price: cost per million tokens as ``(prompt, completion)``, or a mapping model name ->
            ``(prompt, completion)``; ``None`` = cost not tracked.
        max_cost: budget for the backend's session; a request that could exceed it is not sent.
            Needs ``price``, and every request must set ``max_tokens`` (or
            ``max_completion_tokens``) so that its worst-case cost is known.
        embed_batch_size: inputs per embeddings request.
        history: how many recent requests ``backend.history`` keeps (what was sent and
            received; see ``langtorch.inspect_history``); 0 keeps none.

    Example:
        >>> RuntimeOptions(max_concurrency=4).max_retries
        4
    """

    max_concurrency: int = 16
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    timeout: float | None = 60.0
    max_retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 20.0
    max_retry_after: float = 60.0
    cache: Any = None
    price: Any = None
    max_cost: float | None = None
    embed_batch_size: int = 64
    history: int = 100


class Backend(abc.ABC):
    """Base class of model backends: one request per coroutine; policy in ``self.options``.

    Subclasses implement :meth:`complete` (and :meth:`embed` when they can embed). They call
    ``super().__init__(model, **options)`` where ``options`` are :class:`RuntimeOptions` fields.
    A backend that holds credentials returns them from :meth:`redaction_secrets` (and masks
    them in its ``repr`` with :func:`langtorch.core.mask_key`).

    Args:
        model: the model name put into requests (``request["model"]``).
        capabilities: what this instance declares instead of its class's
            ``default_capabilities``: a :class:`Capabilities`, or a mapping that changes some
            (``{"logprobs": False}`` for a server without them). See :attr:`capabilities`.
        **options: fields of :class:`RuntimeOptions`.

    Attributes:
        default_capabilities: (class attribute) what the backend class honours. A ``Backend``
            subclass that declares nothing (neither this nor ``capabilities=``) reads as text
            chat only, and a check that needs more trusts it with a ``DeprecationWarning`` (as
            before backends declared capabilities); declare what it honours.
        model: the model name.
        options: the :class:`RuntimeOptions`.
        usage: running :class:`Usage` totals of this backend's session (updated by the runtime).
        cost: running cost of this session, in the price table's currency.

    Example:
        >>> import asyncio
        >>> class Upper(Backend):
        ...     async def complete(self, request):
        ...         return Completion((Choice(request["messages"][-1]["content"].upper()),))
        >>> Upper("u", max_concurrency=2).options.max_concurrency
        2
    """

    default_capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, model: str, *, capabilities: Capabilities | dict[str, bool] | None = None,
                 **options: Any):
        if not isinstance(model, str) or not model:
            raise TypeError(f"Backend expected a non-empty model name (str), got {model!r}.")
        self.model = model
        self._capabilities = type(self).default_capabilities.override(capabilities)
        self._capabilities_given = capabilities is not None
        self.options = RuntimeOptions(**options)
        if self.options.max_cost is not None and self.options.price is None:
            raise ValueError(
                f"max_cost={self.options.max_cost} needs a price to count against: pass "
                "price=(prompt, completion) per million tokens, or a {model: (prompt, completion)} "
                "table.")
        self.usage = Usage()
        self.cost = 0.0
        if not isinstance(self.options.history, int) or self.options.history < 0:
            raise ValueError(f"history must be an int >= 0, got {self.options.history!r}")
        # The latest requests with their answers (dicts: time, model, request, response, usage,
        # cached, latency, error); bounded by options.history.
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.options.history)

    @property
    def capabilities(self) -> Capabilities:
        """What this backend declares it honours (structured output, tools, logprobs, ``n`` > 1,
        streaming, embeddings): its class's ``default_capabilities`` unless ``capabilities=``
        was given. Losses, optimizers and ``lt.nn.LLM`` check it before their first request.
        Assigning a :class:`Capabilities` or a mapping declares, as ``capabilities=`` does.

        Example:
            >>> class B(Backend):
            ...     default_capabilities = Capabilities(structured_output=True)
            ...     async def complete(self, request): ...
            >>> B("m").capabilities.structured_output, B("m", capabilities={"structured_output": False}).capabilities.structured_output
            (True, False)
        """
        return getattr(self, "_capabilities", type(self).default_capabilities)

    @capabilities.setter
    def capabilities(self, value: Capabilities | dict[str, bool]) -> None:
        # Assigning declares, as capabilities= does (a mapping changes the class's declaration).
        # Anything else is refused with what the name means: a subclass written before backends
        # declared capabilities may have used the name for its own data.
        if not isinstance(value, (Capabilities, collections.abc.Mapping)):
            raise TypeError(
                f"{type(self).__name__}.capabilities is what the backend declares it honours: a "
                f"langtorch.backends.Capabilities or a mapping of {list(Capabilities.names())} to "
                f"True/False, got {type(value).__name__}. Keep other data under another "
                "attribute name.")
        self._capabilities = type(self).default_capabilities.override(value)
        self._capabilities_given = True

    @property
    def _capabilities_declared(self) -> bool:
        # Whether the instance (capabilities=) or a class below Backend declares capabilities.
        # One that does not (a subclass written before backends declared them) is trusted by
        # the capability checks, with a DeprecationWarning (langtorch.core.capabilities).
        if getattr(self, "_capabilities_given", False):
            return True
        for klass in type(self).__mro__:
            if klass is Backend:
                return False
            if "default_capabilities" in vars(klass) or "capabilities" in vars(klass):
                return True
        return True

    @property
    def cache_namespace(self) -> str:
        """What cache keys are scoped to, besides the request: the backend type (HTTP backends
        add their server), so two servers serving the same model name never share answers.

        Example:
            >>> class B(Backend):
            ...     async def complete(self, request): ...
            >>> B("m").cache_namespace
            'B'
        """
        return type(self).__qualname__

    @abc.abstractmethod
    async def complete(self, request: dict[str, Any]) -> Completion:
        """Answer one chat-completions request (one attempt: no retries here).

        Args:
            request: an OpenAI chat-completions body (``model``, ``messages``, sampling params).

        Returns:
            A :class:`Completion` with ``request.get("n", 1)`` choices.

        Raises:
            langtorch.errors.BackendError: a subclass saying what failed and whether to retry.
        """

    async def embed(self, texts: Sequence[str], **params: Any) -> Embeddings:
        """Embed many texts in one call (one attempt). Backends without embeddings raise.

        Args:
            texts: the inputs.
            **params: extra body fields (``dimensions``, ``encoding_format`` ...).

        Returns:
            :class:`Embeddings` with one vector per input, in order.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no embeddings endpoint; use a backend that embeds "
            "(e.g. OpenAIBackend with an embedding model)."
        )

    async def stream(self, request: dict[str, Any]) -> AsyncIterator[str | Usage]:
        """Yield the answer's text as it arrives (first choice), then optionally one :class:`Usage`.

        Text deltas are ``str``; a :class:`Usage` item (at most one, when the backend knows it)
        reports the tokens spent; the runtime accounts it and does not pass it on. Default:
        complete the request, yield its text once, then its usage.

        Example:
            >>> import asyncio
            >>> class E(Backend):
            ...     async def complete(self, request):
            ...         return Completion((Choice("ab"),), Usage(2, 1))
            >>> async def main():
            ...     return [d async for d in E("e").stream({"messages": []})]
            >>> asyncio.run(main())
            ['ab', Usage(prompt_tokens=2, completion_tokens=1)]
        """
        completion = await self.complete(request)
        yield completion.text
        yield completion.usage

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        # Before redaction_secrets was public, backends declared their keys by overriding the
        # private ``_secrets``: keep honouring them (a key must never leak), with a warning.
        if "_secrets" in cls.__dict__ and "redaction_secrets" not in cls.__dict__:
            import warnings

            warnings.warn(f"{cls.__qualname__} overrides Backend._secrets, which is deprecated: "
                          "rename it to redaction_secrets (the public way to declare the "
                          "secrets traces and histories redact).", DeprecationWarning,
                          stacklevel=2)
            cls.redaction_secrets = cls.__dict__["_secrets"]  # type: ignore[method-assign]

    def redaction_secrets(self) -> tuple[str, ...]:
        """The backend's own secrets (API keys), which traces, request histories and tool
        errors redact wherever they appear (:class:`langtorch.core.HasSecrets`). Backends
        holding credentials override this; it returns them in clear, so never print it.

        Example:
            >>> class Keyed(Backend):
            ...     def __init__(self, key):
            ...         super().__init__("m")
            ...         self._key = key
            ...     async def complete(self, request):
            ...         raise NotImplementedError
            ...     def redaction_secrets(self):
            ...         return (self._key,)
            >>> import langtorch as lt
            >>> with lt.trace() as tr:
            ...     tr.add_secrets(Keyed("hunter22"))
            ...     with lt.tracing.span("tool", "t", inputs=[lt.TextTensor("pw hunter22")]):
            ...         pass
            >>> tr.spans[0].inputs[0]["texts"]
            ['pw ***']
        """
        return ()

    def __deepcopy__(self, memo: dict) -> Backend:
        # A backend is a shared resource (a connection pool, model weights, rate limits, session
        # totals): deep-copying a module that holds one, copy.deepcopy(llm), shares it.
        return self

    def __copy__(self) -> Backend:
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r})"
