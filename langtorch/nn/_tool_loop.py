"""The tool-call loop of :class:`~langtorch.nn.LLM`: run the tools a model asks for, send the
results back, round after round, for every conversation (entry x sample) at once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from langtorch import tracing
from langtorch.backends.base import Backend, Choice, Completion, Usage
from langtorch.core.redact import redact, secrets_of
from langtorch.nn._requests import _index
from langtorch.nn.tools import Tool, ToolError, as_tool
from langtorch.runtime import CallResult, acomplete
from langtorch.tensor import TextTensor


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


async def tool_loop(backend: Backend, shape: tuple[int, ...], requests: list[dict[str, Any]],
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
        await asyncio.gather(*(run_tools(backend, th, tools, rounds, shape) for th in active))
        step = await acomplete(backend, [{**follow, "messages": list(th.messages)} for th in active],
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


async def run_tools(backend: Backend, th: _Thread, tools: Mapping[str, Tool], round_: int,
                    shape: tuple[int, ...]) -> None:
    """One round of a conversation's tool calls, concurrently; results appended in order."""
    calls, th.pending = th.pending or [], None
    index = _index(th.entry, shape)
    secrets = secrets_of(backend)
    done = await asyncio.gather(*(_run_call(call, tools, round_, index, secrets) for call in calls))
    for message, record in done:
        th.messages.append(message)
        th.calls.append(record)
    th.rounds = round_
