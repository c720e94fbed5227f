"""The decode weights' dtype per shape (issue 20, item 3): ``EngineOptions(decode_dtype=...)``.

The default (``"auto"``) decodes every chunk in bf16 where the machine has bf16 dot units, else
in the params' dtype (batch-invariant either way); ``None`` is the params' dtype; ``"bfloat16"`` /
``"float32"`` pick one dtype for every row count; ``"by_shape"`` decodes chunks of many rows with a
bf16 copy (``SlotBatch(wide_params=, wide_rows=)``) where a probe finds it faster. The checks:
the wide params really run from ``wide_rows`` rows on and never below (tokens equal those of
an all-bf16 / all-fp32 batch), the copies are shared, and bad values are refused.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import engine as E
from langtorch.functional.engine import Sequence, SlotBatch
from langtorch.functional.models import llama

CFG = llama.LlamaConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, intermediate_size=48, max_positions=256)


def _params():
    return llama.random_params(jax.random.key(3), CFG)


def _bf16(p):
    return jax.tree.map(lambda a: a.astype(jnp.bfloat16), p)


def _run(batch, prompts, max_tokens=4):
    """Each sequence's (token, logprob) pairs: the logprobs carry the decode's last bits."""
    seqs = [Sequence(list(p), max_tokens=max_tokens, top_logprobs=0) for p in prompts]
    batch.admit(seqs)
    while batch.live:
        batch.step()
    return [[(int(e[0]), float(e[1])) for e in s.logprobs] for s in seqs]


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, CFG.vocab_size, int(rng.integers(3, 9))).tolist() for _ in range(n)]


def _as_decoded(batch, params):
    # The params as the batch's decode chunks read them (its decode layout's).
    from langtorch.functional.engine import columns_params

    return columns_params(params) if batch._layout_of(params) == "columns" else params


def _same(a, b):
    # The same arrays in the same tree (columns_params makes a new tree around kept arrays).
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    return ta == tb and all(x is y for x, y in zip(la, lb))


def test_wide_params_run_from_wide_rows_on_and_never_below():
    p = _params()
    pb = _bf16(p)
    kw = dict(config=CFG, prefill_params=pb, max_slots=4, prefix_cache_tokens=0)
    wide = SlotBatch(p, wide_params=pb, wide_rows=4, **kw)
    assert _same(wide.decode_params(1), _as_decoded(wide, wide.params))
    assert _same(wide.decode_params(4), _as_decoded(wide, wide.wide_params))
    # The wide copy is the prefill copy (one bf16 tree, not two).
    assert wide.wide_params is wide.prefill_params
    four = _prompts(4)
    # Four rows: the logprobs of an all-bf16 decode, one row: those of an all-fp32 decode
    # (they differ: checked), so a batch that ignored wide_params (or used it at one row)
    # fails one of the two equalities.
    all_bf16 = _run(SlotBatch(pb, **kw), four)
    all_fp32 = _run(SlotBatch(p, **kw), four)
    assert all_bf16 != all_fp32
    assert _run(wide, four) == all_bf16
    # (One fp32 row is compared with one fp32 row: fp32's one-row program may round
    # differently from four rows.)
    one_bf16, one_fp32 = _run(SlotBatch(pb, **kw), four[:1]), _run(SlotBatch(p, **kw), four[:1])
    assert one_bf16 != one_fp32
    assert _run(wide, four[:1]) == one_fp32


def test_wide_arguments_are_checked():
    p = _params()
    with pytest.raises(ValueError, match="wide_params and wide_rows"):
        SlotBatch(p, config=CFG, wide_params=_bf16(p))
    with pytest.raises(ValueError, match="wide_params and wide_rows"):
        SlotBatch(p, config=CFG, wide_rows=4)
    for bad in (0, 1.5, "4", True):
        with pytest.raises(ValueError, match="wide_params and wide_rows"):
            SlotBatch(p, config=CFG, wide_params=_bf16(p), wide_rows=bad)


def _model(params, **attrs):
    return types.SimpleNamespace(params=params, config=CFG, eos_id=0, decode=lambda ids: "",
                                 **attrs)


def test_engine_options_decode_dtype():
    from langtorch.models import Engine, EngineOptions

    with pytest.raises(ValueError, match="decode_dtype"):
        EngineOptions(decode_dtype="float16")
    assert EngineOptions().decode_dtype == "auto"  # one dtype at every row count
    m = _model(_params(), decode_dtype="bfloat16")
    assert EngineOptions.of(m).decode_dtype == "bfloat16"
    eng = Engine(m, max_slots=4, prefill_dtype="bfloat16", decode_dtype="bfloat16")
    leaves = jax.tree.leaves(eng.batch.params)
    assert {a.dtype for a in leaves} == {jnp.dtype(jnp.bfloat16)}
    assert eng.batch.params is eng.batch.prefill_params  # one bf16 copy for both
    assert eng.batch.wide_rows is None
    own = Engine(_model(_params()), max_slots=4, prefill_dtype=None, decode_dtype=None)
    assert own.batch.wide_rows is None and own.batch.min_rows == 1
    assert {a.dtype for a in jax.tree.leaves(own.batch.params)} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("units", [True, False])
def test_engine_auto_is_bf16_where_the_machine_has_bf16_dot_units(monkeypatch, units):
    from langtorch.models import Engine, EngineOptions
    from langtorch.models import _engine as M

    monkeypatch.setattr(M, "bf16_dot_units", lambda: units)
    eng = Engine(_model(_params()), max_slots=4, prefill_dtype=None)
    want = jnp.bfloat16 if units else jnp.float32
    assert {a.dtype for a in jax.tree.leaves(eng.batch.params)} == {jnp.dtype(want)}
    assert eng.batch.wide_rows is None  # one dtype at every row count
    # 16-bit decode weights: a lone row runs as two (the one-row program rounds differently).
    assert eng.batch.min_rows == (2 if units else 1)
    # A quantized model keeps its params' dtype around the int8 products.
    q = Engine(_model(_params()), max_slots=4, prefill_dtype=None, quantization="int8")
    assert q.batch.min_rows == 1
    # A model that asks for its params' dtype (decode_dtype=None, as a loaded checkpoint
    # does) gets it; a model without the attribute gets "auto".
    assert EngineOptions.of(_model(_params(), decode_dtype=None)).decode_dtype is None
    assert EngineOptions.of(_model(_params())).decode_dtype == "auto"


def test_engine_by_shape_uses_the_probe(monkeypatch):
    from langtorch.models import Engine
    from langtorch.models import _engine as M

    # The probe says bf16 wins from 2 rows on: chunks of 2+ rows decode with the bf16 copy.
    monkeypatch.setattr(M, "bf16_decode_wins", lambda layer, config, rows, **kw: rows >= 2)
    eng = Engine(_model(_params()), max_slots=4, prefill_dtype="bfloat16",
                 decode_dtype="by_shape")
    assert eng.batch.wide_rows == 2
    assert eng.batch.wide_params is eng.batch.prefill_params
    assert _same(eng.batch.decode_params(1), _as_decoded(eng.batch, eng.batch.params))
    # Tried from the largest bucket down, stopping at the first loss: a probe that wins at 4
    # and (noise) at 1 but not at 2 gives 4, never 1.
    monkeypatch.setattr(M, "bf16_decode_wins", lambda layer, config, rows, **kw: rows != 2)
    eng = Engine(_model(_params()), max_slots=4, prefill_dtype=None, decode_dtype="by_shape")
    assert eng.batch.wide_rows == 4
    # Never faster: no wide copy at all.
    monkeypatch.setattr(M, "bf16_decode_wins", lambda layer, config, rows, **kw: False)
    eng = Engine(_model(_params()), max_slots=4, prefill_dtype=None, decode_dtype="by_shape")
    assert eng.batch.wide_rows is None and eng.batch.wide_params is None


def test_bf16_decode_probe_runs_on_a_layer():
    from langtorch.functional.models import decoder
    from langtorch.models._engine import bf16_decode_wins

    layer = decoder.unstack_layers(_params())["layers"][0]
    assert isinstance(bf16_decode_wins(layer, CFG, 2, context=16), bool)


def test_bf16_decode_probe_compiles_as_the_decode_chunks_do(monkeypatch):
    # The probe must time the program the engine runs: a decode option it ignored would let
    # it pick bf16 by XLA's default products while the chunks run others. An option XLA
    # rejects shows that the probe's layer is compiled with the decode chunks' options.
    import langtorch.functional.engine as FE
    import langtorch.models._engine as M
    from langtorch.functional.models import decoder

    if jax.default_backend() != "cpu":
        pytest.skip("the decode compile options are CPU options")
    monkeypatch.setattr(M, "_PROBE", {})
    monkeypatch.setattr(FE, "decode_compiler_options",
                        lambda: {"xla_cpu_experimental_ynn_fusion_type": "NO_SUCH_FUSION_TYPE"})
    layer = decoder.unstack_layers(_params())["layers"][0]
    with pytest.raises(Exception, match="NO_SUCH_FUSION_TYPE"):
        M.bf16_decode_wins(layer, CFG, 2, context=16)


def test_bf16_decode_probe_keeps_one_answer_per_layer_dtype(monkeypatch):
    # Two models of one config in different dtypes share a process: each gets its own probe.
    import langtorch.models._engine as M
    from langtorch.functional.models import decoder

    monkeypatch.setattr(M, "_PROBE", {})
    layer = decoder.unstack_layers(_params())["layers"][0]
    M.bf16_decode_wins(layer, CFG, 2, context=16)
    M.bf16_decode_wins(jax.tree.map(lambda a: a.astype(jnp.float16), layer), CFG, 2, context=16)
    assert len(M._PROBE) == 2


def test_local_backend_and_serve_take_decode_dtype():
    from langtorch.backends import LocalBackend
    from langtorch.serve._cli import parser

    with pytest.raises(ValueError, match="decode_dtype"):
        LocalBackend(decode_dtype="fp8")
    # Answers can differ with the decode dtype: cached answers of the two never cross.
    tags = {LocalBackend(decode_dtype=d)._model_tag for d in ("float32", "by_shape", "bfloat16")}
    assert "" in tags
    assert len(tags) == 3
    # The default ("auto") is keyed by what it resolves to here: bf16 answers never share the
    # namespace of the fp32 answers cached before bf16 became the default ("").
    from langtorch.models import resolve_decode_dtype

    bf16_here = resolve_decode_dtype("auto") == "bfloat16"
    assert LocalBackend()._model_tag == (
        LocalBackend(decode_dtype="bfloat16")._model_tag if bf16_here else "")
    assert LocalBackend(decode_dtype="float32")._model_tag == ""  # = the default SmolLM2's
    assert LocalBackend(decode_dtype="auto")._model_tag == LocalBackend()._model_tag
    # The model's own decode_dtype counts too (a model object that asks for "by_shape").
    extra = dict(encode=lambda text: [1], apply_chat_template=lambda msgs, **kw: "")
    plain = _model(_params(), **extra)
    wide = _model(_params(), decode_dtype="by_shape", **extra)
    assert LocalBackend(plain)._model_tag != LocalBackend(wide)._model_tag
    for value in ("auto", "by_shape"):
        assert parser().parse_args(["serve", "--decode-dtype", value]).decode_dtype == value
    assert parser().parse_args(["serve"]).decode_dtype is None


def test_local_backend_and_serve_take_decode_layout(monkeypatch):
    from langtorch.backends import LocalBackend
    from langtorch.models import EngineOptions
    from langtorch.serve import _cli
    from langtorch.serve._cli import parser

    for bad in ("cols", 1, ["rows"], ""):
        with pytest.raises(ValueError, match="decode_layout"):
            LocalBackend(decode_layout=bad)
    with pytest.raises(ValueError, match="float weights"):
        LocalBackend(decode_layout="columns", quantization="int8")
    extra = dict(encode=lambda text: [1], apply_chat_template=lambda msgs, **kw: "")
    with pytest.raises(ValueError, match=r"columns'\ \(the model's own\) is for float"):
        LocalBackend(_model(_params(), decode_layout="columns", **extra), quantization="int8")
    with pytest.raises(ValueError, match="the model's decode_layout is 'cols'"):
        LocalBackend(_model(_params(), decode_layout="cols", **extra))
    # The engine is built with the backend's layout, else the model's own, else "auto".
    m = _model(_params(), decode_dtype="float32", **extra)
    for layout in ("rows", "columns"):
        eng = LocalBackend(m, decode_layout=layout).engine
        assert eng.batch.decode_layout == layout
    eng = LocalBackend(m).engine
    assert eng.batch.decode_layout == E.resolve_decode_layout("auto", eng.batch.params)
    own = _model(_params(), decode_dtype="float32", decode_layout="rows", **extra)
    assert EngineOptions.of(own).decode_layout == "rows"
    assert LocalBackend(own).engine.batch.decode_layout == "rows"
    assert LocalBackend(own, decode_layout="columns").engine.batch.decode_layout == "columns"
    # The response cache is keyed by the layout as it resolves: asking for the layout "auto"
    # gives anyway shares its namespace; the other layout (another summation order: a
    # near-tie can decode differently) gets its own.
    auto = E.resolve_decode_layout("auto", m.params)
    other = {"rows": "columns", "columns": "rows"}[auto]
    assert LocalBackend(m, decode_layout=auto)._model_tag == LocalBackend(m)._model_tag
    assert LocalBackend(m, decode_layout=other)._model_tag != LocalBackend(m)._model_tag
    assert LocalBackend(own)._model_tag == LocalBackend(m, decode_layout="rows")._model_tag
    assert LocalBackend(decode_layout="auto")._model_tag == LocalBackend()._model_tag
    # int8 weights always decode as rows: "rows" asks for nothing new.
    assert LocalBackend(quantization="int8", decode_layout="rows")._model_tag == \
        LocalBackend(quantization="int8")._model_tag
    for value in ("auto", "rows", "columns"):
        assert parser().parse_args(["serve", "--decode-layout", value]).decode_layout == value
    assert parser().parse_args(["serve"]).decode_layout is None
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--decode-layout", "cols"])
    # serve hands the layout to its backends, and refuses columns with int8 before loading.
    seen = {}

    def fake_build(models, adapters, **options):
        seen.update(options)
        raise SystemExit("stop")

    monkeypatch.setattr(_cli, "build_backends", fake_build)
    with pytest.raises(SystemExit, match="stop"):
        _cli.serve_command(parser().parse_args(["serve", "--decode-layout", "rows"]))
    assert seen["decode_layout"] == "rows"
    seen.clear()
    with pytest.raises(SystemExit, match="decode-layout columns is for float weights"):
        _cli.serve_command(parser().parse_args(["serve", "--decode-layout", "columns",
                                                "--quantization", "int8"]))
    assert not seen
    from langtorch.models import SmolLM2  # (checked before the weights load)

    with pytest.raises(ValueError, match="decode_layout"):
        SmolLM2(decode_layout="cols")
    with pytest.raises(ValueError, match="float weights"):
        SmolLM2(decode_layout="columns", quantization="int8")
    llm = SmolLM2(decode_layout="rows")  # (its weights load from the local cache: ~2 s)
    assert llm.decode_layout == "rows" and EngineOptions.of(llm).decode_layout == "rows"
    assert SmolLM2(decode_layout=None).decode_layout == "auto"


def test_an_fp32_engine_after_a_bf16_one_keeps_the_tied_head():
    # A bf16 engine adds an [H, V] LM head to its kept weights (no transposed copy of the tied
    # table per call); an fp32 engine made later for the same model casts from the tied
    # params, not from that copy: no fp32 head, the logprobs of a fresh fp32 engine.
    from langtorch.models import Engine

    cfg = llama.LlamaConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=8, intermediate_size=48, max_positions=256)
    p = jax.tree.map(lambda a: a.astype(jnp.bfloat16), llama.random_params(jax.random.key(3), cfg))

    def model():
        return types.SimpleNamespace(params=p, config=cfg, eos_id=0, decode=lambda ids: "")

    m = model()
    first = Engine(m, max_slots=2, prefill_dtype=None)
    assert first.batch.params["lm_head"].shape == (32, 64)  # the kept bf16 head
    later = Engine(m, max_slots=2, prefill_dtype=None, decode_dtype="float32")
    fresh = Engine(model(), max_slots=2, prefill_dtype=None, decode_dtype="float32")
    assert "lm_head" not in later.batch.params and "lm_head" not in fresh.batch.params
    assert "lm_head" not in m.params

    def logprobs(batch):
        s = Sequence([5, 6, 7, 8, 9, 10, 11], max_tokens=6, top_logprobs=0)
        batch.run([s])
        return [lp for _, lp, _, _ in s.logprobs]

    assert logprobs(later.batch) == logprobs(fresh.batch)


def test_warmup_compiles_the_programs_a_short_chunk_runs():
    # A bf16 engine runs a lone row in a two-row program and a chunk of 1 in a program with
    # room for MIN_DECODE_STEPS steps: warmup compiles those, so nothing compiles later.
    from langtorch.models import Engine

    m = _model(_bf16(_params()))
    eng = Engine(m, max_slots=4, chunk=1, prefill_dtype=None, decode_dtype=None)
    assert eng.batch.min_rows == 2
    eng.warmup(batch_sizes=(1,), prompt_tokens=8, max_tokens=8)
    warmed = E.decode_chunk._cache_size()
    eng.generate([[1, 2, 3]], max_tokens=3)
    assert E.decode_chunk._cache_size() == warmed
    one = Engine(m, max_slots=1, prefill_dtype=None, decode_dtype=None)
    assert one.batch.min_rows == 1  # one slot: never any company, no second cache row


def test_the_bf16_probe_times_the_layout_the_engine_decodes_with(monkeypatch):
    import jax

    from langtorch.functional.models import decoder
    from langtorch.models import Engine
    from langtorch.models import _engine as M

    seen = []
    monkeypatch.setattr(M, "bf16_decode_wins", lambda layer, config, rows, **kw:
                        seen.append(kw.get("columns")) or False)
    for layout in ("columns", "rows"):
        Engine(_model(_params()), max_slots=4, decode_dtype="by_shape", decode_layout=layout)
    assert seen == [True, False]  # (the largest bucket loses: one probe each)
    monkeypatch.undo()
    # With columns the probe runs the column block (its transposed weights, [H, R] states).
    layer = decoder.unstack_layers(_params())["layers"][0]
    assert isinstance(M.bf16_decode_wins(layer, CFG, 2, context=16, columns=True), bool)

    def fail(*a, **kw):
        raise RuntimeError("column block")

    monkeypatch.setattr(decoder, "block_columns", fail)
    with pytest.raises(RuntimeError, match="column block"):
        M.bf16_decode_wins(layer, CFG, 3, context=16, columns=True)
    jax.clear_caches()


def test_engine_for_builds_the_engine_its_options_name():
    # Every EngineOptions field reaches the engine (a field engine_for did not pass on was
    # silently ignored: decode_layout="rows" gave the default layout's engine).
    import dataclasses
    import inspect

    from langtorch.models import Engine, EngineOptions, engine_for

    model = _model(_params())
    rows = engine_for(model, decode_layout="rows")
    assert rows.batch.decode_layout == "rows"
    assert rows.options == EngineOptions.of(model, decode_layout="rows")
    assert engine_for(model, decode_layout="columns").batch.decode_layout == "columns"
    # Every option is an Engine argument (the engine is built from them by name).
    assert {f.name for f in dataclasses.fields(EngineOptions)} <= set(
        inspect.signature(Engine).parameters)
    with pytest.raises(ValueError, match="float weights"):
        EngineOptions(quantization="int8", decode_layout="columns")
