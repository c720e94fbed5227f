"""A griffe extension for the API reference: our docstrings as mkdocstrings should read them.

langtorch's docstrings are Google style with two habits the Google parser does not know:

* the examples section is headed ``Example:`` (the parser's examples section is ``Examples:``; under
  ``Example:`` the ``>>>`` lines would render as nested block quotes, not as code);
* Sphinx roles (``:class:`TextTensor```, ``:meth:`save```) mark code; they render as inline code.

And one habit of the layout: ``langtorch.functional`` and ``langtorch.interop`` live in the top-level
folders ``functional/`` and ``interop/`` (pyproject's ``package-dir``), where griffe's finder does not
look; the extension visits them as the ``langtorch`` package's subpackages.

mkdocs.yml loads this file through the python handler's ``extensions`` option.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")
_EXAMPLE_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROOT = Path(__file__).resolve().parents[2]
_GRAFTED = {"functional": _ROOT / "functional", "interop": _ROOT / "interop"}


def rewrite(text: str) -> str:
    """The docstring text with ``Example:`` headings as ``Examples:`` and roles as inline code.

    >>> rewrite("Fill it.\\n\\nExample:\\n    >>> 1 + 1\\n    2")
    'Fill it.\\n\\nExamples:\\n    >>> 1 + 1\\n    2'
    >>> rewrite("See :meth:`TextTensor.embed` and :class:`~langtorch.Trace`.")
    'See `TextTensor.embed` and `langtorch.Trace`.'
    """
    return _ROLE.sub(r"`\1`", _EXAMPLE_HEADING.sub(r"\1Examples:", text))


class LangtorchDocstrings(griffe.Extension):
    """Rewrite each docstring once, when its object is created (before it is parsed)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "langtorch":
            return
        for name, folder in _GRAFTED.items():
            if name not in pkg.members or pkg.members[name].is_alias:
                pkg.set_member(name, _visit_package(name, folder, pkg, loader))
                loader.expand_exports(pkg.members[name])


def _visit_package(name: str, folder: Path, parent: griffe.Module,
                   loader: griffe.GriffeLoader) -> griffe.Module:
    """The package in ``folder`` and its modules and subpackages, statically, as griffe would."""
    def visit(module_name: str, path: Path, module_parent: griffe.Module) -> griffe.Module:
        return griffe.visit(module_name, path, path.read_text(encoding="utf-8"),
                            extensions=loader.extensions, parent=module_parent,
                            docstring_parser=loader.docstring_parser,
                            docstring_options=loader.docstring_options,
                            lines_collection=loader.lines_collection,
                            modules_collection=loader.modules_collection)

    package = visit(name, folder / "__init__.py", parent)
    for child in sorted(folder.iterdir()):
        if child.suffix == ".py" and child.name != "__init__.py":
            package.set_member(child.stem, visit(child.stem, child, package))
        elif child.is_dir() and (child / "__init__.py").is_file():
            package.set_member(child.name, _visit_package(child.name, child, package, loader))
    return package
