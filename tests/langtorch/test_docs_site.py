"""The documentation site (mkdocs.yml): it builds in strict mode — a broken link or an unresolved
API reference fails — fast, with the guides, the examples and an API reference generated from the
docstrings; and its home page renders in a real headless Chromium (docs/site_home.png is that
screenshot, shown in the README)."""

from __future__ import annotations

import html
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "site_home.png"
WINDOW = (1280, 800)
# CPU seconds of the build (its own process), not wall time: the machine may be shared, and a
# loaded machine stretches wall time without the build doing more work. Measured: about 4 s.
BUILD_CPU_LIMIT_S = 30.0


def _mkdocs(config: pathlib.Path, site_dir: pathlib.Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``mkdocs build --strict``; returns the process, its wall time and its CPU time."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason="the docs packages are in the test extra: pip install -e '.[test]'")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    proc, wall, cpu = _mkdocs(ROOT / "mkdocs.yml", out)
    print(f"mkdocs build --strict: {wall:.1f} s wall, {cpu:.1f} s CPU")
    return out, proc, wall, cpu


def _page(site_dir: pathlib.Path, doc: str) -> str:
    """The built HTML of a docs page, e.g. ``"optimization.md"`` (mkdocs' directory URLs)."""
    stem = doc[:-len(".md")]
    path = site_dir / "index.html" if stem == "index" else site_dir / stem / "index.html"
    assert path.is_file(), f"{doc} was not built to {path}"
    return path.read_text(encoding="utf-8")


def test_site_builds_in_strict_mode_fast(site):
    _, proc, _, cpu = site
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    assert cpu < BUILD_CPU_LIMIT_S, f"the docs build took {cpu:.1f} s of CPU"


def test_every_guide_is_in_the_site(site):
    import yaml

    site_dir, proc, _, _ = site
    assert proc.returncode == 0, proc.stderr[-4000:]
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]

    def pages(entries):
        for entry in entries:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]

    in_nav = set(pages(nav))
    guides = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert guides - in_nav == set(), "docs pages missing from mkdocs.yml's nav"
    for doc in sorted(in_nav):
        _page(site_dir, doc)


def test_reference_is_generated_from_the_docstrings(site):
    import langtorch as lt

    site_dir, proc, _, _ = site
    assert proc.returncode == 0, proc.stderr[-4000:]
    nn_page = _page(site_dir, "reference/nn.md")
    for name in lt.nn.__all__:
        assert f'id="langtorch.nn.{name}"' in nn_page, f"langtorch.nn.{name} is not in the reference"
    top = _page(site_dir, "reference/langtorch.md")
    for name in ("TextTensor", "text", "where", "trace", "no_grad"):
        assert f'id="langtorch.{name}"' in top
    # The docstrings' "Example:" sections render as highlighted code, not as quoted text.
    assert '<span class="gp">&gt;&gt;&gt; </span>' in top
    assert "<blockquote>\n<blockquote>" not in top
    # langtorch.functional and langtorch.interop live outside langtorch/ (pyproject's package-dir).
    assert 'id="langtorch.functional.topk"' in _page(site_dir, "reference/functional.md")
    assert 'id="langtorch.interop.to_jax"' in _page(site_dir, "reference/interop.md")
    # Sphinx roles become inline code.
    assert ":class:`" not in top and ":meth:`" not in top


def test_examples_page_shows_the_example_scripts(site):
    site_dir, proc, _, _ = site
    assert proc.returncode == 0, proc.stderr[-4000:]
    page = _page(site_dir, "examples.md")
    for script in sorted((ROOT / "examples").glob("*.py")):
        assert f"python examples/{script.name}" in page, f"{script.name} is not on the examples page"
    # The scripts' own text is included: each one's first docstring line, as the page shows it.
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    for script in sorted((ROOT / "examples").glob("*.py")):
        first = script.read_text(encoding="utf-8").splitlines()[0]
        assert first in text, f"{script.name}'s source is not on the examples page"
    assert "--8<--" not in text


