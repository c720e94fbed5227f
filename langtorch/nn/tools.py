"""Tools: Python functions a model can call (``LLM(backend, tools=[...])``), and modules too.

``Tool(fn)`` reads ``fn``'s signature, type hints and docstring (Google-style ``Args:`` or
reST ``:param x:``) and builds the function's JSON schema with pydantic, so the model sees
what the function takes. A Tool is also a :class:`~langtorch.nn.TModule`: ``tool(x)`` runs it
on every entry of a TextTensor (each entry a JSON object of arguments, or, for a function with
one parameter or one required parameter, that argument itself), and ``tool(query=texts)`` on keyword arguments broadcast
together, so the same search function is a step of a ``TChain`` and a tool of an LLM.

Arguments from the model are validated (and converted: ``"3"`` becomes ``3`` for an ``int``
parameter; an argument the function does not take is refused, not dropped) before the function
runs; a parameter annotated ``TextTensor`` receives a 0-d data
TextTensor. The return value becomes the tool message: a ``str`` as is, a 0-d TextTensor its
text, anything else JSON (pydantic models through ``model_dump_json``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from langtorch import tracing
from langtorch.core.sync import nested_sync_calls
from langtorch.errors import BatchError, LangTorchError, ShapeError
from langtorch.nn.modules import TModule
from langtorch.tensor import TextTensor

__all__ = ["Tool", "ToolError", "as_tool"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|"
                      r"Return|Yields|Raises|Example|Examples|Note|Notes|Attributes|See Also)\s*:\s*$")
_ARG_SECTIONS = ("Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments")


class ToolError(LangTorchError):
    """A tool could not be run as asked, or a tool loop did not finish.

    Raised for arguments that do not fit the tool's schema (the LLM tool loop sends the message
    back to the model instead), for a call of an unknown tool, and when a model still asks for
    tools after ``max_tool_rounds`` rounds (then ``messages`` holds the conversation so far and
    ``tool_calls`` the calls made).

    Example:
        >>> ToolError("no tool named 'x'").messages is None
        True
    """

    def __init__(self, message: str, *, messages: list | None = None, tool_calls: list | None = None):
        super().__init__(message)
        self.messages = messages
        self.tool_calls = tool_calls


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` from a Google-style or reST docstring."""
    if not doc:
        return "", {}
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    entry_indent: int | None = None
    for line in inspect.cleandoc(doc).splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        rest = re.match(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$", stripped)
        if rest:
            section, current = "rest", rest.group(1)
            params[current] = rest.group(2).strip()
            continue
        if re.match(r"^:(returns?|rtype|raises?)\b", stripped):
            section, current = "other", None
            continue
        header = _SECTION.match(stripped)
        if header and indent == 0:
            section = "args" if header.group(1) in _ARG_SECTIONS else "other"
            current, entry_indent = None, None
            continue
        if section is None:
            description.append(stripped)
        elif section == "args":
            entry = re.match(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", stripped)
            if entry and (entry_indent is None or indent <= entry_indent):
                entry_indent = indent
                current = entry.group(1).lstrip("*")
                params[current] = entry.group(2).strip()
            elif current is not None and stripped:
                params[current] = (params[current] + " " + stripped).strip()
        elif section == "rest" and current is not None and stripped and indent > 0:
            params[current] = (params[current] + " " + stripped).strip()
    return re.sub(r"\s+", " ", " ".join(description)).strip(), params


def _is_text_tensor(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, TextTensor)


def _target(fn: Any) -> Callable[..., Any]:
    """The callable whose signature describes ``fn``'s arguments (a module's ``forward``)."""
    if isinstance(fn, TModule):
        return fn.forward
    return fn


def _stringify(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, TextTensor):
        return value.item() if value.ndim == 0 else json.dumps(value.tolist(), ensure_ascii=False)
    if hasattr(value, "model_dump_json"):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


class Tool(TModule):
    """A Python function (or a text module) as a tool for an LLM, and as a module itself.

    Args:
        fn: the function (sync or ``async``), or a :class:`~langtorch.nn.TModule` (its
            ``forward`` signature is read). Parameters need type hints to get a typed schema
            (unannotated ones accept any JSON value); ``*args``/``**kwargs`` are refused.
        name: the tool's name (default ``fn.__name__``, or the module's class name);
            letters, digits, ``_`` and ``-``, at most 64.
        description: what the tool does (default: the docstring's summary).
        timeout: seconds a call may take (default ``None``: no limit); a call past it fails
            with :class:`ToolError` (in an LLM's tool loop: sent to the model as the call's
            error). A sync function's thread cannot be stopped and finishes in the background.

    Attributes:
        name, description: as sent to the model.
        parameters: the JSON schema of the arguments.
        spec: the ``{"type": "function", "function": {...}}`` entry of a request's ``tools``.

    Raises:
        TypeError: ``fn`` is not callable, has ``*args``/``**kwargs``, or a parameter whose
            type has no JSON schema.
        ValueError: an invalid name or timeout.

    Example:
        >>> import langtorch as lt
        >>> def add(a: int, b: int = 1) -> int:
        ...     '''Add two numbers.
        ...
        ...     Args:
        ...         a: the first number.
        ...         b: the second number.
        ...     '''
        ...     return a + b
        >>> tool = lt.nn.Tool(add)
        >>> tool.spec["function"]["description"], tool.parameters["required"]
        ('Add two numbers.', ['a'])
        >>> tool.parameters["properties"]["b"]
        {'default': 1, 'description': 'the second number.', 'type': 'integer'}
        >>> tool(lt.TextTensor(['{"a": 2}', '{"a": "5", "b": 5}'])).tolist()
        ['3', '10']
    """

    _trace_kind = None  # opens its own "tool" span

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                 timeout: float | None = None):
        super().__init__()
        if isinstance(fn, Tool):  # re-wrapped: its settings, unless given again
            name = fn.name if name is None else name
            description = fn.description if description is None else description
            timeout = fn.timeout if timeout is None else timeout
            fn = fn.fn
        if not callable(fn):
            raise TypeError(f"Tool expected a function or a TModule, got {type(fn).__name__}.")
        import pydantic

        target = _target(fn)
        default_name = type(fn).__name__ if isinstance(fn, TModule) else getattr(fn, "__name__", None)
        name = name if name is not None else default_name
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"Tool name must be 1-64 letters, digits, '_' or '-', got {name!r}; pass name=...")
        doc_source = fn if isinstance(fn, TModule) and type(fn).__doc__ else target
        summary, param_docs = _parse_docstring(inspect.getdoc(doc_source))
        if isinstance(fn, TModule):
            forward_summary, forward_params = _parse_docstring(inspect.getdoc(target))
            summary = summary or forward_summary
            param_docs = {**forward_params, **param_docs}
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError) as e:
            raise TypeError(f"Tool could not read the signature of {name!r}: {e}") from None
        try:
            hints = typing.get_type_hints(target)
        except Exception:  # noqa: BLE001 - unresolvable forward references: annotations as written
            hints = {k: v for k, v in getattr(target, "__annotations__", {}).items()
                     if not isinstance(v, str)}
        fields: dict[str, Any] = {}
        self._text_params: set[str] = set()
        self._positional = [p.name for p in signature.parameters.values() if p.kind == p.POSITIONAL_ONLY]
        for p in signature.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(
                    f"Tool {name!r}: parameter {p.name!r} is *args/**kwargs, which has no JSON "
                    "schema; give the function named parameters.")
            annotation = hints.get(p.name, Any)
            if _is_text_tensor(annotation):
                self._text_params.add(p.name)
                annotation = str
            default = ... if p.default is p.empty else p.default
            # Fields are named p0, p1, ... with the parameter's name as alias: any parameter name
            # works (``_x``, ``model_config``, ``schema``, ... clash with pydantic's own names).
            fields[f"p{len(fields)}"] = (annotation, pydantic.Field(
                default, alias=p.name, description=param_docs.get(p.name)))
        self.fn = fn
        self.name = name
        self.description = description if description is not None else summary
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0):
            raise ValueError(f"Tool timeout must be a number of seconds > 0 or None, got {timeout!r}")
        self.timeout = None if timeout is None else float(timeout)
        # Unknown arguments are refused (the model is told), not dropped: a misspelt optional
        # argument would otherwise silently run the tool with its default.
        config = pydantic.ConfigDict(extra="forbid")
        try:
            self._model = pydantic.create_model(f"{name}_arguments", __config__=config, **fields)
            schema = self._model.model_json_schema()
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as e:
            bad = _unsupported_parameter(fields, config)
            raise TypeError(
                f"Tool {name!r}: {'parameter ' + repr(bad) if bad else 'a parameter'} has a type "
                f"with no JSON schema ({type(e).__name__}: {str(e).splitlines()[0]}); annotate it "
                "with a JSON type (str, int, float, bool, list, dict, Literal, a pydantic model).") from None
        self._aliases = {f: info.alias for f, info in self._model.model_fields.items()}
        schema.pop("title", None)
        for prop in (schema.get("properties") or {}).values():
            if isinstance(prop, dict):
                prop.pop("title", None)
        schema.setdefault("properties", {})
        self.parameters = schema
        self._async = inspect.iscoroutinefunction(target) and not isinstance(fn, TModule)

    @property
    def spec(self) -> dict[str, Any]:
        """The tool as a request's ``tools`` entry."""
        function = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}

    def extra_repr(self) -> str:
        return f"name={self.name!r}"

    # ------------------------------------------------------------------ running
    def _arguments(self, arguments: Any) -> dict[str, Any]:
        """Validated keyword arguments from a JSON text or a mapping; ToolError if they do not fit."""
        import pydantic

        if isinstance(arguments, (str, bytes)):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as e:
                raise ToolError(f"tool {self.name!r}: the arguments are not valid JSON ({e}); "
                                f"expected an object matching {json.dumps(self.parameters)}") from None
        if not isinstance(arguments, Mapping):
            raise ToolError(f"tool {self.name!r}: expected a JSON object of arguments, got "
                            f"{type(arguments).__name__}.")
        try:
            validated = self._model.model_validate(dict(arguments))
        except pydantic.ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'arguments'}: {err['msg']}"
                                 for err in e.errors())
            raise ToolError(f"tool {self.name!r}: invalid arguments ({problems}).") from None
        kwargs = {alias: getattr(validated, field) for field, alias in self._aliases.items()}
        for k in self._text_params:
            if isinstance(kwargs.get(k), str):
                kwargs[k] = TextTensor(kwargs[k], template=False)
        return kwargs

    async def arun(self, arguments: Any) -> str:
        """Validate ``arguments`` (JSON text or a mapping), run the function, return its result
        as the text of a tool message. A sync function runs in a worker thread, so calls run
        concurrently. Exceptions of the function propagate; bad arguments raise
        :class:`ToolError`.

        Example:
            >>> import asyncio, langtorch as lt
            >>> asyncio.run(lt.nn.Tool(lambda x: x * 2, name="double").arun('{"x": 4}'))
            '8'
        """
        kwargs = self._arguments(arguments)
        args = [kwargs.pop(name) for name in self._positional]  # positional-only parameters

        async def call() -> Any:
            if self._async:
                result = await self.fn(*args, **kwargs)
            else:
                result = await asyncio.to_thread(_in_tool_thread, self.fn, args, kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        if self.timeout is None:
            return _stringify(await call())

        async def own_timeouts_apart() -> Any:
            try:
                return await call()
            except TimeoutError as e:  # the function's own (a socket's): not this timeout
                raise _OwnTimeout(e) from None

        try:
            return _stringify(await asyncio.wait_for(own_timeouts_apart(), self.timeout))
        except _OwnTimeout as own:
            raise own.error from None
        except TimeoutError:
            # A sync function's thread cannot be stopped: it finishes in the background.
            raise ToolError(f"tool {self.name!r} did not finish within timeout={self.timeout:g} s.") from None

    def _entry_arguments(self, text: str, index: tuple[int, ...]) -> Any:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, Mapping):
            return value
        fields = self._model.model_fields
        names = [f.alias for f in fields.values()]
        required = [f.alias for f in fields.values() if f.is_required()]
        if len(names) == 1 or len(required) == 1:
            return {(names if len(names) == 1 else required)[0]: text}
        raise ToolError(f"tool {self.name!r}: entry {index} is not a JSON object of arguments "
                        f"({text[:100]!r}), and the tool takes {len(names)} parameters {names} "
                        f"({len(required)} required).")

    def forward(self, x: Any = None, **kwargs: Any) -> TextTensor:
        """Run the tool on every entry: ``tool(x)`` (entries are JSON objects of arguments, or the
        argument of a tool with one parameter, or one required parameter) or ``tool(name=values, ...)`` (TextTensors, lists and
        scalars, broadcast together). Entries run concurrently.

        Returns:
            A data TextTensor of the results, of the entries' shape, with ``metadata["tool"]``.

        Raises:
            ToolError / the function's exception: when the only entry failed; otherwise
            :class:`~langtorch.errors.BatchError` (``results`` with failed entries ``""``,
            ``errors`` keyed by entry index; ``results`` is ``None`` when all failed).
        """
        from langtorch.runtime import run_sync

        if x is not None and kwargs:
            raise TypeError(f"tool {self.name!r}: pass either a TextTensor of arguments or keyword "
                            "arguments, not both.")
        if x is not None:
            x = x if isinstance(x, TextTensor) else TextTensor(x, template=False)
            shape = x.shape
            flat = x.texts.reshape(-1).tolist()
            calls = [self._entry_arguments(t, _unravel(i, shape)) for i, t in enumerate(flat)]
            inputs = [x]
        else:
            arrays = {k: (v.texts if isinstance(v, TextTensor) else np.asarray(v, dtype=object))
                      for k, v in kwargs.items()}
            try:
                shape = np.broadcast_shapes(*(a.shape for a in arrays.values())) if arrays else ()
            except ValueError:
                shapes = ", ".join(f"{k}: {a.shape}" for k, a in arrays.items())
                raise ShapeError(f"tool {self.name!r}: the keyword arguments' shapes do not "
                                 f"broadcast together ({shapes}).") from None
            flat_cols = {k: np.broadcast_to(a, shape).reshape(-1).tolist() for k, a in arrays.items()}
            size = int(np.prod(shape)) if shape else 1
            calls = [{k: col[i] for k, col in flat_cols.items()} for i in range(size)]
            inputs = [TextTensor(np.array([json.dumps(c, default=str) for c in calls], dtype=object)
                                 .astype(str).reshape(shape) if shape else json.dumps(calls[0], default=str),
                                 template=False)]

        async def run_all() -> list[Any]:
            return await asyncio.gather(*(self.arun(c) for c in calls), return_exceptions=True)

        with tracing.span("tool", self.name, inputs=inputs) as span:
            outcomes = run_sync(run_all())
            failures = {_unravel(i, shape): o for i, o in enumerate(outcomes) if isinstance(o, BaseException)}
            texts = ["" if isinstance(o, BaseException) else o for o in outcomes]
            out = TextTensor(np.array(texts, dtype=object).astype(str).reshape(shape) if shape else texts[0],
                             template=False)
            out.metadata["tool"] = self.name
            tracing.set_outputs(span, out)
            if failures:
                first = next(iter(failures.values()))
                if len(outcomes) == 1:
                    raise first
                everything = len(failures) == len(outcomes)
                raise BatchError(
                    f"tool {self.name!r}: {len(failures)} of {len(outcomes)} entries failed; first "
                    f"error: {type(first).__name__}: {first}", results=None if everything else out,
                    errors=failures)
            return out


