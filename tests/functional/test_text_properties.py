"""Property tests: arbitrary unicode passes through fill, concat, join and split unchanged."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import langtorch.functional as F
from langtorch.functional import TemplateError, TextTensor, parse_template

# Emoji, combining marks, RTL marks, NUL, braces, surrogate-free unicode in general.
SPECIAL = ["\U0001f600", "e\u0301", "\u200f", "\u202e", "\x00", "{", "}", "{{", "{x}", "\n", " "]
texts = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
    st.lists(st.sampled_from(SPECIAL), max_size=6).map("".join),
)
text_lists = st.lists(texts, min_size=1, max_size=8)


def _all_parse(values):
    try:
        for v in values:
            parse_template(v)
    except TemplateError:
        return False
    return True


@given(text_lists)
def test_roundtrip_construction(values):
    # data holds any text
    assert TextTensor(values, template=False).tolist() == values
    assert TextTensor(np.array(values, dtype=object), template=False).tolist() == values
    # as a template: texts that parse are always accepted; a text is refused (when the tensor is
    # made, with the way out) only if it does not parse
    for data in (values, np.array(values, dtype=object)):
        try:
            made = TextTensor(data)
        except TemplateError as e:
            assert not _all_parse(values)
            assert "template=False" in str(e) and "{{" in str(e)
        else:
            assert made.tolist() == values


@given(text_lists, texts, texts)
def test_fill_inserts_values_verbatim(values, left, right):
    template = left.replace("{", "{{").replace("}", "}}") + "{v}" + right.replace("{", "{{").replace("}", "}}")
    out = TextTensor(template) + TextTensor(values, template=False)
    assert out.tolist() == [left + v + right for v in values]
    strict = TextTensor(template) * TextTensor({"v": values})
    assert strict.tolist() == out.tolist()


@given(text_lists, text_lists)
def test_concat_matches_python(a, b):
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    assert F.concat(a, b).tolist() == [x + y for x, y in zip(a, b)]
    data = TextTensor(a, template=False)
    assert (data + TextTensor(b, template=False)).tolist() == [x + y for x, y in zip(a, b)]
    assert (data + b).tolist() == [x + y for x, y in zip(a, b)]


@given(text_lists, texts)
def test_join_matches_str_join(values, sep):
    assert F.join(values, sep).item() == sep.join(values)
    grid = TextTensor([values, values], template=False)
    assert grid.join(sep, axis=0).tolist() == [sep.join([v, v]) for v in values]


@settings(max_examples=200)
@given(text_lists, st.sampled_from([",", "|", "\x00", "\U0001f600", "{}", "\u200f"]))
def test_split_inverts_join(values, sep):
    joined = F.join(values, sep)
    assert joined.split(sep).tolist() == sep.join(values).split(sep)
    assert F.join(joined.split(sep), sep).item() == sep.join(values)
