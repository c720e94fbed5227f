"""Docs are part of done: public symbols have docstrings with examples, and the examples run."""

import doctest
import importlib
import inspect

import pytest

# Modules whose examples are cheap enough to run on every test run (no model weights).
DOCTESTED = [
    "langtorch.core.heap",
    "langtorch.functional.errors",
    "langtorch.functional.template",
    "langtorch.functional.text",
    "langtorch.functional.textops",
    "langtorch.functional",
    "langtorch.errors",
    "langtorch.tensor",
    "langtorch.nn.modules",
    "langtorch.nn",
    "langtorch",
    "langtorch.autograd",
    "langtorch.autograd._graph",
    "langtorch.autograd._backward",
    "langtorch.autograd._grad_mode",
    "langtorch.tracing",
    "langtorch.tracing._trace",
    "langtorch.nn.losses",
    "langtorch.nn.debug",
    "langtorch.nn.demos",
    "langtorch.nn.tools",
    "langtorch.func",
    "langtorch.optim",
    "langtorch.optim._tgd",
    "langtorch.optim._search",
    "langtorch.optim._gepa",
    "langtorch.optim._pool",
    "langtorch.optim._reflection",
    "langtorch.evaluation",
    "langtorch.runtime._budget",
    "langtorch.tracing._views",
    "langtorch.tracing._otel",
    "langtorch.testing._script",
    "langtorch.index",
    "langtorch.nn.retrieve",
    "langtorch.metrics",
    "langtorch.core",
    "langtorch.core.redact",
    "langtorch.core.sync",
    "langtorch.core.types",
    "langtorch.core.capabilities",
    "langtorch.core.events",
    "langtorch.functional.constrain",
    "langtorch.functional.sampling",
    "langtorch.models._resolve",
    "langtorch.tracing._history",
]

# Public namespaces whose every exported symbol must carry a docstring with a `>>>` example.
NAMESPACES = ["langtorch", "langtorch.functional", "langtorch.nn", "langtorch.errors", "langtorch.optim",
              "langtorch.autograd", "langtorch.tracing", "langtorch.func",
              "langtorch.metrics", "langtorch.core", "langtorch.evaluation"]


@pytest.mark.parametrize("name", DOCTESTED)
def test_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def _public(namespace):
    module = importlib.import_module(namespace)
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            continue
        yield f"{namespace}.{name}", obj


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_public_symbols_have_examples(namespace):
    missing = [qual for qual, obj in _public(namespace) if ">>>" not in (inspect.getdoc(obj) or "")]
    assert missing == [], f"public symbols without a runnable example: {missing}"
