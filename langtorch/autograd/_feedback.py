"""The feedback engine: the critic that ``loss.backward()`` and the text optimizers ask for text.

The backward pass turns feedback on an LLM's answer into feedback on the prompt that produced
it, and merges many feedback items into one; :class:`~langtorch.optim.TGD` and
:class:`~langtorch.optim.Search` ask for new values. All of them talk to a critic through one
small protocol, :class:`FeedbackEngine`: a batch of chat prompts in, one answer per prompt out.
``autograd`` knows nothing about backends or the runtime; the engines live above it:
``lt.nn.LLM`` is a feedback engine (its sampling parameters and runtime switches are used), and a
``Backend`` is adapted to one by :func:`as_feedback_engine` (``nn`` registers the adapter).

Example:
    >>> import asyncio
    >>> from langtorch.autograd import Answer, FeedbackEngine
    >>> class Shout:                       # any object with ``afeedback`` is a feedback engine
    ...     async def afeedback(self, prompts, **options):
    ...         return [Answer(p[-1]["content"].upper()) for p in prompts]
    >>> isinstance(Shout(), FeedbackEngine)
    True
    >>> asyncio.run(Shout().afeedback([[{"role": "user", "content": "be brief"}]]))[0].text
    'BE BRIEF'
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from langtorch.errors import BatchError

__all__ = ["Answer", "FeedbackEngine", "as_feedback_engine", "ask_feedback", "get_backward_engine",
           "get_feedback_engine", "set_backward_engine", "set_feedback_engine"]

# A prompt is a list of chat messages ({"role", "content"} dicts).
Prompt = Sequence[Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class Answer:
    """A feedback engine's answer to one prompt.

    Attributes:
        text: the answer's text (stripped; empty when it failed).
        finish_reason: why generation stopped (``"stop"``, ``"length"``, ...), when known.
        error: the exception of a failed prompt (only with ``raise_errors=False``).

    Example:
        >>> Answer("Be more specific.").text
        'Be more specific.'
    """

    text: str = ""
    finish_reason: str | None = None
    error: BaseException | None = None


@runtime_checkable
class FeedbackEngine(Protocol):
    """What the backward pass and the text optimizers need from a critic.

    ``await engine.afeedback(prompts, ...)`` answers every prompt (a list of chat messages)
    concurrently and returns one :class:`Answer` per prompt, in order. Options:

    * ``response_format``: a chat-completions ``response_format`` (a JSON schema the answer
      follows), or ``None`` for free text.
    * ``token_room``: the answer needs at least this many tokens; an engine whose own
      ``max_tokens`` is larger keeps it.
    * ``validate``: ``validate(text) -> bool``; an answer that fails comes back as it is but is
      never cached, so asking again (the caller's retry, a rerun) gets a fresh answer.
    * ``raise_errors``: raise failed prompts (one: its own error; several: a
      :class:`~langtorch.errors.BatchError`), or return them in :attr:`Answer.error`.

    ``lt.nn.LLM`` implements it; a ``Backend`` is adapted by :func:`as_feedback_engine`.

    Example:
        >>> import langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> isinstance(lt.nn.LLM(OpenAIBackend("m", api_key="sk-test1234")), FeedbackEngine)
        True
    """

    async def afeedback(self, prompts: Sequence[Prompt], *, response_format: Mapping[str, Any] | None = None,
                        token_room: int | None = None, validate: Callable[[str], bool] | None = None,
                        raise_errors: bool = True) -> list[Answer]:
        """One :class:`Answer` per prompt, in order."""
        ...


@functools.singledispatch
def as_feedback_engine(engine: Any) -> FeedbackEngine:
    """``engine`` as a :class:`FeedbackEngine`: a feedback engine is returned as is; other types
    are adapted by the adapter registered for them (``as_feedback_engine.register(cls)``;
    ``langtorch.nn``, when loaded, registers one for ``Backend``: an ``lt.nn.LLM`` over it).

    Raises:
        TypeError: no adapter for ``engine``'s type.

    Example:
        >>> from langtorch.backends import OpenAIBackend
        >>> engine = as_feedback_engine(OpenAIBackend("m", api_key="sk-test1234"))
        >>> isinstance(engine, FeedbackEngine), type(engine).__name__
        (True, 'LLM')
    """
    if isinstance(engine, FeedbackEngine):
        return engine
    raise TypeError(f"a feedback engine must be an lt.nn.LLM, a langtorch Backend or an object with an "
                    f"async afeedback(prompts, ...) method (lt.autograd.FeedbackEngine); got "
                    f"{type(engine).__name__}. (A Backend is adapted once langtorch.nn is loaded: "
                    "use lt.nn.LLM(backend), or import langtorch.nn first.)")


async def ask_feedback(engine: FeedbackEngine, prompts: Sequence[Prompt], *,
                       response_format: Mapping[str, Any] | None = None, token_room: int | None = None,
                       validate: Callable[[str], bool] | None = None, raise_errors: bool = True) -> list[Answer]:
    """``await engine.afeedback(prompts, ...)``, with the reply checked: how the backward pass
    and the optimizers ask a feedback engine (any implementation, not only ``lt.nn.LLM``).

    The reply must be one :class:`Answer` per prompt, in order. A failed prompt (an answer with
    an ``error``) never counts as text: with ``raise_errors`` it is raised (the error itself for
    a single prompt, else a :class:`~langtorch.errors.BatchError` keyed by ``(prompt index,)``)
    even when the engine returned it instead; without, it comes back with empty text.

    Raises:
        TypeError: the engine did not return one Answer per prompt.

    Example:
        >>> import asyncio
        >>> class Echo:
        ...     async def afeedback(self, prompts, **options):
        ...         return [Answer(p[-1]["content"]) for p in prompts]
        >>> asyncio.run(ask_feedback(Echo(), [[{"role": "user", "content": "hi"}]]))[0].text
        'hi'
    """
    prompts = list(prompts)
    # Only the options asked for are passed: a minimal engine, afeedback(self, prompts), answers
    # the backward pass (which asks for none).
    options: dict[str, Any] = {k: v for k, v in (("response_format", response_format), ("token_room", token_room),
                                                 ("validate", validate)) if v is not None}
    if not raise_errors:
        options["raise_errors"] = False
    answers = await engine.afeedback(prompts, **options)
    if (not isinstance(answers, Sequence) or isinstance(answers, str) or len(answers) != len(prompts)
            or not all(isinstance(a, Answer) for a in answers)):
        got = (f"{len(answers)} items ({', '.join(sorted({type(a).__name__ for a in answers})) or 'none'})"
               if isinstance(answers, Sequence) and not isinstance(answers, str) else type(answers).__name__)
        raise TypeError(f"the feedback engine {type(engine).__name__} must return one "
                        f"lt.autograd.Answer per prompt, in order: it was asked {len(prompts)} prompts "
                        f"and returned {got}. Fix its afeedback(prompts, ...).")
    failed = {i: a.error for i, a in enumerate(answers) if a.error is not None}
    if failed and raise_errors:
        if len(prompts) == 1:
            raise failed[0]
        summary = ", ".join(f"{i}: {type(e).__name__}: {e}" for i, e in list(failed.items())[:3])
        raise BatchError(f"{len(failed)} of {len(prompts)} feedback prompts failed ({summary})",
                         results=[a.text if a.error is None else "" for a in answers],
                         errors={(i,): e for i, e in failed.items()})
    return [dataclasses.replace(a, text="") if a.error is not None and a.text else a for a in answers]


_default_engine: FeedbackEngine | None = None


def set_feedback_engine(engine: Any) -> None:
    """Set the default feedback engine of ``loss.backward()`` (an ``lt.nn.LLM``, a ``Backend``
    or any :class:`FeedbackEngine`); ``None`` clears it.

    Raises:
        TypeError: ``engine`` is not (and cannot be adapted to) a feedback engine.

    Example:
        >>> import langtorch as lt
        >>> lt.autograd.set_feedback_engine(None)
        >>> lt.autograd.get_feedback_engine() is None
        True
    """
    global _default_engine
    _default_engine = None if engine is None else as_feedback_engine(engine)


def get_feedback_engine() -> FeedbackEngine | None:
    """The default feedback engine of ``loss.backward()`` (``None`` when unset).

    Example:
        >>> import langtorch as lt
        >>> lt.autograd.get_feedback_engine() is None
        True
    """
    return _default_engine


def set_backward_engine(engine: Any) -> None:
    """Deprecated alias of :func:`set_feedback_engine` ("engine" alone names the decode engine).

    Example:
        >>> import warnings, langtorch as lt
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     lt.optim.set_backward_engine(None)
    """
    warnings.warn("set_backward_engine is deprecated; use lt.autograd.set_feedback_engine",
                  DeprecationWarning, stacklevel=2)
    set_feedback_engine(engine)


def get_backward_engine() -> FeedbackEngine | None:
    """Deprecated alias of :func:`get_feedback_engine`.

    Example:
        >>> import warnings, langtorch as lt
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     lt.optim.get_backward_engine() is None
        True
    """
    warnings.warn("get_backward_engine is deprecated; use lt.autograd.get_feedback_engine",
                  DeprecationWarning, stacklevel=2)
    return get_feedback_engine()


def renamed_feedback_engine(feedback_engine: Any, engine: Any, where: str,
                            stacklevel: int = 3) -> Any:
    """The critic given as ``feedback_engine=`` or as the deprecated ``engine=`` (which warns:
    "engine" alone names the decode engine); both at once is a ``TypeError``."""
    if engine is None:
        return feedback_engine
    if feedback_engine is not None:
        raise TypeError(f"{where}: got both feedback_engine= and its deprecated name engine=; "
                        "pass feedback_engine= only.")
    warnings.warn(f"{where}: engine= is deprecated; pass feedback_engine= (the critic that "
                  "writes feedback; 'engine' names the decode engine).", DeprecationWarning,
                  stacklevel=stacklevel)
    return engine
