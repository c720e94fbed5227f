"""Issue 14 (LLM side): conversations that continue (answer.reply), the tool-call loop
(lt.nn.Tool), and the traps (unfilled placeholders, every entry failed) — against the loopback
server with the real openai client."""

import json
import threading

import pytest

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.errors import BatchError, TemplateError
from langtorch.testing import Reply, tool_results

KEY = "sk-conversation-test-0123456789"


@pytest.fixture
def backend(srv):
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, backoff_base=0.001)


def _by_first_user(bodies):
    """Bodies of one concurrent call, ordered by their first user message."""
    first = lambda b: next(m["content"] for m in b["messages"] if m["role"] == "user")  # noqa: E731
    return sorted(bodies, key=first)


def test_three_turn_conversation_over_a_batch_with_per_entry_system_prompts(backend, srv):
    llm = lt.nn.LLM(backend, system="Be brief.", temperature=0)
    chat = lt.nn.chat([[{"role": "user", "content": f"q{i}"}] for i in range(3)],
                      system=["You are A.", "You are B.", ""])  # entry 2: the module's system
    systems = ["You are A.", "You are B.", "Be brief."]

    a1 = llm(chat, progress=False)
    a2 = llm(a1.reply(["more 0", "more 1", "more 2"]), progress=False)
    a3 = llm(a2.reply("and then?"), progress=False)  # one text broadcast over the batch

    turns = [srv.bodies[0:3], srv.bodies[3:6], srv.bodies[6:9]]
    assert len(srv.bodies) == 9
    for turn, bodies in enumerate(turns):
        for i, body in enumerate(_by_first_user(bodies)):
            expected = [{"role": "system", "content": systems[i]}, {"role": "user", "content": f"q{i}"}]
            if turn >= 1:
                expected += [{"role": "assistant", "content": f"Echo: q{i}"},
                             {"role": "user", "content": f"more {i}"}]
            if turn == 2:
                expected += [{"role": "assistant", "content": f"Echo: more {i}"},
                             {"role": "user", "content": "and then?"}]
            assert body["messages"] == expected, (turn, i)
    # The answer carries the conversation (without the system prompt), ending with its own turn.
    assert a3.tolist() == ["Echo: and then?"] * 3
    history = a3.metadata["messages"][1]
    assert [m["role"] for m in history] == ["user", "assistant"] * 3
    assert history[-1] == {"role": "assistant", "content": "Echo: and then?"}
    assert a3.metadata["system"].tolist() == ["You are A.", "You are B.", ""]


def test_branching_keeps_one_history_per_sample(backend, srv):
    llm = lt.nn.LLM(backend)
    chat = lt.nn.chat([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]])
    first = llm(chat, n=2, progress=False)
    assert first.shape == (2, 2)
    srv.reset()
    second = llm(first.reply("next"), progress=False)
    assert second.shape == (2, 2) and srv.chat_requests == 4
    sent = sorted(tuple(m["content"] for m in body["messages"]) for body in srv.bodies)
    assert sent == [("a", "Echo: a", "next"), ("a", "Echo: a [1]", "next"),
                    ("b", "Echo: b", "next"), ("b", "Echo: b [1]", "next")]
    assert second.metadata["messages"][0, 1][1] == {"role": "assistant", "content": "Echo: a [1]"}


def test_plain_answers_carry_no_history_into_the_next_call(backend, srv):
    """Only answers to chat entries carry a conversation: a pipeline that inserts an answer into
    a new prompt must not send the first exchange as history."""
    llm = lt.nn.LLM(backend, temperature=0)
    answer = llm(lt.TextTensor(["x", "y"]), progress=False)
    assert "messages" not in answer.metadata
    llm(lt.TLayer("Rate: {}")(answer), progress=False)
    assert srv.bodies[-1]["messages"] in ([{"role": "user", "content": "Rate: Echo: x"}],
                                          [{"role": "user", "content": "Rate: Echo: y"}])


