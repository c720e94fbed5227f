"""The declared order of the ``langtorch`` packages (docs/architecture.md), enforced.

Every import of a ``langtorch`` module — at module level or inside a function — goes *down* the
order (or stays inside its own package); no package imports a private module (``_x``) or a private
name of another package: a package's ``__init__`` (its public modules and names) is its contract.
The checker runs on source text, so a lazy import inside a function cannot hide an upward edge.
"""

from __future__ import annotations

import ast
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
    ("nn", "index", "func", "metrics", "datasets", "distributed"),
    ("optim", "tuning"),
    ("serve", "testing"),
    ("langtorch", "__main__"),
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}

# Known violations still being removed. Each entry is "<file> -> <imported module[:name]>".
# The test fails on a violation not listed here, and on an entry that no longer occurs, so this
# list only shrinks. It must end empty.
ALLOWED: set[str] = {
    "langtorch/autograd/_backward.py -> langtorch.backends.base:Backend",
    "langtorch/autograd/_backward.py -> langtorch.runtime:acomplete",
    "langtorch/autograd/_backward.py -> langtorch.runtime:raise_for_errors",
    "langtorch/autograd/_backward.py -> langtorch.runtime:run_sync",
    "langtorch/autograd/_backward.py -> langtorch.tensor:TextTensor",
    "langtorch/autograd/_graph.py -> langtorch.tensor:TextParameter",
    "langtorch/func.py -> langtorch.autograd._graph:parameter_sources",
    "langtorch/func.py -> langtorch.autograd._graph:tracked_leaf",
    "langtorch/func.py -> langtorch.nn.modules:_overrides",
    "langtorch/index.py -> langtorch.autograd._graph:broadcast_index",
    "langtorch/index.py -> langtorch.autograd._graph:record_node",
    "langtorch/nn/classify.py -> langtorch.autograd._graph:identity_index",
    "langtorch/nn/classify.py -> langtorch.autograd._graph:record_node",
    "langtorch/nn/llm.py -> langtorch.autograd._graph:record_node",
    "langtorch/nn/losses.py -> langtorch.autograd._graph:broadcast_index",
    "langtorch/nn/losses.py -> langtorch.autograd._graph:record_node",
    "langtorch/optim/__init__.py -> langtorch.autograd._backward:get_backward_engine",
    "langtorch/optim/__init__.py -> langtorch.autograd._backward:set_backward_engine",
    "langtorch/optim/_search.py -> langtorch.autograd._backward:_engine_parts",
    "langtorch/optim/_tgd.py -> langtorch.autograd._backward:_engine_parts",
    "langtorch/tensor.py -> langtorch.autograd._graph:identity_index",
    "langtorch/tensor.py -> langtorch.autograd._graph:record_node",
    "langtorch/tensor.py -> langtorch.autograd:_graph",
    "langtorch/tracing/_history.py -> langtorch.runtime._executor:_recent",
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


def violations_in(source: str, module: str, is_package: bool, label: str) -> list[str]:
    """The order and privacy violations of one file's source."""
    src_unit = unit_of(module)
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[tuple[str, str | None]] = []
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            targets = [(name, a.name) for a in node.names]
        for target, name in targets:
            if target == "langtorch" and name in RANK:  # `from langtorch import nn` imports langtorch.nn
                target, name = f"langtorch.{name}", None
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
    return out


def all_violations() -> tuple[list[str], dict[str, set[str]]]:
    found: list[str] = []
    edges: dict[str, set[str]] = {}
    for folder in ("langtorch", "functional", "interop"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = module_name(path)
            label = str(path.relative_to(ROOT))
            source = path.read_text(encoding="utf-8")
            found += violations_in(source, module, path.name == "__init__.py", label)
            src_unit = unit_of(module)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    pairs = [
                        (f"langtorch.{a.name}", f"{label} -> langtorch.{a.name}")
                        if node.module == "langtorch" and a.name in RANK
                        else (node.module, f"{label} -> {node.module}:{a.name}")
                        for a in node.names
                    ]
                elif isinstance(node, ast.Import):
                    pairs = [(a.name, f"{label} -> {a.name}") for a in node.names]
                else:
                    continue
                for target, entry in pairs:
                    dst = unit_of(target)
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
