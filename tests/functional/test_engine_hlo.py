"""The decode step's KV cache in the optimized HLO: written in place, read without copies.

XLA:CPU rewrites the whole cache when the write path converts it (a bf16 cache is upcast to
f32, updated and cast back: two full-cache converts per layer per step) and copies it when
attention reads it in another axis order (a transposed copy of K and of V per layer per step).
These tests lower :func:`langtorch.functional.engine.decode_chunk` for tiny models of every
architecture the loader supports, compile it, and check the optimized HLO text: no ``convert``,
``transpose`` or ``copy`` whose result has the shape of a cache array, and one in-place
write per cache array (a ``scatter`` of each row's slot; a ``dynamic-update-slice`` at one
row). They check the program, not
time, so they hold on a loaded machine.

Shapes are compared without their size-1 axes: XLA drops a size-1 axis freely (one decode row,
one KV head), and a copy of the squeezed array costs the same as a copy of the full one. One
decode row once cost four full-cache copies per array per step (the write fused twice around
the reshape that drops the row axis), so the check runs at one row as well as at ``ROWS``.
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import pytest

from langtorch.functional import engine as E
from langtorch.functional.models import decoder

# Distinct from every other dimension below, so shapes cannot collide. CTX is two key blocks
# (decoder.KEY_BLOCK); SHORT is a cache of one block (shorter than KEY_BLOCK: one block of its
# length, the key blocks' axis of size 1).
ROWS, CTX, SHORT = 4, 256, 48

_BASE = dict(vocab_size=56, hidden_size=24, num_layers=2, num_heads=4, num_kv_heads=2,
             head_dim=6, intermediate_size=40, max_positions=512)
ARCHS = {
    "llama": dict(),
    "mistral": dict(architecture="mistral", sliding_window=16, sliding_layers=(True, True)),
    "qwen2": dict(architecture="qwen2", qkv_bias=True),
    "qwen3": dict(architecture="qwen3", qk_norm=True),
    "gemma2": dict(architecture="gemma2", norm_offset=1.0, activation="gelu_tanh",
                   post_norms=True, embed_scale=24 ** 0.5, query_scale=0.25, attn_softcap=50.0,
                   final_softcap=30.0, sliding_window=16, sliding_layers=(True, False)),
    "gemma3": dict(architecture="gemma3", norm_offset=1.0, activation="gelu_tanh",
                   post_norms=True, qk_norm=True, embed_scale=24 ** 0.5, query_scale=0.25,
                   sliding_window=16, sliding_layers=(True, False), rope_local_theta=10000.0),
    "phi3": dict(architecture="phi3", tie_embeddings=False),
}

# One instruction of HLO text: `name = TYPE[dims]{layout} opcode(`.
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(\w+)\[([\d,]*)\]\S*\s+([\w\-]+)\(")


def _dims(dims) -> list[int]:
    return sorted(int(x) for x in dims if int(x) != 1)


def cache_shaped_ops(hlo: str, shape: tuple) -> collections.Counter:
    """Count ``(opcode)`` of the instructions whose result has ``shape``'s dims in any order
    and with or without its size-1 axes (so a transposed or squeezed copy counts), anywhere in
    the module (fusions and loop bodies included)."""
    want = _dims(shape)
    found: collections.Counter = collections.Counter()
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if m and _dims(x for x in m.group(2).split(",") if x) == want:
            found[m.group(3)] += 1
    return found


def _decode_hlo(cfg: decoder.DecoderConfig, param_dtype, kv_dtype,
                rows: int = ROWS, layout: str = "auto", ctx: int = CTX) -> tuple[str, tuple]:
    params = jax.tree.map(lambda a: a.astype(param_dtype),
                          decoder.random_params(jax.random.key(0), cfg))
    batch = E.SlotBatch(params, config=cfg, max_slots=rows, kv_dtype=kv_dtype,
                        decode_layout=layout)
    # The engine's cache: decoder.init_kv_cache's per-layer layout (as SlotBatch allocates it).
    empty = decoder.init_kv_cache(cfg, rows, ctx, kv_dtype, per_layer=True, transposed_keys=True)
    cache = {n: tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in empty[n]) for n in "kv"}
    shape = (cache["k"][0].shape, cache["v"][0].shape)  # keys blocked: other dims than values
    i32 = jax.ShapeDtypeStruct((rows,), jnp.int32)
    f32 = jax.ShapeDtypeStruct((rows,), jnp.float32)
    text = E.decode_chunk.lower(  # the params the batch decodes with (its layout's)
        batch.decode_params(rows), cache, i32, i32, jax.ShapeDtypeStruct((rows,), bool), i32,
        i32, f32, f32, jax.ShapeDtypeStruct((rows, 3), jnp.uint32),
        jnp.zeros((1,), jnp.int32), None, config=cfg, steps=2, features=(),
    ).compile().as_text()
    return text, shape


def cache_ops(text: str, shapes: tuple) -> collections.Counter:
    """:func:`cache_shaped_ops` of the keys' and the values' shapes together (once when they
    have the same dims: a cache of one block)."""
    distinct = {tuple(_dims(s)): s for s in shapes}.values()
    return sum((cache_shaped_ops(text, s) for s in distinct), collections.Counter())


def test_engine_cache_layout_is_heads_major():
    # The layout the HLO checks below assume is the one the engine allocates.
    cfg = decoder.DecoderConfig(**_BASE)
    b = E.SlotBatch(decoder.random_params(jax.random.key(0), cfg), config=cfg, max_slots=2)
    b.admit([E.Sequence([1, 2, 3], max_tokens=2)])
    k = b.cache["k"][0]
    want = decoder.init_kv_cache(cfg, k.shape[0], b.cache_buckets[0], b.kv_dtype,
                                 per_layer=True, transposed_keys=True)["k"][0]
    assert (k.shape, k.dtype) == (want.shape, want.dtype)


@pytest.mark.parametrize("arch,param_dtype,rows,kv_heads,layout,ctx", [
    *[(a, jnp.float32, ROWS, 2, "columns", CTX) for a in sorted(ARCHS)],
    ("llama", jnp.bfloat16, ROWS, 2, "columns", CTX),  # bf16 decode weights
    ("gemma2", jnp.bfloat16, ROWS, 2, "columns", CTX),
    # The params as they are (quantized models, other backends, decode_layout="rows").
    ("llama", jnp.float32, ROWS, 2, "rows", CTX), ("gemma2", jnp.bfloat16, ROWS, 2, "rows", CTX),
    # One decode row (single-stream decoding) with one KV head (Gemma 3 270M's attention):
    # both size-1 axes of the cache at once, in one program (a few seconds of compile; the
    # write path is shared by every architecture, each checked by hand at one row).
    ("gemma3", jnp.float32, 1, 1, "columns", CTX), ("gemma3", jnp.float32, 1, 1, "rows", CTX),
    # A cache of one key block: the blocks' axis has size 1 too. (With several rows, such a
    # cache, like one KV head, is copied twice per array after the loop, once per chunk: XLA
    # lays the un-squeezed result out another way. Not checked here.)
    ("gemma3", jnp.float32, 1, 1, "columns", SHORT)])
def test_decode_step_writes_cache_in_place_without_converts_or_copies(arch, param_dtype, rows,
                                                                      kv_heads, layout, ctx):
    cfg = decoder.check_config(decoder.DecoderConfig(
        **{**_BASE, **ARCHS[arch], "num_kv_heads": kv_heads}))
    kv_dtype = E.SlotBatch(decoder.random_params(jax.random.key(0), cfg), config=cfg).kv_dtype
    text, shape = _decode_hlo(cfg, param_dtype, kv_dtype, rows, layout, ctx)
    ops = cache_ops(text, shape)
    arrays = 2 * cfg.num_layers
    bad = {op: n for op, n in ops.items() if op in ("convert", "transpose", "copy")}
    assert not bad, (f"{arch}, {rows} row(s): the decode step converts or copies a full cache "
                     f"array {shape} ({bad}): the cache is rewritten or re-laid out every step")
    # One in-place write per cache array: a scatter of each row's slot (a dynamic-update-slice
    # for one row).
    assert ops["scatter"] + ops["dynamic-update-slice"] == arrays, ops
    assert ops["scatter" if rows > 1 else "dynamic-update-slice"] == arrays, ops


def test_the_check_sees_a_full_cache_convert():
    # The counter is not blind: a bf16 cache's write is upcast whole by XLA:CPU (the reason the
    # engine's decode cache is fp32), and the check counts those converts.
    cfg = decoder.DecoderConfig(**_BASE)
    text, shape = _decode_hlo(cfg, jnp.float32, jnp.bfloat16)
    assert cache_ops(text, shape)["convert"] >= 2 * cfg.num_layers


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # GQA; soft-capping + sliding window
def test_transposed_keys_attend_like_heads_major_keys(arch):
    # The engine's decode cache stores keys in blocks, [R, Nkv, C/b, D, b]
    # (decoder.blocked_keys); decoder.block(transposed_keys=True) must compute what it
    # computes from [R, Nkv, C, D] keys.
    cfg = decoder.check_config(decoder.DecoderConfig(**{**_BASE, **ARCHS[arch]}))
    p = decoder.unstack_layers(decoder.random_params(jax.random.key(1), cfg))["layers"][0]
    ctx_k = jax.random.normal(jax.random.key(2), (ROWS, cfg.num_kv_heads, CTX, cfg.head_dim))
    ctx_v = jax.random.normal(jax.random.key(3), ctx_k.shape)
    x = jax.random.normal(jax.random.key(4), (ROWS, 1, cfg.hidden_size))
    pos = jnp.full((ROWS, 1), CTX - 1)
    tables = decoder.rope_tables(pos, cfg)
    distance = (CTX - 1 - jnp.arange(CTX))[None, None, :]
    allowed = jnp.arange(CTX)[None, None, :] < jnp.array([CTX, 20, 7, 33])[:, None, None]
    biases = decoder.layer_biases(allowed, distance, cfg)

    def kv(transposed):
        def f(k, v):
            keys, values = ctx_k.at[:, :, -1:].set(k), ctx_v.at[:, :, -1:].set(v)
            return (decoder.blocked_keys(keys) if transposed else keys), values, None
        return f

    want, _ = decoder.layer(p, x, tables, biases, kv(False), config=cfg, sliding=True)
    got, _ = decoder.layer(p, x, tables, biases, kv(True), config=cfg, sliding=True,
                           transposed_keys=True)
    assert jnp.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not jnp.allclose(want, x)  # attention did something


def test_bf16_decode_reads_the_embedding_table_without_converting_or_copying_it():
    # Three whole-table ops once cost ~86 ms per bf16 decode chunk (SmolLM2, a [49152, 576]
    # table): XLA:CPU gathers bf16 rows from an f32 convert of the whole table, and transposes
    # the tied [V, H] table into an [H, V] copy for the LM head's product, both hoisted out of
    # the decode loop but paid on every call; and the uint16 bitcast of the table the rows
    # were then gathered from was a copy of the table on every step (~1.7 ms per step). The
    # engine's bf16 weights keep an [H, V] head (_engine._with_head), and the decode program
    # gathers rows from the table's bits handed in (E.embedding_bits, kept by the SlotBatch).
    from langtorch.models._engine import _with_head

    cfg = decoder.DecoderConfig(**_BASE)
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16),
                          decoder.random_params(jax.random.key(0), cfg))
    kept = _with_head(params)
    assert kept["lm_head"].shape == (cfg.hidden_size, cfg.vocab_size)
    assert _with_head(kept) is kept
    f32 = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    assert _with_head(f32) is f32  # fp32 reads the tied [V, H] table directly

    def table_ops(p, lower=E.decode_chunk.lower):
        batch = E.SlotBatch(p, config=cfg, max_slots=ROWS, kv_dtype=jnp.float32)
        empty = decoder.init_kv_cache(cfg, ROWS, CTX, jnp.float32, per_layer=True,
                                      transposed_keys=True)
        cache = {n: tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in empty[n])
                 for n in "kv"}
        i32 = jax.ShapeDtypeStruct((ROWS,), jnp.int32)
        f = jax.ShapeDtypeStruct((ROWS,), jnp.float32)
        text = lower(
            batch.decode_params(ROWS), cache, i32, i32, jax.ShapeDtypeStruct((ROWS,), bool),
            i32, i32, f, f, jax.ShapeDtypeStruct((ROWS, 3), jnp.uint32),
            jnp.zeros((1,), jnp.int32), None, config=cfg, steps=2, features=(),
        ).compile().as_text()
        ops = cache_shaped_ops(text, (cfg.vocab_size, cfg.hidden_size))
        return {op: n for op, n in ops.items()
                if op in ("convert", "transpose", "copy", "bitcast-convert")}

    assert table_ops(kept) == {}
    assert table_ops(params)  # the check sees the tied table's copy (no kept head)
    # ... and the bitcast copy of the table when its bits are not handed in.
    assert table_ops(kept, lower=E._decode_jit().lower) == {"bitcast-convert": 1}


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: scaled embeddings
def test_the_kept_embedding_bits_decode_like_the_table(arch):
    # The rows gathered from the kept bits are the table's rows: the same tokens and logprobs
    # as the in-program gather.
    cfg = decoder.check_config(decoder.DecoderConfig(**{**_BASE, **ARCHS[arch]}))
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16),
                          decoder.random_params(jax.random.key(0), cfg))
    batch = E.SlotBatch(params, config=cfg, max_slots=ROWS)
    p, bits = batch.decode_inputs(ROWS)
    assert p is batch.decode_params(ROWS) and bits.dtype == jnp.uint16
    assert bits is E.embedding_bits(batch.params)  # the layouts share the table
    assert (jax.lax.bitcast_convert_type(bits, jnp.bfloat16) == params["embed"]).all()
    assert E.SlotBatch(jax.tree.map(lambda a: a.astype(jnp.float32), params), config=cfg,
                       max_slots=ROWS).decode_inputs(ROWS)[1] is None

    def run(fn, **kw):
        empty = decoder.init_kv_cache(cfg, ROWS, CTX, jnp.float32, per_layer=True,
                                      transposed_keys=True)
        i32 = jnp.arange(ROWS, dtype=jnp.int32) + 3
        out = fn(p, {"k": empty["k"], "v": empty["v"]}, i32, i32, jnp.ones((ROWS,), bool),
                 jnp.full((ROWS,), 9, jnp.int32), i32 * 0, jnp.zeros((ROWS,), jnp.float32),
                 jnp.ones((ROWS,), jnp.float32), jnp.zeros((ROWS, 3), jnp.uint32),
                 jnp.zeros((0,), jnp.int32), None, config=cfg, steps=4,
                 features=("logprobs",), **kw)
        return out[1].tolist(), out[8][0].tolist()

    want = run(E._decode_jit())  # embed_bits=None: gathered inside the program
    assert run(E.decode_chunk, embed_bits=bits) == want
    assert run(E.decode_chunk) == want  # computed by the wrapper when not given


def test_a_slot_batch_hands_its_tables_bits_to_every_chunk(monkeypatch):
    cfg = decoder.DecoderConfig(**_BASE)
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16),
                          decoder.random_params(jax.random.key(0), cfg))
    batch = E.SlotBatch(params, config=cfg, max_slots=ROWS)
    seen = []
    real = E.decode_chunk

    def spy(*args, **kw):
        seen.append(kw.get("embed_bits"))
        return real(*args, **kw)

    monkeypatch.setattr(E, "decode_chunk", spy)
    batch.run([E.Sequence([1, 2, 3], max_tokens=5), E.Sequence([4, 5], max_tokens=3)])
    want = E.embedding_bits(batch.params)
    assert seen and all(b is want for b in seen)


def test_embedding_bits_are_made_once_per_table_and_go_with_it():
    import gc

    table = jnp.arange(12, dtype=jnp.float32).reshape(4, 3).astype(jnp.bfloat16)
    bits = E.embedding_bits({"embed": table})
    assert E.embedding_bits({"embed": table}) is bits  # another tree, the same table
    assert (jax.lax.bitcast_convert_type(bits, jnp.bfloat16) == table).all()
    other = table + 1
    assert E.embedding_bits({"embed": other}) is not bits
    key = id(table)
    del table, bits
    gc.collect()
    assert key not in E._TABLE_BITS
    abstract = {"embed": jax.ShapeDtypeStruct((4, 3), jnp.float16)}
    assert E.embedding_bits(abstract) == jax.ShapeDtypeStruct((4, 3), jnp.uint16)
    # A traced table is not kept (its bits would hold the trace), nor a numpy one (it can
    # change in place).
    n = len(E._TABLE_BITS)
    jax.jit(lambda t: E.embedding_bits({"embed": t}))(jnp.ones((4, 3), jnp.bfloat16))
    assert len(E._TABLE_BITS) == n


def test_decode_chunk_rejects_bits_that_do_not_fit_the_table():
    cfg = decoder.DecoderConfig(**_BASE)
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16),
                        decoder.random_params(jax.random.key(0), cfg))
    fp32 = jax.tree.map(lambda a: a.astype(jnp.float32), bf16)
    empty = decoder.init_kv_cache(cfg, 1, CTX, jnp.float32, per_layer=True,
                                  transposed_keys=True)
    i32 = jnp.zeros((1,), jnp.int32)

    def call(params, bits):
        return E.decode_chunk(params, {"k": empty["k"], "v": empty["v"]}, i32, i32,
                              jnp.ones((1,), bool), i32 + 2, i32, jnp.zeros((1,)), jnp.ones((1,)),
                              jnp.zeros((1, 3), jnp.uint32), jnp.zeros((0,), jnp.int32), None,
                              config=cfg, steps=4, embed_bits=bits)

    good = E.embedding_bits(bf16)
    with pytest.raises(ValueError, match="uint16"):
        call(bf16, good[:-1])  # another vocabulary size
    with pytest.raises(ValueError, match="uint16"):
        call(bf16, good.astype(jnp.int32))
    with pytest.raises(ValueError, match="bf16/fp16"):
        call(fp32, good)


# One dot of HLO text: its result dims and its operands' names.
_DOT = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\w+\[([\d,]*)\]\S*\s+dot\(")


def _dot_results(hlo: str) -> collections.Counter:
    return collections.Counter(tuple(int(x) for x in m.group(1).split(",") if x)
                               for m in map(_DOT.match, hlo.splitlines()) if m)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "phi3"])
def test_column_decode_multiplies_every_layer_weight_from_the_left(arch):
    # decode_layout="columns": every layer product is W [N, K] x states [K, R] -> [N, R]
    # (decoder.block_columns), none is states [R, K] x W -> [R, N]. XLA rewrites
    # transpose(W x y) as y^T x W^T when the product's result is transposed straight away
    # (the q/k/v products feed attention as rows), which would bring the rows product back
    # for those three; an optimization barrier keeps them.
    cfg = decoder.check_config(decoder.DecoderConfig(**{**_BASE, **ARCHS[arch]}))
    text, _ = _decode_hlo(cfg, jnp.float32, jnp.float32, ROWS, "columns")
    dots = _dot_results(text)
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, f = cfg.hidden_size, cfg.intermediate_size
    layers = cfg.num_layers
    # (q and wo's output are [24, R] alike here: hidden 24 = 4 heads x 6.)
    want = collections.Counter({(q, ROWS): 2 * layers, (kv, ROWS): 2 * layers,
                                (f, ROWS): 2 * layers})
    want[(h, ROWS)] += layers  # w_down
    assert {k: dots[k] for k in want} == dict(want), dots
    rows_products = {k: n for k, n in dots.items()
                     if len(k) == 2 and k[0] == ROWS and k[1] in (q, kv, h, f)}
    assert not rows_products, rows_products
    # The rows layout is the other way round (the check tells them apart).
    text, _ = _decode_hlo(cfg, jnp.float32, jnp.float32, ROWS, "rows")
    assert _dot_results(text)[(ROWS, f)] == 2 * layers
