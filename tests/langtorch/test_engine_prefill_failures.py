"""Review regressions for the batched, chunked prefill and the prefix cache (issue 20): a request
that fails while its prompt joins a decode row fails alone; soft prompts never share blocks."""

from __future__ import annotations

import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import engine as E
from langtorch.functional.models import llama

CFG = llama.LlamaConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                        num_kv_heads=1, head_dim=8, intermediate_size=32, max_positions=256)


@pytest.fixture(scope="module")
def model():
    return types.SimpleNamespace(params=llama.random_params(jax.random.key(5), CFG), config=CFG,
                                 eos_id=63, decode=lambda ids: " ".join(map(str, ids)))


class _RaisingMatcher:
    """A grammar matcher whose engine raises when asked for its first mask."""

    words = 2
    error = None

    def fill_bitmask(self, out):
        raise RuntimeError("grammar engine crashed")

    def advance(self, tok):
        return True


def test_a_matcher_that_raises_at_the_first_token_fails_its_request_alone(model):
    from langtorch.models._engine import Engine

    eng = Engine(model, max_slots=4, chunk=4, prefill_dtype=None, prefill_chunk=8)
    want = eng.generate([[5, 6, 7] * 5], max_tokens=6)[0]
    good = E.Sequence([5, 6, 7] * 5, max_tokens=6)
    bad = E.Sequence([5, 6, 7] * 5 + [9], max_tokens=6)
    bad.matcher = _RaisingMatcher()
    out = {}
    events = []
    for name, s in (("good", good), ("bad", bad)):
        done = threading.Event()
        eng.submit([s], on_done=lambda *_, n=name, d=done: (out.setdefault(n, "ok"), d.set()),
                   on_error=lambda e, n=name, d=done: (out.setdefault(n, e), d.set()))
        events.append(done)
    assert all(d.wait(120) for d in events)
    assert out["good"] == "ok", out
    assert isinstance(out["bad"], Exception) and "grammar engine crashed" in str(out["bad"])
    assert model.decode(good.tokens) == want.text
    # The engine and its prefix cache keep serving exactly.
    assert eng.generate([[5, 6, 7] * 5], max_tokens=6)[0] == want
    assert eng.batch.live == []


def test_soft_prompts_never_share_prefix_blocks(model):
    # The keys/values of a prompt behind a soft prompt differ from the same tokens alone (and
    # from the same tokens behind another soft prompt): no block may be shared between them.
    # (Compared on the logprobs: this random model's greedy tokens ignore the soft prompt.)
    ids = [(3 * i) % 60 + 1 for i in range(40)]  # five blocks of 8
    p1 = np.random.default_rng(0).normal(size=(3, CFG.hidden_size)).astype(np.float32)
    p2 = np.random.default_rng(1).normal(size=(3, CFG.hidden_size)).astype(np.float32)

    def batch(cache):
        return E.SlotBatch(model.params, config=CFG, max_slots=2, chunk=4,
                           kv_dtype=jnp.float32, prefill_chunk=8, prefix_cache_tokens=cache)

    def run(b, prefix):
        s = b.run([E.Sequence(ids, max_tokens=4, prefix=prefix, top_logprobs=2)])[0]
        return np.array([[lp, *top] for _, lp, _, top in s.logprobs])

    want = [run(batch(0), p) for p in (None, p1, p2)]
    for i in range(3):  # the soft prompts matter here (far more than rounding)
        assert np.abs(want[i] - want[i - 1]).max() > 1e-3
    b = batch(4096)
    for i in (0, 1, 2, 0, 2):
        # Equal up to rounding (the ring position of a row's keys differs between a fresh
        # batch and a used one, which moves the last bits of the attention sums).
        np.testing.assert_allclose(run(b, (None, p1, p2)[i]), want[i], rtol=1e-5, atol=1e-6)
    st = b.stats()["prefix_cache"]
    assert st["hits"] == 4 and st["blocks"] == 5  # only the plain prompt's blocks, reused once


class _LaterRaisingMatcher(_RaisingMatcher):
    """Allows every token, and raises building its third mask (a later token's)."""

    def __init__(self):
        self.calls = 0

    def fill_bitmask(self, out):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("grammar engine crashed later")
        out[:] = -1


def test_a_matcher_that_raises_mid_decode_fails_its_request_alone(model):
    from langtorch.models._engine import Engine

    eng = Engine(model, max_slots=4, chunk=4, prefill_dtype=None, prefill_chunk=8)
    want = eng.generate([[5, 6, 7] * 5], max_tokens=12)[0]
    good = E.Sequence([5, 6, 7] * 5, max_tokens=12)
    bad = E.Sequence([5, 6, 7] * 5 + [9], max_tokens=12)
    bad.matcher = _LaterRaisingMatcher()
    out, events = {}, []
    for name, s in (("bad", bad), ("good", good)):
        done = threading.Event()
        eng.submit([s], on_done=lambda *_, n=name, d=done: (out.setdefault(n, "ok"), d.set()),
                   on_error=lambda e, n=name, d=done: (out.setdefault(n, e), d.set()))
        events.append(done)
    assert all(d.wait(120) for d in events)
    assert out["good"] == "ok", out
    assert isinstance(out["bad"], Exception) and "crashed later" in str(out["bad"])
    assert bad.finish_reason == "error" and bad.matcher.calls == 3
    assert model.decode(good.tokens) == want.text
    assert eng.batch.live == []


