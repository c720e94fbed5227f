"""Chat templates are untrusted code from a model file: rendered in Jinja's immutable sandbox,
made stricter here. Each refusal names the model and the template line. The bombs and the
silent ``''.__class__`` below rendered (or hung) before review6."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("jinja2")

from langtorch.functional.errors import TemplateError  # noqa: E402
from langtorch.functional.loaders import ChatTemplate  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]


def _render(source):
    return ChatTemplate(source, name="tiny-model").render(MSGS)


def test_unsafe_attribute_fails_naming_model_and_line():
    with pytest.raises(TemplateError, match=r"tiny-model.*line 2.*SecurityError.*__class__"):
        _render("ok\n{{ ''.__class__ }}")


@pytest.mark.parametrize("bomb", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for c in 'a' * 100000 %}\n{% for d in 'b' * 100000 %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% for i in range(n) %}{{ f(n) }}{% endfor %}{% endmacro %}{{ f(9) }}",
])
def test_loop_bombs_stop_within_the_iteration_budget(bomb):
    start = time.monotonic()
    with pytest.raises(TemplateError, match=r"tiny-model.*line \d"):
        _render(bomb)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("bomb", ["{{ ('a' * 10000000000)|length }}", "{{ 10 ** 100000000 }}"])
def test_huge_values_are_refused(bomb):
    with pytest.raises(TemplateError, match=r"tiny-model.*line 1.*SecurityError"):
        _render(bomb)


def test_helpers_and_ordinary_templates_still_render():
    with pytest.raises(TemplateError, match=r"tiny-model.*line 2.*bad role"):
        _render("a\n{{ raise_exception('bad role') }}")
    assert len(_render("{{ strftime_now('%Y') }}")) == 4
    src = ("{% for m in messages %}{{ loop.index }}{% if loop.last %}L{% endif %}"
           "{{ loop.length }}{% else %}E{% endfor %}{% for m in [] %}x{% else %}E{% endfor %}"
           "{% set ns = namespace(a=0) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}"
           "{% endfor %}{{ ns.a }}{% for m in messages|reverse if m.role == 'user' %}"
           "{{ m.content }}{% endfor %}{{ 2 ** 10 }}{{ 'ab' * 2 }}{{ messages[::-1][0].role }}")
    assert _render(src) == "1L1E3hi1024ababuser"
