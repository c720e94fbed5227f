"""Review regressions for the shared decode engine: a failed device call must not break the
engine for later requests; every adapter source is checked for non-finite values."""

import types

import jax
import numpy as np
import pytest

from langtorch.functional import engine as E
from langtorch.functional.models import llama

CFG = llama.LlamaConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=8, intermediate_size=16, max_positions=256)


@pytest.fixture(scope="module")
def model():
    return types.SimpleNamespace(params=llama.random_params(jax.random.key(0), CFG), config=CFG,
                                 eos_id=63, decode=lambda ids: " ".join(map(str, ids)))


def test_engine_keeps_serving_after_a_failed_decode_chunk(model, monkeypatch):
    # A device failure (OOM, ...) after the cache was donated to the chunk: the requests in it
    # fail, the ones after it must be answered, not fail with "Array has been deleted".
    from langtorch.models._engine import Engine

    eng = Engine(model, max_slots=2, chunk=4, prefill_dtype=None)
    want = eng.generate([[1, 2, 3]], max_tokens=6)
    real, calls = E.decode_chunk, []

    def failing(params, cache, *args, **kw):
        calls.append(1)
        if len(calls) == 1:
            for a in cache["k"] + cache["v"]:
                a.delete()  # what donation does to the inputs of a call that then fails
            raise RuntimeError("RESOURCE_EXHAUSTED: simulated")
        return real(params, cache, *args, **kw)

    monkeypatch.setattr(E, "decode_chunk", failing)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        eng.generate([[1, 2, 3]], max_tokens=6)
    assert eng.generate([[1, 2, 3]], max_tokens=6) == want
    assert eng.batch.live == []


def test_adapter_with_nan_is_refused_from_every_source(tmp_path):
    from langtorch.backends import LocalBackend
    from langtorch.tuning._files import save_peft_adapter

    bad = np.ones((3, 16), np.float32)
    bad[1, 2] = np.nan
    save_peft_adapter(tmp_path / "nan", bad)
    for source in (bad, tmp_path / "nan",
                   types.SimpleNamespace(prompt_embeddings=lambda: bad)):
        with pytest.raises(ValueError, match="non-finite|NaN"):
            LocalBackend(adapter=source)
        with pytest.raises(ValueError, match="non-finite|NaN"):
            LocalBackend(adapters={"a": source})


def test_stop_string_in_the_last_chunk_finishes_with_stop(model):
    # The random model answers "3 3 3 ..." to [1, 2, 3]; with max_tokens=4 and chunk=4 every
    # token comes in the chunk that also ends the sequence by length, and the stop string is
    # found after it: the reason must be "stop" (the text ends at the stop), not "length".
    from langtorch.models._engine import Engine

    eng = Engine(model, max_slots=2, chunk=4, prefill_dtype=None)
    assert eng.generate([[1, 2, 3]], max_tokens=4)[0].text == "3 3 3 3"
    for budget in (4, 12):
        r = eng.generate([[1, 2, 3]], max_tokens=budget, stops=[[" 3 3"]])[0]
        assert (r.text, r.finish_reason, r.completion_tokens) == ("3", "stop", 3), budget


@pytest.fixture(scope="module")
def chat(model):
    # The same random model behind LocalBackend: one character = one token.
    return types.SimpleNamespace(
        name="fake", params=model.params, config=CFG, eos_id=63, decode=model.decode,
        encode=lambda text: [ord(c) % 60 + 1 for c in text],
        apply_chat_template=lambda messages, add_generation_prompt=True: "".join(
            m["content"] for m in messages))


def test_max_tokens_is_honoured_when_max_completion_tokens_is_none(chat):
    import asyncio

    from langtorch.backends import LocalBackend

    b = LocalBackend(chat, default_max_tokens=20, max_slots=2)
    req = {"messages": [{"role": "user", "content": "abc"}], "temperature": 0}
    for extra in ({"max_tokens": 5}, {"max_completion_tokens": None, "max_tokens": 5},
                  {"max_completion_tokens": 5, "max_tokens": None}):
        c = asyncio.run(b.complete({**req, **extra}))
        assert c.usage.completion_tokens == 5, extra