class _OwnTimeout(Exception):
    """Carries a TimeoutError the tool raised itself past ``asyncio.wait_for``."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def _in_tool_thread(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run a sync tool in its worker thread, its own langtorch sync calls (a TModule tool that
    calls an LLM: a sub-agent) on a fresh event loop rather than the runtime's loop. On the
    runtime's loop, their own sync tools would queue for the worker threads the outer tools
    hold while they wait for them: with more outer calls than workers, a deadlock."""
    with nested_sync_calls():
        return fn(*args, **kwargs)


def _unsupported_parameter(fields: Mapping[str, Any], config: Any) -> str | None:
    """The first parameter whose annotation has no JSON schema (for the error message)."""
    import pydantic

    for field, spec in fields.items():
        try:
            pydantic.create_model("probe", __config__=config, **{field: spec}).model_json_schema()
        except Exception:  # noqa: BLE001 - any failure names this parameter
            return spec[1].alias
    return None


def _unravel(i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(v) for v in np.unravel_index(i, shape)) if shape else ()


def as_tool(value: Any) -> Tool:
    """``value`` as a :class:`Tool`: a Tool as is, a function or TModule wrapped.

    Example:
        >>> as_tool(len).name
        'len'
    """
    if isinstance(value, Tool):
        return value
    if callable(value):
        return Tool(value)
    raise TypeError(f"expected a tool (a function, a TModule or lt.nn.Tool), got {type(value).__name__}.")
