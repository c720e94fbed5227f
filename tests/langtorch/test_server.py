"""langtorch.testing.OpenAIServer: the real openai client against the loopback server."""

import asyncio
import json

import httpx
import numpy as np
import openai
import pytest

from langtorch.testing import FAULTS, OpenAIServer, Reply, default_responder, openai_server  # noqa: F401


@pytest.fixture
def client(srv):
    return openai.OpenAI(base_url=srv.url, api_key="sk-test-000000", max_retries=0, timeout=5)


def _user(text):
    return [{"role": "user", "content": text}]


def test_chat_n_usage_and_counters(srv, client):
    r = client.chat.completions.create(model="m1", messages=_user("two words"), n=3)
    assert [c.message.content for c in r.choices] == ["Echo: two words", "Echo: two words [1]",
                                                    "Echo: two words [2]"]
    assert r.model == "m1" and r.usage.prompt_tokens == 3 and r.usage.total_tokens > 3
    assert srv.requests == srv.chat_requests == 1 and srv.bodies[0]["n"] == 3


@pytest.mark.parametrize("extra, param", [
    ({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"seed": "1"}, "seed")])
def test_out_of_range_sampling_values_are_400_naming_the_param(srv, extra, param):
    # The same SamplingParams reader as LocalBackend and `langtorch serve`: OpenAI's ranges.
    r = httpx.post(srv.url + "/chat/completions", json={"model": "m", "messages": _user("x"),
                                                        **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    ok = httpx.post(srv.url + "/chat/completions", json={"model": "m", "messages": _user("x"),
                                                         "temperature": 2, "top_p": 1})
    assert ok.status_code == 200


def test_streaming_with_usage(srv, client):
    stream = client.chat.completions.create(model="m", messages=_user("a b c"), stream=True,
                                            stream_options={"include_usage": True})
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(pieces) == "Echo: a b c" and len(pieces) == 4
    assert usage.completion_tokens == 4


def test_tools_and_tool_result_round_trip(srv, client):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "number"}}}}}]
    r = client.chat.completions.create(model="m", messages=_user("1+2?"), tools=tools)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 1, "b": 0.5}
    follow = _user("1+2?") + [r.choices[0].message.model_dump(exclude_none=True),
                              {"role": "tool", "tool_call_id": call.id, "content": "3"}]
    r2 = client.chat.completions.create(model="m", messages=follow, tools=tools)
    assert r2.choices[0].message.content == "Echo: 3"


def test_scripted_parallel_tool_calls_with_ids_and_results(srv, client):
    """A responder scripts several tool calls in one answer (with chosen ids); after the tool
    results, tool_results() hands them to the responder and the default echo joins them."""
    from langtorch.testing import tool_results

    srv.responder = lambda body: (
        "got " + json.dumps(tool_results(body)) if body["messages"][-1]["role"] == "tool"
        else Reply(tool_calls=[{"id": "first", "name": "a", "arguments": {"x": 1}},
                               {"name": "b", "arguments": "{\"y\": 2}"}]))
    r = client.chat.completions.create(model="m", messages=_user("go"))
    calls = r.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("first", "a", '{"x": 1}'), ("call_0_1", "b", '{"y": 2}')]
    follow = _user("go") + [r.choices[0].message.model_dump(exclude_none=True),
                            {"role": "tool", "tool_call_id": "first", "content": "one"},
                            {"role": "tool", "tool_call_id": "call_0_1", "content": "two"}]
    r2 = client.chat.completions.create(model="m", messages=follow)
    assert r2.choices[0].message.content == 'got {"first": "one", "call_0_1": "two"}'
    srv.responder = None
    assert default_responder({"messages": follow})[0].content == "Echo: one | two"