def test_generate_checks_every_prompt_before_queueing_any(model, monkeypatch):
    # A bad prompt after good ones used to leave the good ones decoding for nobody.
    from langtorch.models._engine import Engine

    eng = Engine(model, max_slots=2, chunk=4, prefill_dtype=None)
    submitted = []
    real = eng.submit
    monkeypatch.setattr(eng, "submit", lambda *a, **k: (submitted.append(1), real(*a, **k))[1])
    with pytest.raises(ValueError, match="prompt"):
        eng.generate([[1, 2], [1, 99]], max_tokens=200)
    with pytest.raises(ValueError, match="max_tokens: expected one value or one per prompt"):
        eng.generate([[1, 2], [3]], max_tokens=[4])
    assert submitted == []
    assert [r.completion_tokens for r in eng.generate([[1, 2], [3]], max_tokens=[2, 3])] == [2, 3]


def test_adapter_of_another_model_is_refused_when_the_model_is_known(chat, tmp_path):
    import asyncio

    from langtorch.backends import LocalBackend
    from langtorch.errors import BadRequestError
    from langtorch.tuning._files import save_peft_adapter

    save_peft_adapter(tmp_path / "wide", np.ones((3, 24), np.float32))  # CFG is 16 wide
    with pytest.raises(ValueError, match="adapter is 24 wide.*16"):
        LocalBackend(chat, adapter=tmp_path / "wide")
    with pytest.raises(ValueError, match=r"adapters\['w'\] is 24 wide"):
        LocalBackend(chat, adapters={"w": tmp_path / "wide"})
    # Without a model given it loads lazily, so the width is checked per request (400).
    lazy = LocalBackend(adapters={"w": tmp_path / "wide"})
    lazy._llm = chat
    req = {"messages": [{"role": "user", "content": "abc"}], "max_tokens": 2, "adapter": "w"}
    with pytest.raises(BadRequestError) as info:
        asyncio.run(lazy.complete(req))
    assert info.value.param == "adapter"


def _stream(eng, prompt, stops=(), **kw):
    import itertools
    import threading

    deltas, out, done = [], {}, threading.Event()
    seq = E.Sequence(prompt, **kw)
    eng.submit([seq], stops=stops, on_delta=lambda i, t: deltas.append(t),
               on_finish=lambda i, r: out.setdefault("reason", r),
               on_done=lambda p, c: (out.setdefault("tokens", c), done.set()),
               on_error=lambda e: (out.setdefault("error", e), done.set()))
    assert done.wait(60) and "error" not in out, out
    return list(itertools.accumulate(deltas)), out, seq


def test_stream_never_shows_text_it_later_takes_back(model):
    # Byte-level tokens (some are pieces of multi-byte UTF-8 characters) and stop strings that
    # span a chunk boundary: every streamed prefix must be a prefix of the final text, so the
    # stream never shows a partial character or the start of a stop string.
    from langtorch.models._engine import Engine

    pieces = [bytes([97 + i]) for i in range(26)] + [b" "] * 6 + \
        [b"\xc3", b"\xa9", b"\xe4", b"\xbd", b"\xa0", b"\xf0", b"\x9f", b"\x98", b"\x80"] * 3 + \
        [b"."] * 5
    assert len(pieces) == 64
    bytes_model = types.SimpleNamespace(**{**vars(model), "decode": lambda ids: b"".join(
        pieces[i] for i in ids).decode("utf-8", "replace")})
    eng = Engine(bytes_model, max_slots=4, chunk=4, prefill_dtype=None)
    partial, stopped = 0, 0
    for seed in range(12):
        kw = {"max_tokens": 24, "temperature": 1.0, "seed": seed}
        shown, out, seq = _stream(eng, [1, 2, 3], **kw)
        full = bytes_model.decode(seq.tokens)
        assert shown and shown[-1] == full and all(full.startswith(s) for s in shown), seed
        partial += any(s.endswith("\ufffd") for s in [bytes_model.decode(seq.tokens[:k])
                                                     for k in range(1, len(seq.tokens))])
        # A stop string across the boundary of the first two chunks (tokens 4 and 5).
        t = seq.tokens
        if len(t) < 8:
            continue
        stop = bytes_model.decode(t[:6])[len(bytes_model.decode(t[:4])) - 1:]
        if not stop.strip() or "\ufffd" in stop:
            continue
        shown, out, seq2 = _stream(eng, [1, 2, 3], stops=[stop], **kw)
        want = full[:full.index(stop)]
        assert out["reason"] == "stop" and (shown[-1] if shown else "") == want, seed
        assert all(want.startswith(s) for s in shown), (seed, stop, shown)
        stopped += 1
    assert partial and stopped  # the cases above really happened


