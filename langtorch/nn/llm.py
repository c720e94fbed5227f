"""LLM and embedding modules: one backend request per entry, run by ``langtorch.runtime``.

``LLM(backend)(x)`` sends every entry of ``x`` as one chat-completions request (concurrently,
under the backend's limits, retries, cache and budget) and returns a TextTensor of the answers,
of ``x``'s shape (``n > 1`` adds a trailing dimension of samples), created with
``template=False`` so that answers are data: ``answer + more`` concatenates and braces in model
output are never parsed as placeholders.

**Chats.** An entry's text is the user turn. Earlier turns live in the metadata column
``"messages"`` (object dtype: a list of ``{"role", "content"}`` dicts per entry) and a per-entry
system prompt in the column ``"system"`` (overrides the module's ``system``). :func:`chat` builds
such a tensor from message lists. The request of an entry is
``[system] + metadata["messages"] + [{"role": "user", "content": text}]``; an empty text adds no
user turn (to continue after a tool result, for instance).

**Conversations.** The answer to a chat entry (an input with a ``"messages"`` column) carries
the conversation in its own ``metadata["messages"]``, ending with the assistant turn, and keeps
``metadata["system"]``; ``answer.reply(texts)`` makes the next turn, so
``llm(llm(chat).reply("and then?"))`` continues every conversation (each sample's own, with
``n > 1``). Answers to plain inputs carry no history.

**Templates.** An input that is a template (text a user wrote) is sent with its escapes resolved
(``{{`` becomes ``{``); a placeholder still unfilled raises
:class:`~langtorch.errors.TemplateError` naming the field and the entry, unless
``allow_placeholders=True``. Data (model output, ``template=False``) is sent as is.

**Tools.** ``LLM(backend, tools=[fn, lt.nn.Tool(...)])`` runs the tool-call loop (see
:class:`LLM`); tool specs given as dicts are sent as given, and the model's calls are returned in
``metadata["tool_calls"]`` without running anything.

**Output metadata** (one value per output entry): ``prompt_tokens`` and ``completion_tokens``
(a request's usage is put on its sample 0 and on the first of identical entries, so sums over the
tensor equal what was spent; cache hits count 0), ``model``, ``finish_reason``, ``cached``, and
when present ``tool_calls`` (list of dicts), ``tool_rounds``, ``logprobs``, ``parsed``
(structured output), and ``messages`` / ``system`` for chats.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from langtorch import tracing
from langtorch.autograd import LLM_CALL, record_node
from langtorch.backends.base import Backend, Choice, Completion, Usage
from langtorch.core import context as _context
from langtorch.core.redact import redact
from langtorch.errors import ParseError, TemplateError
from langtorch.functional.template import parse_template
from langtorch.nn.modules import TModule
from langtorch.nn.tools import Tool, ToolError, as_tool
from langtorch.runtime import CallResult, acomplete, aembed, astream, raise_for_errors, run_sync
from langtorch.tensor import TextParameter, TextTensor

__all__ = ["LLM", "Embed", "chat"]

# Call-time options that steer the runtime, not the request body.
_RUNTIME_KEYS = ("use_cache", "progress")
# Options of the module itself (settable at construction or per call), never sent.
_MODULE_KEYS = ("max_tool_rounds", "allow_placeholders")
DEFAULT_MAX_TOOL_ROUNDS = 8


def chat(conversations: Any, *, system: Any = None) -> TextTensor:
    """Make a chat TextTensor from message lists (one list per entry, nested for n-d); a plain
    string stands for a conversation of one user message. The LLM's answers to a chat carry
    their conversation, so ``answer.reply(...)`` continues it.

    The last message of each conversation must be a user turn: it becomes the entry's text; the
    earlier ones go to ``metadata["messages"]``. A last turn with a list of content parts
    (multimodal) is kept as given in ``metadata["messages"]`` and the entry's text is empty. A ``"system"`` first message, or ``system=``
    (one string, or one per entry), goes to ``metadata["system"]``.

    Args:
        conversations: a list of message dicts (a 0-d tensor), or nested lists of those; a
            ``str`` in place of a message list is one user turn.
        system: an optional system prompt for every entry, or an array-like of them.

    Returns:
        A TextTensor (``template=False``) of the conversations' shape.

    Example:
        >>> t = chat([[{"role": "system", "content": "Be terse."},
        ...            {"role": "user", "content": "hi"}],
        ...           [{"role": "user", "content": "2+2?"},
        ...            {"role": "assistant", "content": "4"},
        ...            {"role": "user", "content": "times 3?"}]])
        >>> t.tolist(), t.metadata["system"].tolist()
        (['hi', 'times 3?'], ['Be terse.', ''])
        >>> t[1].metadata["messages"]
        [{'role': 'user', 'content': '2+2?'}, {'role': 'assistant', 'content': '4'}]
        >>> q = chat(["Hello", "2+2?"], system=["Be kind.", "Be terse."])
        >>> q.tolist(), q.metadata["messages"].tolist()
        (['Hello', '2+2?'], [[], []])
    """
    if isinstance(conversations, str) or (isinstance(conversations, Sequence) and conversations
                                          and isinstance(conversations[0], Mapping)):
        shape: tuple[int, ...] = ()
        flat = [conversations]
    else:
        arr = np.empty(_chat_shape(conversations), dtype=object)
        _fill_chats(arr, conversations, ())
        shape, flat = arr.shape, list(arr.reshape(-1))
    texts, history, systems = [], np.empty(len(flat), dtype=object), []
    for i, conv in enumerate(flat):
        conv = [{"role": "user", "content": conv}] if isinstance(conv, str) else list(conv)
        sys_text = ""
        if conv and conv[0].get("role") == "system":
            sys_text = str(conv[0].get("content") or "")
            conv = conv[1:]
        if not conv or conv[-1].get("role") != "user":
            raise ValueError(
                f"chat expected each conversation to end with a user message, got "
                f"{conv[-1].get('role') if conv else 'an empty conversation'} at entry {i}; end it "
                "with {'role': 'user', 'content': ...}.")
        content = conv[-1].get("content")
        if isinstance(content, str) or content is None:
            texts.append(content or "")
            history[i] = [dict(m) for m in conv[:-1]]
        else:
            # Content parts (images, audio, ...) have no text form that could be sent back: the
            # whole conversation stays in "messages" as given, and the entry's text is empty
            # (an empty text adds no user turn).
            texts.append("")
            history[i] = [dict(m) for m in conv]
        systems.append(sys_text)
    out = TextTensor(np.array(texts, dtype=object).reshape(shape) if shape else texts[0], template=False)
    out.metadata["messages"] = history.reshape(shape)
    if system is not None:
        sys_col = np.broadcast_to(np.asarray(system, dtype=object), shape)
        systems = [str(s) for s in sys_col.reshape(-1)]
    out.metadata["system"] = np.array(systems, dtype=object).reshape(shape).astype(str)
    return out


def _chat_shape(x: Any) -> tuple[int, ...]:
    if isinstance(x, str) or (isinstance(x, Sequence) and x and isinstance(x[0], Mapping)):
        return ()
    if not isinstance(x, Sequence) or not x:
        raise TypeError("chat expected (nested) lists of message lists.")
    return (len(x),) + _chat_shape(x[0])


def _fill_chats(arr: np.ndarray, x: Any, index: tuple[int, ...]) -> None:
    if arr.ndim == len(index):
        if not (isinstance(x, str) or (isinstance(x, Sequence) and x and isinstance(x[0], Mapping))):
            raise TypeError(f"chat: entry {index} is not a conversation (a list of message dicts, or "
                            f"a string) but {type(x).__name__}; the nesting must be even.")
        arr[index] = x
        return
    if isinstance(x, str) or not isinstance(x, Sequence) or len(x) != arr.shape[len(index)]:
        got = len(x) if isinstance(x, Sequence) and not isinstance(x, str) else type(x).__name__
        raise ValueError(f"chat: the conversations are ragged: at {index} expected "
                         f"{arr.shape[len(index)]} entries (like the first), got {got}.")
    for i, item in enumerate(x):
        _fill_chats(arr, item, index + (i,))


def _as_text_tensor(x: Any) -> TextTensor:
    return x if isinstance(x, TextTensor) else TextTensor(x, template=False)


def _column(t: TextTensor, key: str) -> np.ndarray | None:
    return t.metadata.column(key).reshape(-1) if key in t.metadata else None


def _response_format(value: Any) -> tuple[Any, Any]:
    """(request value, parser) for a ``response_format`` given as a pydantic model or a dict."""
    if value is None:
        return None, None
    if isinstance(value, type) and hasattr(value, "model_json_schema"):
        schema = value.model_json_schema()
        body = {"type": "json_schema", "json_schema": {"name": value.__name__, "schema": schema}}
        return body, value
    if isinstance(value, Mapping) and value.get("type") in ("json_schema", "json_object"):
        return dict(value), dict(value)
    if isinstance(value, Mapping) and ("properties" in value or value.get("type") == "object"):
        # A bare JSON schema: wrap it the way the API expects.
        body = {"type": "json_schema", "json_schema": {"name": value.get("title", "answer"), "schema": dict(value)}}
        return body, body
    return value, None


def _parse(text: str, parser: Any, index: tuple[int, ...]) -> Any:
    """Parse one answer for a ``response_format``; ParseError when it does not fit."""
    if isinstance(parser, type):  # a pydantic model
        try:
            return parser.model_validate_json(text)
        except Exception as e:  # noqa: BLE001 - pydantic's ValidationError and JSON errors alike
            raise ParseError(
                f"expected JSON matching {parser.__name__} at entry {index}, got {text[:200]!r} "
                f"({type(e).__name__}: {str(e).splitlines()[0]}). Check the prompt, or the "
                "server's support for response_format.", text=text, index=index) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(
            f"expected a JSON answer at entry {index}, got {text[:200]!r} ({e}). Check the prompt, "
            "or the server's support for response_format.", text=text, index=index) from None
    schema = (parser.get("json_schema") or {}).get("schema") or {}
    required = schema.get("required") or []
    if schema.get("type") == "object" and not isinstance(value, dict):
        raise ParseError(f"expected a JSON object at entry {index}, got {type(value).__name__}: "
                         f"{text[:200]!r}.", text=text, index=index)
    missing = [k for k in required if not isinstance(value, dict) or k not in value]
    if missing:
        raise ParseError(f"expected the JSON answer at entry {index} to have keys {required}, "
                         f"missing {missing}: {text[:200]!r}.", text=text, index=index)
    return value


def _parses(text: str, parser: Any) -> bool:
    try:
        _parse(text, parser, ())
    except ParseError:
        return False
    return True


def _index(i: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(v) for v in np.unravel_index(i, shape)) if shape else ()


def _prompt_text(text: str, where: str, allow: bool) -> str:
    """The text a template entry sends: escapes resolved (``{{`` is ``{``); a placeholder still
    in it raises TemplateError (unless ``allow``: then the text goes as written). A text that is
    not a well-formed template (a lone brace) goes as written."""
    if "{" not in text and "}" not in text:
        return text
    try:
        template = parse_template(text)
    except TemplateError:
        return text
    if not template.fields:
        return template.literals[0]
    if allow:
        return text
    field = template.fields[0]
    excerpt = text if len(text) <= 120 else text[:117] + "..."
    raise TemplateError(
        f"{where} still holds the placeholder {{{field}}} and would go to the model unfilled: "
        f"{excerpt!r}. Fill it (prompt + values, or prompt * {{{field!r}: ...}}); if the braces "
        f"are literal text, double them ({{{{{field}}}}}); if the text is data (model output, "
        "user input or an f-string that inserted some), mark it as data with lt.text(...) or "
        "lt.TextTensor(..., template=False). To send placeholders as written, pass "
        "allow_placeholders=True to the LLM.", template=text, field=field)


def _check_rounds(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"max_tool_rounds must be an int >= 1, got {value!r}")
    return int(value)


def _classify_tools(value: Any) -> tuple[list[Tool] | None, Any]:
    """``(executable tools, raw tool specs)`` from an LLM's ``tools`` argument."""
    if value is None:
        return None, None
    if isinstance(value, (Tool, Mapping)) or callable(value):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise TypeError(f"tools expected a list of lt.nn.Tool / functions (run by the LLM) or of "
                        f"tool specs (dicts, sent as given), got {type(value).__name__}.")
    specs = [t for t in value if isinstance(t, Mapping)]
    if not specs:
        tools = [as_tool(t) for t in value]
        names = [t.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tools has two tools named {dupes}; give them distinct name=... .")
        return tools, None
    if len(specs) != len(value):
        raise ValueError(
            "tools mixes tool specs (dicts, whose calls the LLM cannot run) with functions/"
            "lt.nn.Tool (which it runs); use one kind: wrap each function in lt.nn.Tool, or "
            "pass only specs and handle metadata['tool_calls'] yourself.")
    return None, list(value)


def _assistant_message(choice: Choice) -> dict[str, Any]:
    """The assistant turn of a choice, as it goes back into a conversation."""
    rest = {k: v for k, v in (choice.message or {}).items()
            if v is not None and k not in ("role", "content")}
    content = choice.text if choice.text or not rest.get("tool_calls") else None
    return {"role": "assistant", "content": content, **rest}


@dataclasses.dataclass
class _Thread:
    """One conversation of a tool loop: an entry's sample, its messages and its tool calls."""

    entry: int
    messages: list[dict[str, Any]]
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    rounds: int = 0
    usage: Usage = Usage()
    cached: bool = True
    final: Choice | None = None
    pending: list[dict[str, Any]] | None = None
    error: BaseException | None = None


def _advance(th: _Thread, choice: Choice) -> None:
    """Take a model turn: tool calls to run next, or the conversation's final answer."""
    calls = (choice.message or {}).get("tool_calls")
    if calls:
        th.messages.append(_assistant_message(choice))
        th.pending = list(calls)
    else:
        th.final = choice


async def _run_call(call: Mapping[str, Any], tools: Mapping[str, Tool], round_: int,
                    index: tuple[int, ...], secrets: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one tool call in a ``tool`` span: ``(the tool message, the call's record)``. A failure
    (unknown tool, bad arguments, the tool raised) becomes the message's content: the model
    sees it and can recover; the record and the span keep the error. The error text is
    redacted (the backend's key, key-shaped strings, bearer tokens): it is sent to the server,
    kept in metadata and, as part of the next request, in the response cache."""
    function = call.get("function") or {}
    name = str(function.get("name") or "")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {})
    try:
        parsed: Any = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        parsed = arguments
    record = {"id": call.get("id"), "name": name, "arguments": parsed, "round": round_,
              "result": None, "error": None}
    try:
        with tracing.span("tool", name or "unknown", inputs=[TextTensor(arguments, template=False)],
                         attrs={"call_id": call.get("id"), "round": round_, "entry": list(index)}) as span:
            tool = tools.get(name)
            if tool is None:
                raise ToolError(f"there is no tool named {name!r}; the tools are {sorted(tools)}.")
            content = await tool.arun(arguments)
            tracing.set_outputs(span, TextTensor(content, template=False))
        record["result"] = content
    except Exception as e:  # noqa: BLE001 - the model gets the error as the tool's answer
        content = redact(f"Error: {type(e).__name__}: {e}", *secrets) or ""
        record["error"] = content
    return {"role": "tool", "tool_call_id": call.get("id"), "content": content}, record


class LLM(TModule):
    """A chat model as a text module: one request per entry; answers of the input's shape.

    Every keyword besides ``system`` is a chat-completions parameter and is sent as given
    (``temperature``, ``max_tokens``, ``seed``, ``tools``, ``logprobs``, ``n``, ...), except:

    * ``response_format``: a pydantic model class or a JSON schema (bare, or in the API's
      ``{"type": "json_schema", ...}`` form) also parses each answer into ``metadata["parsed"]``
      (a model instance / a dict); an answer that does not parse raises
      :class:`~langtorch.errors.ParseError` (within a :class:`~langtorch.errors.BatchError` when
      other entries succeeded).
    * ``stream=True``: the call returns an iterator of text deltas as they arrive (one entry),
      or of ``(index, delta)`` pairs (several entries).
    * ``use_cache`` / ``progress``: runtime switches (cache reads/writes, the progress bar).
    * ``tools``: functions, :class:`~langtorch.nn.Tool` objects or TModules are *run* (below); a list
      of tool specs (dicts) is sent as given and the model's calls come back in
      ``metadata["tool_calls"]`` (the API's format), unrun.
    * ``max_tool_rounds`` / ``allow_placeholders``: options of this module (below), not sent.

    **The tool-call loop.** The model gets the tools' schemas; when an answer calls tools, the
    calls of that answer (parallel tool calls) and of every other entry run concurrently (sync
    functions in worker threads), each in a ``tool`` trace span, and their results go back as
    tool messages; this repeats until the model answers without calling tools. A tool that
    raises, arguments that do not fit its schema and unknown tool names do not fail the entry:
    ``"Error: <type>: <message>"`` goes back to the model as that call's result, and is recorded
    (``metadata["tool_calls"]``: per entry, every call made as ``{"id", "name", "arguments",
    "round", "result", "error"}``; ``metadata["tool_rounds"]``). After ``max_tool_rounds``
    (default 8) rounds an answer that still calls tools fails its entry with
    :class:`~langtorch.nn.ToolError` (``.messages``: the conversation so far), other entries
    unaffected. Usage of every round is summed on the entry. With ``n > 1`` each sample runs
    its own loop. Tools run again on a rerun even when the cache answers the requests.

    **Unfilled placeholders.** A template input (or system prompt) that still holds a
    placeholder raises :class:`~langtorch.errors.TemplateError` before anything is sent;
    ``allow_placeholders=True`` sends such texts as written.

    Parameters can be overridden per call: ``llm(x, temperature=0)``. The system prompt is a
    :class:`~langtorch.TextParameter` (saved in ``state_dict()``, tunable by text optimizers);
    the backend, and with it the API key, is never part of the state dict.

    Errors: a failed entry raises its typed error when it was the only entry; otherwise a
    :class:`~langtorch.errors.BatchError` whose ``results`` is the output with failed entries
    empty and whose ``errors`` maps entry index tuples to exceptions (``results`` is ``None``
    when every entry failed).

    Args:
        backend: a :class:`~langtorch.backends.Backend` (e.g. ``OpenAIBackend("gpt-4o-mini")``).
        system: system prompt for every entry (per-entry ones: ``metadata["system"]``).
        tools: functions / :class:`~langtorch.nn.Tool` / TModules to run, or tool specs (dicts).
        max_tool_rounds: rounds of tool calls an answer may take (>= 1).
        allow_placeholders: send template texts with unfilled placeholders as written.
        **chat_params: chat-completions parameters.

    Attributes:
        last_call: the :class:`~langtorch.runtime.CallResult` of the latest call (``usage``,
            ``cost``, ``cache_hits``, ``attempts``); session totals are ``backend.usage`` and
            ``backend.cost``.

    Example:
        >>> import langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> with OpenAIServer() as server:
        ...     llm = lt.nn.LLM(OpenAIBackend("m", base_url=server.url, api_key="sk-test1234"),
        ...                     system="Be brief.", temperature=0)
        ...     out = llm(lt.TextTensor([["hi", "yo"]]))
        >>> out.shape, out.tolist(), out.metadata["finish_reason"].tolist()
        ((1, 2), [['Echo: hi', 'Echo: yo']], [['stop', 'stop']])
    """

    # An LLM opens its own "llm" span (with one "request" child per request sent).
    _trace_kind = None

    def __init__(self, backend: Backend, *, system: str | None = None, tools: Any = None,
                 max_tool_rounds: int = DEFAULT_MAX_TOOL_ROUNDS, allow_placeholders: bool = False,
                 **chat_params: Any):
        super().__init__()
        if not isinstance(backend, Backend):
            raise TypeError(
                f"LLM expected a langtorch.backends.Backend (e.g. OpenAIBackend('gpt-4o-mini')), got "
                f"{type(backend).__name__}.")
        self.backend = backend
        if system is not None:
            system = TextParameter(system)
            if system.shape != ():
                raise ValueError(
                    f"LLM expected one system prompt (a str), got shape {system.shape}; for a "
                    "system prompt per entry set the input's metadata['system'] column (or build "
                    "the input with lt.nn.chat(..., system=[...])).")
            self.system = system
        self.chat_params = dict(chat_params)
        executable, specs = _classify_tools(tools)
        if specs is not None:
            self.chat_params["tools"] = specs  # sent as given; calls end up in metadata
        # Tools the module runs (submodules: a TModule tool's text parameters are module state).
        from torch import nn

        self.tools = nn.ModuleList(executable) if executable else ()
        self.max_tool_rounds = _check_rounds(max_tool_rounds)
        self.allow_placeholders = bool(allow_placeholders)
        self.last_call: CallResult | None = None

    def extra_repr(self) -> str:
        # redact: a parameter may hold a token (e.g. a key someone put in extra_body).
        params = ", ".join(f"{k}={redact(repr(v))}" for k, v in self.chat_params.items())
        system = super().extra_repr()
        return ", ".join(p for p in (repr(self.backend), system, params) if p)

    # ------------------------------------------------------------------ requests
    def _split_params(self, overrides: Mapping[str, Any]) -> tuple[dict, dict, Any, bool]:
        return self._split(overrides)[:4]

    def _split(self, overrides: Mapping[str, Any]) -> tuple[dict, dict, Any, bool, dict]:
        """``(request params, runtime switches, parser, stream, module options)`` of a call."""
        overrides = dict(overrides)
        tools = list(self.tools)
        replaced = "tools" in overrides
        if replaced:  # a call's tools replace the module's (tools=[] or None: none)
            tools, specs = _classify_tools(overrides.pop("tools"))
            tools = tools or []
            if specs is not None:
                overrides["tools"] = specs
        params = {**self.chat_params, **overrides}
        if tools or (replaced and "tools" not in overrides):
            params.pop("tools", None)
        options = {
            "tools": {t.name: t for t in tools},
            "max_tool_rounds": _check_rounds(params.pop("max_tool_rounds", self.max_tool_rounds)),
            "allow_placeholders": bool(params.pop("allow_placeholders", self.allow_placeholders)),
        }
        if tools:
            params["tools"] = [t.spec for t in tools]
        runtime = {k: params.pop(k) for k in _RUNTIME_KEYS if k in params}
        stream = bool(params.pop("stream", False))
        fmt, parser = _response_format(params.pop("response_format", None))
        if fmt is not None:
            params["response_format"] = fmt
        return params, runtime, parser, stream, options

    def _requests(self, x: TextTensor, params: Mapping[str, Any], system_param: Any = None,
                  allow_placeholders: bool = False) -> list[dict[str, Any]]:
        return self._build(x, params, system_param, allow_placeholders)[0]

    def _build(self, x: TextTensor, params: Mapping[str, Any], system_param: Any = None,
               allow_placeholders: bool = False) -> tuple[list[dict[str, Any]], list[bool]]:
        """One request per entry, and per entry whether its messages start with a system
        prompt added here (not part of the conversation kept in the answer's metadata)."""
        texts = x.texts.reshape(-1).tolist()
        if x.is_template:
            # Template entries: escapes resolved; a placeholder left unfilled is an error.
            texts = [_prompt_text(t, f"entry {_index(i, x.shape)} of the LLM's input",
                                  allow_placeholders) for i, t in enumerate(texts)]
        histories = _column(x, "messages")
        systems = _column(x, "system")
        default_system = None
        param_systems = None
        if system_param is not None:
            if system_param.ndim == 0:
                default_system = str(system_param)
                if system_param.is_template:
                    default_system = _prompt_text(default_system, "the LLM's system prompt",
                                                  allow_placeholders)
            else:
                # A batch of candidate system prompts (lt.func.functional_call): broadcast them
                # against the entries.
                try:
                    param_systems = np.broadcast_to(system_param.texts, x.shape).reshape(-1).tolist()
                except ValueError:
                    raise ValueError(
                        f"the system prompt has shape {system_param.shape}, which does not "
                        f"broadcast against the input of shape {x.shape}") from None
        requests = []
        added: list[bool] = []
        for i, text in enumerate(texts):
            messages: list[dict[str, Any]] = []
            base = param_systems[i] if param_systems is not None else default_system
            system = str(systems[i]) if systems is not None and systems[i] else base
            added.append(bool(system))
            if system:
                messages.append({"role": "system", "content": system})
            if histories is not None and histories[i]:
                messages.extend(histories[i])
            if text or not messages:
                messages.append({"role": "user", "content": text})
            requests.append({"messages": messages, **params})
        return requests, added

    # ------------------------------------------------------------------ outputs
    def _output(self, x: TextTensor, result: CallResult, n: int | None, parser: Any,
                requests: list[dict[str, Any]] | None = None, added: list[bool] | None = None,
                threads: list[list[_Thread]] | None = None) -> TextTensor:
        k = n or 1
        shape = x.shape + ((n,) if n is not None and n > 1 else ())
        size = len(result.completions) * k
        texts = [""] * size
        cols: dict[str, np.ndarray] = {
            "prompt_tokens": np.zeros(size, np.int64),
            "completion_tokens": np.zeros(size, np.int64),
            "model": np.full(size, "", dtype=object),
            "finish_reason": np.full(size, "", dtype=object),
            "cached": np.zeros(size, bool),
        }
        extra: dict[str, np.ndarray] = {}
        errors = dict(result.errors)
        for i, completion in enumerate(result.completions):
            if completion is None:
                continue
            for j, choice in enumerate(completion.choices[:k]):
                at = i * k + j
                texts[at] = choice.text
                cols["model"][at] = completion.model
                cols["finish_reason"][at] = choice.finish_reason or ""
                cols["cached"][at] = completion.cached
                if j == 0:
                    cols["prompt_tokens"][at] = completion.usage.prompt_tokens
                    cols["completion_tokens"][at] = completion.usage.completion_tokens
                message = choice.message or {}
                if message.get("tool_calls"):
                    extra.setdefault("tool_calls", np.full(size, None, dtype=object))[at] = message["tool_calls"]
                if choice.logprobs is not None:
                    extra.setdefault("logprobs", np.full(size, None, dtype=object))[at] = choice.logprobs
                if parser is not None:
                    column = extra.setdefault("parsed", np.full(size, None, dtype=object))
                    index = tuple(int(v) for v in np.unravel_index(at, shape)) if shape else ()
                    try:
                        column[at] = _parse(choice.text, parser, index)
                    except ParseError as e:
                        errors.setdefault(i, e)
        if threads is not None:
            # The tool loop: every call made (with its result or error), and the rounds taken.
            extra["tool_calls"] = np.full(size, None, dtype=object)
            extra["tool_rounds"] = np.zeros(size, np.int64)
            for i, ths in enumerate(threads):
                for j, th in enumerate(ths[:k]):
                    extra["tool_calls"][i * k + j] = list(th.calls)
                    extra["tool_rounds"][i * k + j] = th.rounds
        if "messages" in x.metadata and requests is not None:
            # A chat entry's answer carries its conversation (system prompt aside), ending with
            # the assistant turn: answer.reply(...) makes the next turn.
            conversations = np.full(size, None, dtype=object)
            for i, completion in enumerate(result.completions):
                if completion is None:
                    continue
                for j, choice in enumerate(completion.choices[:k]):
                    sent = threads[i][j].messages if threads is not None else requests[i]["messages"]
                    sent = sent[1:] if added and added[i] else sent
                    conversations[i * k + j] = [dict(m) for m in sent] + [_assistant_message(choice)]
            extra["messages"] = conversations
            if "system" in x.metadata:
                extra["system"] = np.repeat(x.metadata.column("system").reshape(-1), k)
        metadata = {key: col.astype(str) if key in ("model", "finish_reason") else col
                    for key, col in {**cols, **extra}.items()}
        out = TextTensor(np.array(texts, dtype=object).astype(str).reshape(shape) if shape else texts[0],
                         template=False)
        for key, col in metadata.items():
            out.metadata[key] = col.reshape(shape)
        # Errors keyed by entry index tuples of the input (the request granularity).
        if errors:
            keyed = {(tuple(int(v) for v in np.unravel_index(i, x.shape)) if x.shape else ()): e
                     for i, e in sorted(errors.items())}
            failed = dataclasses.replace(result, errors=dict(sorted(errors.items())))
            try:
                raise_for_errors(failed, results=out)
            except Exception as exc:
                if hasattr(exc, "errors"):
                    exc.errors = keyed
                raise
        return out

    # ------------------------------------------------------------------ calls
    async def acall(self, x: Any, **overrides: Any) -> Any:
        """Asynchronous forward: ``await llm.acall(x)`` on the caller's event loop.

        With ``stream=True`` it returns an async iterator (deltas, or ``(index, delta)`` pairs).

        Example:
            >>> import asyncio, langtorch as lt
            >>> from langtorch.backends import OpenAIBackend
            >>> from langtorch.testing import OpenAIServer
            >>> with OpenAIServer() as server:
            ...     llm = lt.nn.LLM(OpenAIBackend("m", base_url=server.url, api_key="sk-test1234"))
            ...     asyncio.run(llm.acall("hello")).item()
            'Echo: hello'
        """
        tokens = self._enter_scope()  # awaited directly (not through __call__): same call path
        try:
            return await self._acall(x, **overrides)
        finally:
            self._exit_scope(tokens)

    async def _acall(self, x: Any, **overrides: Any) -> Any:
        x = _as_text_tensor(x)
        params, runtime, parser, stream, options = self._split(overrides)
        tools = options["tools"]
        system = self._system_param()
        if system is not None and system.ndim and system.shape != x.shape:
            # Candidate system prompts (lt.func.functional_call): the input broadcasts against
            # them, so [P, 1] systems x [N] inputs give [P, N] answers.
            from langtorch.functional.text import broadcast_shapes
            from langtorch.functional.textops import concat

            shape = broadcast_shapes(system.shape, x.shape)
            x = concat(TextTensor(np.full(shape, "", dtype=object).astype(str), template=False), x)
        requests, added = self._build(x, params, system, options["allow_placeholders"])
        if stream:
            if tools:
                raise ValueError("stream=True cannot run tools (the tool-call loop needs whole "
                                 "answers); call without stream, or pass tool specs (dicts) instead.")
            return self._traced_stream(x, requests, params)
        if parser is not None:
            # Answers that do not parse are reported (ParseError) but never cached: a rerun asks
            # the server again instead of failing forever on the stored answer.
            # In a tool loop, a turn that calls tools is not the answer to parse (it is cached).
            runtime["validate"] = lambda choice: (
                bool(tools and (choice.message or {}).get("tool_calls")) or _parses(choice.text, parser))
        n = params.get("n")
        n = int(n) if n is not None else None
        attrs = self._span_attrs(params, n)
        if tools:
            attrs["tools"] = sorted(tools)
        with tracing.span("llm", "LLM", inputs=[x], attrs=attrs, backend=self.backend) as span:
            result = await acomplete(self.backend, requests, **runtime)
            threads = None
            if tools:
                result, threads = await self._tool_loop(x.shape, requests, result, params, runtime,
                                                        options, n or 1)
            self.last_call = result
            if span is not None:
                span.usage = {"prompt_tokens": result.usage.prompt_tokens,
                              "completion_tokens": result.usage.completion_tokens}
                span.cost, span.cached, span.attempts = result.cost, result.cache_hits, result.attempts
            try:
                out = self._output(x, result, n, parser, requests, added, threads)
            except Exception as e:
                partial = getattr(e, "results", None)
                if isinstance(partial, TextTensor):
                    keys = getattr(e, "errors", {}) or {}
                    failed = {int(np.ravel_multi_index(k, x.shape)) if x.shape else 0
                              for k in keys if isinstance(k, tuple)}
                    self._record(x, partial, n, system, requests, failed)
                    tracing.set_outputs(span, partial)
                raise
            self._record(x, out, n, system, requests)
            tracing.set_outputs(span, out)
            return out

    # ------------------------------------------------------------------ tool-call loop
    async def _tool_loop(self, shape: tuple[int, ...], requests: list[dict[str, Any]],
                         result: CallResult, params: Mapping[str, Any], runtime: Mapping[str, Any],
                         options: Mapping[str, Any], k: int) -> tuple[CallResult, list[list[_Thread]]]:
        """Run the tools the model asks for and send the results back, round after round, for
        every conversation (entry x sample) at once, until each has a final answer."""
        tools, max_rounds = options["tools"], options["max_tool_rounds"]
        threads: list[list[_Thread]] = [[] for _ in requests]
        for i, completion in enumerate(result.completions):
            if completion is None:
                continue
            for j, choice in enumerate(completion.choices[:k]):
                th = _Thread(i, list(requests[i]["messages"]),
                             usage=completion.usage if j == 0 else Usage(), cached=completion.cached)
                _advance(th, choice)
                threads[i].append(th)
        follow = {key: v for key, v in params.items() if key != "n"}  # one answer per conversation
        results = [result]
        rounds = 0
        while True:
            active = [th for ths in threads for th in ths if th.pending is not None]
            if not active:
                break
            rounds += 1
            if rounds > max_rounds:
                for th in active:
                    names = sorted({str((c.get("function") or {}).get("name")) for c in th.pending})
                    th.error = ToolError(
                        f"entry {_index(th.entry, shape)}: the model still asked for tools {names} "
                        f"after max_tool_rounds={max_rounds} rounds of tool calls. Raise "
                        "max_tool_rounds, or make the tools' results conclusive (or ask for a "
                        "final answer in the prompt); the conversation so far is in .messages, the "
                        "calls made in .tool_calls.", messages=list(th.messages), tool_calls=list(th.calls))
                    th.pending = None
                break
            await asyncio.gather(*(self._run_tools(th, tools, rounds, shape) for th in active))
            step = await acomplete(self.backend, [{**follow, "messages": list(th.messages)} for th in active],
                                   entries=[th.entry for th in active], **runtime)
            results.append(step)
            for a, (th, completion) in enumerate(zip(active, step.completions)):
                if completion is None:
                    th.error = step.errors[a]
                    continue
                th.usage = th.usage + completion.usage
                th.cached = th.cached and completion.cached
                _advance(th, completion.choices[0])
        completions: list[Completion | None] = []
        errors = dict(result.errors)
        for i, ths in enumerate(threads):
            first = result.completions[i]
            failure = next((th.error for th in ths if th.error is not None), None)
            if first is None or failure is not None:
                completions.append(None)
                if failure is not None:
                    errors[i] = failure
                continue
            usage = sum((th.usage for th in ths), Usage())
            completions.append(Completion(tuple(th.final for th in ths), usage, first.model,
                                          cached=all(th.cached for th in ths)))
        merged = CallResult(
            completions, dict(sorted(errors.items())), sum((r.usage for r in results), Usage()),
            sum(r.cost for r in results), sum(r.cache_hits for r in results),
            sum(r.sent for r in results), sum(r.attempts for r in results))
        return merged, threads

    async def _run_tools(self, th: _Thread, tools: Mapping[str, Tool], round_: int,
                         shape: tuple[int, ...]) -> None:
        """One round of a conversation's tool calls, concurrently; results appended in order."""
        calls, th.pending = th.pending or [], None
        index = _index(th.entry, shape)
        secrets = self.backend._secrets() if hasattr(self.backend, "_secrets") else ()
        done = await asyncio.gather(*(_run_call(call, tools, round_, index, secrets) for call in calls))
        for message, record in done:
            th.messages.append(message)
            th.calls.append(record)
        th.rounds = round_

    def _system_param(self) -> TextTensor | None:
        if "system" not in self._text_parameters or self.system is None:
            return None
        return self.system

    def _span_attrs(self, params: Mapping[str, Any], n: int | None) -> dict[str, Any]:
        return {"model": str(params.get("model") or self.backend.model),
                "backend": redact(repr(self.backend)),
                "params": {k: redact(repr(v)) if not isinstance(v, (int, float, bool)) else v
                           for k, v in params.items()},
                **({"n": n} if n is not None else {})}

    def _record(self, x: TextTensor, out: TextTensor, n: int | None, system: Any,
                requests: list[dict[str, Any]], failed: set[int] | None = None) -> None:
        """The provenance node of this call: output entries <- input entry (and the system
        prompt, for the entries that used it: a per-entry ``metadata["system"]`` overrides it).
        ``failed``: flat input entries whose request failed (backward skips them)."""
        src = np.arange(x.size if x.ndim else 1, dtype=np.int64).reshape(x.shape)
        if n is not None and n > 1:
            src = np.broadcast_to(src[..., None], out.shape)
        inputs = [(x, src[..., None], "input")]
        if isinstance(system, TextTensor):
            sys_index = np.array(np.broadcast_to(
                np.arange(system.size if system.ndim else 1, dtype=np.int64).reshape(system.shape),
                x.shape))
            own = _column(x, "system")
            if own is not None:
                overridden = np.array([bool(s) for s in own], dtype=bool).reshape(x.shape)
                sys_index = np.where(overridden, -1, sys_index)
            if n is not None and n > 1:
                sys_index = np.broadcast_to(sys_index[..., None], out.shape)
            inputs.append((system, np.asarray(sys_index)[..., None], "system"))
        record_node(LLM_CALL, out, inputs, attrs={
            "model": self.backend.model, "requests": requests, "n": n or 1,
            "module": _context.path_string(), "failed": frozenset(failed or ())})

    def forward(self, x: Any, **overrides: Any) -> Any:
        """Answer every entry of ``x`` (see the class docstring); blocks until all are done.

        Works in a thread with a running event loop too (Jupyter): the requests run on
        langtorch's private loop in a worker thread.
        """
        x = _as_text_tensor(x)
        if overrides.get("stream", self.chat_params.get("stream", False)):
            return _sync_iter(run_sync(self.acall(x, **overrides)))
        return run_sync(self.acall(x, **overrides))

    async def _traced_stream(self, x: TextTensor, requests: list[dict[str, Any]],
                             params: Mapping[str, Any]) -> AsyncIterator[Any]:
        """The stream, inside an ``llm`` span whose output is the concatenated answers.

        Each step of a synchronous iteration runs as its own task, so the span is opened by hand
        and made current only around each step (a context token cannot outlive its task)."""
        tr = _context.active_trace.get()
        span = None
        if tr is not None:
            tr.add_secrets(self.backend)
            span = tr.open_span("llm", "LLM", inputs=[x],
                                attrs={**self._span_attrs(params, None), "stream": True})
        pieces: dict[Any, list[str]] = {}
        first = tuple(int(v) for v in np.unravel_index(0, x.shape)) if x.shape else ()
        agen = self._astream(x, requests)
        error: BaseException | None = None
        try:
            while True:
                token = _context.current_span.set(span) if span is not None else None
                try:
                    item = await agen.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    if token is not None:
                        _context.current_span.reset(token)
                key, delta = item if isinstance(item, tuple) else (first, item)
                pieces.setdefault(key, []).append(delta)
                yield item
        except BaseException as e:
            error = e
            raise
        finally:
            await agen.aclose()
            if span is not None:
                texts = ["".join(pieces.get(tuple(int(v) for v in np.unravel_index(i, x.shape)) if x.shape else (), []))
                         for i in range(len(requests))]
                tr.close_span(span, outputs=[TextTensor(texts if x.shape else texts[0], template=False)],
                              error=error)

    async def _astream(self, x: TextTensor, requests: list[dict[str, Any]]) -> AsyncIterator[Any]:
        if len(requests) == 1:
            async for delta in astream(self.backend, requests[0]):
                if delta:
                    yield delta
            return
        import asyncio

        queue: asyncio.Queue = asyncio.Queue()
        indices = [tuple(int(v) for v in np.unravel_index(i, x.shape)) for i in range(len(requests))]

        async def pump(index: tuple[int, ...], request: dict[str, Any]) -> None:
            try:
                async for delta in astream(self.backend, request):
                    if delta:
                        await queue.put((index, delta))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                await queue.put((index, e))
            finally:
                await queue.put((index, None))

        tasks = [asyncio.ensure_future(pump(i, r)) for i, r in zip(indices, requests)]
        try:
            remaining = len(tasks)
            while remaining:
                index, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            for t in tasks:
                t.cancel()


def _sync_iter(agen: AsyncIterator[Any]) -> Iterator[Any]:
    """Drive an async iterator that lives on the runtime loop from synchronous code."""
    try:
        while True:
            try:
                item = run_sync(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        # A consumer that stops early (break, an exception) must not leave the stream's tasks
        # and connections pending on the runtime loop.
        run_sync(agen.aclose())


class Embed(TModule):
    """Embeddings as a text module: ``Embed(backend)(x)`` returns ``x`` with ``.embedding`` set.

    Inputs are sent many per request (``backend.options.embed_batch_size``), distinct texts
    only, concurrently under the backend's limits and retries. ``backend=None`` uses the local
    default embedding model (all-MiniLM-L6-v2 through ``langtorch.models``), with no network.

    Args:
        backend: a :class:`~langtorch.backends.Backend` with an embeddings endpoint, or ``None``.
        **params: extra embeddings parameters (``dimensions``, ...).

    Example:
        >>> import langtorch as lt
        >>> from langtorch.backends import OpenAIBackend
        >>> from langtorch.testing import OpenAIServer
        >>> with OpenAIServer(embedding_dim=4) as server:
        ...     embed = lt.nn.Embed(OpenAIBackend("e", base_url=server.url, api_key="sk-test1234"))
        ...     embed(lt.TextTensor([["a", "b", "c"]])).embedding.shape
        (1, 3, 4)
    """

    _trace_kind = None  # opens its own "embed" span

    def __init__(self, backend: Backend | None = None, **params: Any):
        super().__init__()
        if backend is not None and not isinstance(backend, Backend):
            raise TypeError(f"Embed expected a langtorch.backends.Backend or None, got {type(backend).__name__}.")
        self.backend = backend
        self.params = dict(params)
        self.last_usage = None

    async def acall(self, x: Any) -> TextTensor:
        """Asynchronous forward."""
        x = _as_text_tensor(x)
        if self.backend is None:
            return self._local(x)
        tokens = self._enter_scope()
        try:
            return await self._aembed(x)
        finally:
            self._exit_scope(tokens)

    async def _aembed(self, x: TextTensor) -> TextTensor:
        model = str(self.params.get("model") or self.backend.model)
        with tracing.span("embed", "Embed", inputs=[x], attrs={"model": model}, backend=self.backend) as span:
            vectors, usage = await aembed(self.backend, x.texts.reshape(-1).tolist(), **self.params)
            self.last_usage = usage
            if span is not None:
                span.usage = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": 0}
                span.attrs["dimensions"] = int(vectors.shape[-1])
            out = x.with_embedding(vectors.reshape(x.shape + vectors.shape[-1:]))
            tracing.set_outputs(span, out, metadata=False)
            return out

    def _local(self, x: TextTensor) -> TextTensor:
        with tracing.span("embed", "Embed", inputs=[x], attrs={"model": "all-MiniLM-L6-v2 (local)"}) as span:
            out = x.embed() if hasattr(x, "embed") else TextTensor(x).embed()
            if span is not None:
                span.attrs["dimensions"] = int(out.embedding.shape[-1])
            tracing.set_outputs(span, out, metadata=False)
            return out

    def forward(self, x: Any) -> TextTensor:
        """Embed every entry of ``x``; returns ``x`` with ``.embedding`` of shape ``shape + (d,)``."""
        x = _as_text_tensor(x)
        if self.backend is None:
            return self._local(x)
        return run_sync(self.acall(x))

