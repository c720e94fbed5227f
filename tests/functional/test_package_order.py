"""The declared order of the ``langtorch`` packages (docs/architecture.md), enforced.

Every import of a ``langtorch`` module — at module level or inside a function — goes *down* the
order (or stays inside its own package); no package imports a private module (``_x``) or a private
name of another package: a package's ``__init__`` (its public modules and names) is its contract.
The checker runs on source text, so a lazy import inside a function cannot hide an upward edge.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Low to high. A unit is a package under langtorch/ (``nn``), a top-level module
# (``tensor`` for langtorch/tensor.py), ``functional``/``interop`` (the lower layers, shipped as
# langtorch.functional / langtorch.interop) or ``langtorch`` itself (the facade __init__).
# Units in one layer may import each other as long as the unit graph stays acyclic.
LAYERS: list[tuple[str, ...]] = [
    ("functional",),
    ("interop",),
    ("errors", "core"),
    ("tracing",),
    ("models",),
    ("autograd",),
    ("tensor",),
    ("backends",),
    ("runtime",),
    ("nn", "index", "func", "metrics", "datasets", "distributed", "evaluation"),
    ("optim", "tuning"),
    ("serve", "testing"),
    ("langtorch", "__main__"),
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}

# Known violations still being removed. Each entry is "<file> -> <imported module[:name]>".
# The test fails on a violation not listed here, and on an entry that no longer occurs, so this
# list only shrinks. It must end empty.
ALLOWED: set[str] = {
    "langtorch/backends/local.py -> langtorch.models._engine:engine_for",
    "langtorch/backends/local.py -> langtorch.tuning._files:load_peft_adapter",
    "langtorch/tuning/_tuner.py -> langtorch.models._engine:engine_for",
    # private attributes of an imported name (see private_attributes_in)
}


def unit_of(module: str) -> str | None:
    """The unit of an absolute module name inside langtorch, or None outside it."""
    parts = module.split(".")
    if parts[0] != "langtorch":
        return None
    if len(parts) == 1:
        return "langtorch"
    return parts[1]


def _is_private(parts: list[str]) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def module_name(path: pathlib.Path) -> str:
    """``langtorch/nn/llm.py`` -> ``langtorch.nn.llm``; functional/ and interop/ map under langtorch."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in ("functional", "interop"):
        parts = ["langtorch", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


_DYNAMIC_IMPORTS = ("importlib.import_module", "import_module", "__import__")


def imports_in(source: str, module: str, is_package: bool) -> list[tuple[str, str | None]]:
    """Every import of one file's source as ``(absolute module, imported name or None)``:
    ``import``/``from`` statements anywhere (relative ones resolved), and
    ``importlib.import_module("...")``/``__import__("...")`` with a literal name. ``from langtorch
    import nn`` is an import of ``langtorch.nn``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found += [(name, a.name) for a in node.names]
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) in _DYNAMIC_IMPORTS
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")):
            found.append((node.args[0].value, None))
    return [(f"langtorch.{name}", None) if target == "langtorch" and name in RANK else (target, name)
            for target, name in found]


def private_attributes_in(source: str, module: str, is_package: bool, label: str) -> list[str]:
    """Reach-ins through an imported name: ``sync._local`` after ``from langtorch.core import
    sync``, ``TextTensor._wrap`` after ``from langtorch.tensor import TextTensor``,
    ``langtorch.runtime._x`` after ``import langtorch``. (Source text cannot type a variable:
    the private attributes of *instances* of another package's classes are not seen here.)"""
    tree = ast.parse(source)
    src_unit = unit_of(module)
    bound: dict[str, str] = {}  # a name the file binds by importing -> what it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for a, (target, name) in zip(node.names, imports_in(ast.unparse(node), module, is_package)):
                bound[a.asname or a.name] = target if name is None else f"{target}.{name}"
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    # A class that subclasses an imported class may use its base's protected hooks (a subclass
    # extending ``_tree_unflatten`` is inheritance, not a reach-in).
    bases = {ast.unparse(b) for n in ast.walk(tree) if isinstance(n, ast.ClassDef) for b in n.bases}
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue  # one report per chain a.b._c, from its outermost attribute
        attrs: list[str] = []
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            attrs.insert(0, root.attr)
            root = root.value
        if not isinstance(root, ast.Name) or root.id not in bound or not _is_private(attrs):
            continue
        owner = ast.unparse(node.value)
        if owner in bases and len(attrs) >= 1 and not _is_private(attrs[:-1]):
            continue
        dotted = ".".join([bound[root.id], *attrs])
        dst_unit = unit_of(dotted)
        if dst_unit is not None and dst_unit != src_unit:
            out.append(f"{label} -> {dotted} (private attribute of {dst_unit})")
    return out


def violations_in(source: str, module: str, is_package: bool, label: str) -> list[str]:
    """The order and privacy violations of one file's source."""
    src_unit = unit_of(module)
    out: list[str] = []
    for target, name in imports_in(source, module, is_package):
        dst_unit = unit_of(target)
        if dst_unit is None or dst_unit == src_unit:
            continue
        entry = f"{label} -> {target}" + (f":{name}" if name else "")
        if dst_unit not in RANK:
            out.append(f"{entry} (unit {dst_unit!r} is not in the declared order)")
        elif src_unit not in RANK:
            out.append(f"{entry} (unit {src_unit!r} is not in the declared order)")
        elif RANK[dst_unit] > RANK[src_unit]:
            out.append(f"{entry} (upward: {src_unit} is below {dst_unit})")
        elif _is_private(target.split(".")[2:]) or (name is not None and _is_private([name])):
            out.append(f"{entry} (private to {dst_unit})")
    return out + private_attributes_in(source, module, is_package, label)


@functools.lru_cache(maxsize=1)
def all_violations() -> tuple[list[str], dict[str, set[str]]]:
    found: list[str] = []
    edges: dict[str, set[str]] = {}
    for folder in ("langtorch", "functional", "interop"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = module_name(path)
            label = str(path.relative_to(ROOT))
            source = path.read_text(encoding="utf-8")
            is_package = path.name == "__init__.py"
            found += violations_in(source, module, is_package, label)
            src_unit = unit_of(module)
            for target, name in imports_in(source, module, is_package):
                dst = unit_of(target)
                entry = f"{label} -> {target}" + (f":{name}" if name else "")
                # An edge known to be wrong (ALLOWED) is reported by the test above.
                if dst is not None and dst != src_unit and entry not in ALLOWED:
                    edges.setdefault(src_unit, set()).add(dst)
    return found, edges


def _strip(entry: str) -> str:
    return entry.split(" (", 1)[0]


def test_imports_go_down_the_declared_order_and_stay_public():
    found, _ = all_violations()
    new = sorted(v for v in found if _strip(v) not in ALLOWED)
    fixed = sorted(ALLOWED - {_strip(v) for v in found})
    assert not new, "imports against docs/architecture.md's package order:\n" + "\n".join(new)
    assert not fixed, "fixed; remove from ALLOWED:\n" + "\n".join(fixed)


def test_no_cycle_between_units():
    _, edges = all_violations()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v) :] + [v]
            if v not in state and (cycle := visit(v)):
                return cycle
        stack.pop()
        state[u] = 2
        return None

    for unit in sorted(edges):
        if unit not in state and (cycle := visit(unit)):
            raise AssertionError("import cycle between langtorch packages: " + " -> ".join(cycle))


def test_every_unit_on_disk_is_in_the_order():
    units = {p.stem if p.is_file() else p.name for p in (ROOT / "langtorch").iterdir()}
    units = {u for u in units if not u.startswith(".") and u not in ("__pycache__", "__init__")}
    units |= {"functional", "interop", "langtorch"}
    missing = sorted(u for u in units if u not in RANK and not u.endswith((".json", ".css", ".js")))
    assert missing == [], f"add these to LAYERS and docs/architecture.md: {missing}"


def test_checker_flags_upward_private_and_lazy_imports():
    """The checker itself: an upward import (even inside a function) and a private reach-in are
    flagged; a downward public import is not."""
    src = textwrap.dedent(
        """
        from langtorch.tensor import TextTensor            # down: fine
        from langtorch import tracing                      # down: fine
        from langtorch import optim                        # upward
        from langtorch.tracing._trace import Span          # private module of another package
        from langtorch.tracing import _trace               # private name of another package

        def f():
            from langtorch.nn import TModule               # upward, hidden in a function
        """
    )
    found = violations_in(src, "langtorch.runtime._executor", False, "x.py")
    assert sorted(_strip(v) for v in found) == [
        "x.py -> langtorch.nn:TModule",
        "x.py -> langtorch.optim",
        "x.py -> langtorch.tracing._trace:Span",
        "x.py -> langtorch.tracing:_trace",
    ]
    assert any("upward" in v for v in found)


def test_checker_sees_dynamic_and_relative_imports():
    """An upward import cannot slip through as ``importlib.import_module("langtorch.nn")``,
    ``__import__``, an aliased ``import ... as`` inside a function, or a relative import; and the
    cycle check sees relative imports too (before, it read absolute ``from`` imports only, and
    dynamic imports were not read at all)."""
    src = textwrap.dedent(
        """
        import importlib
        from importlib import import_module

        def f():
            import langtorch.nn as nn                      # upward, aliased, in a function
            importlib.import_module("langtorch.optim")     # upward, dynamic
            import_module("langtorch.tuning")              # upward, dynamic
            __import__("langtorch.serve")                  # upward, dynamic
            from ..index import Index                      # upward, relative
            from .. import func                            # upward, relative package
            from ..tracing import _trace                   # private, relative
        """
    )
    found = violations_in(src, "langtorch.runtime._executor", False, "x.py")
    assert sorted(_strip(v) for v in found) == [
        "x.py -> langtorch.func",
        "x.py -> langtorch.index:Index",
        "x.py -> langtorch.nn",
        "x.py -> langtorch.optim",
        "x.py -> langtorch.serve",
        "x.py -> langtorch.tracing:_trace",
        "x.py -> langtorch.tuning",
    ]
    # what the cycle check reads: same-layer edges written as relative imports count
    assert imports_in("from ..index import Index\n", "langtorch.nn.llm", False) == [
        ("langtorch.index", "Index")]


def test_checker_sees_private_attributes_reached_through_an_import():
    """``from langtorch.core import sync; sync._local.nested = True`` is a private reach-in as
    much as ``from langtorch.core.sync import _local`` (before, only the second was flagged)."""
    src = textwrap.dedent(
        """
        import langtorch
        from langtorch.core import sync as _sync
        from langtorch.tracing import Trace
        from langtorch.runtime import Budget            # same package: its own business

        def f(tr):
            _sync._local.nested = True                   # private module state of core
            Trace._content(tr, "x")                      # private method of tracing's class
            langtorch.tracing._trace.Span                # through the package's attributes
            Budget._lock                                 # fine: inside runtime
            tr._secrets                                  # an instance: not visible to the checker
        """
    )
    found = violations_in(src, "langtorch.runtime._executor", False, "x.py")
    assert sorted(_strip(v) for v in found) == [
        "x.py -> langtorch",                             # the facade: upward from runtime
        "x.py -> langtorch.core.sync._local.nested",
        "x.py -> langtorch.tracing.Trace._content",
        "x.py -> langtorch.tracing._trace.Span",
    ]


def test_checker_lets_a_subclass_extend_its_base_hooks_only():
    src = textwrap.dedent(
        """
        from langtorch.functional import text as _text
        from langtorch.tensor import TextTensor

        class P(_text.TextTensor):
            @staticmethod
            def _tree_unflatten(aux, children):
                return _text.TextTensor._tree_unflatten(aux, children)   # its base's hook: fine

        def f(v):
            return TextTensor._wrap(v)                                   # not a base here
        """
    )
    found = private_attributes_in(src, "langtorch.index", False, "x.py")
    assert [v.split(" (")[0] for v in found] == ["x.py -> langtorch.tensor.TextTensor._wrap"]
