"""Prompt-tuning core on tiny random models: losses, gradients, compiles, NaN guard, decoding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from langtorch.functional import losses as L
from langtorch.functional import prompt_tuning as PT
from langtorch.functional.errors import LangTorchError
from langtorch.functional.models import bert, llama

CFG = llama.LlamaConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2,
                        head_dim=4, intermediate_size=32, max_positions=256)
BCFG = bert.BertConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                       intermediate_size=32, max_positions=128)


@pytest.fixture(scope="module")
def params():
    return llama.random_params(jax.random.key(0), CFG)


def _rows(rng, n, lo, hi):
    return [list(rng.integers(3, CFG.vocab_size, rng.integers(lo, hi + 1))) for _ in range(n)]


def test_causal_lm_loss_matches_manual():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 4, 7)), jnp.float32)
    labels = jnp.array([[-100, 3, 1, -100], [-100, -100, 6, 2]])
    loss, n = L.causal_lm_loss(logits, labels)
    logp = jax.nn.log_softmax(logits, -1)
    manual = -(logp[0, 0, 3] + logp[0, 1, 1] + logp[1, 1, 6] + logp[1, 2, 2]) / 4
    assert int(n) == 4 and abs(float(loss) - float(manual)) < 1e-5


def test_label_logits_equal_full_forward_and_lm_loss_layout(params):
    rng = np.random.default_rng(1)
    prompt = jnp.asarray(rng.normal(size=(3, 16)) * 0.05, jnp.float32)
    ids, mask = PT.pad_rows([[5, 6, 7, 8], [9, 10]], 0, length=6)
    index = jnp.array([3, 1])
    label_ids = jnp.array([11, 12, 13])
    got = L.decoder_label_logits(prompt, {"model": params, "label_ids": label_ids},
                                 {"ids": ids, "mask": mask, "index": index}, config=CFG)
    # Reference: the unpadded rows through the plain forward with the prompt in front.
    fwd = jax.jit(functools.partial(llama.forward, config=CFG))
    for r, n in enumerate([4, 2]):
        emb = jnp.concatenate([prompt, params["embed"][ids[r, :n]]])[None]
        full, _ = fwd(params, None, jnp.arange(3 + n)[None], jnp.ones((1, 3 + n)),
                      inputs_embeds=emb)
        np.testing.assert_allclose(got[r], full[0, -1, label_ids], atol=1e-5)


def _label_reference(params, prompt, rows, labels):
    """``[B, K]`` sums of label-token log-probabilities from scratch: each row + label alone
    (no padding, no batching) through the plain forward with the prompt in front."""
    fwd = jax.jit(functools.partial(llama.forward, config=CFG))
    out = np.zeros((len(rows), len(labels)))
    for r, row in enumerate(rows):
        for k, lab in enumerate(labels):
            seq = jnp.asarray(row + lab)
            emb = jnp.concatenate([prompt, params["embed"][seq]])[None]
            n = emb.shape[1]
            full, _ = fwd(params, None, jnp.arange(n)[None], jnp.ones((1, n)), inputs_embeds=emb)
            logp = np.asarray(jax.nn.log_softmax(full[0].astype(jnp.float32), -1), np.float64)
            start = prompt.shape[0] + len(row) - 1  # the state before the label's first token
            out[r, k] = sum(logp[start + j, t] for j, t in enumerate(lab))
    return out


@pytest.mark.parametrize("p", [0, 3])
def test_multi_token_label_scores_equal_summed_token_logprobs(params, p):
    rng = np.random.default_rng(2)
    prompt = jnp.asarray(rng.normal(size=(p, 16)) * 0.05, jnp.float32)
    rows = [[5, 6, 7, 8], [9, 10], [20, 21, 22, 23, 24]]
    labels = [[11, 12, 13], [14], [15, 16]]
    ids, mask = PT.pad_rows(rows, 0, length=6, batch_size=4)   # one padding row
    batch = {"ids": ids, "mask": mask, "index": np.array([3, 1, 4, 0])}
    frozen = {"model": params, **L.label_token_data(labels)}
    assert frozen["label_ids"].shape == (3, 3)
    want = _label_reference(params, prompt, rows, labels)
    got = np.asarray(L.decoder_label_scores(prompt, frozen, batch, config=CFG))
    assert got.shape == (4, 3)
    np.testing.assert_allclose(got[:3], want, atol=1e-5)
    mean = np.asarray(L.decoder_label_scores(prompt, frozen, batch, config=CFG,
                                             reduction="mean"))
    np.testing.assert_allclose(mean[:3], want / np.array([3, 1, 2]), atol=1e-5)
    # The jitted shared scorer is the same function.
    from langtorch.models import label_logits

    np.testing.assert_allclose(np.asarray(label_logits(prompt, frozen, batch, config=CFG))[:3],
                               want, atol=1e-5)
    with pytest.raises(ValueError, match="reduction 'sum' or 'mean', got 'max'"):
        L.decoder_label_scores(prompt, frozen, batch, config=CFG, reduction="max")


def test_single_token_fast_path_equals_the_teacher_forced_path(params):
    # Single-token labels take the one-state fast path; the same labels forced through the
    # multi-token path ([K, 1] ids) give the same scores, and both are log-probabilities.
    rng = np.random.default_rng(3)
    prompt = jnp.asarray(rng.normal(size=(2, 16)) * 0.05, jnp.float32)
    rows = [[5, 6, 7], [9, 10, 11, 12, 13]]
    ids, mask = PT.pad_rows(rows, 0, length=8)
    batch = {"ids": ids, "mask": mask, "index": np.array([2, 4])}
    fast = {"model": params, **L.label_token_data([[11], [14], [40]])}
    assert fast["label_ids"].shape == (3,)
    forced = {"model": params, "label_ids": jnp.array([[11], [14], [40]]),
              "label_mask": jnp.ones((3, 1), jnp.int32)}
    a = np.asarray(L.decoder_label_scores(prompt, fast, batch, config=CFG))
    b = np.asarray(L.decoder_label_scores(prompt, forced, batch, config=CFG, reduction="mean"))
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(a, _label_reference(params, prompt, rows, [[11], [14], [40]]),
                               atol=1e-5)
    # Same softmax over labels as the raw label-word logits the fast training loss uses.
    raw = np.asarray(L.decoder_label_logits(prompt, fast, batch, config=CFG))
    np.testing.assert_allclose(jax.nn.log_softmax(a, -1), jax.nn.log_softmax(raw, -1), atol=1e-5)
    b2 = dict(batch, target=np.array([0, 2]))
    np.testing.assert_allclose(L.decoder_classification_loss(prompt, fast, b2, config=CFG)[0],
                               L.decoder_classification_loss(prompt, forced, b2, config=CFG)[0],
                               rtol=1e-5)


def test_multi_token_classification_loss_is_cross_entropy_over_label_scores_and_trains(params):
    labels = [[11, 12, 13], [14], [15, 16]]
    rows = [[5, 6, 7, 8], [9, 10]]
    ids, mask = PT.pad_rows(rows, 0, length=6)
    batch = {"ids": ids, "mask": mask, "index": np.array([3, 1]), "target": np.array([0, 2])}
    frozen = {"model": params, **L.label_token_data(labels)}
    prompt = jnp.full((2, 16), 0.01)
    ref = _label_reference(params, prompt, rows, labels)
    logp = ref - np.logaddexp.reduce(ref, axis=1, keepdims=True)
    loss, m = L.decoder_classification_loss(prompt, frozen, batch, config=CFG)
    assert float(loss) == pytest.approx(-(logp[0, 0] + logp[1, 2]) / 2, abs=1e-5)
    assert float(m["accuracy"]) == float(np.mean(ref.argmax(1) == [0, 2]))
    opt = PT.make_optimizer(0.1, total_steps=20, warmup_steps=0)
    step = PT.make_train_step(functools.partial(L.decoder_classification_loss, config=CFG), opt)
    stacked = PT.stack_batches([dict(batch, weight=np.ones(2, np.float32),
                                     active=np.asarray(True))] * 10)
    _, _, metrics = step(prompt, opt.init(prompt), stacked, frozen)
    assert float(metrics["loss"][-1]) < float(metrics["loss"][0])


def test_label_token_data_refuses_an_empty_label():
    with pytest.raises(ValueError, match="non-empty token list per label"):
        L.label_token_data([[3], []])


def test_gradients_only_for_the_prompt(params):
    prompt = jnp.full((2, 16), 0.01)
    ids, mask = PT.pad_rows([[5, 6, 7]], 0, length=4)
    batch = {"ids": ids, "mask": mask, "labels": np.where(mask > 0, ids, -100)}
    loss_fn = functools.partial(L.decoder_lm_loss, config=CFG)
    g = jax.jit(jax.grad(lambda p, f: loss_fn(p, f, batch)[0]))(prompt, {"model": params})
    assert g.shape == prompt.shape and float(jnp.abs(g).sum()) > 0


def test_straight_through_projection_forward_and_backward(params):
    table = params["embed"]
    prompt = table[jnp.array([4, 9])] + 1e-3
    hard = L.straight_through_project(prompt, table)
    np.testing.assert_allclose(hard, table[jnp.array([4, 9])], atol=1e-6)
    assert PT.nearest_tokens(prompt, table).tolist() == [4, 9]
    g = jax.grad(lambda p: jnp.sum(L.straight_through_project(p, table) * 2.0))(prompt)
    np.testing.assert_allclose(g, 2.0 * jnp.ones_like(prompt))


def _classification_batches(rng, rows, batch_size, length):
    ids, mask = PT.pad_rows(rows, 0, length=length, batch_size=batch_size)
    n = len(rows)
    return {"ids": ids, "mask": mask,
            "index": np.array([len(r) - 1 for r in rows] + [0] * (batch_size - n), np.int32),
            "target": rng.integers(0, 2, batch_size).astype(np.int32),
            "weight": np.array([1.0] * n + [0.0] * (batch_size - n), np.float32),
            "active": np.asarray(True)}


def test_no_recompiles_across_50_steps_of_mixed_lengths(params):
    rng = np.random.default_rng(2)
    loss = functools.partial(L.decoder_classification_loss, config=CFG)
    opt = PT.make_optimizer(1e-2, total_steps=50)
    step = PT.make_train_step(loss, opt)
    frozen = {"model": params, "label_ids": jnp.array([3, 4])}
    prompt = jnp.zeros((4, 16))
    state = opt.init(prompt)
    buckets = (16, 32, 48)
    seen = set()
    for i in range(50):
        rows = _rows(rng, int(rng.integers(1, 5)), 2, 45)  # partial batches, lengths 2..45
        length = PT.bucket(max(map(len, rows)), buckets)
        seen.add(length)
        batch = PT.stack_batches([_classification_batches(rng, rows, 4, length)])
        prompt, state, m = step(prompt, state, batch, frozen)
        if i == 20:
            warm = step.num_compiles
    assert step.num_compiles == len(seen) == warm  # one compile per bucket, none after warm-up
    assert step.jitted._cache_size() == len(seen)
    counts = optax.tree_utils.tree_get_all_with_path(state, "count")
    assert [int(c) for _, c in counts] == [50, 50]


def test_inactive_steps_apply_nothing(params):
    loss = functools.partial(L.decoder_classification_loss, config=CFG)
    opt = PT.make_optimizer(1e-2, total_steps=10)
    step = PT.make_train_step(loss, opt)
    frozen = {"model": params, "label_ids": jnp.array([3, 4])}
    rng = np.random.default_rng(3)
    real = _classification_batches(rng, _rows(rng, 2, 3, 8), 2, 16)
    idle = dict(real, active=np.asarray(False))
    prompt = jnp.ones((2, 16)) * 0.1
    a = step(prompt, opt.init(prompt), PT.stack_batches([real, idle]), frozen)
    b = step(prompt, opt.init(prompt), PT.stack_batches([real, real]), frozen)
    c = step(prompt, opt.init(prompt), PT.stack_batches([idle, real]), frozen)
    np.testing.assert_array_equal(a[0], c[0])  # both are exactly one update
    assert not np.allclose(a[0], b[0])
    assert step.num_compiles == 1


def test_nan_guard_raises_and_keeps_the_last_good_state():
    def loss(p, frozen, batch):
        value = jnp.sum((p - 1.0) ** 2)
        return jnp.where(batch["poison"], jnp.nan, value), {}

    opt = optax.adam(0.1)
    step = PT.make_train_step(loss, opt)
    p0 = jnp.zeros(3)
    poison = np.array([False, False, True, False])
    with pytest.raises(PT.NonFiniteLossError, match="step 2 .*non-finite.*last good") as ei:
        step(p0, opt.init(p0), {"poison": poison}, {})
    err = ei.value
    assert isinstance(err, LangTorchError) and err.step == 2
    good_p, good_s, _ = step(p0, opt.init(p0), {"poison": poison[:2]}, {})
    np.testing.assert_array_equal(err.params, good_p)
    np.testing.assert_array_equal(err.opt_state[0].mu, good_s[0].mu)
    assert np.all(np.isfinite(err.params))


def test_optimizer_clips_the_global_norm():
    # Constant schedule, no warm-up: the learning rate is 1 from the first step. Adam normalises
    # one gradient's scale away, so clipping shows in the *second* update: clipped, the
    # gradients [300, 400] and [3, 4] both become [0.3, 0.4] (norm 0.5).
    opt = PT.make_optimizer(1.0, total_steps=100, warmup_steps=0, clip_norm=0.5,
                            schedule="constant")
    grads = [jnp.array([300.0, 400.0]), jnp.array([3.0, 4.0])]

    def run(tx, gs):
        params, state, out = jnp.zeros(2), tx.init(jnp.zeros(2)), []
        for g in gs:
            u, state = tx.update(g, state, params)
            params = optax.apply_updates(params, u)
            out.append(u)
        return out

    got = run(opt, grads)
    clipped = run(optax.adamw(1.0, weight_decay=0.0), [g * 0.5 / jnp.linalg.norm(g)
                                                        for g in grads])
    unclipped = run(optax.adamw(1.0, weight_decay=0.0), grads)
    np.testing.assert_allclose(got[1], clipped[1], rtol=1e-6)
    assert not np.allclose(got[1], unclipped[1], rtol=1e-3)
    assert float(jnp.abs(got[0]).max()) > 0.5  # the first step really moves (lr is not 0)


def test_optimizer_warmup_and_schedules():
    def lrs(**kw):  # plain SGD-like probe: Adam's first update is lr * sign(g)
        opt = PT.make_optimizer(1.0, total_steps=20, clip_norm=1e9, **kw)
        params, state, out = jnp.zeros(1), opt.init(jnp.zeros(1)), []
        for _ in range(20):
            u, state = opt.update(jnp.ones(1), state, params)
            out.append(-float(u[0]))
        return np.array(out)

    warm = lrs(warmup_steps=5)
    assert warm[0] == 0.0 and warm[5] == pytest.approx(1.0, rel=1e-3)  # linear warm-up to peak
    assert warm[-1] < 0.2 and np.all(np.diff(warm[5:]) <= 1e-7)         # cosine decay to 10%
    assert lrs(warmup_steps=0, schedule="constant") == pytest.approx(np.ones(20), rel=1e-3)
    lin = lrs(warmup_steps=0, schedule="linear")
    assert lin[0] == pytest.approx(1.0, rel=1e-3) and lin[10] == pytest.approx(0.5, rel=1e-2)
    with pytest.raises(ValueError, match="schedule"):
        PT.make_optimizer(schedule="exp")


@pytest.mark.parametrize("p", [0, 3])
def test_lm_loss_label_positions_equal_the_full_head(params, p):
    # Reference: the whole sequence through forward + lm_head, the shifted loss over every
    # position (PEFT's layout); ours sends only the label positions through the head.
    rng = np.random.default_rng(7)
    prompt = jnp.asarray(rng.normal(size=(p, 16)) * 0.05, jnp.float32)
    rows = [[5, 6, 7, 8, 9], [10, 11, 12]]
    ids, mask = PT.pad_rows(rows, 0, length=8)
    labels = np.full_like(ids, -100)
    labels[0, 2:5], labels[1, 0:3] = ids[0, 2:5], ids[1, 0:3]  # row 1 labels its first token
    full = {"ids": ids, "mask": mask, "labels": labels}
    pos, valid = PT.label_positions(labels, buckets=(4,))
    assert pos.shape == (2, 4)
    gathered = dict(full, label_positions=pos, label_valid=valid)
    emb, m, positions = L.decoder_inputs(prompt, params["embed"], jnp.asarray(ids),
                                         jnp.asarray(mask))
    logits = llama.forward(params, None, positions, m, inputs_embeds=emb, config=CFG)[0]
    ext = np.concatenate([np.full((2, p), -100), labels], axis=1)
    want, n = L.causal_lm_loss(logits, jnp.asarray(ext))
    for batch in (full, gathered):
        loss, aux = L.decoder_lm_loss(prompt, {"model": params}, batch, config=CFG)
        assert int(aux["tokens"]) == int(n) == (6 if p else 5)
        np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)


def test_generate_with_prompt_matches_naive_greedy(params):
    prompt = jax.random.normal(jax.random.key(5), (3, 16)) * 0.1
    rows = [[5, 6, 7, 8], [9, 10]]
    t = 6
    ids = np.zeros((2, t), np.int32)
    mask = np.zeros((2, t), np.int32)
    for r, row in enumerate(rows):
        ids[r, t - len(row):] = row
        mask[r, t - len(row):] = 1
    got = PT.generate_with_prompt(params, prompt, jnp.asarray(ids), jnp.asarray(mask),
                                  config=CFG, max_new_tokens=5, eos_id=63)
    # Reference: recompute the whole sequence every step, right padded to one fixed length
    # (causal attention: the padding after position n-1 cannot change its logits).
    fwd = jax.jit(lambda e, m: llama.forward(params, None, jnp.arange(e.shape[1])[None], m,
                                             inputs_embeds=e, config=CFG)[0])
    for r, row in enumerate(rows):
        seq = list(row)
        for _ in range(5):
            n = len(seq)
            tok = jnp.asarray(seq + [0] * (12 - n))
            emb = jnp.concatenate([prompt, params["embed"][tok]])[None]
            m = (jnp.arange(15) < 3 + n)[None].astype(jnp.int32)
            nxt = int(jnp.argmax(fwd(emb, m)[0, 3 + n - 1]))
            seq.append(nxt)
            if nxt == 63:
                break
        want = seq[len(row):]
        assert got[r, :len(want)].tolist() == want


def test_encoder_loss_trains_the_prompt():
    bp = bert.random_params(jax.random.key(1), BCFG)
    vecs = jax.random.normal(jax.random.key(2), (2, 16))
    frozen = {"model": bp, "label_vectors": vecs / jnp.linalg.norm(vecs, axis=-1, keepdims=True)}
    ids, mask = PT.pad_rows([[1, 5, 6, 2], [1, 7, 2]], 0, length=8)
    batch = {"ids": ids, "mask": mask, "target": np.array([0, 1], np.int32)}
    loss = functools.partial(L.encoder_classification_loss, config=BCFG)
    opt = PT.make_optimizer(0.05, total_steps=20, warmup_steps=0, schedule="constant")
    step = PT.make_train_step(loss, opt)
    prompt = jnp.zeros((2, 16))
    _, _, m = step(prompt, opt.init(prompt), PT.stack_batches([batch] * 20), frozen)
    assert float(m["loss"][-1]) < float(m["loss"][0])


def test_pad_rows_errors():
    with pytest.raises(ValueError, match="more than length"):
        PT.pad_rows([[1, 2, 3]], 0, length=2)
    with pytest.raises(ValueError, match="batch_size"):
        PT.pad_rows([[1], [2]], 0, batch_size=1)
    assert PT.bucket(600) == 768


@pytest.mark.parametrize("name", ["langtorch.functional.losses",
                                  "langtorch.functional.prompt_tuning",
                                  "langtorch.functional.soft_prompt"])
def test_docstring_examples_run(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 10


def test_no_import_cycle_between_losses_and_prompt_tuning():
    import ast
    import importlib

    for name, other in (("losses", "prompt_tuning"), ("prompt_tuning", "losses")):
        path = importlib.import_module(f"langtorch.functional.{name}").__file__
        tree = ast.parse(open(path).read())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert f"langtorch.functional.{other}" not in imported, (name, other)


def test_mesh_placement_error_names_the_batch_sharding_it_wants():
    # The batch axis of TrainStep batches is axis 1 ([steps, batch, ...]); the placement error
    # used to name P('data', None) (axis 0) as what mesh= asks for.
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np, optax
        from langtorch.functional import prompt_tuning as PT
        loss = lambda p, frozen, b: (jnp.mean((p - b["x"].mean()) ** 2), {})
        opt = optax.sgd(0.1)
        step = PT.make_train_step(loss, opt, mesh="auto")
        x = jax.device_put(np.ones((1, 2, 3), np.float32), jax.devices()[1])
        try:
            step(jnp.zeros(3), opt.init(jnp.zeros(3)), {"x": x}, {})
        except ValueError as e:
            print("ERR", e)
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ERR batches: the array is explicitly placed with SingleDeviceSharding" in out.stdout
    assert "asks for NamedSharding(spec=P(None, 'data', None)" in out.stdout, out.stdout



def test_shard_frozen_without_a_mesh_is_refused():
    # It was silently ignored (the weights stayed unsplit).
    with pytest.raises(ValueError, match="shard_frozen: needs mesh="):
        PT.make_train_step(lambda p, f, b: (jnp.sum(p), {}), optax.sgd(0.1), shard_frozen=True)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_token_cross_entropy_gradients_equal_autodiff_of_log_softmax(softcap):
    # The loss has its own VJP (softmax - onehot in one pass); the reference differentiates
    # the plain log-softmax formula. Ignored targets get no gradient; the weights still get
    # theirs (the VJP is not specialised to the prompt).
    cfg = CFG._replace(final_softcap=softcap)
    rng = np.random.default_rng(3)
    hidden = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32)
    embed = jnp.asarray(rng.normal(size=(64, 16)) * 0.3, jnp.float32)
    target = jnp.array([[1, 7, -100, 63, 0], [-100, -100, 5, 5, 9]])

    def ref(h, e):
        logits = h @ e.T
        if softcap:
            logits = jnp.tanh(logits / softcap) * softcap
        logp = jax.nn.log_softmax(logits, -1)
        valid = target != -100
        nll = -jnp.take_along_axis(logp, jnp.where(valid, target, 0)[..., None], -1)[..., 0]
        return jnp.where(valid, nll, 0.0).sum() / valid.sum()

    def ours(h, e):
        return L.token_cross_entropy({"embed": e}, h, target, config=cfg)[0]

    want, (wh, we) = jax.value_and_grad(ref, argnums=(0, 1))(hidden, embed)
    got, (gh, ge) = jax.jit(jax.value_and_grad(ours, argnums=(0, 1)))(hidden, embed)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gh), np.asarray(wh), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(ge), np.asarray(we), rtol=1e-5, atol=1e-7)
    assert float(jnp.abs(gh[0, 2]).max()) == 0.0  # an ignored position


def test_bf16_lm_loss_runs_the_layers_unrolled_with_the_scans_numbers():
    # XLA:CPU upcasts the dynamic slices of stacked bf16 arrays under lax.scan (every stacked
    # weight converted to f32 on every step), so the loss runs bf16 layers unrolled: same
    # loss and prompt gradient as the scanned forward, and no f32 copy of a stacked weight.
    cfg = CFG._replace(num_layers=4)
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16),
                          llama.random_params(jax.random.key(1), cfg))
    rng = np.random.default_rng(4)
    prompt = jnp.asarray(rng.normal(size=(3, 16)) * 0.1, jnp.float32)
    ids, mask = PT.pad_rows([[5, 6, 7, 8, 9], [10, 11, 12]], 0, length=8)
    labels = np.where(mask > 0, ids, -100)
    batch = {"ids": ids, "mask": mask, "labels": labels}

    def ref(p):  # the scanned forward (stacked weights) and the full-vocabulary loss
        emb, m, positions = L.decoder_inputs(p, params["embed"], jnp.asarray(ids),
                                             jnp.asarray(mask))
        logits = llama.forward(params, None, positions, m, inputs_embeds=emb, config=cfg)[0]
        ext = np.concatenate([np.full((2, 3), -100), labels], axis=1)
        return L.causal_lm_loss(logits, jnp.asarray(ext))[0]

    def ours(p, f):
        return L.decoder_lm_loss(p, f, batch, config=cfg)[0]

    want, wg = jax.jit(jax.value_and_grad(ref))(prompt)
    step = jax.jit(jax.value_and_grad(ours))
    got, gg = step(prompt, {"model": params})
    np.testing.assert_allclose(float(got), float(want), rtol=1e-2)
    np.testing.assert_allclose(np.asarray(gg), np.asarray(wg), rtol=0.1,
                               atol=0.05 * float(jnp.abs(wg).max()))
    text = step.lower(prompt, {"model": params}).compile().as_text()
    entry = text[text.index("\nENTRY"):]  # the top-level program (the last computation)
    # No whole stacked w_gate / w_up converted to f32 (inside a fusion, a layer's slice is).
    assert "f32[4,16,32]" not in entry and " while(" not in text
