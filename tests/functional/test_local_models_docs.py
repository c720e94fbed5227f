"""The examples in the local-model modules run (those that need weights are marked SKIP)."""

import doctest
import importlib

import pytest

MODULES = [
    "langtorch.functional.models.bert",
    "langtorch.functional.models.llama",
    "langtorch.functional.models.decoder",
    "langtorch.functional.models.quant",
    "langtorch.functional.embedding",
    "langtorch.functional.generate",
    "langtorch.functional.engine",
    "langtorch.functional.request",
    "langtorch.functional.shapes",
    "langtorch.functional.loaders._atomic",
    "langtorch.functional.loaders",
    "langtorch.functional.loaders._bert",
    "langtorch.functional.loaders._gguf",
    "langtorch.functional.loaders._tokenizer",
    "langtorch.models",
    "langtorch.models._paths",
    "langtorch.models._minilm",
    "langtorch.models._smollm2",
    "langtorch.models._engine",
    "langtorch.models.adapters",
    "langtorch.backends.local",
]


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