def test_cache_namespace_tells_models_apart(chat):
    # Every SmolLM2 is named "SmolLM2-135M-Instruct" whatever its GGUF: the namespace must
    # differ per model file/dtype/config, or one model's cached answers serve another's.
    from langtorch.backends import LocalBackend

    other_file = types.SimpleNamespace(**{**vars(chat), "path": "/models/other.gguf"})
    bf16 = types.SimpleNamespace(**{**vars(chat), "kv_dtype": "float32"})
    wider = types.SimpleNamespace(**{**vars(chat), "config": CFG._replace(num_layers=2)})
    spaces = [LocalBackend(m).cache_namespace for m in (chat, other_file, bf16, wider)]
    assert len(set(spaces)) == 4
    assert LocalBackend(chat).cache_namespace == spaces[0]
    # The default model with fp32 decode steps adds nothing (bf16 ones, the default on CPUs
    # with bf16 dot units, add a model digest: their answers differ).
    assert LocalBackend(decode_dtype="float32").cache_namespace == "LocalBackend"
    a = LocalBackend(chat, adapter=np.zeros((2, 16))).cache_namespace
    assert a.startswith(spaces[0][:-1]) and "adapter=" in a


def test_engine_options_are_explicit_never_the_first_callers(chat):
    # Regression: the engine was cached on the model, so after one caller (SmolLM2.generate)
    # created it, LocalBackend(max_slots=64) silently ran on the first caller's slots.
    from langtorch.backends import LocalBackend
    from langtorch.models import EngineOptions, engine_for

    m = types.SimpleNamespace(params=chat.params, config=CFG, eos_id=63, decode=chat.decode,
                              encode=chat.encode, apply_chat_template=chat.apply_chat_template,
                              max_batch=2, chunk=4, prefill_dtype=None)
    first = engine_for(m)
    assert first.batch.max_slots == 2 and engine_for(m) is first  # the model's own options
    wide = LocalBackend(m, max_slots=5).engine
    assert wide is not first and wide.batch.max_slots == 5 and wide.batch.chunk == 4
    assert engine_for(m, max_slots=5) is wide  # same options: shared
    assert LocalBackend(m).engine is first  # no max_slots: the model's own
    assert engine_for(m, EngineOptions(max_slots=2, chunk=4, prefill_dtype=None)) is first
    assert [r.completion_tokens for r in wide.generate([[1, 2], [3]], max_tokens=3)] == [3, 3]
    # warmup compiles *this* engine's shapes (5 slots), not the model's own engine's (2).
    before = E.decode_chunk._cache_size()
    assert wide.warmup(batch_sizes=(5,), prompt_tokens=8, max_tokens=8) is wide
    warmed = E.decode_chunk._cache_size()
    assert warmed > before
    wide.generate([[1, 2]] * 5, max_tokens=3)
    assert E.decode_chunk._cache_size() == warmed  # nothing left to compile for 5 rows
    with pytest.raises(ValueError, match="max_slots"):
        EngineOptions(max_slots=0)
    with pytest.raises(TypeError, match="unknown options"):
        EngineOptions.of(m, slots=3)


def _bad_worker(backend, monkeypatch, exc):
    # The engine's worker reports `exc` for the next request it admits.
    eng = backend.engine

    def admit(seqs, **options):
        raise exc

    monkeypatch.setattr(eng.batch, "admit", admit)


def test_only_the_engines_typed_request_error_is_a_bad_request(chat, monkeypatch):
    import asyncio

    from langtorch.backends import LocalBackend
    from langtorch.errors import BackendError, BadRequestError

    b = LocalBackend(chat, default_max_tokens=4, max_slots=3)
    req = {"messages": [{"role": "user", "content": "abc"}], "temperature": 0}
    # A ValueError that happens to look like "param: message" (a JAX shape error, say) is a
    # bug: 500, not a 400 with a made-up param.
    _bad_worker(b, monkeypatch, ValueError("top_p: incompatible shapes (3,) and (4,)"))
    with pytest.raises(BackendError) as e:
        asyncio.run(b.complete(req))
    assert not isinstance(e.value, BadRequestError)
    assert e.value.status == 500 and "bug" in str(e.value) and not e.value.retryable
    # The engine's typed refusal is the request's fault: 400 naming the request parameter.
    _bad_worker(b, monkeypatch, E.SequenceError("prompt", "expected at least one token."))
    with pytest.raises(BadRequestError) as e:
        asyncio.run(b.complete(req))
    assert e.value.param == "messages" and "expected at least one token" in str(e.value)


