"""GCG token search on a tiny random Llama: gradients, batched scoring, search, bad input.

References are written independently of the batched code: one unpadded example at a time through
``llama.forward`` with ``arange`` positions and an all-ones mask, so a wrong left-padding mask, a
wrong slot column or non-uniformly wrong positions in the batched layout show up as a mismatch.
"""

import doctest
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import token_search as ts
from langtorch.functional.models import llama

V = 64
CFG = llama.LlamaConfig(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=8, intermediate_size=64, max_positions=128)
LABELS = [4, 5, 6]
FWD = jax.jit(functools.partial(llama.forward, config=CFG))


@pytest.fixture(scope="module")
def params():
    return llama.random_params(jax.random.key(0), CFG)


@pytest.fixture(scope="module")
def task():
    """Per-example prefixes (one empty) and suffixes of different lengths, and targets."""
    rng = np.random.default_rng(0)
    prefixes = [[1, 2], [3], [], [7, 8, 9]]
    suffixes = [list(rng.integers(10, V, n)) for n in (3, 1, 2, 4)]
    targets = [0, 2, 1, 1]
    return prefixes, suffixes, targets


def _batch(task, num_slots, **kw):
    prefixes, suffixes, targets = task
    return ts.make_slot_batch(prefixes, suffixes, targets=targets, label_ids=LABELS,
                              num_slots=num_slots, **kw)


def _ref_parts(params, task, slot_embeds, slot_target):
    """(task loss, fluency) one example at a time; ``slot_target`` [S, V] weights the slot tokens'
    log-probabilities (a one-hot row reads the token's own log-probability)."""
    prefixes, suffixes, targets = task
    table = params["embed"]
    s = slot_embeds.shape[0]
    ces, nlls = [], []
    for pre, suf, tgt in zip(prefixes, suffixes, targets):
        emb = jnp.concatenate([table[jnp.array(pre, jnp.int32)].reshape(-1, table.shape[1]),
                               slot_embeds, table[jnp.array(suf, jnp.int32)]])[None]
        n = emb.shape[1]
        logits, _ = FWD(params, None, jnp.arange(n)[None], jnp.ones((1, n), jnp.int32),
                        inputs_embeds=emb)
        ces.append(-jax.nn.log_softmax(logits[0, -1, jnp.array(LABELS)])[tgt])
        logp = jax.nn.log_softmax(logits[0], axis=-1)
        for k in range(s):
            if len(pre) + k >= 1:  # slot token k is predicted from the column before it
                nlls.append(-jnp.dot(logp[len(pre) + k - 1], slot_target[k]))
    return jnp.mean(jnp.stack(ces)), jnp.mean(jnp.stack(nlls))


def test_examples_in_docstrings_run():
    result = doctest.testmod(importlib.import_module("langtorch.functional.token_search"),
                             optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_batch_layout_is_left_padded_with_slot_columns(task):
    b = _batch(task, 2, length=12, batch_size=6)
    prefixes, suffixes, _ = task
    assert b.ids.shape == (6, 12) and b.slot_pos.shape == (6, 2)
    for r, (pre, suf) in enumerate(zip(prefixes, suffixes)):
        n = len(pre) + 2 + len(suf)
        assert b.mask[r].tolist() == [0] * (12 - n) + [1] * n
        assert b.ids[r, 12 - n:].tolist()[:len(pre)] == pre
        assert b.ids[r, 12 - len(suf):].tolist() == suf
        assert b.slot_pos[r].tolist() == [12 - n + len(pre), 12 - n + len(pre) + 1]
    assert b.weight.tolist() == [1, 1, 1, 1, 0, 0]
    # Default length: a bucket of the generation engine (longest row is 3 + 2 + 4 = 9 tokens).
    assert _batch(task, 2).ids.shape[1] == 16


def test_slot_gradients_match_reference_and_embedding_chain_rule(params, task):
    slot = jnp.array([11, 12, 13])
    b = _batch(task, 3, batch_size=6)  # padding rows must not count
    loss, grad = ts.slot_gradients(params, b, slot, config=CFG)
    table = params["embed"]

    def ref_task(e):
        return _ref_parts(params, task, e, jax.nn.one_hot(slot, V))[0]

    ref_loss, g_embeds = jax.jit(jax.value_and_grad(ref_task))(table[slot])
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    # d loss / d one_hot = d loss / d embeds @ E.T (the slot enters as one_hot @ E).
    np.testing.assert_allclose(grad, g_embeds @ table.T, atol=1e-6)


def test_slot_gradients_with_fluency_match_reference(params, task):
    slot = jnp.array([20, 21])
    w = 0.3
    loss, grad = ts.slot_gradients(params, _batch(task, 2), slot, config=CFG, fluency_weight=w)

    def ref_total(onehot):
        t, f = _ref_parts(params, task, onehot @ params["embed"], onehot)
        return t + w * f

    ref_loss, ref_grad = jax.jit(jax.value_and_grad(ref_total))(jax.nn.one_hot(slot, V))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-6)


