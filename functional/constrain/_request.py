"""OpenAI request fields -> a :class:`Constraint` (a tokenizer-independent llguidance grammar)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from langtorch.functional.errors import BadRequestError

__all__ = ["Constraint", "constraint_from_request", "tool_call_constraint"]

# Readable, bounded JSON: ", " and ": " like json.dumps (what small models tend to write anyway)
# and no free whitespace, so a random or looping model cannot spend its budget on blank lines.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# Keywords whose values are subschemas (a mapping of them, a list of them, or one).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
               "propertyNames", "unevaluatedProperties", "unevaluatedItems",
               "additionalItems")


@dataclasses.dataclass(frozen=True)
class Constraint:
    """A decoding constraint: an llguidance grammar (JSON text), valid for any tokenizer.

    Attributes:
        kind: ``"json_object"``, ``"json_schema"``, ``"regex"``, ``"choice"`` or ``"tool_call"``.
        grammar: the serialized llguidance grammar.
        schema: the JSON schema the output validates against (json kinds), else None.
        key: a digest of ``grammar``; with the tokenizer's name it keys the compiled-grammar cache.

    Example:
        >>> from langtorch.functional.constrain import constraint_from_request
        >>> c = constraint_from_request(guided_choice=["yes", "no"])
        >>> c.kind, len(c.key)
        ('choice', 24)
    """

    kind: str
    grammar: str
    schema: Any = None
    key: str = ""

    def __post_init__(self):
        if not self.key:
            object.__setattr__(self, "key",
                               hashlib.sha256(self.grammar.encode()).hexdigest()[:24])


def _llg():
    try:
        import llguidance
    except ImportError as exc:  # pragma: no cover - llguidance is a core dependency
        raise ImportError("structured outputs need llguidance: pip install llguidance") from exc
    return llguidance


def _errors(grammar: str) -> str | None:
    is_error, messages = _llg().LLMatcher.validate_grammar_with_warnings(grammar, None)
    return messages[0].strip() if is_error else None


def _json_grammar(schema: Any) -> str:
    return _llg().LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)


def _children(schema: Any, path: str) -> Iterator[tuple[str, Any]]:
    if not isinstance(schema, Mapping):
        return
    for key in _SCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            for name, s in sub.items():
                yield f"{path}.{key}.{name}", s
    for key in _SCHEMA_LISTS:
        sub = schema.get(key)
        if isinstance(sub, list):
            for i, s in enumerate(sub):
                yield f"{path}.{key}[{i}]", s
    for key in _SCHEMA_ONE:
        sub = schema.get(key)
        if isinstance(sub, Mapping):
            yield f"{path}.{key}", sub
        elif key == "items" and isinstance(sub, list):  # draft-4 tuple form
            for i, s in enumerate(sub):
                yield f"{path}.items[{i}]", s


def _failing_path(schema: Any, root: Mapping, path: str) -> str:
    """The deepest subschema path that fails to compile on its own (with the root's $defs, so
    references still resolve); ``path`` itself when no child fails alone."""
    defs = {k: root[k] for k in ("$defs", "definitions") if k in root}
    for child_path, child in _children(schema, path):
        if isinstance(child, Mapping):
            probe = {**defs, **child}
        elif isinstance(child, bool):
            probe = child
        else:
            return child_path  # a subschema must be an object or a boolean
        if _errors(_json_grammar(probe)) is not None:
            return _failing_path(child, root, child_path)
    return path


def _schema_constraint(schema: Any, kind: str, param: str) -> Constraint:
    if not isinstance(schema, (Mapping, bool)):
        raise BadRequestError(
            f"{param}: expected a JSON schema (an object), got {type(schema).__name__}; pass e.g. "
            f'{{"type": "object", "properties": {{...}}}}.', param=param)
    grammar = _json_grammar(schema)
    err = _errors(grammar)
    if err is not None:
        path = _failing_path(schema, schema if isinstance(schema, Mapping) else {}, "$")
        raise BadRequestError(
            f"{param}: the JSON schema at {path} is invalid or unsupported by the grammar engine "
            f"({err}); fix that part of the schema.", param=param)
    return Constraint(kind, grammar, schema)


def _regex_constraint(regex: Any, kind: str, param: str) -> Constraint:
    if not isinstance(regex, str):
        raise BadRequestError(f"{param}: expected a regular expression string, got "
                              f"{type(regex).__name__}.", param=param)
    grammar = _llg().LLMatcher.grammar_from_regex(regex)
    err = _errors(grammar)
    if err is not None:
        raise BadRequestError(f"{param}: the regular expression {regex!r} does not compile: "
                              f"{err}", param=param)
    return Constraint(kind, grammar)


def constraint_from_request(response_format: Mapping[str, Any] | None = None, *,
                            guided_regex: str | None = None,
                            guided_choice: Sequence[str] | None = None,
                            guided_json: Any = None) -> Constraint | None:
    """The decoding constraint an OpenAI-style request asks for, or None for free text.

    Request fields (at most one may constrain the output):

    * ``response_format={"type": "json_object"}`` — any JSON object.
    * ``response_format={"type": "json_schema", "json_schema": {"name": ..., "schema": {...},
      "strict": true}}`` — JSON valid against ``schema`` (``strict`` is accepted and always
      honoured: the output is always valid unless the token budget runs out).
    * ``response_format={"type": "text"}`` — no constraint.
    * ``guided_regex="..."`` — text matching the regular expression (whole output).
    * ``guided_choice=["positive", "negative"]`` — exactly one of the strings.
    * ``guided_json={...}`` — like ``json_schema`` (vLLM's spelling).

    The ``guided_*`` names are vLLM's extra request fields (with the ``openai`` client: pass them
    in ``extra_body``), so a client written for vLLM works unchanged.

    Raises:
        BadRequestError: an invalid or unsupported schema (the message names the schema path,
            e.g. ``$.properties.age``), a regex that does not compile, an empty choice list, or
            two constraints in one request; ``param`` names the request field.

    Example:
        >>> from langtorch.functional.constrain import constraint_from_request
        >>> constraint_from_request({"type": "json_object"}).kind
        'json_object'
        >>> constraint_from_request({"type": "text"}) is None
        True
        >>> constraint_from_request({"type": "json_schema", "json_schema": {
        ...     "schema": {"type": "object", "properties": {"n": {"type": "intger"}}}}})
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.BadRequestError: response_format: the JSON schema at $.properties.n is invalid or unsupported by the grammar engine (Invalid type: intger); fix that part of the schema.
    """
    given = [name for name, v in (("response_format", response_format),
                                  ("guided_regex", guided_regex),
                                  ("guided_choice", guided_choice),
                                  ("guided_json", guided_json)) if v is not None]
    if response_format is not None and not isinstance(response_format, Mapping):
        raise BadRequestError(f"response_format: expected an object with a 'type', got "
                              f"{type(response_format).__name__}.", param="response_format")
    if response_format is not None and response_format.get("type") == "text":
        given.remove("response_format")
        response_format = None
    if len(given) > 1:
        raise BadRequestError(f"expected at most one output constraint, got {given}; choose one.",
                              param=given[1])
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "json_object":
            return Constraint("json_object", _json_grammar({"type": "object"}),
                              {"type": "object"})
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, Mapping) or "schema" not in spec:
                raise BadRequestError(
                    "response_format: expected {'type': 'json_schema', 'json_schema': {'name': "
                    "..., 'schema': {...}}}, got no 'json_schema.schema'.",
                    param="response_format")
            return _schema_constraint(spec["schema"], "json_schema", "response_format")
        raise BadRequestError(f"response_format: expected type 'text', 'json_object' or "
                              f"'json_schema', got {kind!r}.", param="response_format")
    if guided_json is not None:
        if isinstance(guided_json, str):
            try:
                guided_json = json.loads(guided_json)
            except ValueError as exc:
                raise BadRequestError(f"guided_json: expected a JSON schema, got text that is "
                                      f"not JSON ({exc}).", param="guided_json") from None
        return _schema_constraint(guided_json, "json_schema", "guided_json")
    if guided_regex is not None:
        return _regex_constraint(guided_regex, "regex", "guided_regex")
    if guided_choice is not None:
        if isinstance(guided_choice, str) or not guided_choice or not all(
                isinstance(c, str) and c for c in guided_choice):
            raise BadRequestError(f"guided_choice: expected a non-empty list of non-empty "
                                  f"strings, got {guided_choice!r}.", param="guided_choice")
        regex = "(" + "|".join(re.escape(c) for c in guided_choice) + ")"
        return _regex_constraint(regex, "choice", "guided_choice")
    return None


def tool_call_constraint(tools: Sequence[Mapping[str, Any]],
                         tool_choice: Any = "required") -> Constraint:
    """A constraint for one tool call ``{"name": ..., "arguments": {...}}`` over ``tools``.

    For models whose chat template has no tool-call format: the output is a JSON object whose
    ``name`` is one of the tools' names (or the one ``tool_choice`` forces) and whose
    ``arguments`` validate against that tool's ``parameters``.

    Raises:
        BadRequestError: no tools, a tool without a name, parameters that are not an object
            schema (``param`` is ``tools``; the message names ``tools[i].function.parameters``),
            or a ``tool_choice`` naming an unknown tool.

    Example:
        >>> from langtorch.functional.constrain import tool_call_constraint
        >>> tools = [{"type": "function", "function": {"name": "add", "parameters": {
        ...     "type": "object", "properties": {"a": {"type": "integer"}}}}}]
        >>> tool_call_constraint(tools).schema["anyOf"][0]["properties"]["name"]
        {'const': 'add'}
        >>> tool_call_constraint([{"type": "function", "function": {"name": "f",
        ...                        "parameters": {"type": "array"}}}])
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.BadRequestError: tools[0].function.parameters: expected an object schema ({"type": "object", ...}), got type 'array'; a tool's arguments are a JSON object.
    """
    if not tools:
        raise BadRequestError("tools: expected at least one tool, got none.", param="tools")
    forced = None
    if isinstance(tool_choice, Mapping):
        forced = (tool_choice.get("function") or {}).get("name")
    elif tool_choice not in ("auto", "required", None):
        raise BadRequestError(f"tool_choice: expected 'auto', 'required' or "
                              f"{{'type': 'function', 'function': {{'name': ...}}}}, got "
                              f"{tool_choice!r}.", param="tool_choice")
    options, names, defs = [], [], {}
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str) or not name:
            raise BadRequestError(f"tools[{i}].function.name: expected a non-empty string, got "
                                  f"{name!r}.", param="tools")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, Mapping) or params.get("type", "object") != "object":
            got = (f"type {params.get('type')!r}" if isinstance(params, Mapping)
                   else type(params).__name__)
            raise BadRequestError(f"tools[{i}].function.parameters: expected an object schema "
                                  f'({{"type": "object", ...}}), got {got}; a tool\'s arguments '
                                  f"are a JSON object.", param="tools")
        names.append(name)
        params = dict(params)
        # Hoist the tool's own definitions to the root (renamed per tool), so that its
        # "#/$defs/X" references still resolve once the schema sits under "arguments".
        local = {**params.pop("definitions", {}), **params.pop("$defs", {})}
        if local:
            params = _rename_refs(params, name)
            defs.update({f"{name}.{k}": _rename_refs(v, name) for k, v in local.items()})
        if forced is None or forced == name:
            options.append({"type": "object",
                            "properties": {"name": {"const": name},
                                           "arguments": {"type": "object", **params}},
                            "required": ["name", "arguments"],
                            "additionalProperties": False})
    if forced is not None and not options:
        raise BadRequestError(f"tool_choice: names {forced!r}, which is not among the tools "
                              f"{names}.", param="tool_choice")
    schema: dict[str, Any] = {"anyOf": options}
    if defs:
        schema["$defs"] = defs
    return _schema_constraint(schema, "tool_call", "tools")


def _rename_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, Mapping):
        out = {k: _rename_refs(v, prefix) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str):
            for root in ("#/$defs/", "#/definitions/"):
                if ref.startswith(root):
                    out["$ref"] = f"#/$defs/{prefix}.{ref[len(root):]}"
        return out
    if isinstance(node, list):
        return [_rename_refs(v, prefix) for v in node]
    return node