# ----------------------------------------------------------------------------------- tools
def _weather(city: str, unit: str = "C") -> str:
    """Current weather of a city.

    Args:
        city: the city's name.
        unit: C or F.
    """
    return f"{city}: 21 {unit}"


def test_tool_schema_from_hints_and_docstring_and_tool_as_module():
    tool = lt.nn.Tool(_weather)
    assert tool.spec == {"type": "function", "function": {
        "name": "_weather", "description": "Current weather of a city.",
        "parameters": {"type": "object", "required": ["city"], "additionalProperties": False, "properties": {
            "city": {"type": "string", "description": "the city's name."},
            "unit": {"type": "string", "default": "C", "description": "C or F."}}}}}
    # A module: JSON arguments per entry, the bare argument of a one-parameter tool, kwargs.
    assert tool(lt.TextTensor(['{"city": "Oslo"}', '{"city": "Rome", "unit": "F"}'])).tolist() == [
        "Oslo: 21 C", "Rome: 21 F"]
    out = tool(city=lt.TextTensor(["Oslo", "Lima"]), unit="F")
    assert out.tolist() == ["Oslo: 21 F", "Lima: 21 F"] and out.metadata["tool"].tolist() == ["_weather"] * 2
    count = lt.nn.Tool(lambda n: n + 1, name="inc")
    assert count(lt.TextTensor('{"n": 1}')).item() == "2"
    with pytest.raises(lt.nn.ToolError, match="invalid arguments"):
        lt.nn.Tool(lambda n: n, name="f").forward(lt.TextTensor('{"m": 1}'))
    with pytest.raises(TypeError, match=r"\*args"):
        lt.nn.Tool(lambda *a: a, name="g")
    with pytest.raises(ValueError, match="name"):
        lt.nn.Tool(_weather, name="has space")


def test_tool_loop_with_two_parallel_calls_one_raising(backend, srv):
    both_started = threading.Barrier(2, timeout=20)  # the two calls must run at the same time

    def lookup(key: str) -> dict:
        """Look a key up."""
        both_started.wait()
        return {"key": key, "value": 42}

    def explode(reason: str) -> str:
        """Always fails."""
        both_started.wait()
        raise ValueError(f"cannot do {reason}")

    def responder(body):
        if body["messages"][-1]["role"] == "tool":
            return "done: " + " / ".join(tool_results(body).values())
        return Reply(tool_calls=[{"id": "c1", "name": "lookup", "arguments": {"key": "k"}},
                                 {"id": "c2", "name": "explode", "arguments": {"reason": "that"}}])

    srv.responder = responder
    llm = lt.nn.LLM(backend, tools=[lookup, explode], temperature=0)
    with lt.trace() as tr:
        out = llm(lt.TextTensor("question"), progress=False)

    first, second = srv.bodies
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup", "explode"]
    assert first["tools"][0]["function"]["parameters"]["properties"]["key"] == {"type": "string"}
    error = "Error: ValueError: cannot do that"
    assert second["messages"] == [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "k"}'}},
            {"id": "c2", "type": "function", "function": {"name": "explode", "arguments": '{"reason": "that"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"key": "k", "value": 42}'},
        {"role": "tool", "tool_call_id": "c2", "content": error}]
    assert out.item() == 'done: {"key": "k", "value": 42} / ' + error
    assert out.metadata["finish_reason"] == "stop" and out.metadata["tool_rounds"] == 1
    assert out.metadata["tool_calls"] == [
        {"id": "c1", "name": "lookup", "arguments": {"key": "k"}, "round": 1,
         "result": '{"key": "k", "value": 42}', "error": None},
        {"id": "c2", "name": "explode", "arguments": {"reason": "that"}, "round": 1,
         "result": None, "error": error}]
    # usage: both requests counted, on the entry and in last_call
    assert llm.last_call.sent == 2 and out.metadata["prompt_tokens"] == llm.last_call.usage.prompt_tokens
    # trace: two tool spans under the llm span, the failing one with its error; two requests
    (llm_span,) = tr.find(kind="llm")
    tools = {s.name: s for s in tr.find(kind="tool")}
    assert set(tools) == {"lookup", "explode"} and all(s.parent_id == llm_span.id for s in tools.values())
    assert tools["explode"].error == {"type": "ValueError", "message": "cannot do that"}
    assert tools["lookup"].error is None and tools["lookup"].outputs[0]["texts"] == ['{"key": "k", "value": 42}']
    assert tools["lookup"].inputs[0]["texts"] == ['{"key": "k"}']
    assert [s.attrs["entries"] for s in tr.find(kind="request")] == [[0], [0]]