def test_composes_under_jit_and_vmap(params, task):
    b = _batch(task, 2)
    slots = jnp.array([[11, 12], [13, 14]])
    loss, grad = ts.slot_gradients(params, b, slots[0], config=CFG)
    f = jax.jit(lambda s: ts.slot_gradients(params, b, s, config=CFG))
    np.testing.assert_allclose(f(slots[0])[1], grad, atol=1e-7)
    many = jax.vmap(lambda s: ts.slot_gradients(params, b, s, config=CFG)[0])(slots)
    np.testing.assert_allclose(many, ts.score_candidates(params, b, slots, config=CFG).total,
                               rtol=1e-5)


def test_gradient_predicts_single_token_swaps(params, task):
    """The linearisation ranks swaps: predicted and true loss changes are well correlated."""
    slot = jnp.array([30, 31, 32])
    b = _batch(task, 3)
    loss, grad = ts.slot_gradients(params, b, slot, config=CFG)
    cands, pred = [], []
    for s in range(3):
        for v in range(V):
            c = np.asarray(slot).copy()
            c[s] = v
            cands.append(c)
            pred.append(float(grad[s, v] - grad[s, slot[s]]))
    true = np.asarray(ts.score_candidates(params, b, jnp.array(cands), config=CFG).total - loss)
    assert np.corrcoef(pred, true)[0, 1] > 0.5


def test_score_candidates_equal_one_at_a_time_reference(params, task):
    rng = np.random.default_rng(1)
    cands = jnp.asarray(rng.integers(0, V, (5, 3)), jnp.int32)
    b = _batch(task, 3, batch_size=5)
    w = 0.7
    got = ts.score_candidates(params, b, cands, config=CFG, fluency_weight=w, chunk_size=2)
    for i, c in enumerate(cands):
        t, f = _ref_parts(params, task, params["embed"][c], jax.nn.one_hot(c, V))
        np.testing.assert_allclose(got.task[i], t, rtol=1e-5)
        np.testing.assert_allclose(got.fluency[i], f, rtol=1e-5)
        np.testing.assert_allclose(got.total[i], t + w * f, rtol=1e-5)
    # Chunking and the fluency switch change nothing about the task loss.
    plain = ts.score_candidates(params, b, cands, config=CFG)
    np.testing.assert_allclose(plain.task, got.task, rtol=1e-6)
    np.testing.assert_allclose(plain.total, plain.task)
    assert not np.any(np.asarray(plain.fluency))


def test_reference_is_sensitive_to_the_padding_mask(params, task):
    """Guard on the reference: the padded batch attending to its padding gives other logits, so
    the equality above does test the mask. (A wrong *uniform* position offset per row cannot be
    seen by any test: rotary attention depends on relative positions only.)"""
    b = _batch(task, 3)
    c = jnp.array([40, 41, 42])
    ids = b.ids.at[jnp.arange(b.ids.shape[0])[:, None], b.slot_pos].set(c)
    pos = llama.positions_from_mask(b.mask)
    right, _ = FWD(params, ids, pos, b.mask)
    unmasked, _ = FWD(params, ids, pos, jnp.ones_like(b.mask))
    assert float(jnp.abs(unmasked[:, -1] - right[:, -1]).max()) > 1e-3