def test_serve_answers_400_only_for_request_errors_and_500_says_bug(chat, monkeypatch):
    import httpx

    from langtorch.backends import LocalBackend
    from langtorch.serve import Server, create_app

    b = LocalBackend(chat, default_max_tokens=4, max_slots=3)
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "abc"}],
            "temperature": 0}
    with Server(create_app(b, embedding_backend=None)) as server:
        def post(**extra):
            return httpx.post(server.url + "/chat/completions", json={**body, **extra},
                              timeout=60)

        ok = post()
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
        r = post(top_p=0)
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"
        r = post(messages=[{"content": "no role"}])
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
        for stream in (False, True):
            _bad_worker(b, monkeypatch, ValueError("max_tokens: shape mismatch"))
            r = post(stream=stream)
            assert r.status_code == 500, r.text
            err = r.json()["error"]
            assert err["param"] is None and "bug" in err["message"], err
            _bad_worker(b, monkeypatch, E.SequenceError("max_tokens", "too long for the context."))
            r = post(stream=stream, max_tokens=3)
            assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_request_errors_live_in_errors_and_carry_openais_code(chat):
    import asyncio
    import pickle

    import langtorch as lt
    from langtorch.backends import LocalBackend
    from langtorch.errors import BadRequestError, SequenceError
    from langtorch.functional import errors

    # One class, importable from the engine (compatibility) and from the error hierarchy.
    assert E.SequenceError is errors.SequenceError is SequenceError is lt.errors.SequenceError
    e = pickle.loads(pickle.dumps(SequenceError("top_p", "expected 0 < top_p <= 1.")))
    assert (type(e), e.param, e.reason) == (SequenceError, "top_p", "expected 0 < top_p <= 1.")
    # OpenAI's machine-readable code is an argument of the error, not an attribute set later.
    bad = BadRequestError("too long", param="messages", code="context_length_exceeded")
    assert (bad.param, bad.code, bad.status, bad.retryable) == (
        "messages", "context_length_exceeded", 400, False)
    assert BadRequestError("no").code is None
    b = LocalBackend(chat, default_max_tokens=4, max_slots=2)
    long = {"messages": [{"role": "user", "content": "x" * (CFG.max_positions + 10)}]}
    with pytest.raises(BadRequestError) as info:
        asyncio.run(b.complete(long))
    assert (info.value.param, info.value.code) == ("messages", "context_length_exceeded")


def test_engines_with_other_options_share_the_model_weights(model):
    # Regression (review4): every engine_for(model, other options) unstacked the weights twice
    # (params and prefill params) for itself: ~1 GB more per option set for SmolLM2, never freed.
    from langtorch.models import engine_for

    m = types.SimpleNamespace(params=model.params, config=CFG, eos_id=63, decode=model.decode,
                              prefill_dtype=None, decode_dtype=None)
    a, b = engine_for(m, max_slots=2), engine_for(m, max_slots=3)
    assert a is not b
    leaves = [jax.tree.leaves(t) for t in (a.batch.params, a.batch.prefill_params,
                                           b.batch.params, b.batch.prefill_params)]
    assert all(x is y for other in leaves[1:] for x, y in zip(leaves[0], other))
    h2, h3 = (engine_for(m, max_slots=k, prefill_dtype="bfloat16") for k in (2, 3))
    assert h2 is not a and jax.tree.leaves(h2.batch.params)[0] is leaves[0][0]
    assert all(x is y and x.dtype == jax.numpy.bfloat16 for x, y in zip(
        jax.tree.leaves(h2.batch.prefill_params), jax.tree.leaves(h3.batch.prefill_params)))
    m.params = jax.tree.map(lambda x: x + 0, model.params)  # new weights: a new copy
    c = engine_for(m, max_slots=4)
    assert jax.tree.leaves(c.batch.params)[0] is not leaves[0][0]
    assert [r.completion_tokens for r in c.generate([[1, 2]], max_tokens=3)] == [3]


def test_an_idle_engine_worker_ends_and_restarts_on_the_next_request(model, monkeypatch):
    # Regression (review4): each engine's worker thread waited forever, so every option set
    # ever used kept a thread alive.
    import time

    from langtorch.models import _engine
    from langtorch.models._engine import Engine

    monkeypatch.setattr(_engine, "_IDLE_S", 0.05)
    monkeypatch.setattr(_engine, "_TRIM_AFTER_S", 0.05)  # the heap trim after work, first
    eng = Engine(model, max_slots=2, chunk=4, prefill_dtype=None)
    want = eng.generate([[1, 2, 3]], max_tokens=5)
    thread = eng._thread
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not thread.is_alive() and eng._thread is None
    assert eng.generate([[1, 2, 3]], max_tokens=5) == want