def test_tool_loop_stops_at_max_tool_rounds(backend, srv):
    srv.responder = lambda body: Reply(tool_calls=[{"name": "again", "arguments": {}}])
    calls = []
    llm = lt.nn.LLM(backend, tools=[lt.nn.Tool(lambda: calls.append(1) or "more", name="again")],
                    max_tool_rounds=2)
    with pytest.raises(lt.nn.ToolError, match="max_tool_rounds=2") as info:
        llm(lt.TextTensor("loop"), progress=False)
    assert srv.chat_requests == 3 and len(calls) == 2
    assert [m["role"] for m in info.value.messages] == ["user", "assistant", "tool", "assistant", "tool",
                                                        "assistant"]
    # in a batch, the looping entry fails alone
    srv.responder = lambda body: ("fine" if body["messages"][0]["content"] == "ok"
                                  else Reply(tool_calls=[{"name": "again", "arguments": {}}]))
    with lt.trace() as tr, pytest.raises(BatchError) as batch:
        llm(lt.TextTensor(["ok", "loop"]), progress=False)
    assert batch.value.results.tolist() == ["fine", ""] and list(batch.value.errors) == [(1,)]
    # the follow-up requests name the entry they continue
    assert [s.attrs["entries"] for s in tr.find(kind="request")][-2:] == [[1], [1]]
    with pytest.raises(ValueError, match="max_tool_rounds"):
        lt.nn.LLM(backend, tools=[_weather], max_tool_rounds=0)


def test_bad_arguments_and_unknown_tools_go_back_to_the_model(backend, srv):
    def responder(body):
        if body["messages"][-1]["role"] == "tool":
            return json.dumps(tool_results(body))
        return Reply(tool_calls=[{"id": "a", "name": "_weather", "arguments": {"unit": "F"}},
                                 {"id": "b", "name": "nope", "arguments": {}}])

    srv.responder = responder
    out = lt.nn.LLM(backend, tools=[_weather])(lt.TextTensor("w?"), progress=False)
    results = json.loads(out.item())
    assert results["a"].startswith("Error: ToolError: tool '_weather': invalid arguments (city: Field required")
    assert results["b"] == "Error: ToolError: there is no tool named 'nope'; the tools are ['_weather']."


def test_web_search_module_from_the_seed_as_a_tool(backend, srv):
    """Seed section 3.3: a WebSearchModule (a TModule) is a step of a pipeline and an LLM tool."""

    class WebSearchModule(lt.TModule):
        """Search the web and return the top results' titles and snippets."""

        def forward(self, query: lt.TextTensor) -> lt.TextTensor:
            """Args:
                query: what to search for.
            """
            output = lt.TextTensor(f"3 results for {query}", template=False)
            output.metadata["source"] = "web_search"
            return output

    search = lt.nn.Tool(WebSearchModule(), name="web_search")
    assert search.parameters["properties"]["query"] == {"type": "string", "description": "what to search for."}
    assert search.description == "Search the web and return the top results' titles and snippets."
    assert search(lt.TextTensor("nobel 2025")).item() == "3 results for nobel 2025"
    srv.responder = lambda body: (
        "answer from " + tool_results(body)["s"] if body["messages"][-1]["role"] == "tool"
        else Reply(tool_calls=[{"id": "s", "name": "web_search", "arguments": {"query": "nobel"}}]))
    out = lt.nn.LLM(backend, tools=[search])(lt.TextTensor("Who won?"), progress=False)
    assert out.item() == "answer from 3 results for nobel"


