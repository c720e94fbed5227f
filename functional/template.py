"""A safe template engine: ``{name}``, ``{}``, ``{0}`` placeholders and ``{{``/``}}`` escapes.

Templates may come from users, so they are parsed with a small scanner instead of ``str.format``:
a field name is an identifier or a non-negative integer and nothing else. Attribute access
(``{x.__class__}``), indexing (``{x[0]}``), conversions (``{x!r}``) and format specs (``{x:>9}``)
are rejected when the template is parsed, so a template can never reach into Python objects.

A parsed :class:`Template` is a tuple of literal pieces and field names; filling it concatenates
literals and values. Values are inserted once and never scanned again, so braces inside data
survive untouched. Parsing is cached per template text.

Example:
    >>> t = parse_template("Hello {name}, {{literal}} {0}")
    >>> t.literals, t.fields
    (('Hello ', ', {literal} ', ''), ('name', '0'))
    >>> t.render({"name": "Ada", "0": "{x}"})
    'Hello Ada, {literal} {x}'
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from langtorch.functional.errors import TemplateError

__all__ = ["Template", "parse_template"]


@dataclass(frozen=True)
class Template:
    """A parsed template: ``literals[0] + v(fields[0]) + literals[1] + ... + literals[-1]``.

    Attributes:
        text: the template source text.
        literals: the literal pieces, one more than ``fields``; escapes already resolved.
        fields: the field name of each placeholder in order; positional fields are named by their
            index as a string (``"{}"`` and ``"{0}"`` are both field ``"0"``).
        names: the distinct field names, in order of first appearance.

    Example:
        >>> parse_template("{a} and {b} and {a}").names
        ('a', 'b')
    """

    text: str
    literals: tuple[str, ...]
    fields: tuple[str, ...]
    names: tuple[str, ...]

    @property
    def has_fields(self) -> bool:
        """Whether the template has at least one placeholder.

        Example:
            >>> parse_template("no fields {{here}}").has_fields
            False
        """
        return bool(self.fields)

    def render(self, values: dict[str, str]) -> str:
        """Fill the template with a mapping from field name to text (a single-entry fill).

        Raises:
            TemplateError: a field has no value.

        Example:
            >>> parse_template("{} + {}").render({"0": "1", "1": "2"})
            '1 + 2'
        """
        out = [self.literals[0]]
        for name, lit in zip(self.fields, self.literals[1:]):
            if name not in values:
                raise TemplateError(
                    f"template {self.text!r} needs field {{{name}}} but no value was given for it; "
                    f"values were given for {sorted(values)}",
                    template=self.text,
                    field=name,
                )
            value = values[name]
            if not isinstance(value, str):
                raise TypeError(f"value for field {{{name}}} must be str, got {type(value).__name__}")
            out.append(value)
            out.append(lit)
        return "".join(out)


def _error(template: str, pos: int, what: str) -> TemplateError:
    pointer = template[max(0, pos - 20) : pos + 20]
    caret = " " * (min(pos, 20) + 1) + "^"
    return TemplateError(
        f"{what} at position {pos} of the template:\n  {pointer!r}\n {caret}\n"
        "Placeholders are {name}, {} or {0}; write {{ and }} for literal braces.",
        template=template,
        position=pos,
    )


def _check_field(template: str, start: int, body: str) -> None:
    """Reject anything in ``{...}`` that is not an identifier or an integer, saying why."""
    if body == "" or body.isidentifier() or (body.isdigit() and body.isascii()):
        return
    name = re.match(r"\w*", body).group()
    pos = start + 1 + len(name)
    nxt = body[len(name)] if len(name) < len(body) else ""
    if name and (name.isidentifier() or name.isdigit()) and nxt in _WHY:
        raise _error(template, pos, f"{_WHY[nxt]} in field {{{body}}} is not allowed")
    raise _error(
        template,
        pos,
        f"field name {{{body}}} is not an identifier or a non-negative integer (if this is "
        "literal text such as JSON, double its braces)",
    )


_WHY = {".": "attribute access", "[": "indexing", "!": "conversion", ":": "format spec"}


@functools.lru_cache(maxsize=4096)
def parse_template(text: str) -> Template:
    """Parse a template text once (cached) into literals and field names.

    Args:
        text: the template, e.g. ``"Translate into {lang}: {text}"``.

    Returns:
        The parsed :class:`Template`.

    Raises:
        TemplateError: unbalanced braces, a field that is not an identifier or integer, attribute
            access, indexing, a conversion, a format spec, or a mix of ``{}`` and ``{0}``; the
            error's ``position`` points at the offending character.
        TypeError: ``text`` is not a ``str``.

    Example:
        >>> parse_template("Q: {question}\\nA:").fields
        ('question',)
        >>> parse_template("{x.__class__}")
        Traceback (most recent call last):
        ...
        langtorch.functional.errors.TemplateError: attribute access in field {x.__class__} is not allowed at position 2 of the template:
          '{x.__class__}'
           ^
        Placeholders are {name}, {} or {0}; write {{ and }} for literal braces.
    """
    if not isinstance(text, str):
        raise TypeError(f"a template must be str, got {type(text).__name__}")
    literals: list[str] = []
    fields: list[str] = []
    buf: list[str] = []
    auto = manual = False
    auto_next = 0
    i, n = 0, len(text)
    while i < n:
        # Copy the run of ordinary characters in one slice (fast for long templates).
        j = i
        while j < n and text[j] != "{" and text[j] != "}":
            j += 1
        if j > i:
            buf.append(text[i:j])
            i = j
            continue
        ch = text[i]
        if ch == "}":
            if i + 1 < n and text[i + 1] == "}":
                buf.append("}")
                i += 2
                continue
            raise _error(text, i, "single '}' without a matching '{'")
        # ch == "{"
        if i + 1 < n and text[i + 1] == "{":
            buf.append("{")
            i += 2
            continue
        close = text.find("}", i + 1)
        nested = text.find("{", i + 1)
        if close == -1:
            raise _error(text, i, "'{' is never closed")
        if nested != -1 and nested < close:
            raise _error(text, nested, "'{' inside a placeholder")
        body = text[i + 1 : close]
        _check_field(text, i, body)
        if body == "":
            if manual:
                raise _error(text, i, "cannot mix automatic '{}' with numbered '{0}' fields")
            auto = True
            body = str(auto_next)
            auto_next += 1
        elif body.isdigit():
            if auto:
                raise _error(text, i, "cannot mix automatic '{}' with numbered '{0}' fields")
            manual = True
            body = str(int(body))
        literals.append("".join(buf))
        buf = []
        fields.append(body)
        i = close + 1
    literals.append("".join(buf))
    names = tuple(dict.fromkeys(fields))
    return Template(text=text, literals=tuple(literals), fields=tuple(fields), names=names)
