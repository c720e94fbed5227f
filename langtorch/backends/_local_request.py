"""How :meth:`LocalBackend.prepare <langtorch.backends.LocalBackend.prepare>` reads a request:
the keys it accepts, the tools and their constraint, the prompt text and its tokens, and the
structured-output constraint. Each reader raises :class:`~langtorch.errors.BadRequestError` naming
the parameter at fault (messages prefixed ``LocalBackend:``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langtorch.errors import BadRequestError
from langtorch.functional.constrain import constraint_from_request, tool_call_constraint
from langtorch.functional.request import fold_tool_turns, normalize_messages

# Keys a local model can ignore without changing the answer's meaning (or that are read below).
IGNORED = {"model", "messages", "n", "max_tokens", "max_completion_tokens", "temperature",
           "top_p", "seed", "stop", "stream", "stream_options", "user", "metadata", "store",
           "parallel_tool_calls", "service_tier", "prompt_cache_key", "safety_identifier",
           "adapter", "frequency_penalty", "presence_penalty", "repetition_penalty",
           "logit_bias", "logprobs", "top_logprobs", "top_k", "min_p", "response_format",
           "guided_regex", "guided_choice", "guided_json", "prompt"}
MAX_N = 128


def bad(param: str, message: str, code: str | None = None) -> BadRequestError:
    """A :class:`BadRequestError` naming ``param``, its message prefixed ``LocalBackend:``."""
    return BadRequestError(f"LocalBackend: {message}", param=param, code=code)


def checked(fn: Any, *args: Any, **kw: Any) -> Any:
    """Call a request reader, prefixing its BadRequestError's message with ``LocalBackend:``."""
    try:
        return fn(*args, **kw)
    except BadRequestError as exc:
        raise bad(exc.param, str(exc)) from None


def check_keys(request: Mapping[str, Any]) -> None:
    """Refuse a request key the local model cannot honour (naming it and what is supported)."""
    for key, value in request.items():
        if key in IGNORED or key in ("tools", "tool_choice"):
            continue
        if key == "functions" and not value:
            continue
        raise bad(key, f"the request parameter {key}={value!r} is not supported by the local "
                       "model (supported: messages, n, max_tokens, temperature, top_p, seed, "
                       "stop, frequency_penalty, presence_penalty, repetition_penalty, "
                       "logit_bias, logprobs, top_logprobs, top_k, min_p, response_format, "
                       "guided_regex, guided_choice, guided_json, tools, tool_choice, adapter). "
                       "Remove it "
                       "or use an OpenAI-compatible backend.")


def tools_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system message that offers ``tools`` to a chat template without a tools section."""
    lines = ["You can call these tools. To call one, answer with only a JSON object "
             '{"name": <tool name>, "arguments": {...}}.']
    for t in tools:
        fn = t.get("function", t)
        lines.append(json.dumps({"name": fn.get("name"), "description": fn.get("description", ""),
                                 "parameters": fn.get("parameters", {})}))
    return "\n".join(lines)


def chat_template(llm: Any) -> Any:
    """The model's (or its tokenizer's) chat template object, or ``None``."""
    for owner in (llm, getattr(llm, "tokenizer", None)):
        t = getattr(owner, "chat_template", None)
        if t is not None and hasattr(t, "render") and hasattr(t, "source"):
            return t
    return None


def constraint_param(request: Mapping[str, Any]) -> str:
    """The request parameter that asked for structured output (for an error to name)."""
    for key in ("response_format", "guided_json", "guided_regex", "guided_choice"):
        if request.get(key) is not None:
            return key
    return "response_format"


def read_tools(request: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(tools, tool_choice)`` of a request, their shapes checked (``tools`` ``None`` when
    absent or empty)."""
    tools = request.get("tools") or None
    tool_choice = request.get("tool_choice")
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise bad("tools", f"expected `tools` as a list of function tools, got "
                           f"{type(tools).__name__}.")
    if tool_choice not in (None, "none", "auto", "required") and not (
            isinstance(tool_choice, Mapping) and tools):
        raise bad("tool_choice", f"expected 'none', 'auto', 'required' or {{'type': "
                                 f"'function', 'function': {{'name': ...}}}} (with "
                                 f"tools), got {tool_choice!r}.")
    return tools, tool_choice