def test_candidate_swaps_change_one_position_to_a_shortlisted_allowed_token(params, task):
    slot = jnp.array([11, 12, 13])
    _, grad = ts.slot_gradients(params, _batch(task, 3), slot, config=CFG)
    allowed = np.ones(V, bool)
    allowed[:10] = False
    top_k = 5
    cands = np.asarray(ts.candidate_swaps(grad, slot, jax.random.key(0), top_k=top_k,
                                          num_candidates=40, allowed_mask=allowed))
    assert cands.shape == (40, 3) and cands.dtype == np.int32
    diff = cands != np.asarray(slot)[None]
    assert (diff.sum(1) == 1).all()  # the current token is never re-proposed
    g = np.where(allowed[None], np.asarray(grad), np.inf)
    for c, d in zip(cands, diff):
        s = int(np.argmax(d))
        shortlist = [v for v in np.argsort(g[s]) if v != slot[s]][:top_k]
        assert c[s] in shortlist and allowed[c[s]]
    assert len({int(np.argmax(d)) for d in diff}) == 3  # positions are spread


def test_gradient_shortlist_beats_random_swaps(params, task):
    """Candidates from the gradient shortlist are better on average than uniform swaps."""
    slot = jnp.array([30, 31, 32])
    b = _batch(task, 3)
    loss, grad = ts.slot_gradients(params, b, slot, config=CFG)
    key = jax.random.key(3)
    gcg = ts.candidate_swaps(grad, slot, key, top_k=4, num_candidates=64)
    uniform = ts.candidate_swaps(grad, slot, key, top_k=V, num_candidates=64)
    a = ts.score_candidates(params, b, gcg, config=CFG).total
    r = ts.score_candidates(params, b, uniform, config=CFG).total
    assert float(a.mean()) < float(r.mean()) and float(a.mean()) < float(loss)


def test_token_search_bookkeeping(params, task):
    b = _batch(task, 2, batch_size=6)
    init = jnp.array([50, 51])
    seen = []

    def callback(step, slot_ids, loss):
        seen.append((step, slot_ids.tolist(), loss))

    r = ts.token_search(params, b, init, config=CFG, steps=6, top_k=6, num_candidates=8,
                        key=jax.random.key(0), fluency_weight=0.1, callback=callback)
    hist = r.loss_history
    assert r.steps == 6 and len(hist) == 7 and [s for s, _, _ in seen] == list(range(1, 7))
    assert (np.diff(hist) <= 0).all() and hist[-1] == r.loss < hist[0]
    init_loss, _ = ts.slot_gradients(params, b, init, config=CFG, fluency_weight=0.1)
    np.testing.assert_allclose(hist[0], init_loss, rtol=1e-6)
    again = ts.score_candidates(params, b, jnp.asarray(r.slot_ids)[None], config=CFG,
                                fluency_weight=0.1).total[0]
    np.testing.assert_allclose(r.loss, again, rtol=1e-5)
    moves = int(np.count_nonzero(np.diff(hist) < 0))
    # One gradient for the initial slot, one per move that a later step used.
    assert r.gradient_passes == 1 + moves - (hist[-1] < hist[-2])
    assert r.forward_passes == 4 * (8 * 6 + r.gradient_passes)  # 4 real examples
    assert seen[-1][1] == r.slot_ids.tolist()

    stopped = ts.token_search(params, b, init, config=CFG, steps=6, top_k=6, num_candidates=8,
                              key=jax.random.key(0), callback=lambda step, *_: step == 2)
    assert stopped.steps == 2 and len(stopped.loss_history) == 3
    none = ts.token_search(params, b, init, config=CFG, steps=0, top_k=6, num_candidates=8,
                           key=jax.random.key(0))
    assert none.slot_ids.tolist() == [50, 51] and none.forward_passes == 4


