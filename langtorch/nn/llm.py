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

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from langtorch import tracing
from langtorch.autograd import LLM_CALL, Answer, as_feedback_engine, record_node
from langtorch.backends.base import Backend, Capabilities
from langtorch.core import context as _context
from langtorch.core.redact import redact
from langtorch.nn._answers import build_output
from langtorch.nn._requests import (
    _column,
    _parses,
    _response_format,
    as_text_tensor,
    build_requests,
    check_capabilities,
)
from langtorch.nn._streaming import astream_entries, sync_iter
from langtorch.nn._tool_loop import _check_rounds, _classify_tools, tool_loop
from langtorch.nn.embed import Embed
from langtorch.nn.modules import TModule
from langtorch.runtime import CallResult, acomplete, raise_for_errors, run_sync
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

    **As a critic.** An LLM is a :class:`~langtorch.autograd.FeedbackEngine`
    (:meth:`afeedback`): ``loss.backward(feedback_engine=llm)``, ``lt.optim.TGD(params, llm)`` and
    ``lt.optim.Search(..., proposer=llm)`` ask it for feedback and new values.

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
        # Tools, response_format, logprobs or n > 1 on a backend that declares it lacks them fail
        # here, not at the first request of a long run.
        check_capabilities(backend, self._split({})[0], "lt.nn.LLM")

    @property
    def capabilities(self) -> Capabilities:
        """The backend's declared :class:`~langtorch.backends.Capabilities` (what TGD, Search
        and the tool loop check before they send anything).

        Example:
            >>> import langtorch as lt
            >>> from langtorch.backends import OpenAIBackend
            >>> lt.nn.LLM(OpenAIBackend("m", api_key="sk-test1234")).capabilities.tools
            True
        """
        return self.backend.capabilities

    def extra_repr(self) -> str:
        # redact: a parameter may hold a token (e.g. a key someone put in extra_body).
        params = ", ".join(f"{k}={redact(repr(v))}" for k, v in self.chat_params.items())
        system = super().extra_repr()
        return ", ".join(p for p in (repr(self.backend), system, params) if p)

    # ------------------------------------------------------------------ requests
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

    # ------------------------------------------------------------------ feedback engine
    async def afeedback(self, prompts: Sequence[Sequence[Mapping[str, Any]]], *,
                        response_format: Mapping[str, Any] | None = None, token_room: int | None = None,
                        validate: Callable[[str], bool] | None = None,
                        raise_errors: bool = True) -> list[Answer]:
        """This LLM as a :class:`~langtorch.autograd.FeedbackEngine`, the critic of
        ``loss.backward()`` and of TGD / Search: one :class:`~langtorch.autograd.Answer` per
        prompt (a list of chat messages), all sent at once through the runtime.

        The module's sampling parameters are used (``temperature`` 0 and ``max_tokens`` 400
        unless it sets them) and its runtime switches (``use_cache``, ``progress``); its
        ``n``, ``stream``, ``response_format``, tools and system prompt are not: a prompt is
        sent as given. See :class:`~langtorch.autograd.FeedbackEngine` for the options.

        Example:
            >>> import asyncio, langtorch as lt
            >>> from langtorch.backends import OpenAIBackend
            >>> from langtorch.testing import OpenAIServer
            >>> with OpenAIServer() as server:
            ...     llm = lt.nn.LLM(OpenAIBackend("m", base_url=server.url, api_key="sk-test1234"))
            ...     asyncio.run(llm.afeedback([[{"role": "user", "content": "hi"}]]))[0].text
            'Echo: hi'
        """
        params, runtime, _, _, _ = self._split({})
        for key in ("n", "stream", "response_format", "tools", "tool_choice", "parallel_tool_calls"):
            params.pop(key, None)
        params = {"temperature": 0, "max_tokens": 400, **params}
        if token_room is not None:
            params["max_tokens"] = max(params.get("max_tokens") or 0, int(token_room))
        if response_format is not None:
            params["response_format"] = dict(response_format)
        check_capabilities(self.backend, params, "lt.nn.LLM.afeedback")
        if validate is not None:
            runtime["validate"] = lambda choice: validate(choice.text)
        requests = [{**params, "messages": [dict(m) for m in prompt]} for prompt in prompts]
        result = await acomplete(self.backend, requests, **runtime)
        if raise_errors:
            raise_for_errors(result)
        answers = []
        for i, completion in enumerate(result.completions):
            if completion is None:
                answers.append(Answer(error=result.errors.get(i)))
            else:
                choice = completion.choices[0]
                answers.append(Answer(choice.text.strip(), choice.finish_reason))
        return answers

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
        x = as_text_tensor(x)
        params, runtime, parser, stream, options = self._split(overrides)
        check_capabilities(self.backend, params, "lt.nn.LLM")
        tools = options["tools"]
        system = self._system_param()
        if system is not None and system.ndim and system.shape != x.shape:
            # Candidate system prompts (lt.func.functional_call): the input broadcasts against
            # them, so [P, 1] systems x [N] inputs give [P, N] answers.
            from langtorch.functional.text import broadcast_shapes
            from langtorch.functional.textops import concat

            shape = broadcast_shapes(system.shape, x.shape)
            x = concat(TextTensor(np.full(shape, "", dtype=object).astype(str), template=False), x)
        requests, added = build_requests(x, params, system, options["allow_placeholders"])
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
                result, threads = await tool_loop(self.backend, x.shape, requests, result, params,
                                                  runtime, options, n or 1)
            self.last_call = result
            if span is not None:
                span.usage = {"prompt_tokens": result.usage.prompt_tokens,
                              "completion_tokens": result.usage.completion_tokens}
                span.cost, span.cached, span.attempts = result.cost, result.cache_hits, result.attempts
            try:
                out = build_output(x, result, n, parser, requests, added, threads)
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
        x = as_text_tensor(x)
        if overrides.get("stream", self.chat_params.get("stream", False)):
            return sync_iter(run_sync(self.acall(x, **overrides)))
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

    def _astream(self, x: TextTensor, requests: list[dict[str, Any]]) -> AsyncIterator[Any]:
        return astream_entries(self.backend, x, requests)


# A Backend is a feedback engine through an LLM module over it (default sampling parameters).
as_feedback_engine.register(Backend)(lambda backend: LLM(backend))
