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
    assert LocalBackend().cache_namespace == "LocalBackend"
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
    np.testing.assert_allclose(got, at[:, labels], rtol=1e-4, atol=1e-5)
    # ... and so the classifier's log-softmax over the labels is transformers' too.
    ls = lambda z: z - np.log(np.exp(z).sum(-1, keepdims=True))  # noqa: E731
    np.testing.assert_allclose(ls(got), ls(at[:, labels]), atol=1e-5)
    # The cap bites: uncapped label logits would be far from transformers'.
    uncapped = decoder.DecoderConfig(**{**lm.config._asdict(), "final_softcap": None})
    raw = np.asarray(label_logits(empty, {"model": lm.params, "label_ids": jnp.asarray(labels)},
                                  {"ids": ids, "mask": mask, "index": index}, config=uncapped))
    assert np.abs(raw - at[:, labels]).max() > 0.05 and np.abs(at).max() <= 0.05
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
