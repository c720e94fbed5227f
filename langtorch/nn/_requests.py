"""Request building of :class:`~langtorch.nn.LLM`: entries -> chat-completions requests.

An entry's request is ``[system] + metadata["messages"] + [{"role": "user", "content": text}]``;
template entries are sent with their escapes resolved (an unfilled placeholder is an error);
``response_format`` given as a pydantic model or a JSON schema becomes the API's form plus a
parser for the answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from langtorch.errors import ParseError, TemplateError
from langtorch.functional.template import parse_template
from langtorch.tensor import TextTensor


def as_text_tensor(x: Any) -> TextTensor:
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


def build_requests(x: TextTensor, params: Mapping[str, Any], system_param: Any = None,
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