def read_messages(request: Mapping[str, Any]) -> tuple[Any, str | None, list]:
    """``(raw_messages, raw_prompt, messages)``: a chat request's messages (normalised, tool
    turns folded), or a raw completion ``prompt`` (then ``messages`` is ``[]``)."""
    raw_messages = request.get("messages")
    raw_prompt = request.get("prompt") if raw_messages is None else None
    if raw_prompt is not None and not isinstance(raw_prompt, str):
        raise bad("prompt", f"expected `prompt` as a string (a raw completion prompt), got "
                            f"{type(raw_prompt).__name__}.")
    messages = [] if raw_prompt is not None else checked(
        normalize_messages, fold_tool_turns(raw_messages))
    return raw_messages, raw_prompt, messages


def tool_plan(tools: Any, tool_choice: Any, raw_messages: Any) -> tuple[Any, bool]:
    """``(tool_constraint, calling)``: the constraint a tool call is decoded under (``None``
    without tools or with ``tool_choice="none"``), and whether this turn calls a tool."""
    tool_constraint = None
    calling = False
    if tools is not None and tool_choice != "none":
        # Every tool's schema is checked (400 naming tools[i]) whether or not we call now.
        tool_constraint = checked(tool_call_constraint, tools,
                                  tool_choice if isinstance(tool_choice, Mapping)
                                  else "required")
        last = raw_messages[-1] if isinstance(raw_messages, (list, tuple)) and \
            raw_messages else {}
        # "auto": call a tool unless the last turn is a tool's result (then answer in text):
        # a small model cannot be trusted to choose, and the loop must end.
        calling = tool_choice not in (None, "auto") or not (
            isinstance(last, Mapping) and last.get("role") == "tool")
    return tool_constraint, calling


def prompt_ids(llm: Any, messages: list, raw_prompt: str | None, tools: Any) -> list:
    """The prompt's token ids: a raw prompt as it is, else the messages through the chat template
    (with the tools, in the template or as a system message)."""
    template = chat_template(llm)
    try:
        if raw_prompt is not None:  # a raw completion: the text as it is, no template
            text = raw_prompt
        elif tools is not None and template is not None and "tools" in template.source:
            text = template.render(messages, add_generation_prompt=True, tools=list(tools))
        elif tools is not None:
            sys_msg = {"role": "system", "content": tools_prompt(tools)}
            if messages and messages[0]["role"] == "system":
                merged = [{"role": "system", "content": messages[0]["content"] + "\n\n"
                           + sys_msg["content"]}] + messages[1:]
            else:
                merged = [sys_msg] + messages
            text = llm.apply_chat_template(merged)
        else:
            text = llm.apply_chat_template(messages)
        return list(llm.encode(text))
    except Exception as exc:  # noqa: BLE001 - a template/tokenizer failure is this request's
        raise bad("messages", f"could not render the messages with the chat template: "
                              f"{type(exc).__name__}: {exc}") from None


def output_constraint(request: Mapping[str, Any], calling: bool, tool_constraint: Any,
                      backend: Any) -> tuple[Any, Any]:
    """``(constraint, compiler)``: the request's structured-output constraint (the tool call's
    when ``calling``), compiled once now so a bad grammar is a 400, with ``backend``'s grammar
    compiler (``(None, None)`` when unconstrained)."""
    constraint = checked(
        constraint_from_request, request.get("response_format"),
        guided_regex=request.get("guided_regex"), guided_choice=request.get("guided_choice"),
        guided_json=request.get("guided_json"))
    if calling:
        constraint = tool_constraint
    compiler = None
    if constraint is not None:
        compiler = backend.grammar_compiler
        if compiler is None:
            raise bad(constraint_param(request), "this model's tokenizer cannot be read "
                                                 "for constrained decoding.")
        checked(compiler.matcher, constraint)  # a grammar that does not compile: 400 now
    return constraint, compiler
