"""langtorch.nn.LLM / Embed / chat against the loopback server with the real openai client."""

import asyncio
import copy
import io
import json

import numpy as np
import pydantic
import pytest
import torch

import langtorch as lt
from langtorch.backends import OpenAIBackend, Usage
from langtorch.errors import AuthenticationError, BatchError, ParseError

KEY = "sk-llm-module-test-0123456789"


@pytest.fixture
def backend(srv):
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, backoff_base=0.001)


def test_output_shape_metadata_and_data_semantics(backend, srv):
    srv.responder = lambda body: "{" + body["messages"][-1]["content"] + "}"
    llm = lt.nn.LLM(backend, temperature=0)
    x = lt.TextTensor([["a", "b", "c"], ["d", "e", "f"]])
    out = llm(x, progress=False)
    assert out.shape == (2, 3) and out.tolist()[1] == ["{d}", "{e}", "{f}"]
    assert not out.is_template and (out + lt.TextTensor("!")).tolist()[0][0] == "{a}!"
    md = out.metadata
    assert md["model"].tolist()[0] == ["m"] * 3 and md["finish_reason"].tolist()[0][0] == "stop"
    assert md["prompt_tokens"].sum() == llm.last_call.usage.prompt_tokens > 0
    assert md["completion_tokens"].sum() == llm.last_call.usage.completion_tokens
    assert backend.usage == llm.last_call.usage and not md["cached"].any()


def test_every_chat_parameter_passes_through(backend, srv):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}]
    llm = lt.nn.LLM(backend, seed=3, logprobs=True, max_tokens=9, tools=tools, tool_choice="auto",
                    custom_server_flag="x")
    out = llm(lt.TextTensor("find"), top_p=0.5)  # per-call override
    body = srv.bodies[-1]
    assert {k: body[k] for k in ("seed", "logprobs", "max_tokens", "tool_choice", "custom_server_flag",
                                 "top_p")} == {"seed": 3, "logprobs": True, "max_tokens": 9,
                                               "tool_choice": "auto", "custom_server_flag": "x",
                                               "top_p": 0.5}
    assert body["tools"] == tools and out.metadata["finish_reason"] == "tool_calls"
    call = out.metadata["tool_calls"][0]
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"]) == {"q": "echo"}


def test_n_adds_trailing_dimension(backend):
    out = lt.nn.LLM(backend, n=3)(lt.TextTensor(["p", "q"]), progress=False)
    assert out.shape == (2, 3) and out.tolist()[1] == ["Echo: q", "Echo: q [1]", "Echo: q [2]"]
    tokens = out.metadata["prompt_tokens"]
    assert tokens[:, 1:].sum() == 0 and tokens[:, 0].all()  # usage on sample 0: sums are exact
    assert lt.nn.LLM(backend, n=2)(lt.TextTensor("s")).shape == (2,)


