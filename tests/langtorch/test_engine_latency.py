"""Time to first token: how the engine schedules prefill and decode chunks.

* every prompt waiting at a step advances by one prefill chunk before the next decode chunk
  (a burst of short prompts all join; a long prompt still advances one chunk per step);
* each prefill call's joined sequences are handed over (``on_join``) as soon as that call is
  done, and the engine streams their first tokens before the decode chunk runs;
* a decode chunk is cut to about ``chunk_seconds`` of measured step time, and where chunks end
  does not change the tokens;
* with int8 weights, prompt chunks use float products when the probe says they are faster.

The reference for tokens is the same engine run another way (one request alone, whole chunks).
"""

from __future__ import annotations

import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional.engine import Sequence, SlotBatch
from langtorch.functional.models import llama, quant

CFG = llama.LlamaConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                        num_kv_heads=1, head_dim=8, intermediate_size=32, max_positions=256)


@pytest.fixture(scope="module")
def params():
    return llama.random_params(jax.random.key(3), CFG)


def _model():
    import types

    return types.SimpleNamespace(params=llama.random_params(jax.random.key(0), CFG), config=CFG,
                                 eos_id=63, decode=lambda ids: " ".join(map(str, ids)))


def _prompts(n, lo=3, hi=14, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 64, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def _batch(params, **kw):
    kw = {"config": CFG, "max_slots": 16, "chunk": 4, "kv_dtype": jnp.float32,
          "prefill_chunk": 16, "prefill_rows": 4, "prefix_cache_tokens": 0, **kw}
    return SlotBatch(params, **kw)


def test_a_burst_of_prompts_all_join_before_the_next_decode_chunk(params):
    b = _batch(params)
    seqs = [Sequence(p, max_tokens=6) for p in _prompts(10)]
    b.admit(seqs, prefill=False)
    calls = []
    joined = b.prefill_step(on_join=lambda got: calls.append([id(s) for s in got]))
    # 10 one-chunk prompts, 4 per call: 3 calls, each handed over on its own, in order.
    assert [len(c) for c in calls] == [4, 4, 2] and b.stats()["prefill_calls"] == 3
    assert [i for c in calls for i in c] == [id(s) for s in seqs] == [id(s) for s in joined]
    assert all(len(s.tokens) == 1 and s.slot >= 0 for s in seqs)
    # admit(prefill=True) does the same: every waiting prompt, not only prefill_rows of them.
    b2 = _batch(params)
    more = [Sequence(p, max_tokens=6) for p in _prompts(7, seed=1)]
    b2.admit(more)
    assert all(len(s.tokens) == 1 for s in more)
    # A long prompt advances one chunk per step even beside a burst.
    b3 = _batch(params)
    long = Sequence([(3 * i) % 60 + 2 for i in range(50)], max_tokens=2)  # 4 chunks of 16
    b3.admit([long] + [Sequence(p, max_tokens=20) for p in _prompts(5, seed=2)])
    assert long.slot == -1 and b3.stats()["prefill_tokens"] == 16 + sum(
        map(len, _prompts(5, seed=2)))
    for _ in range(3):
        b3.step()
    assert long.slot >= 0 and len(long.tokens) >= 1


def test_tokens_do_not_depend_on_where_decode_chunks_end(params):
    prompts = _prompts(6, seed=3)
    whole = _batch(params, chunk_seconds=None).run([Sequence(p, max_tokens=11) for p in prompts])
    b = _batch(params, chunk_seconds=1e-9)  # every chunk after the first at a shape: 1 step
    cut = b.run([Sequence(p, max_tokens=11) for p in prompts])
    assert [s.tokens for s in cut] == [s.tokens for s in whole]
    assert all(len(s.tokens) == 11 for s in cut)
    # The step time was measured per shape, and chunks were cut to one step.
    assert any(v for v in b._step_s.values())
    st = b.stats()
    b2 = _batch(params, chunk_seconds=None)
    b2.run([Sequence(p, max_tokens=11) for p in prompts])
    assert st["decode_chunks"] > b2.stats()["decode_chunks"]


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "0.25"])
def test_chunk_seconds_is_checked(params, bad):
    with pytest.raises(ValueError, match="chunk_seconds"):
        _batch(params, chunk_seconds=bad)


@pytest.mark.parametrize("ok", [1e308, np.float32(0.5), np.int64(2)])
def test_chunk_seconds_takes_any_positive_real(params, ok):
    b = _batch(params, chunk=2, chunk_seconds=ok)
    seqs = b.run([Sequence([1, 2, 3], max_tokens=12)])  # several chunks at one shape
    assert len(seqs[0].tokens) == 12 and b.chunk_seconds == float(ok)


