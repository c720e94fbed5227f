"""The engine with int8 weights (``quantization="int8"``): what it computes, that a request's
result does not depend on its batch, and the option's plumbing.

The reference for the quantized engine's greedy tokens is transformers' ``generate`` on the
same tiny checkpoint with its weights replaced by ``q * scale`` in torch
(``tests/functional/test_quant.py``).
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional.engine import Sequence, SlotBatch
from langtorch.functional.models import llama, quant

CFG = llama.LlamaConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, intermediate_size=48, max_positions=256)


def _params():
    return llama.random_params(jax.random.key(5), CFG)


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, CFG.vocab_size, int(rng.integers(3, 30))).tolist() for _ in range(n)]


def _run(batch, prompts, max_tokens=12):
    """Each sequence's (token, logprob) pairs (logprobs carry the last bits of the logits)."""
    from tests.langtorch.test_engine_decode_dtype import _run as run

    return run(batch, prompts, max_tokens)


def _close(a, b, atol):
    assert [t for t, _ in a] == [t for t, _ in b]
    np.testing.assert_allclose([lp for _, lp in a], [lp for _, lp in b], atol=atol, rtol=0)


@pytest.mark.parametrize("prefill_dtype,products", [
    (jnp.float32, "int8"), (jnp.bfloat16, "int8"), (jnp.bfloat16, "float")])
def test_a_requests_tokens_do_not_depend_on_its_batch(prefill_dtype, products):
    # The int8 products are exact (tests/functional/test_quant.py checks their bits across
    # row counts); the rest of the step is not bit-stable across slot buckets, and a last-bit
    # change upstream can move an activation's rounding by one int8 step, so logprobs agree
    # to ~1e-5 here, not bit for bit (measured: at most 2e-5; fp32 weights 5e-7; a bf16
    # prefill's activations round to 8 bits: 3e-4).
    qp = quant.quantize_params(_params())
    # products="float": prompt chunks in float products (what the engine picks where int8
    # products are slower at many rows); decode steps stay int8.
    pre = quant.with_products(quant.cast(qp, prefill_dtype), products)
    kw = dict(config=CFG, prefill_params=pre, prefix_cache_tokens=0)
    prompts = _prompts(5)
    target = prompts[2]
    alone = _run(SlotBatch(qp, max_slots=1, **kw), [target])[0]
    assert len(alone) == 12
    tol = 1e-4 if prefill_dtype == jnp.float32 else 2e-3
    _close(_run(SlotBatch(qp, max_slots=8, **kw), prompts)[2], alone, tol)  # 4 others
    _close(_run(SlotBatch(qp, max_slots=2, chunk=1, **kw), prompts[1:3])[1], alone, tol)
    if prefill_dtype != jnp.float32:
        return
    # The float engine with the same (dequantized) weights computes nearly the same thing:
    # quantized activations are kept to ~15 bits per row.
    deq = jax.tree.map(lambda a: a.dequantize() if quant.is_quantized(a) else a, qp,
                       is_leaf=quant.is_quantized)
    ref = _run(SlotBatch(deq, config=CFG, prefill_params=quant.cast(deq, prefill_dtype),
                         max_slots=1, prefix_cache_tokens=0), [target])[0]
    _close(alone, ref, 2e-3)


def test_prefix_cache_hits_equal_misses_with_int8_weights():
    qp = quant.quantize_params(_params())
    system = _prompts(1, seed=3)[0] * 3  # > one 16-token block
    prompts = [system + p for p in _prompts(4, seed=4)]
    kw = dict(config=CFG, prefill_params=qp, prefill_chunk=16)
    cold = _run(SlotBatch(qp, prefix_cache_tokens=0, **kw), prompts)
    b = SlotBatch(qp, prefix_cache_tokens=1024, **kw)
    _run(b, prompts[:1])
    # Tokens equal; logprobs to ~1e-5 (see the batch test above: a hit changes which chunks
    # are prefilled together).
    for got, want in zip(_run(b, prompts), cold):
        _close(got, want, 1e-4)
    assert b.stats()["prefix_cache"]["hits"] > 0


def _model(params, **attrs):
    return types.SimpleNamespace(params=params, config=CFG, eos_id=0, decode=lambda ids: "",
                                 **attrs)