def _planted():
    """A task whose labels are the model's own predictions with a planted key slot.

    The key is the most self-consistent of 100 random slots (lowest loss against its own argmax
    labels), so reaching its loss from another slot takes real search. The weights are scaled
    1.5x so that the slot changes the predicted label of some examples.
    """
    p = llama.random_params(jax.random.key(2), CFG)
    p = jax.tree.map(lambda x: 1.5 * x if x.ndim >= 2 else x, p)
    rng = np.random.default_rng(2)
    n, s = 8, 3
    suffixes = [list(rng.integers(10, V, rng.integers(2, 5))) for _ in range(n)]
    probe = ts.make_slot_batch([1, 2], suffixes, targets=[0] * n, label_ids=LABELS, num_slots=s)
    slots = jnp.asarray(rng.integers(10, V, (100, s)), jnp.int32)

    def label_logits(slot):
        ids = probe.ids.at[jnp.arange(n)[:, None], probe.slot_pos].set(slot)
        logits, _ = llama.forward(p, ids, llama.positions_from_mask(probe.mask), probe.mask,
                                  config=CFG)
        return logits[:, -1][:, jnp.array(LABELS)]

    logits = jax.jit(jax.vmap(label_logits))(slots)
    own = jnp.argmax(logits, -1)
    self_loss = -jnp.take_along_axis(jax.nn.log_softmax(logits), own[..., None], -1).mean((1, 2))
    k = int(jnp.argmin(self_loss))
    targets = np.asarray(own[k])
    batch = ts.make_slot_batch([1, 2], suffixes, targets=targets, label_ids=LABELS, num_slots=s)
    init = jnp.asarray(rng.integers(10, V, s), jnp.int32)
    return p, batch, slots[k], init, targets


def test_planted_key_is_recovered():
    p, batch, key_slot, init, targets = _planted()
    assert len(set(targets.tolist())) > 1  # the labels depend on the example
    key_loss = float(ts.score_candidates(p, batch, key_slot[None], config=CFG).total[0])
    init_loss = float(ts.slot_gradients(p, batch, init, config=CFG)[0])
    assert init_loss > key_loss + 0.2
    r = ts.token_search(p, batch, init, config=CFG, steps=10, top_k=4, num_candidates=16,
                        key=jax.random.key(0))
    assert r.loss <= key_loss + 1e-4 and r.loss < init_loss
    acc = ts.score_candidates(p, batch, jnp.asarray(r.slot_ids)[None], config=CFG).accuracy[0]
    assert float(acc) == 1.0  # every example gets the key's label


def test_planted_key_needs_the_gradient(monkeypatch):
    """Control: with a random gradient (an uninformed shortlist of the same size), the same
    budget does not reach the key's loss, so the test above depends on the gradient guiding the
    shortlist."""
    p, batch, key_slot, init, _ = _planted()
    key_loss = float(ts.score_candidates(p, batch, key_slot[None], config=CFG).total[0])
    real = ts._slot_gradients
    rng = iter(jax.random.split(jax.random.key(123), 1000))

    def random_gradients(*args, **kwargs):
        loss, grad = real(*args, **kwargs)
        return loss, jax.random.normal(next(rng), grad.shape, grad.dtype)

    monkeypatch.setattr(ts, "_slot_gradients", random_gradients)
    r = ts.token_search(p, batch, init, config=CFG, steps=10, top_k=4, num_candidates=16,
                        key=jax.random.key(0))
    assert r.loss > key_loss + 0.05


# ------------------------------------------------------------------------------------ bad input