def test_strict_mode_fails_on_a_broken_link_and_a_missing_reference(tmp_path):
    """The site's own configuration, on a page with one broken link and one unresolved reference."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(
        "# Broken\n\nSee [the guide](no_such_page.md) and [langtorch.NoSuchSymbol][].\n", encoding="utf-8")
    config["docs_dir"] = str(docs)
    config["nav"] = [{"Home": "index.md"}]
    python = next(p for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    handler = python["mkdocstrings"]["handlers"]["python"]
    handler["paths"] = [str(ROOT)]
    handler["options"]["extensions"] = [str(ROOT / e) for e in handler["options"]["extensions"]]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    proc, _, _ = _mkdocs(path, tmp_path / "site")
    assert proc.returncode != 0
    assert "no_such_page.md" in proc.stderr
    assert "langtorch.NoSuchSymbol" in proc.stderr


# --- the home page in a real browser --------------------------------------------------------------

def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("Chromium is not installed (apt-get install chromium); CI runs this test")


def _browser(tmp_path, *args):
    return subprocess.run(
        [_chromium(), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", *args],
        capture_output=True, text=True, timeout=120)


def _check_home_screenshot(png: pathlib.Path) -> None:
    """Not blank, the material header bar at the top, and the site title drawn on it in light text."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    assert image.size == WINDOW, image.size
    pixels = image.load()
    width, height = image.size
    colours = {pixels[x, y] for x in range(0, width, 4) for y in range(0, height, 4)}
    assert len(colours) > 50, f"the page looks blank ({len(colours)} colours)"
    # The header bar: the theme's primary colour across the top (sampled right of the title).
    bar = pixels[width - 300, 20]
    assert bar[2] > bar[0] + 60 and bar[2] > 150, f"no header bar at the top: {bar}"
    assert all(pixels[x, y] == bar for x in range(width // 2, width - 40, 16) for y in (4, 24, 44))
    # The title: light pixels on the bar where the header's title is (left third, within the bar).
    light = sum(1 for x in range(60, width // 3) for y in range(6, 42)
                if min(pixels[x, y]) > 200)
    assert light > 60, f"no title drawn on the header bar ({light} light pixels)"
    # The page's heading: dark text below the header, in the content column.
    dark = sum(1 for x in range(width // 4, 3 * width // 4) for y in range(90, 150)
               if max(pixels[x, y]) < 120)
    assert dark > 200, f"no page heading drawn ({dark} dark pixels)"


def test_home_page_renders_in_chromium(site, tmp_path):
    site_dir, proc, _, _ = site
    assert proc.returncode == 0, proc.stderr[-4000:]
    home = (site_dir / "index.html").as_uri()
    dom = _browser(tmp_path, "--dump-dom", home)
    assert dom.returncode == 0, dom.stderr[-2000:]
    title = re.search(r'<div class="md-header__topic">\s*<span class="md-ellipsis">\s*([^<]+?)\s*</span>',
                      dom.stdout)
    assert title and title.group(1) == "langtorch", "the site title is not in the header"
    assert "langtorch — the whole library in one read" in re.sub(r"<[^>]+>", "", dom.stdout)

    shot = tmp_path / "home.png"
    run = _browser(tmp_path, f"--screenshot={shot}", home)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    _check_home_screenshot(shot)
    if os.environ.get("LANGTORCH_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)


def test_checked_in_screenshot_is_the_home_page_and_the_readme_shows_it():
    # Refresh it with: LANGTORCH_UPDATE_SCREENSHOT=1 python -m pytest tests/langtorch/test_docs_site.py
    pytest.importorskip("PIL", reason="pillow is in the test extra: pip install -e '.[test]'")
    _check_home_screenshot(SCREENSHOT)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/site_home.png)" in readme
    assert "mkdocs serve" in readme


# --- what the pages say ---------------------------------------------------------------------------

def _guides():
    # architecture.md is the contributors' page (package order, internal names): not a user guide.
    return {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))
            if p.name != "architecture.md"}


def test_guides_speak_to_users():
    notes = re.compile(r"seed article|seed pipeline|\bissue\b|\bthe lead\b|\bgoals? (?:of|is|are|missed)",
                       re.IGNORECASE)
    found = [f"{name}: {m.group(0)!r}" for name, text in _guides().items() for m in notes.finditer(text)]
    assert found == [], "internal notes in the user docs: " + "; ".join(found)


def test_what_is_not_supported_is_documented_where_users_look():
    guides = _guides()
    section = guides["local_models.md"].split("### What is not supported yet", 1)
    assert len(section) == 2, "local_models.md has no 'What is not supported yet' section"
    body = section[1].split("\n## ", 1)[0]
    # What is still missing on the local engine (structured output, logprobs and tools are
    # supported since issue 21; the section says what is left of them).
    for needle in ("Other models", "models.md", "tool-call formats", "logprobs"):
        assert needle in body, needle
    assert "local_models.md#what-is-not-supported-yet" in guides["index.md"]


def test_optimization_guide_shows_offline_optimisation_with_local_classifier():
    text = _guides()["optimization.md"]
    section = text.split("## Offline, with a small local model: `lt.nn.LocalClassifier`", 1)
    assert len(section) == 2
    code = section[1].split("```python", 1)[1].split("```", 1)[0]
    assert "lt.nn.LocalClassifier(" in code and "lt.optim.Search(" in code
    compile(code, "optimization.md", "exec")  # the example is valid Python as printed


# Each measured line of docs/bench_results_2026-12-01.jsonl, and the figures of it the benchmarks
# page states (as printed there), including those where langtorch is slower than the peer.
MEASURED = {
    "embed": [("ours_fp32_sentences_per_s", "{:.1f}"), ("peer_fp32_sentences_per_s", "{:.1f}"),
              ("ours_bf16_sentences_per_s", "{:.1f}"), ("peer_bf16_sentences_per_s", "{:.1f}"),
              ("ratio_fp32_vs_peer_fp32", "{:.2f} (slower)"), ("ratio_bf16_vs_peer_bf16", "{:.2f} (slower)")],
    "generate": [("ours_batched_tok_s", "{:.1f}"), ("peer_batched_default_fp32_tok_s", "{:.1f}"),
                 ("peer_batched_best_tok_s", "{:.1f}"), ("ours_single_tok_s", "{:.1f}"),
                 ("peer_single_best_tok_s", "{:.1f}"), ("llama_cpp_single_tok_s", "{:.1f}"),
                 ("ratio_batched_vs_default", "{:.2f} (slower)"), ("ratio_batched_vs_best", "{:.2f} (slower)"),
                 ("ratio_single_vs_llama_cpp", "{:.2f} (slower)")],
    "prompt_tuning": [("ours_float32_s", "{:.3f} s"), ("peft_float32_s", "{:.3f} s"),
                      ("ours_bfloat16_s", "{:.3f} s"), ("peft_bfloat16_s", "{:.3f} s"),
                      ("ratio_fp32", "{:.2f} (slower)"), ("ratio_bf16", "{:.2f} (slower)")],
    "serve": [("served.tokens_per_s", "{:.1f}"), ("in_process.tokens_per_s", "{:.1f}"),
              ("llama_cpp_server.tokens_per_s", "{:.1f}"), ("served_vs_llama_cpp", "{:.1f}x")],
    "serving_local": [("throughput_tok_s", "{:.1f}"), ("short_p50_latency_s", "{:.1f} s")],
    "serving_local_baseline": [("throughput_tok_s", "{:.1f}"), ("short_p50_latency_s", "{:.1f} s")],
    "scaling": [("embed_s.1x1", "{:.3f} s"), ("embed_s.2x1", "{:.3f} s"),
                ("embed_efficiency_2dev", "{:.3f}"), ("tune_efficiency_2dev", "{:.3f}")],
}


def test_benchmarks_page_states_the_measured_lines():
    import json

    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    lines = (ROOT / "docs" / "bench_results_2026-12-01.jsonl").read_text(encoding="utf-8").splitlines()
    runs = {rec["run"]: rec for rec in map(json.loads, filter(None, lines))}
    assert set(runs) == set(MEASURED), "a measured run is not on the benchmarks page (or is gone)"
    missing = []
    for run, figures in MEASURED.items():
        for field, fmt in figures:
            value = runs[run]
            for key in field.split("."):
                value = value[key]
            if fmt.format(value) not in page:
                missing.append(f"{run}.{field} = {fmt.format(value)!r}")
    assert missing == [], "figures of the measured lines missing from docs/benchmarks.md: " + ", ".join(missing)


def test_readme_links_resolve(site):
    """The README is outside the site (mkdocs' strict mode never sees it): its relative links and
    their anchors are checked here, so a renamed page or heading does not leave it pointing
    nowhere."""
    site_dir, proc, _, _ = site
    assert proc.returncode == 0, proc.stderr[-4000:]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "the README links no local file"
    broken = []
    for link in local:
        path, _, anchor = link.partition("#")
        if not (ROOT / path).exists():
            broken.append(link)
        elif anchor and path.startswith("docs/") and path.endswith(".md"):
            if f'id="{anchor}"' not in _page(site_dir, path[len("docs/"):]):
                broken.append(link)
    assert broken == [], f"README links that lead nowhere: {broken}"