# ----------------------------------------------------------------------------------- traps
def test_unfilled_placeholder_raises_before_anything_is_sent(backend, srv):
    llm = lt.nn.LLM(backend, temperature=0)
    prize = "the {Prize} of 2025"  # inserted text that holds braces: the f-string is a template
    with pytest.raises(TemplateError) as info:
        llm(lt.TextTensor(["ok", f"Who will win {prize}?"]), progress=False)
    message = str(info.value)
    assert "entry (1,)" in message and "{Prize}" in message and info.value.field == "Prize"
    assert "double them" in message and "template=False" in message and "lt.text(" in message
    assert "allow_placeholders=True" in message and srv.chat_requests == 0
    with pytest.raises(TemplateError, match="system prompt"):
        lt.nn.LLM(backend, system="Answer about {topic}.")(lt.TextTensor("x"), progress=False)
    # the fixes: doubled braces send literal braces; data is sent as is; or opt out
    llm(lt.TextTensor("Who will win the {{Prize}}?"), progress=False)
    assert srv.bodies[-1]["messages"][-1]["content"] == "Who will win the {Prize}?"
    llm(lt.TextTensor(f"Who will win {prize}?", template=False), progress=False)
    assert srv.bodies[-1]["messages"][-1]["content"] == "Who will win the {Prize} of 2025?"
    lt.nn.LLM(backend, allow_placeholders=True)(lt.TextTensor("keep {x}"), progress=False)
    assert srv.bodies[-1]["messages"][-1]["content"] == "keep {x}"
    llm(lt.TextTensor("keep {y}"), allow_placeholders=True, progress=False)
    assert srv.bodies[-1]["messages"][-1]["content"] == "keep {y}"


def test_llm_call_whose_entries_all_failed_raises_batch_error(backend, srv):
    srv.set_faults(["bad_request", "bad_request"])
    with pytest.raises(BatchError, match="all 2 entries failed") as info:
        lt.nn.LLM(backend, temperature=0)(lt.TextTensor(["a", "b"]), progress=False)
    assert info.value.results is None and sorted(info.value.errors) == [(0,), (1,)]


def test_reply_broadcasts_and_starts_conversations_from_plain_tensors():
    answer = lt.TextTensor(["A0", "A1"], template=False)
    answer.metadata["messages"] = [[{"role": "user", "content": "q0"}, {"role": "assistant", "content": "A0"}],
                                   [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "A1"}]]
    answer.metadata["system"] = ["s0", "s1"]
    grid = answer.reply(lt.TextTensor([["x"], ["y"], ["z"]]))  # [3, 1] against [2]: [3, 2]
    assert grid.shape == (3, 2) and grid[2, 1].item() == "z"
    assert not answer.reply([["x"], ["y"], ["z"]]).is_template  # strings are data
    assert grid[2, 1].metadata["messages"][0] == {"role": "user", "content": "q1"}
    assert grid.metadata["system"].tolist()[0] == ["s0", "s1"]
    # the new turns do not share (or mutate) the old ones' lists
    grid[0, 0].metadata["messages"].append({"role": "user", "content": "extra"})
    assert len(answer[0].metadata["messages"]) == 2
    started = lt.TextTensor("Hello, how can I help?").reply("Tell me a joke")
    assert started.item() == "Tell me a joke"
    assert started.metadata["messages"] == [{"role": "assistant", "content": "Hello, how can I help?"}]
    assert lt.nn.chat("hi").metadata["messages"] == [] and lt.nn.chat("hi").item() == "hi"
    with pytest.raises(ValueError, match=r"ragged: at \(1,\) expected 2 entries \(like the first\), got 1"):
        lt.nn.chat([["a", "b"], ["c"]])
    with pytest.raises(ValueError, match="ragged"):
        lt.nn.chat([["a"], ["b", "c"]])
    with pytest.raises(TypeError, match=r"entry \(1, 0\) is not a conversation"):
        lt.nn.chat([["a"], [["b"]]])