def test_the_engine_streams_first_tokens_before_the_decode_chunk(monkeypatch):
    from langtorch.functional import engine as E
    from langtorch.models import Engine
    model = _model()
    eng = Engine(model, max_slots=4, chunk=4, prefill_dtype=None)
    seen, first_at = [], {}
    real = E.SlotBatch.decode_step

    def decode_step(self):
        seen.append(dict(first_at))  # what had been streamed when this chunk started
        return real(self)

    monkeypatch.setattr(E.SlotBatch, "decode_step", decode_step)
    done = threading.Event()
    seq = Sequence([1, 2, 3], max_tokens=8)
    eng.submit([seq], on_delta=lambda i, text: first_at.setdefault(i, len(seen)),
               on_done=lambda *_: done.set(), on_error=lambda e: done.set())
    assert done.wait(120)
    assert 0 in first_at and first_at[0] == 0  # streamed before the first decode chunk
    assert seen and seen[0] == {0: 0}


@pytest.mark.parametrize("int8_wins", [True, False])
def test_int8_prompt_chunks_use_the_products_the_cpu_rule_picks(monkeypatch, int8_wins):
    import langtorch.models._engine as EM

    monkeypatch.setattr(EM, "cpu_flags", lambda: frozenset({"avx512f", "amx_int8"} if int8_wins
                                                           else {"avx512f", "avx512_vnni"}))
    monkeypatch.setattr(EM, "_PROBE", {})
    assert EM.int8_dot_units() is (jax.default_backend() == "cpu" and int8_wins)
    model = _model()
    eng = EM.Engine(model, max_slots=4, chunk=4, prefill_dtype="bfloat16",
                    prefill_rows=2, prefill_chunk=8, quantization="int8")
    assert EM._PROBE == {}  # a rule on the CPU's flags: nothing was timed
    mats = [a for a in quant.leaves(eng.batch.prefill_params["layers"]) if quant.is_quantized(a)]
    want = "int8" if EM.int8_dot_units() else "float"
    assert mats and {a.products for a in mats} == {want} and eng.prefill_products == want
    decode = [a for a in quant.leaves(eng.batch.params["layers"]) if quant.is_quantized(a)]
    assert {a.products for a in decode} == {"int8"}  # decode steps keep int8 products
    # Same storage, and the tokens of the int8 model either way (greedy, tiny model).
    assert mats[0].q is decode[0].q
    got = eng.generate([[1, 2, 3, 4, 5]], max_tokens=6)
    assert len(got) == 1 and got[0].completion_tokens >= 1
    # A float-products tree is never kept as the model's bf16 view: an engine decoding in
    # bf16 gets int8 products.
    other = EM.Engine(model, max_slots=4, chunk=4, prefill_dtype="float32",
                      decode_dtype="bfloat16", quantization="int8")
    assert {a.products for a in quant.leaves(other.batch.params["layers"])
            if quant.is_quantized(a)} == {"int8"}
    assert quant.leaves(other.batch.params["layers"])[0].dtype == jnp.bfloat16


def test_int8_products_probe_answers_per_shape():
    from langtorch.models._engine import _PROBE, int8_products_win

    small = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
                              num_kv_heads=1, head_dim=4, intermediate_size=8)
    a = int8_products_win(small, 4)
    assert isinstance(a, bool) and int8_products_win(small, 4) is a
    assert ("products", 4, 8, 16, "bfloat16", 1.2) in _PROBE
    # An impossible margin keeps int8 (float must be ratio x faster to be chosen).
    assert int8_products_win(small, 4, ratio=1e9) is True
    m = quant.quantize(jnp.ones((8, 12)), transposed=True)
    assert isinstance(int8_products_win(small, 4, matrix=m), bool)
    assert ("products", 4, 8, 12, "bfloat16", 1.2) in _PROBE
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="rows"):
            int8_products_win(small, bad)
    with pytest.raises(ValueError, match="QuantizedMatrix"):
        int8_products_win(small, 4, matrix=jnp.ones((8, 12)))


def test_prefill_dtype_auto_follows_the_cpu_flags_not_a_timing(monkeypatch):
    import langtorch.models._engine as EM

    for flags, bf16 in (({"avx2", "fma"}, False), ({"avx512f", "avx512_bf16"}, True),
                        ({"amx_bf16"}, True), ({"fp", "asimd", "bf16"}, True)):
        monkeypatch.setattr(EM, "cpu_flags", lambda f=frozenset(flags): f)
        want = bf16 or jax.default_backend() != "cpu"
        assert EM.bf16_dot_units() is want
        eng = EM.Engine(_model(), max_slots=2, chunk=4)
        dtypes = {a.dtype for a in quant.leaves(eng.batch.prefill_params)}
        assert dtypes == {jnp.dtype(jnp.bfloat16 if want else jnp.float32)}, (flags, dtypes)


def test_cpu_flags_reads_this_machine():
    from langtorch.models._engine import cpu_flags

    flags = cpu_flags()
    assert isinstance(flags, frozenset) and cpu_flags() is flags  # read once per process
    if os.path.exists("/proc/cpuinfo"):
        assert flags and all(f == f.lower() for f in flags)


