"""What a model backend can do, declared as data, and the check that reads it before anything runs.

A backend declares its :class:`Capabilities` (``backend.capabilities``; ``OpenAIBackend`` the
OpenAI API's set, ``LocalBackend`` what the local engine honours today, a plain ``Backend``
subclass nothing beyond text chat until it says more: the checks trust one that says nothing,
with a ``DeprecationWarning``). Whatever needs a capability — a loss that
asks a judge for JSON, an optimizer whose proposals come in a JSON schema, an ``lt.nn.LLM`` with
tools — calls :func:`require_capabilities` when it is built, so a missing capability fails at
once with :class:`~langtorch.errors.CapabilityError` instead of after minutes of forward and
backward passes.

The declaration says what to *check*; it does not change what a backend sends. A user whose
server lacks something the backend's class promises (an OpenAI-compatible server without
``logprobs``) narrows it: ``OpenAIBackend(..., capabilities={"logprobs": False})``.

Example:
    >>> from langtorch.core.capabilities import Capabilities, require_capabilities
    >>> class Engine:
    ...     capabilities = Capabilities(tools=True)
    >>> require_capabilities(Engine(), "tools", who="my agent")   # declared: passes
    >>> Engine.capabilities.missing("tools", "structured_output")
    ('structured_output',)
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from langtorch.functional.errors import CapabilityError

__all__ = ["Capabilities", "require_capabilities"]

# What each capability means, in the words a message shows.
_MEANING = {
    "structured_output": "structured output (response_format with a JSON schema)",
    "tools": "tool calls (tools=)",
    "logprobs": "token log-probabilities (logprobs=True)",
    "multiple_choices": "several choices per request (n > 1)",
    "streaming": "streaming (text as it is generated)",
    "embeddings": "embeddings",
}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend honours, beyond plain text chat completions (which every backend does).

    Attributes:
        structured_output: ``response_format`` with a JSON schema (or ``json_object``) is
            honoured: the answer is JSON that follows it.
        tools: ``tools`` / ``tool_choice`` (function calling).
        logprobs: ``logprobs`` / ``top_logprobs``.
        multiple_choices: ``n`` > 1 returns ``n`` choices.
        streaming: ``stream()`` yields the text as it is generated (not once at the end).
        embeddings: ``embed()`` works.

    Example:
        >>> caps = Capabilities(tools=True, multiple_choices=True)
        >>> str(caps)
        'tools, multiple_choices'
        >>> caps.replace(tools=False).tools
        False
    """

    structured_output: bool = False
    tools: bool = False
    logprobs: bool = False
    multiple_choices: bool = False
    streaming: bool = False
    embeddings: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, bool):
                raise TypeError(f"Capabilities.{field.name} expected True or False, got {value!r}.")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The capability names, in declaration order.

        Example:
            >>> Capabilities.names()[:2]
            ('structured_output', 'tools')
        """
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def all(cls) -> Capabilities:
        """Every capability (what the OpenAI API offers).

        Example:
            >>> Capabilities.all().logprobs
            True
        """
        return cls(**{name: True for name in cls.names()})

    def replace(self, **changes: bool) -> Capabilities:
        """A copy with some capabilities changed; an unknown name raises ``TypeError``.

        Example:
            >>> Capabilities.all().replace(logprobs=False).logprobs
            False
        """
        _check_names(changes, "Capabilities.replace")
        return dataclasses.replace(self, **changes)

    def override(self, value: Capabilities | Mapping[str, bool] | None) -> Capabilities:
        """``value`` as a declaration on top of this one: ``None`` keeps this one, a
        :class:`Capabilities` replaces it, a mapping changes the capabilities it names.

        Example:
            >>> Capabilities.all().override({"tools": False}).tools
            False
        """
        if value is None:
            return self
        if isinstance(value, Capabilities):
            return value
        if isinstance(value, Mapping):
            return self.replace(**dict(value))
        raise TypeError(f"capabilities expected a Capabilities or a mapping of capability names "
                        f"{list(self.names())} to True/False, got {type(value).__name__}.")

    def missing(self, *needs: str) -> tuple[str, ...]:
        """The capabilities among ``needs`` that this declaration lacks, in the order given.

        Example:
            >>> Capabilities(tools=True).missing("tools", "logprobs")
            ('logprobs',)
        """
        _check_names(needs, "Capabilities.missing")
        return tuple(n for n in dict.fromkeys(needs) if not getattr(self, n))

    def __str__(self) -> str:
        have = [n for n in self.names() if getattr(self, n)]
        return ", ".join(have) if have else "text only"


def _check_names(names: Iterable[str], where: str) -> None:
    unknown = [n for n in names if n not in _MEANING]
    if unknown:
        raise TypeError(f"{where}: unknown capability {unknown[0]!r}; expected one of "
                        f"{list(Capabilities.names())}.")


def require_capabilities(engine: Any, *needs: str, who: str, alternatives: Iterable[str] = ()) -> None:
    """Raise :class:`~langtorch.errors.CapabilityError` when ``engine`` declares that it lacks
    one of ``needs``; call it where the need is known, before any request.

    ``engine`` is anything with a ``capabilities`` attribute: a Backend, an ``lt.nn.LLM`` (its
    backend's), a feedback engine that declares them. An engine that declares none (a custom
    critic) is trusted; so is a ``Backend`` subclass that declares nothing (no
    ``default_capabilities`` in its class, no ``capabilities=``), with a ``DeprecationWarning``
    that says how to declare. The message says who needs what, what the engine declares, and the
    ``alternatives`` (sentences).

    Example:
        >>> from langtorch.errors import CapabilityError
        >>> class Plain:
        ...     capabilities = Capabilities()
        >>> try:
        ...     require_capabilities(Plain(), "logprobs", who="the scorer",
        ...                          alternatives=["score labels locally."])
        ... except CapabilityError as e:
        ...     print(e.missing, e.who)
        ('logprobs',) the scorer
    """
    declared = getattr(engine, "capabilities", None)
    if declared is None:
        return
    if not isinstance(declared, Capabilities):
        raise TypeError(f"{type(engine).__name__}.capabilities expected a langtorch Capabilities "
                        f"(langtorch.backends.Capabilities(structured_output=True, ...)), got "
                        f"{type(declared).__name__}; declare one, or remove the attribute to have "
                        "the engine trusted.")
    missing = declared.missing(*needs)
    if not missing:
        return
    # An engine over a backend (lt.nn.LLM) is named by its backend: that is what declares.
    named = getattr(engine, "backend", engine)
    from langtorch.core.redact import redact

    shown = repr(named).splitlines()[0]
    name = redact(type(named).__name__ if shown.startswith("<") else shown)
    lacks = " and ".join(_MEANING[m] for m in missing)
    it = "it" if len(missing) == 1 else "them"
    if getattr(named, "_capabilities_declared", True) is False:
        # A Backend subclass written before backends declared capabilities: it worked then, so
        # it is trusted, with the way to declare (deprecation path, not a break).
        cls = type(named).__name__
        flags = ", ".join(f"{m}=True" for m in missing)
        warnings.warn(
            f"{who} needs {lacks}; its engine {name} is a Backend subclass that declares no "
            f"capabilities, so it is trusted to honour {it}, as before. This is deprecated: a "
            f"future release treats an undeclared backend as text chat only (CapabilityError). "
            f"If it does honour {it}, declare so in the class (class {cls}(Backend): "
            f"default_capabilities = Capabilities({flags})) or per instance "
            f"(capabilities={{{', '.join(repr(m) + ': True' for m in missing)}}}); "
            "langtorch.backends.Capabilities lists them.",
            DeprecationWarning, stacklevel=3)
        return
    options = [a for a in alternatives if a]
    message = (f"{who} needs {lacks}, and its engine {name} does not declare "
               f"{it} (it declares: {declared}). Nothing was sent."
               + ("\nInstead:" + "".join(f"\n  * {a}" for a in options) if options else "")
               + (f"\nA backend whose server does support {it} says so when it is made, "
                  f"capabilities={{{', '.join(repr(m) + ': True' for m in missing)}}}, or in its "
                  "class's default_capabilities." if _may_declare_more(named, declared) else ""))
    raise CapabilityError(message, who=who, missing=missing, declared=declared)


def _may_declare_more(backend: Any, declared: Capabilities) -> bool:
    """Whether "say so with capabilities=" is advice for ``backend``: a backend class written by
    a user, or a langtorch backend the user narrowed (an OpenAI-compatible server declared
    without logprobs). A langtorch backend at its own class's declaration (LocalBackend: what its
    engine refuses) would only fail later if told otherwise."""
    cls = type(backend)
    if not hasattr(cls, "default_capabilities"):
        return False
    return not cls.__module__.startswith("langtorch.") or declared != cls.default_capabilities