def test_tool_calls_of_all_entries_run_concurrently_and_async_tools_are_awaited(backend, srv):
    import asyncio

    state = {"started": 0}
    everyone = asyncio.Event()

    async def meet(who: str) -> str:
        """Wait until all four calls have started."""
        state["started"] += 1
        if state["started"] == 4:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 20)  # sequential calls would never get here
        return f"met {who}"

    srv.responder = lambda body: (
        " & ".join(tool_results(body).values()) if body["messages"][-1]["role"] == "tool"
        else Reply(tool_calls=[{"name": "meet", "arguments": {"who": body["messages"][-1]["content"] + str(i)}}
                               for i in range(2)]))
    out = lt.nn.LLM(backend, tools=[meet])(lt.TextTensor(["a", "b"]), progress=False)
    assert out.tolist() == ["met a0 & met a1", "met b0 & met b1"]
    assert [[c["error"] for c in calls] for calls in out.metadata["tool_calls"]] == [[None, None]] * 2


# ----------------------------------------------------------------------------------- review fixes
def test_tool_parameter_names_unknown_arguments_and_untyped_parameters():
    """Any parameter name works (pydantic reserves ``_x``, ``model_config``, shadows ``schema``);
    an argument the function does not take is refused (a misspelt optional argument would
    otherwise run the tool with its default); a type without a JSON schema names the parameter."""
    import asyncio
    import warnings

    def odd(_x: int, model_config: str, schema: int = 1) -> str:
        return f"{_x} {model_config} {schema}"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "shadows an attribute in parent BaseModel"
        tool = lt.nn.Tool(odd)
    assert tool.parameters["required"] == ["_x", "model_config"]
    assert set(tool.parameters["properties"]) == {"_x", "model_config", "schema"}
    assert asyncio.run(tool.arun({"_x": "3", "model_config": "c", "schema": 2})) == "3 c 2"
    assert tool(lt.TextTensor('{"_x": 1, "model_config": "m"}')).item() == "1 m 1"
    # a misspelt optional argument is an error the model sees, not a silent default
    with pytest.raises(lt.nn.ToolError, match="unit_: Extra inputs are not permitted"):
        asyncio.run(lt.nn.Tool(_weather).arun({"city": "Oslo", "unit_": "F"}))
    assert lt.nn.Tool(_weather).parameters["additionalProperties"] is False

    class Opaque:
        pass

    def takes(a: int, thing: Opaque) -> str:
        return ""

    with pytest.raises(TypeError, match="parameter 'thing' has a type with no JSON schema"):
        lt.nn.Tool(takes)
    # bytes come back as text, not as a Python repr
    assert asyncio.run(lt.nn.Tool(lambda: "é".encode(), name="b").arun({})) == "é"
    # keyword arguments that do not broadcast: the error names them
    with pytest.raises(lt.errors.ShapeError, match=r"city: \(2,\), unit: \(3,\)"):
        lt.nn.Tool(_weather)(city=["a", "b"], unit=["C", "F", "K"])


