"""Packaging guardrails: the built wheel holds every package on disk, under its mapped name."""

import pathlib
import subprocess
import sys
import zipfile

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAPPING = {"langtorch": "langtorch", "functional": "langtorch/functional", "interop": "langtorch/interop"}


def _packages_on_disk() -> set[str]:
    found = set()
    for folder, dotted in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            parts = [] if str(rel) == "." else list(rel.parts)
            found.add(".".join([dotted.replace("/", ".")] + parts))
    return found


def test_pyproject_lists_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    missing = _packages_on_disk() - listed
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
    assert config["project"]["name"] != "langtorch"  # the PyPI name is taken by another project


def test_no_init_under_tests():
    assert not list((ROOT / "tests").rglob("__init__.py"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(ROOT)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    (whl,) = out.glob("*.whl")
    return whl, proc.stdout + proc.stderr


def test_wheel_build_has_no_package_discovery_warning(wheel):
    """Every importable folder is in `packages`: setuptools warns (and a later release may fail)
    when one holding shipped files, such as the trace view's assets, is not."""
    _, log = wheel
    assert "absent from the `packages` configuration" not in log


def test_wheel_contains_every_package_and_module(wheel):
    names = set(zipfile.ZipFile(wheel[0]).namelist())
    for dotted in _packages_on_disk():
        assert dotted.replace(".", "/") + "/__init__.py" in names, dotted
    for folder, prefix in MAPPING.items():
        for py in (ROOT / folder).rglob("*.py"):
            rel = py.relative_to(ROOT / folder).as_posix()
            assert f"{prefix}/{rel}" in names, f"{folder}/{rel} missing from the wheel"
    assert not any(n.startswith(("functional/", "interop/", "tests/")) for n in names)


def _package_data_on_disk() -> list[str]:
    """Every data file pyproject's package-data declares, as its path in the wheel."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = []
    for package, patterns in config["tool"]["setuptools"].get("package-data", {}).items():
        folder = ROOT / package.replace(".", "/")  # langtorch.* packages live under langtorch/
        for pattern in patterns:
            found += [p.relative_to(ROOT).as_posix() for p in folder.glob(pattern)]
    return sorted(found)


def test_trace_view_assets_are_declared_package_data():
    """The HTML view's page, CSS and script are files under langtorch/tracing/assets/, each
    matched by a package-data pattern (a file no pattern matches would be left out of the wheel)."""
    assets = sorted(p.relative_to(ROOT).as_posix()
                    for p in (ROOT / "langtorch/tracing/assets").iterdir() if p.is_file())
    assert {"langtorch/tracing/assets/page.html", "langtorch/tracing/assets/trace.css",
            "langtorch/tracing/assets/trace.js"} <= set(assets)
    assert [a for a in assets if a not in _package_data_on_disk()] == []


def test_wheel_contains_package_data(wheel):
    names = set(zipfile.ZipFile(wheel[0]).namelist())
    data = _package_data_on_disk()
    assert "langtorch/tracing/assets/trace.js" in data
    missing = [d for d in data if d not in names]
    assert not missing, f"package data missing from the wheel: {missing}"
