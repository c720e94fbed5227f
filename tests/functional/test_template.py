"""The safe template engine: syntax, escapes, rejection of unsafe fields, positions."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from langtorch.functional import Template, TemplateError, parse_template


def test_named_positional_and_escapes():
    t = parse_template("Hi {name}! {{not a field}} {0}{0}")
    assert t.fields == ("name", "0", "0")
    assert t.names == ("name", "0")
    assert t.literals == ("Hi ", "! {not a field} ", "", "")


def test_auto_numbering():
    assert parse_template("{} and {}").fields == ("0", "1")
    assert parse_template("{1}{0}").fields == ("1", "0")


def test_unicode_identifier_fields():
    assert parse_template("写一首关于{主题}的诗").fields == ("主题",)


def test_parse_is_cached():
    assert parse_template("cache {me}") is parse_template("cache {me}")


@pytest.mark.parametrize(
    "text, pos, words",
    [
        ("{x.__class__}", 2, "attribute access"),
        ("ab{x[0]}", 4, "indexing"),
        ("{x!r}", 2, "conversion"),
        ("{x:>10}", 2, "format spec"),
        ("{0.real}", 2, "attribute access"),
        ("open { never", 5, "never closed"),
        ("close } alone", 6, "single '}'"),
        ("{a{b}}", 2, "inside a placeholder"),
        ("{} {0}", 3, "cannot mix"),
        ("{0} {}", 4, "cannot mix"),
        ("{a-b}", 2, "not an identifier"),
        ("{ x}", 1, "not an identifier"),
        ('Return JSON like {"a": 1}', 18, "double its braces"),
    ],
)
def test_rejections_point_at_position(text, pos, words):
    with pytest.raises(TemplateError) as info:
        parse_template(text)
    assert info.value.position == pos
    assert words in str(info.value)
    assert info.value.template == text


def test_render_missing_field_names_it():
    with pytest.raises(TemplateError, match=r"\{b\}"):
        parse_template("{a}{b}").render({"a": "1"})


def test_render_inserts_values_once():
    assert parse_template("<{x}>").render({"x": "{y}{{z}}"}) == "<{y}{{z}}>"


def test_non_str_template():
    with pytest.raises(TypeError, match="must be str"):
        parse_template(3)


@given(st.text(alphabet=st.sampled_from(list("{}ab0_.[]!: x\u00e9\U0001f600")), max_size=30))
def test_fuzzed_templates_parse_or_raise_template_error(text):
    try:
        t = parse_template(text)
    except TemplateError:
        return
    assert isinstance(t, Template)
    assert len(t.literals) == len(t.fields) + 1
    # Filling with the field names reproduces a consistent text: str.format agrees on safe ones.
    values = {f: f"<{f}>" for f in t.names}
    expected = text.format(*[values[str(i)] for i in range(len(t.names)) if str(i) in values],
                           **{k: v for k, v in values.items() if not k.isdigit()})
    assert t.render(values) == expected


@given(st.text(max_size=60))
def test_any_text_parses_or_raises_template_error(text):
    try:
        parse_template(text)
    except TemplateError:
        pass