def test_cancelled_mid_prefill_then_reset(model):
    # A prompt cancelled while it is still being prefilled leaves the batch (no row, no job);
    # the blocks it computed before stay valid for the next request, and after reset() the
    # batch answers as a fresh one.
    def batch(cache=4096):
        return E.SlotBatch(model.params, config=CFG, max_slots=2, chunk=4,
                           kv_dtype=jnp.float32, prefill_chunk=8, prefix_cache_tokens=cache)

    long_ids = [(5 * i) % 60 + 1 for i in range(50)]
    want_long = batch(0).run([E.Sequence(long_ids, max_tokens=5)])[0].tokens
    want_short = batch(0).run([E.Sequence([4, 5, 6], max_tokens=9)])[0].tokens
    b = batch()
    short, long = E.Sequence([4, 5, 6], max_tokens=9), E.Sequence(long_ids, max_tokens=5)
    b.admit([short, long])
    b.step()
    assert long.slot == -1 and b.stats()["prefilling"] == 1
    b.finish(long, "cancelled")
    assert long.finish_reason == "cancelled" and b.stats()["prefilling"] == 0
    while b.live:
        b.step()
    assert short.tokens == want_short and long.tokens == []
    computed = b.stats()["prefill_tokens"]
    assert b.run([E.Sequence(long_ids, max_tokens=5)])[0].tokens == want_long
    assert b.stats()["prefix_cache"]["hits"] >= 2  # the blocks computed before the cancel
    assert b.stats()["prefill_tokens"] - computed < len(long_ids)
    b.reset()
    assert b.stats()["live"] == 0
    assert b.run([E.Sequence(long_ids, max_tokens=5)])[0].tokens == want_long


def test_logprobs_and_constrained_rows_with_prefix_hits(model):
    class Only:  # a grammar allowing tokens 10..19 only
        words, error = 2, None

        def fill_bitmask(self, out):
            out[:] = 0
            out[0] = sum(1 << i for i in range(10, 20))

        def advance(self, tok):
            return 10 <= tok < 20

    ids = [(11 * i) % 60 + 1 for i in range(40)]
    b = E.SlotBatch(model.params, config=CFG, max_slots=2, chunk=4, kv_dtype=jnp.float32,
                    prefill_chunk=8)

    def run(**kw):
        return b.run([E.Sequence(ids, max_tokens=6, top_logprobs=3, **kw)])[0]

    miss, hit = run(), run()
    assert b.stats()["prefix_cache"]["hits"] == 4
    assert miss.tokens == hit.tokens and miss.logprobs[0] == hit.logprobs[0]  # exact
    np.testing.assert_allclose([x[1] for x in hit.logprobs], [x[1] for x in miss.logprobs],
                               rtol=1e-5)
    s = E.Sequence(ids, max_tokens=6, top_logprobs=3)
    s.matcher = Only()
    got = b.run([s])[0]
    assert b.stats()["prefix_cache"]["hits"] == 8
    assert got.finish_reason == "length" and all(10 <= t < 20 for t in got.tokens)
    assert [t for t, *_ in got.logprobs] == got.tokens


def test_a_callback_that_raises_fails_its_request_alone_and_says_so(model):
    # Review of issue 20: a request whose on_delta raised was cancelled silently — neither
    # on_error nor on_done ever came, so a consumer waiting for either waited forever (the
    # serve stream awaits its queue). It now gets on_error with the exception; the others run.
    from langtorch.models import Engine

    eng = Engine(model, max_slots=2, chunk=3, prefill_chunk=8, prefill_dtype=None)
    outcome = {}
    events = {k: threading.Event() for k in ("bad", "good")}

    def on_delta(i, text):
        raise ValueError("consumer bug")

    def ended(name, what):
        outcome[name] = what
        events[name].set()

    eng.submit([E.Sequence([1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=12)], on_delta=on_delta,
               on_done=lambda p, c: ended("bad", "done"), on_error=lambda e: ended("bad", e))
    good = E.Sequence([1, 2, 3, 4, 5, 6, 7, 8, 10], max_tokens=12)
    eng.submit([good], on_done=lambda p, c: ended("good", "done"),
               on_error=lambda e: ended("good", e))
    assert events["good"].wait(120) and events["bad"].wait(120)
    assert isinstance(outcome["bad"], ValueError) and "consumer bug" in str(outcome["bad"])
    assert outcome["good"] == "done" and eng.stats()["live"] == 0
    again = E.Sequence([1, 2, 3, 4, 5, 6, 7, 8, 10], max_tokens=12)
    events["good"].clear()
    eng.submit([again], on_done=lambda p, c: ended("good", "again"))
    assert events["good"].wait(120) and again.tokens == good.tokens  # the same, alone


@pytest.mark.parametrize("kw,param", [
    (dict(prompts=[[1, 2.5]]), "prompt"), (dict(prompts=[[True]]), "prompt"),
    (dict(prompts=[[1]], max_tokens=2.5), "max_tokens"),
    (dict(prompts=[[1]], max_tokens=True), "max_tokens"),
])
def test_non_integer_ids_and_budgets_are_refused_not_cut(model, kw, param):
    # Review of issue 20: Engine.generate cut max_tokens=2.5 to 2 (and True to 1) before the
    # check saw it, and a prompt id 2.5 or True became token 2 or 1, silently.
    from langtorch.models import Engine

    eng = Engine(model, max_slots=1, prefill_dtype=None)
    with pytest.raises(E.SequenceError) as err:
        eng.generate(**kw)
    assert err.value.param == param