def test_response_format_schema_and_json_object(srv, client):
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "tags": {"type": "array", "items": {"enum": ["x"]}}}}
    r = client.chat.completions.create(model="m", messages=_user("q"), response_format={
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert json.loads(r.choices[0].message.content) == {"name": "echo", "tags": ["x"]}
    r = client.chat.completions.create(model="m", messages=_user("q"),
                                       response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content) == {"echo": "q"}


def test_responder_table_function_and_reply(srv, client):
    srv.responder = {"capital of France?": "Paris"}
    ask = lambda q: client.chat.completions.create(model="m", messages=_user(q)).choices[0]  # noqa: E731
    assert ask("capital of France?").message.content == "Paris"
    assert ask("other").message.content == "Echo: other"
    srv.responder = lambda body: Reply("cut", finish_reason="length")
    assert ask("x").finish_reason == "length"
    srv.responder = lambda body: ["a", "b"]
    r = client.chat.completions.create(model="m", messages=_user("x"), n=2)
    assert [c.message.content for c in r.choices] == ["a", "b"]


def test_embeddings_float_and_base64(srv, client):
    r = client.embeddings.create(model="e", input=["x", "y", "x"])  # the client asks for base64
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, 8) and np.allclose(v[0], v[2]) and not np.allclose(v[0], v[1])
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    r = client.embeddings.create(model="e", input="x", dimensions=4, encoding_format="float")
    assert len(r.data[0].embedding) == 4 and srv.embedding_requests == 2


@pytest.mark.parametrize("fault,status", [
    ("rate_limit", 429), ("server_error", 500), ("bad_gateway", 502), ("bad_request", 400),
    ("unauthorized", 401), ("forbidden", 403), ("not_found", 404), ("malformed_json", 200)])
def test_status_faults(srv, fault, status):
    srv.set_faults([fault])
    r = httpx.post(srv.url + "/chat/completions", json={"model": "m", "messages": _user("x")})
    assert r.status_code == status and srv.faults_served[fault] == 1
    if fault == "rate_limit":
        assert float(r.headers["Retry-After"]) == srv.retry_after
    if fault == "bad_gateway":
        assert r.text.startswith("<html>")
    if fault == "malformed_json":
        with pytest.raises(json.JSONDecodeError):
            r.json()
    # the schedule is spent: the next request is normal
    assert httpx.post(srv.url + "/chat/completions", json={"messages": _user("x")}).status_code == 200


def test_hang_and_drop(srv):
    srv.hang_seconds = 2.0
    srv.set_faults(["hang", "drop"])
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/chat/completions", json={"messages": _user("x")}, timeout=0.1)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(srv.url + "/chat/completions", json={"messages": _user("x")}, timeout=2)
    assert srv.faults_served == {"hang": 1, "drop": 1}


def test_probabilistic_and_callable_faults(srv):
    srv.set_faults({"server_error": 0.5})
    codes = [httpx.post(srv.url + "/chat/completions", json={"messages": _user("x")}).status_code
             for _ in range(20)]
    assert 0 < codes.count(500) < 20
    srv.set_faults(lambda number, body: "not_found" if body["messages"][0]["content"] == "bad" else None)
    assert httpx.post(srv.url + "/chat/completions", json={"messages": _user("bad")}).status_code == 404
    with pytest.raises(ValueError, match="unknown fault"):
        srv.set_faults(["explode"])


def test_max_in_flight_counts_concurrency():
    # A server of its own: requests left over by other tests' hang faults must not count here.
    # The latency is long enough that all six overlap even on a heavily loaded machine.
    with OpenAIServer(latency=1.0) as srv:

        async def main():
            client = openai.AsyncOpenAI(base_url=srv.url, api_key="sk-x", max_retries=0)
            await asyncio.gather(*(client.chat.completions.create(model="m", messages=_user(str(i)))
                                   for i in range(6)))
            await client.close()

        asyncio.run(main())
        assert srv.max_in_flight == 6 and srv.in_flight == 0


def test_api_key_check_quotes_sent_key():
    with OpenAIServer(api_key="sk-right-key") as s:
        good = openai.OpenAI(base_url=s.url, api_key="sk-right-key", max_retries=0)
        assert good.chat.completions.create(model="m", messages=_user("x")).choices
        bad = openai.OpenAI(base_url=s.url, api_key="sk-wrong-key", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="sk-wrong-key"):
            bad.chat.completions.create(model="m", messages=_user("x"))


def test_fixture_sets_environment(openai_server):  # noqa: F811
    client = openai.OpenAI(max_retries=0)  # reads OPENAI_BASE_URL / OPENAI_API_KEY
    assert client.chat.completions.create(model="m", messages=_user("env")).choices[0].message.content == "Echo: env"
    assert openai_server.requests == 1


def test_default_responder_and_fault_table_documented():
    assert set(FAULTS) >= {"rate_limit", "server_error", "bad_gateway", "malformed_json", "hang", "drop"}
    assert default_responder({"messages": _user("x"), "tools": [{"function": {"name": "f"}}],
                              "tool_choice": "none"})[0].content == "Echo: x"
    with pytest.raises(RuntimeError, match="not running"):
        _ = OpenAIServer().url