def test_engine_quantizes_once_and_shares_int8_storage_between_dtypes():
    from langtorch.models import Engine, EngineOptions, engine_for

    m = _model(_params())
    eng = Engine(m, max_slots=4, prefill_dtype="bfloat16", quantization="int8")
    dec, pre = eng.batch.params, eng.batch.prefill_params
    assert quant.is_quantized(dec["layers"][0]["wqkv"]) and dec["embed"].dtype == jnp.float32
    assert pre["embed"].dtype == jnp.bfloat16
    assert pre["layers"][0]["w_gate_up"].q is dec["layers"][0]["w_gate_up"].q  # one int8 copy
    # A second engine of the model reuses the quantized weights (quantized once per model).
    again = Engine(m, max_slots=8, prefill_dtype=None, quantization="int8")
    assert again.batch.params["embed"].q is dec["embed"].q
    # The float engine is untouched by it, and engine_for keeps them apart.
    plain = Engine(m, max_slots=4, prefill_dtype=None)
    assert not quant.is_quantized(plain.batch.params["embed"])
    assert engine_for(m, quantization="int8") is not engine_for(m)
    assert EngineOptions.of(_model(_params(), quantization="int8")).quantization == "int8"
    with pytest.raises(ValueError, match="quantization"):
        EngineOptions(quantization="int4")
    with pytest.raises(ValueError, match="quantization"):
        Engine(m, quantization="fp8")


def test_decode_by_shape_probes_the_quantized_layer(monkeypatch):
    from langtorch.models import Engine
    from langtorch.models import _engine as M

    seen = []
    monkeypatch.setattr(M, "bf16_decode_wins", lambda layer, config, rows, **kw: (
        seen.append(quant.is_quantized(layer["wqkv"])), rows >= 2)[1])
    eng = Engine(_model(_params()), max_slots=4, prefill_dtype="bfloat16",
                 decode_dtype="by_shape", quantization="int8")
    assert seen and all(seen)
    assert eng.batch.wide_rows == 2
    assert eng.batch.wide_params["embed"].q is eng.batch.params["embed"].q
    monkeypatch.undo()  # the real probe runs on a quantized layer
    assert isinstance(M.bf16_decode_wins(eng.batch.params["layers"][0], CFG, 2, context=16),
                      bool)


def test_local_backend_smollm2_and_serve_take_quantization():
    from langtorch.backends import LocalBackend
    from langtorch.models import SmolLM2
    from langtorch.serve._cli import parser

    with pytest.raises(ValueError, match="quantization"):
        LocalBackend(quantization="int4")
    with pytest.raises(ValueError, match="quantization"):
        SmolLM2(quantization="q4")  # refused before any weights load
    # Answers differ with the weights: cached answers of the two never cross.
    assert LocalBackend()._model_tag != LocalBackend(quantization="int8")._model_tag
    extra = dict(encode=lambda text: [1], apply_chat_template=lambda msgs, **kw: "")
    plain, q8 = _model(_params(), **extra), _model(_params(), quantization="int8", **extra)
    assert LocalBackend(plain)._model_tag != LocalBackend(q8)._model_tag
    assert parser().parse_args(["serve", "--quantization", "int8"]).quantization == "int8"
    assert parser().parse_args(["serve"]).quantization is None
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--quantization", "int4"])


def test_quantized_engine_greedy_equals_transformers_with_quantized_weights(tmp_path):
    torch = pytest.importorskip("torch")
    import langtorch.models as M
    from tests.functional.test_decoder_archs import make_checkpoint
    from tests.functional.test_quant import _torch_quantized

    ref = _torch_quantized(make_checkpoint(tmp_path, "llama_tied"))
    lm = M.load(tmp_path)
    eng = M.Engine(lm, max_slots=2, prefill_dtype="float32", quantization="int8")
    rng = np.random.default_rng(1)
    prompts = [[int(x) for x in rng.integers(7, 290, size=n)] for n in (5, 30)]
    toks = [[int(t) for t in s.tokens] for s in _seqs(eng, prompts)]
    for p, t in zip(prompts, toks):
        with torch.no_grad():
            out = ref.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False,
                               eos_token_id=1, pad_token_id=2)
        assert t == out[0, len(p):].tolist()


def _seqs(eng, prompts):
    import threading

    seqs = [Sequence(list(p), max_tokens=12) for p in prompts]
    done = threading.Event()
    n = [0]

    def fin(*_):
        n[0] += 1
        if n[0] == len(seqs):
            done.set()

    for s in seqs:
        eng.submit([s], on_done=fin, on_error=lambda e: done.set())
    assert done.wait(300)
    return seqs
