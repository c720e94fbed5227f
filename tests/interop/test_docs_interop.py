"""langtorch.interop's public symbols carry runnable examples, and the examples run."""

import doctest
import importlib
import inspect

import pytest

MODULES = [
    "langtorch.interop",
    "langtorch.interop._convert",
    "langtorch.interop._bridge",
    "langtorch.interop._module",
    "langtorch.interop._models",
    "langtorch.interop._embedding",
    "langtorch.interop._errors",
    "langtorch.functional.soft_prompt",
]


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_public_symbols_have_examples():
    import langtorch.interop as interop

    missing = [n for n in interop.__all__ if ">>>" not in (inspect.getdoc(getattr(interop, n)) or "")]
    assert missing == []


def test_interop_does_not_import_user_facing_langtorch():
    import pathlib

    root = pathlib.Path(importlib.import_module("langtorch.interop").__file__).parent
    for path in root.glob("*.py"):
        for line in path.read_text().splitlines():
            s = line.strip()
            if s.startswith(("import langtorch", "from langtorch")):
                assert s.startswith(("from langtorch.functional", "from langtorch.interop",
                                     "import langtorch.functional", "import langtorch.interop")), (
                    f"{path.name}: {s}")
