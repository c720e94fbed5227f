"""The layering rule: langtorch.functional never imports torch or the upper layers."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_functional_leaves_torch_out():
    code = (
        "import sys, langtorch.functional as F\n"
        "F.TextTensor('{x}') + 'y'\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')"
        " or m.startswith('langtorch.interop') or m == 'langtorch.nn']\n"
        "print(bad[:5])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_forbidden_imports_under_functional():
    offenders = []
    for path in (ROOT / "functional").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in {"torch", "functional", "interop"} or (
                    top == "langtorch" and not name.startswith("langtorch.functional")
                ):
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def test_no_bare_layer_imports_anywhere():
    offenders = []
    for folder in ("functional", "interop", "langtorch", "tests", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                mods = []
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    mods = [node.module]
                offenders += [
                    f"{path.relative_to(ROOT)}: {m}" for m in mods if m.split(".")[0] in {"functional", "interop"}
                ]
    assert offenders == []