def test_a_tool_past_its_timeout_fails_that_call_and_the_model_is_told(backend, srv):
    import asyncio

    release = threading.Event()

    def stuck(q: str) -> str:
        """Never answers in time."""
        release.wait(30)
        return "late"

    async def sleepy(q: str) -> str:
        """Never answers in time either."""
        await asyncio.sleep(30)
        return "late"

    with pytest.raises(ValueError, match="timeout"):
        lt.nn.Tool(stuck, timeout=0)
    again = lt.nn.Tool(lt.nn.Tool(stuck, name="s2", description="d", timeout=5))  # keeps its settings
    assert (again.name, again.description, again.timeout) == ("s2", "d", 5.0)
    assert lt.nn.Tool(again, name="s3").name == "s3"

    def own_timeout(q: str) -> str:
        raise TimeoutError("the socket timed out")

    with pytest.raises(TimeoutError, match="the socket timed out"):  # the tool's own, as itself
        lt.nn.Tool(own_timeout, timeout=30)(lt.TextTensor("x"))
    try:
        with pytest.raises(lt.nn.ToolError, match=r"did not finish within timeout=0.2 s"):
            lt.nn.Tool(stuck, timeout=0.2)(lt.TextTensor("x"))
        srv.responder = lambda body: (
            json.dumps(tool_results(body)) if body["messages"][-1]["role"] == "tool"
            else Reply(tool_calls=[{"id": "s", "name": "stuck", "arguments": {"q": "a"}},
                                   {"id": "z", "name": "sleepy", "arguments": {"q": "b"}}]))
        tools = [lt.nn.Tool(stuck, timeout=0.2), lt.nn.Tool(sleepy, timeout=0.2)]
        out = lt.nn.LLM(backend, tools=tools)(lt.TextTensor("q"), progress=False)
        assert json.loads(out.item()) == {
            "s": "Error: ToolError: tool 'stuck' did not finish within timeout=0.2 s.",
            "z": "Error: ToolError: tool 'sleepy' did not finish within timeout=0.2 s."}
    finally:
        release.set()


def test_a_tool_error_holding_a_key_is_redacted_before_it_is_sent_stored_or_cached(srv, tmp_path):
    import sqlite3

    cache = tmp_path / "c.sqlite"
    backend = OpenAIBackend("m", base_url=srv.url, api_key=KEY, backoff_base=0.001, cache=str(cache))

    def fetch(url: str) -> str:
        """Fetch a URL."""
        raise RuntimeError(f"GET {url} refused: Authorization: Bearer tok123 (key {KEY}, other sk-abcdef123456)")

    srv.responder = lambda body: (
        "sorry" if body["messages"][-1]["role"] == "tool"
        else Reply(tool_calls=[{"name": "fetch", "arguments": {"url": "http://x"}}]))
    out = lt.nn.LLM(backend, tools=[fetch], temperature=0)(lt.TextTensor("get it"), progress=False)
    sent = json.dumps(srv.bodies[-1])
    error = out.metadata["tool_calls"][0]["error"]
    assert error.startswith("Error: RuntimeError: GET http://x refused") and "***" in error
    for text in (sent, error):
        assert KEY not in text and "sk-abcdef123456" not in text and "tok123" not in text
    import langtorch.runtime._cache as cache_module

    for live in list(cache_module._live_caches):  # queued writes on disk
        live.flush()
    rows = sqlite3.connect(cache).execute("SELECT request, choice FROM responses").fetchall()
    assert len(rows) == 2 and not any(KEY in r or "tok123" in r for row in rows for r in row)


def test_reply_with_a_template_tensor_is_a_template_and_strings_are_data(backend, srv):
    llm = lt.nn.LLM(backend, temperature=0)
    first = llm(lt.nn.chat(["hi"]), progress=False)
    llm(first.reply(lt.TextTensor("literal {{braces}}")), progress=False)
    assert srv.bodies[-1]["messages"][-1]["content"] == "literal {braces}"
    with pytest.raises(TemplateError, match="placeholder {x}"):
        llm(first.reply(lt.TextTensor("unfilled {x}")), progress=False)
    llm(first.reply("data {x} as written"), progress=False)
    assert srv.bodies[-1]["messages"][-1]["content"] == "data {x} as written"


