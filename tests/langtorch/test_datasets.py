"""The bundled sentiment set: size, balance, variety, deterministic disjoint splits."""

import collections
import subprocess
import sys

import pytest

from langtorch.datasets import SENTIMENT_LABELS, load_sentiment


def test_sizes_balance_and_disjoint_splits():
    seen = {}
    for split in ("train", "val", "test"):
        texts, labels = load_sentiment(split)
        assert texts.shape == labels.shape and texts.ndim == 1
        counts = collections.Counter(labels.tolist())
        assert set(counts) == set(SENTIMENT_LABELS)
        assert abs(counts["positive"] - counts["negative"]) <= 1
        seen[split] = set(texts.tolist())
        assert len(seen[split]) == len(texts)  # no duplicates
    assert not (seen["train"] & seen["val"]) and not (seen["train"] & seen["test"])
    assert not (seen["val"] & seen["test"])
    texts, labels = load_sentiment("all")
    assert len(texts) >= 400 and len(set(texts.tolist())) == len(texts)
    assert sum(map(len, seen.values())) == len(texts)


def test_domains_and_phenomena_are_covered():
    texts, labels = load_sentiment("all")
    domains = collections.Counter(zip(texts.metadata["domain"].tolist(), labels.tolist()))
    for d in ("products", "food", "travel", "media", "services"):
        for lab in SENTIMENT_LABELS:
            assert domains[(d, lab)] >= 35
    lower = [t.lower() for t in texts.tolist()]
    assert sum(("not " in t or "n't" in t or "never" in t) for t in lower) >= 40  # negation
    assert sum((" but " in t or " yet " in t) for t in lower) >= 40  # contrast / mixed
    assert sum(t.startswith(("oh ", "wow", "fantastic,")) for t in lower) >= 5  # sarcasm


def test_deterministic_across_processes():
    code = ("from langtorch.datasets import load_sentiment; "
            "print(load_sentiment('test')[0].tolist()[:5])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout
    assert out.strip() == str(load_sentiment("test")[0].tolist()[:5])


def test_texts_are_data_and_bad_split():
    texts, _ = load_sentiment("val")
    assert (texts[:1] + " {x}").tolist()[0].endswith(" {x}")  # data, never parsed as template
    with pytest.raises(ValueError, match="'train', 'val', 'test'"):
        load_sentiment("dev")


@pytest.mark.parametrize("name", ["langtorch.datasets", "langtorch.datasets._sentiment",
                                  "langtorch.tuning", "langtorch.tuning._errors"])
def test_docstring_examples_run_and_public_symbols_have_examples(name):
    import doctest
    import importlib
    import inspect

    module = importlib.import_module(name)
    assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0
    for sym in getattr(module, "__all__", []):
        obj = getattr(module, sym)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert ">>>" in (inspect.getdoc(obj) or ""), f"{name}.{sym} has no example"