def test_bad_slot_ids_raise(params, task):
    b = _batch(task, 2)
    with pytest.raises(ValueError, match=r"must lie in \[0, vocab_size=64\), got \[64\]"):
        ts.slot_gradients(params, b, jnp.array([3, 64]), config=CFG)
    with pytest.raises(ValueError, match=r"got \[-1\]"):
        ts.token_search(params, b, [-1, 3], config=CFG, steps=1, top_k=2, num_candidates=2,
                        key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"non-empty 1-d .* got shape \(0,\)"):
        ts.slot_gradients(params, b, jnp.zeros((0,), jnp.int32), config=CFG)
    with pytest.raises(ValueError, match=r"slot of 2 tokens, got `slot_ids` of 3 tokens"):
        ts.slot_gradients(params, b, jnp.array([1, 2, 3]), config=CFG)
    with pytest.raises(ValueError, match="integer token ids"):
        ts.slot_gradients(params, b, jnp.array([1.0, 2.0]), config=CFG)
    with pytest.raises(ValueError, match=r"shape \[C >= 1, S = 2\]"):
        ts.score_candidates(params, b, jnp.zeros((0, 2), jnp.int32), config=CFG)
    with pytest.raises(ValueError, match=r"`candidates` must lie in .* got \[99\]"):
        ts.score_candidates(params, b, jnp.array([[1, 2], [3, 99]]), config=CFG)
    with pytest.raises(ValueError, match="fluency_weight >= 0"):
        ts.score_candidates(params, b, jnp.array([[1, 2]]), config=CFG, fluency_weight=-1.0)
    with pytest.raises(ValueError, match="num_slots >= 1, got 0"):
        _batch(task, 0)
    with pytest.raises(ValueError, match=r"`batch.ids` must lie in \[0, vocab_size=64\)"):
        ts.slot_gradients(params, b._replace(ids=b.ids.at[0, -1].set(70)), jnp.array([1, 2]),
                          config=CFG)
    with pytest.raises(ValueError, match=r"`batch.label_ids` must lie in .* got \[64\]"):
        ts.score_candidates(params, b._replace(label_ids=jnp.array([1, 64])),
                            jnp.array([[1, 2]]), config=CFG)
    with pytest.raises(ValueError, match=r"targets index label_ids, so must lie in \[0, 3\)"):
        ts.make_slot_batch([1], [[2]], targets=[3], label_ids=LABELS, num_slots=1)
    with pytest.raises(ValueError, match="3 per-example lists"):
        ts.make_slot_batch([[1], [2]], [3], targets=[0, 1, 0], label_ids=LABELS, num_slots=1)


def test_bad_search_options_raise(params, task):
    grad = jnp.zeros((2, V))
    slot = jnp.array([1, 2])
    allowed = np.zeros(V, bool)
    allowed[:3] = True
    with pytest.raises(ValueError, match=r"top_k in \[1, 3\] .* got 4"):
        ts.candidate_swaps(grad, slot, jax.random.key(0), top_k=4, num_candidates=2,
                           allowed_mask=allowed)
    with pytest.raises(ValueError, match="num_candidates >= 1, got 0"):
        ts.candidate_swaps(grad, slot, jax.random.key(0), top_k=2, num_candidates=0)
    with pytest.raises(ValueError, match=r"allowed_mask of shape \(64,\)"):
        ts.candidate_swaps(grad, slot, jax.random.key(0), top_k=2, num_candidates=2,
                           allowed_mask=np.ones(10, bool))
    with pytest.raises(ValueError, match=r"slot_ids of shape \(2,\)"):
        ts.candidate_swaps(grad, jnp.array([1]), jax.random.key(0), top_k=2, num_candidates=2)
    b = _batch(task, 2)
    kw = dict(config=CFG, steps=1, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"top_k in \[1, 3\]"):
        ts.token_search(params, b, slot, top_k=5, num_candidates=2, allowed_mask=allowed, **kw)
    with pytest.raises(ValueError, match="num_candidates >= 1, got 0"):
        ts.token_search(params, b, slot, top_k=2, num_candidates=0, **kw)
    with pytest.raises(ValueError, match="steps >= 0"):
        ts.token_search(params, b, slot, top_k=2, num_candidates=2, config=CFG, steps=-1,
                        key=jax.random.key(0))