def test_structured_output_with_tools_caches_the_tool_call_turn(srv, tmp_path):
    """A tool-call turn is not the answer to parse: it is cached, so a rerun sends nothing."""
    import pydantic

    class Answer(pydantic.BaseModel):
        answer: str

    backend = OpenAIBackend("m", base_url=srv.url, api_key=KEY, cache=str(tmp_path / "c.sqlite"))
    srv.responder = lambda body: (
        json.dumps({"answer": "42"}) if body["messages"][-1]["role"] == "tool"
        else Reply(tool_calls=[{"name": "_weather", "arguments": {"city": "Oslo"}}]))
    llm = lt.nn.LLM(backend, tools=[_weather], temperature=0, response_format=Answer)
    assert llm(lt.TextTensor("q"), progress=False).metadata["parsed"].answer == "42"
    assert srv.chat_requests == 2
    again = llm(lt.TextTensor("q"), progress=False)
    assert again.metadata["parsed"].answer == "42" and again.metadata["cached"] and srv.chat_requests == 2


def test_a_failed_follow_up_request_names_its_entry_and_fails_alone(srv):
    backend = OpenAIBackend("m", base_url=srv.url, api_key=KEY, backoff_base=0.001, max_retries=1)
    srv.responder = lambda body: (
        "ok" if body["messages"][0]["content"] == "plain" or body["messages"][-1]["role"] == "tool"
        else Reply(tool_calls=[{"name": "_weather", "arguments": {"city": "Oslo"}}]))
    # the follow-up (the only request with a tool result) always fails
    srv.set_faults(lambda number, body: "server_error" if body["messages"][-1]["role"] == "tool" else None)
    with pytest.raises(BatchError) as info:
        lt.nn.LLM(backend, tools=[_weather])(lt.TextTensor(["plain", "weather?"]), progress=False)
    assert info.value.results.tolist() == ["ok", ""] and list(info.value.errors) == [(1,)]
    message = str(info.value.errors[(1,)])
    assert message.startswith("request 1 to 'm' failed after 2 attempts (max_retries=1); the last one got HTTP 500")


def test_sub_agent_tools_with_more_calls_than_worker_threads_do_not_deadlock(backend, srv):
    """A TModule tool that calls an LLM with sync tools of its own (a sub-agent), on more entries
    than the runtime loop has worker threads: the outer tools held every worker while their
    sub-agents' tools queued for one, and the call hung for ever."""
    import os

    workers = min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor size
    inner = lt.nn.LLM(backend, tools=[_weather])

    class SubAgent(lt.TModule):
        """Ask a sub-agent."""

        def forward(self, question: lt.TextTensor) -> lt.TextTensor:
            return inner(lt.TextTensor("sub " + question.item(), template=False), progress=False)

    def responder(body):
        if body["messages"][-1]["role"] == "tool":
            return "from " + " | ".join(tool_results(body).values())
        first = body["messages"][0]["content"]
        if first.startswith("sub "):
            return Reply(tool_calls=[{"name": "_weather", "arguments": {"city": first[4:]}}])
        return Reply(tool_calls=[{"name": "SubAgent", "arguments": {"question": first}}])

    srv.responder = responder
    outer = lt.nn.LLM(backend, tools=[SubAgent()])
    done: dict = {}

    def run():
        done["out"] = outer(lt.TextTensor([f"c{i}" for i in range(workers + 2)]), progress=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)  # a deadlock guard, not a timing assertion: without the fix it never ends
    assert not thread.is_alive(), "the nested tool calls deadlocked"
    assert done["out"].tolist() == [f"from from c{i}: 21 C" for i in range(workers + 2)]


@pytest.mark.parametrize("section", ["Conversations", "Tools"])
def test_recipes_sections_run(section, capsys):
    """docs/recipes.md: the Conversations and Tools recipes run as written (offline)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "recipes.md").read_text()
    body = re.search(rf"^## {section}\n(.*?)(?=^## |\Z)", text, re.S | re.M).group(1)
    blocks = re.findall(r"```python\n(.*?)```", body, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, f"recipes.md#{section}", "exec"), {"__name__": "recipes"})
    out = capsys.readouterr().out
    assert ("Echo: wine?" in out) if section == "Conversations" else ("From the search: Result 1" in out)