def test_system_prompt_module_and_per_entry_chats(backend, srv):
    llm = lt.nn.LLM(backend, system="You are terse.")
    llm(lt.TextTensor("hi"))
    assert srv.bodies[-1]["messages"] == [{"role": "system", "content": "You are terse."},
                                          {"role": "user", "content": "hi"}]
    x = lt.nn.chat([
        [{"role": "system", "content": "Pirate."}, {"role": "user", "content": "hello"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
         {"role": "user", "content": "and 3+3?"}],
    ])
    out = llm(x, progress=False)
    assert out.tolist() == ["Echo: hello", "Echo: and 3+3?"]
    by_last = {b["messages"][-1]["content"]: b["messages"] for b in srv.bodies[-2:]}
    assert by_last["hello"][0] == {"role": "system", "content": "Pirate."}
    assert [m["role"] for m in by_last["and 3+3?"]] == ["system", "user", "assistant", "user"]
    assert by_last["and 3+3?"][0]["content"] == "You are terse."
    x = lt.TextTensor(["q1", "q2"])
    x.metadata["system"] = ["S1", ""]  # per-entry system prompts; "" falls back to the module's
    llm(x, progress=False)
    systems = {b["messages"][-1]["content"]: b["messages"][0]["content"] for b in srv.bodies[-2:]}
    assert systems == {"q1": "S1", "q2": "You are terse."}
    with pytest.raises(ValueError, match="metadata"):
        lt.nn.LLM(backend, system=["a", "b"])
    with pytest.raises(ValueError, match="end with a user message"):
        lt.nn.chat([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])


def test_stream_single_and_many(backend, srv):
    llm = lt.nn.LLM(backend, stream=True)
    deltas = list(llm(lt.TextTensor("one two three")))
    assert "".join(deltas) == "Echo: one two three" and len(deltas) > 1
    assert all(isinstance(d, str) for d in deltas)
    assert srv.bodies[-1]["stream"] and backend.usage == Usage(4, 4)  # usage of streams counts
    pieces = {}
    for index, delta in llm(lt.TextTensor([["a b", "c d"]])):
        pieces[index] = pieces.get(index, "") + delta
    assert pieces == {(0, 0): "Echo: a b", (0, 1): "Echo: c d"}
    for _ in llm(lt.TextTensor(["x y z", "u v w"])):
        break  # stopping early closes the streams
    assert llm(lt.TextTensor("after"), stream=False).item() == "Echo: after"


class Answer(pydantic.BaseModel):
    city: str
    population: int


def test_structured_output_pydantic_and_schema(backend, srv):
    out = lt.nn.LLM(backend, response_format=Answer)(lt.TextTensor(["x", "y"]), progress=False)
    parsed = out.metadata["parsed"]
    assert all(isinstance(p, Answer) for p in parsed) and parsed[0].population == 1
    assert srv.bodies[-1]["response_format"]["json_schema"]["schema"]["required"] == ["city", "population"]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    out = lt.nn.LLM(backend, response_format=schema)(lt.TextTensor("z"))
    assert out.metadata["parsed"] == {"ok": True}


def test_parse_error_single_and_in_batch(backend, srv):
    srv.responder = lambda body: "not json" if body["messages"][-1]["content"] == "bad" else '{"city": "P", "population": 2}'
    llm = lt.nn.LLM(backend, response_format=Answer)
    with pytest.raises(ParseError) as info:
        llm(lt.TextTensor("bad"))
    assert info.value.text == "not json" and info.value.index == ()
    with pytest.raises(BatchError) as info:
        llm(lt.TextTensor(["ok", "bad", "ok2"]), progress=False)
    assert list(info.value.errors) == [(1,)] and isinstance(info.value.errors[(1,)], ParseError)
    assert info.value.results.metadata["parsed"][0].city == "P"


def test_partial_failure_batch_error_keeps_results(backend, srv):
    srv.set_faults(lambda n, body: "bad_request" if body["messages"][-1]["content"] == "b" else None)
    with pytest.raises(BatchError) as info:
        lt.nn.LLM(backend)(lt.TextTensor([["a", "b"], ["c", "d"]]), progress=False)
    e = info.value
    assert list(e.errors) == [(0, 1)] and e.errors[(0, 1)].status == 400
    assert e.results.tolist() == [["Echo: a", ""], ["Echo: c", "Echo: d"]]
    srv.set_faults(["unauthorized"] * 5)
    with pytest.raises(AuthenticationError):  # a single entry raises its own typed error
        lt.nn.LLM(backend)(lt.TextTensor("x"))


def test_acall_and_sync_call_in_running_loop(backend):
    llm = lt.nn.LLM(backend)

    async def cell():
        a = await llm.acall(lt.TextTensor(["u", "v"]), progress=False)
        b = llm(lt.TextTensor("w"))  # a sync call inside a running loop
        return a.tolist(), b.item()

    assert asyncio.run(cell()) == (["Echo: u", "Echo: v"], "Echo: w")


def test_cache_hits_in_metadata(srv, tmp_path):
    b = OpenAIBackend("m", base_url=srv.url, api_key=KEY, cache=tmp_path / "c.sqlite")
    llm = lt.nn.LLM(b)
    llm(lt.TextTensor(["a", "b"]), progress=False)
    out = llm(lt.TextTensor(["a", "b"]), progress=False)
    assert out.metadata["cached"].all() and out.metadata["prompt_tokens"].sum() == 0
    assert llm.last_call.usage == Usage() and srv.chat_requests == 2
    llm(lt.TextTensor(["a"]), use_cache=False)
    assert srv.chat_requests == 3


def test_state_dict_has_system_prompt_and_no_key(backend):
    llm = lt.nn.LLM(backend, system="Be brief.", temperature=0.2)
    chain = lt.TChain(llm)
    state = chain.state_dict()
    assert state == {"0.system": "Be brief."}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert KEY.encode() not in buffer.getvalue()
    buffer.seek(0)
    loaded = lt.nn.LLM(backend, system="other")
    lt.TChain(loaded).load_state_dict(torch.load(buffer, weights_only=True))
    assert str(loaded.system) == "Be brief."
    assert KEY not in repr(chain) and "sk-***" in repr(chain)
    twin = copy.deepcopy(llm)  # modules deep-copy; the backend (a connection) is shared
    assert twin.backend is backend and str(twin.system) == "Be brief." and twin.system is not llm.system


def test_embed_module_batches_many_inputs(srv):
    b = OpenAIBackend("e", base_url=srv.url, api_key=KEY, embed_batch_size=2)
    out = lt.nn.Embed(b, dimensions=5)(lt.TextTensor([["a", "b", "c"], ["d", "e", "a"]]))
    assert out.embedding.shape == (2, 3, 5) and srv.embedding_requests == 3  # 5 distinct, 2 per request
    assert np.allclose(out.embedding[0, 0], out.embedding[1, 2]) and out.tolist()[0] == ["a", "b", "c"]
    with pytest.raises(TypeError, match="Backend"):
        lt.nn.Embed("not a backend")
    with pytest.raises(TypeError, match="Backend"):
        lt.nn.LLM(None)


def test_unparsable_answers_are_not_cached(srv, tmp_path):
    """M3: an answer that fails response_format parsing is not cached; a rerun asks again."""
    answers = iter(["not json", '{"city": "Paris"}'])
    srv.responder = lambda body: next(answers)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    llm = lt.nn.LLM(OpenAIBackend("m", base_url=srv.url, api_key=KEY, cache=tmp_path / "c.sqlite"),
                    response_format=schema, temperature=0)
    with pytest.raises(ParseError):
        llm("where?")
    out = llm("where?")
    assert out.metadata["parsed"] == {"city": "Paris"} and srv.chat_requests == 2
    assert bool(llm("where?").metadata["cached"]) and srv.chat_requests == 2


def test_lone_surrogate_answer_does_not_crash_the_batch(backend, srv):
    """M11: one answer with half an emoji, in a batch, through LLM."""
    srv.responder = {"a": "cut \ud83d", "b": "fine"}
    out = lt.nn.LLM(backend, temperature=0)(lt.TextTensor(["a", "b"]))
    assert out.tolist() == ["cut \ufffd", "fine"]


def test_client_options_are_not_sent_in_the_body(backend, srv):
    """LOW: extra_headers/timeout as chat params would land in the JSON body, cache and repr."""
    llm = lt.nn.LLM(backend, extra_headers={"Authorization": "Bearer sk-leak-0123456789"})
    assert "sk-leak-0123456789" not in repr(llm) and "Bearer ***'}" in repr(llm)
    with pytest.raises(ValueError, match="default_headers"):
        llm("x")
    with pytest.raises(ValueError, match="timeout"):
        lt.nn.LLM(backend)("x", timeout=3)
    assert srv.chat_requests == 0
    out = lt.nn.LLM(backend, extra_body={"top_k": 5})("x")
    assert out.item() == "Echo: x" and srv.bodies[-1]["top_k"] == 5 and "extra_body" not in srv.bodies[-1]


def test_chat_keeps_multimodal_content(backend, srv):
    """LOW: a list of content parts is sent as given, not turned into a string."""
    parts = [{"type": "text", "text": "what is this?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    x = lt.nn.chat([[{"role": "user", "content": parts}]])
    lt.nn.LLM(backend)(x)
    assert srv.bodies[-1]["messages"] == [{"role": "user", "content": parts}]
