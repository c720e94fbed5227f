"""Docs of the LLM runtime: every public symbol has a runnable example, and the examples run."""

import doctest
import importlib
import inspect

import pytest

MODULES = [
    "langtorch.backends",
    "langtorch.backends.base",
    "langtorch.backends._openai",
    "langtorch.runtime",
    "langtorch.runtime._cache",
    "langtorch.runtime._executor",
    "langtorch.runtime._limits",
    "langtorch.runtime._policies",
    "langtorch.runtime._usage",
    "langtorch.testing",
    "langtorch.testing._server",
    "langtorch.nn.llm",
]
NAMESPACES = ["langtorch.backends", "langtorch.runtime", "langtorch.testing", "langtorch.nn.llm"]


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_public_symbols_have_examples(namespace):
    module = importlib.import_module(namespace)
    missing = []
    for name in module.__all__:
        if name == "LocalBackend":  # documented by its own module's owner and tests
            continue
        obj = getattr(module, name)
        if ">>>" not in (inspect.getdoc(obj) or ""):
            missing.append(name)
    assert missing == []