def test_a_prompt_chunk_runs_at_the_narrowest_width_that_holds_it(params):
    # prefill_chunk 64: widths 16, 32, 48, 64. A 40-token prompt computes 48 positions, a
    # 70-token one 64 + 16; the narrow chunk's block is still 64 wide, so a later prompt sharing
    # the first block finds it in the prefix cache and the tokens match a full-width run.
    rng = np.random.default_rng(5)
    p40, p70 = (rng.integers(1, 63, n).tolist() for n in (40, 70))
    b = _batch(params, prefill_chunk=64, prefill_rows=4, prefix_cache_tokens=1024)
    out40, = b.run([Sequence(p40, max_tokens=8)])
    assert b.stats()["prefill_positions"] == 48
    out70, = b.run([Sequence(p70, max_tokens=8)])
    assert b.stats()["prefill_positions"] == 48 + 64 + 16
    again, = b.run([Sequence(p70[:64] + p40[:10], max_tokens=8)])  # first block from the cache
    assert b.stats()["prefix_cache"]["hits"] == 1
    full = _batch(params, prefill_chunk=64, prefill_rows=4, prefix_cache_tokens=1024)
    full._prefill_widths = (64,)  # every chunk computed at the full width
    ref = [full.run([Sequence(p, max_tokens=8)])[0] for p in (p40, p70, p70[:64] + p40[:10])]
    assert [s.tokens for s in (out40, out70, again)] == [s.tokens for s in ref]
    assert full.stats()["prefill_positions"] == 64 * 4


def test_one_prefill_call_runs_one_width(params):
    # A chunk's keys and values can depend on the width it runs at (SmolLM2's bf16 prefill:
    # up to one bf16 ulp between 48 and 64), so prompts of different widths never share a
    # call: a 40-token prompt prefills at 48 whether or not a 70-token one arrives with it.
    rng = np.random.default_rng(6)
    p40, p70, p45 = (rng.integers(1, 63, n).tolist() for n in (40, 70, 45))
    b = _batch(params, prefill_chunk=64, prefill_rows=4)
    seqs = [Sequence(p, max_tokens=6) for p in (p40, p70, p45)]
    b.admit(seqs, prefill=False)
    b.prefill_step()
    # Round 1: the two 48-wide chunks (4-row bucket); round 2: the 64-wide first chunk of p70.
    assert b.stats()["prefill_calls"] == 2
    assert b.stats()["prefill_positions"] == 4 * 48 + 64
    while b.live:
        b.step()
    alone = [_batch(params, prefill_chunk=64, prefill_rows=4).run([Sequence(p, max_tokens=6)])[0]
             for p in (p40, p70, p45)]
    assert [s.tokens for s in seqs] == [s.tokens for s in alone]


def test_a_burst_sizes_the_cache_once(params):
    # 10 prompts prefilled 4 per call: the cache is made with 16 rows at the first join, not
    # grown 4 -> 8 -> 16 (each growth rewrites the whole cache).
    b = _batch(params)
    b.admit([Sequence(p, max_tokens=6) for p in _prompts(10)], prefill=False)
    b.prefill_step()
    assert b.stats()["prefill_calls"] == 3 and b._rows == 16
    assert b.stats()["cache_resizes"] == 0


def test_a_mixed_burst_pads_little(params):
    # 16 chat-sized prompts of four widths: one call per width, each padded to the 8-row bucket
    # (not 16): 8 x (16 + 32 + 48) + 64 = 832 positions, fewer than one 16 x 64 call.
    rng = np.random.default_rng(7)
    lengths = [10] * 5 + [30] * 5 + [40] * 5 + [60]
    b = _batch(params, prefill_chunk=64, prefill_rows=16)
    b.admit([Sequence(rng.integers(1, 63, n).tolist(), max_tokens=2) for n in lengths],
            prefill=False)
    b.prefill_step()
    assert b.stats()["prefill_calls"] == 4
    assert b.stats()["prefill_positions"] == 8 * (16 + 32 + 48) + 64 < 16 * 64


def test_prefill_blocks_says_when_past_blocks_are_not_block_wide(params):
    from langtorch.functional.engine import prefill_blocks

    i32 = lambda *x: jnp.array(x, jnp.int32)  # noqa: E731
    (b0,), _ = prefill_blocks(params, i32([1, 2, 3, 4]), i32(0), i32(4), (), config=CFG)
    with pytest.raises(ValueError, match="past blocks are 4 positions wide"):
        prefill_blocks(params, i32([5, 6]), i32(4), i32(2), (b0,), config=CFG)
    with pytest.raises(ValueError, match="narrower than the chunk"):
        prefill_blocks(params, i32([5, 6]), i32(4), i32(2), (b0,), config=CFG, block=1)
    (b1,), _ = prefill_blocks(params, i32([5, 6]), i32(4), i32(2), (b0,), config=CFG, block=4)
    assert b1.shape[3] == 4 and not np.asarray(b1[:, :, :, 2:]).any()  # zero-padded to 4
