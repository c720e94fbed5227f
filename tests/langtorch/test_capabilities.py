"""Issue 23, item 3: backends declare their capabilities, and whatever needs one (TGD, GEPA, Search's LLM
proposer, TextLoss, lt.nn.LLM with tools / response_format / logprobs / n, Embed) checks it when
it is built — a CapabilityError naming the alternatives, before a single request — against the
loopback server, with the backend declared without the capability."""

import asyncio
import dataclasses
import json

import pytest

import langtorch as lt
from langtorch.backends import (
    Backend,
    Capabilities,
    Choice,
    Completion,
    LocalBackend,
    OpenAIBackend,
)
from langtorch.errors import BadRequestError, CapabilityError, LangTorchError

KEY = "sk-capabilities-test-0123456789"


def _backend(srv, **kw):
    return OpenAIBackend("m", base_url=srv.url, api_key=KEY, backoff_base=0.001, **kw)


def _lacking(srv, *names):
    return _backend(srv, capabilities={name: False for name in names})


def proposal(value):
    return json.dumps({"reasoning": "r", "improved_variable": value})


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class TextOnly(Backend):
    """A backend that declares text chat only."""

    default_capabilities = Capabilities()

    async def complete(self, request):
        return Completion((Choice("ok"),))


class Undeclared(Backend):
    """A backend subclass as written before backends declared capabilities: it says nothing."""

    async def complete(self, request):
        return Completion((Choice(json.dumps({"reasoning": "r", "improved_variable": "Answer {q} now."})),))

    async def embed(self, texts, **params):
        import numpy as np

        from langtorch.backends import Embeddings
        return Embeddings(np.ones((len(texts), 2), dtype=np.float32))


# ---------------------------------------------------------------------------- declarations
def test_what_each_backend_declares():
    assert TextOnly("t").capabilities == Capabilities()
    assert str(TextOnly("t").capabilities) == "text only"
    assert OpenAIBackend("m", api_key=KEY).capabilities == Capabilities.all()
    local = LocalBackend().capabilities  # no model is loaded to say it
    assert (local.structured_output, local.tools, local.logprobs) == (True, True, True)
    assert (local.multiple_choices, local.streaming, local.embeddings) == (True, True, True)


def test_a_user_narrows_or_replaces_the_declaration_and_a_subclass_declares_its_own():
    narrowed = OpenAIBackend("m", api_key=KEY, capabilities={"logprobs": False, "tools": False})
    assert str(narrowed.capabilities) == "structured_output, multiple_choices, streaming, embeddings"
    replaced = OpenAIBackend("m", api_key=KEY, capabilities=Capabilities(tools=True))
    assert replaced.capabilities == Capabilities(tools=True)
    assert OpenAIBackend("m", api_key=KEY).capabilities == Capabilities.all()  # others unchanged
    assert replaced.options.max_retries == 4  # not taken for a runtime option

    class JsonBackend(TextOnly):
        default_capabilities = Capabilities(structured_output=True)

    assert JsonBackend("j").capabilities.structured_output
    assert not JsonBackend("j", capabilities={"structured_output": False}).capabilities.structured_output
    with pytest.raises(dataclasses.FrozenInstanceError):
        JsonBackend("j").capabilities.tools = True


def test_bad_declarations_say_what_is_expected():
    with pytest.raises(TypeError, match="unknown capability 'json'.*'structured_output'"):
        OpenAIBackend("m", api_key=KEY, capabilities={"json": True})
    with pytest.raises(TypeError, match="expected True or False, got 'yes'"):
        Capabilities(tools="yes")
    with pytest.raises(TypeError, match="expected a Capabilities or a mapping"):
        OpenAIBackend("m", api_key=KEY, capabilities=["tools"])
    with pytest.raises(TypeError, match="unknown capability 'tool'"):
        Capabilities().missing("tool")


@pytest.mark.parametrize("capability, param", [
    ("structured_output", {"response_format": {"type": "json_object"}}),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("logprobs", {"logprobs": True}),
])
def test_local_backend_declares_honestly_what_it_accepts(capability, param):
    """What LocalBackend declares is what its request check lets through (before any model
    loads); an unknown parameter is still refused, naming it."""
    from langtorch.backends.local import _check_keys

    backend = LocalBackend()
    assert getattr(backend.capabilities, capability)
    request = {"messages": [{"role": "user", "content": "hi"}], **param}
    _check_keys(request)
    with pytest.raises(BadRequestError) as info:
        asyncio.run(backend.complete({**request, "no_such_param": 1}))
    assert info.value.param == "no_such_param"


# ---------------------------------------------------------------------------- TGD
def test_tgd_without_structured_output_fails_when_built_not_after_the_passes(srv):
    """The run this item is about: forward and backward passes, then the optimizer. The backward
    pass asks for free text, which any engine gives; TGD needs structured output and says so
    when it is built, so nothing of its own is sent."""
    srv.responder = lambda body: "a long answer"
    prompt = lt.TextParameter("Answer {q}.")
    engine = lt.nn.LLM(_lacking(srv, "structured_output"))
    out = lt.nn.LLM(_backend(srv))(prompt * lt.TextTensor({"q": lt.TextTensor(["2+2?", "3+3?"])}))
    loss = lt.nn.MetricLoss(lambda p, t: (0.0, "too long"))(out, "4")
    srv.responder = lambda body: "Ask for one word."
    loss.backward(feedback_engine=engine)  # free text: fine on this engine
    assert str(prompt.grad) == "Ask for one word."
    srv.reset()
    with pytest.raises(CapabilityError) as info:
        lt.optim.TGD([prompt], engine)
    assert srv.requests == 0
    e = info.value
    assert isinstance(e, LangTorchError) and e.who == "lt.optim.TGD"
    assert e.missing == ("structured_output",) and not e.declared.structured_output
    message = str(e)
    assert "lt.optim.TGD needs structured output (response_format with a JSON schema)" in message
    assert "OpenAIBackend(model='m'" in message and "sk-capabilities" not in message  # key redacted
    assert "it declares: tools, logprobs, multiple_choices, streaming, embeddings" in message
    assert "Search with a mutation proposer" in message and "Nothing was sent" in message
    assert "capabilities={'structured_output': True}" in message  # how a server that has it says so


def test_tgd_accepts_a_backend_engine_that_declares_structured_output(srv):
    srv.responder = lambda body: proposal("Answer {q} in one word.")
    p = lt.TextParameter("Answer {q}.")
    p.grad = lt.TextTensor("too long")
    lt.optim.TGD([p], _backend(srv)).step()
    assert str(p) == "Answer {q} in one word." and srv.chat_requests == 1
    srv.reset()
    with pytest.raises(CapabilityError, match="lt.optim.TGD needs structured output"):
        lt.optim.TGD([p], _lacking(srv, "structured_output"))  # a Backend adapted to an engine
    with pytest.raises(CapabilityError) as info:
        lt.optim.TGD([p], LocalBackend(capabilities={"structured_output": False}))
    # A langtorch backend the user narrowed: the message may say how to declare it back, and
    # names the mutation-proposer alternative.
    assert "Search with a mutation proposer" in str(info.value)
    assert srv.requests == 0


def test_a_custom_feedback_engine_is_checked_only_when_it_declares(srv):
    from langtorch.autograd import Answer

    class Critic:
        async def afeedback(self, prompts, **options):
            return [Answer(proposal("Answer {q} now.")) for _ in prompts]

    class PlainCritic(Critic):
        capabilities = Capabilities()

    p = lt.TextParameter("Answer {q}.")
    p.grad = lt.TextTensor("too long")
    lt.optim.TGD([p], Critic()).step()  # declares nothing: trusted
    assert str(p) == "Answer {q} now."
    with pytest.raises(CapabilityError, match="its engine PlainCritic") as info:
        lt.optim.TGD([p], PlainCritic())
    assert "default_capabilities" not in str(info.value)  # not a backend: no backend advice


# ---------------------------------------------------------------------------- Search
def test_search_llm_proposer_without_structured_output_fails_when_built(srv):
    layer = lt.TLayer("{}?")
    kwargs = dict(module=layer, metric="exact_match", inputs=["a", "b"], targets=["a", "b"])
    srv.reset()
    with pytest.raises(CapabilityError) as info:
        lt.optim.Search(layer.named_text_parameters(), lt.nn.LLM(_lacking(srv, "structured_output")), 2, **kwargs)
    assert srv.requests == 0 and info.value.who == "lt.optim.Search's LLM proposer"
    assert "a mutation proposer: a callable (value, k, rng) -> list[str]" in str(info.value)
    # The alternative it names works, and so does a proposer that declares structured output.
    opt = lt.optim.Search(layer.named_text_parameters(), lambda v, k, rng: ["{}", "{}!"], 2, **kwargs)
    assert opt.step() == 1.0 and str(layer.prompt) == "{}"
    srv.responder = lambda body: json.dumps({"candidates": ["{}.", "{}"]})
    layer.prompt = lt.TextParameter("{}?")
    opt = lt.optim.Search(layer.named_text_parameters(), _backend(srv), 2, **kwargs)
    assert opt.step() == 1.0 and srv.chat_requests == 1


# ---------------------------------------------------------------------------- GEPA
def test_gepa_reflection_engine_without_structured_output_fails_when_built(srv):
    layer = lt.TLayer("{}")
    kwargs = dict(module=layer, metric="exact_match", trainset=(["a", "b"], ["a!", "b!"]),
                  valset=(["c"], ["c!"]), minibatch=2, max_metric_calls=6)
    srv.reset()
    with pytest.raises(CapabilityError) as info:
        lt.optim.GEPA(layer.named_text_parameters(), reflection_engine=_lacking(srv, "structured_output"), **kwargs)
    assert srv.requests == 0 and info.value.who == "lt.optim.GEPA's reflection_engine"
    rewrite = {"reasoning": "add !", "proposals": [{"rewrites": [{"component": "prompt", "new_value": "{}!"}]}]}
    srv.responder = lambda body: json.dumps(rewrite)
    opt = lt.optim.GEPA(layer.named_text_parameters(), reflection_engine=_backend(srv), **kwargs)
    assert opt.fit() == 1.0 and str(layer.prompt) == "{}!" and srv.chat_requests >= 1


# ---------------------------------------------------------------------------- TextLoss
def test_text_loss_judge_without_structured_output_fails_when_built(srv):
    srv.reset()
    with pytest.raises(CapabilityError) as info:
        lt.nn.TextLoss("Be brief.", _lacking(srv, "structured_output"))
    assert srv.requests == 0 and "lt.nn.MetricLoss(metric)" in str(info.value)
    with pytest.raises(CapabilityError, match="lt.nn.TextLoss"):
        lt.nn.TextLoss("Be brief.", LocalBackend(capabilities={"structured_output": False}))
    srv.responder = lambda body: json.dumps({"score": 0.5, "feedback": "Too long."})
    loss = lt.nn.TextLoss("Be brief.", _backend(srv))(lt.TextTensor(["a long answer"]))
    assert loss.metadata["score"].tolist() == [0.5] and srv.chat_requests == 1


# ---------------------------------------------------------------------------- lt.nn.LLM
@pytest.mark.parametrize("capability, params, needle", [
    ("tools", {"tools": [add]}, "tool calls (tools=)"),
    ("tools", {"tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}]},
     "tool calls"),
    ("structured_output", {"response_format": {"type": "object", "properties": {"a": {"type": "string"}}}},
     "structured output"),
    ("logprobs", {"logprobs": True, "top_logprobs": 2}, "token log-probabilities"),
    ("multiple_choices", {"n": 3}, "several choices per request (n > 1)"),
])
def test_llm_checks_what_its_parameters_need_when_built(srv, capability, params, needle):
    srv.reset()
    with pytest.raises(CapabilityError) as info:
        lt.nn.LLM(_lacking(srv, capability), **params)
    assert srv.requests == 0 and info.value.missing == (capability,)
    assert needle in str(info.value) and str(info.value).startswith("lt.nn.LLM(")
    llm = lt.nn.LLM(_backend(srv), **params)  # declared: built, and it sends
    srv.responder = lambda body: json.dumps({"a": "x"})
    llm(lt.TextTensor(["hi"]), max_tool_rounds=1) if capability == "tools" else llm(lt.TextTensor(["hi"]))
    assert srv.chat_requests >= 1


def test_llm_checks_a_call_override_before_its_first_request(srv):
    llm = lt.nn.LLM(_lacking(srv, "tools", "logprobs"), temperature=0)  # needs nothing yet
    assert llm.capabilities.tools is False
    srv.reset()
    with pytest.raises(CapabilityError, match=r"lt.nn.LLM\(tools=...\) needs tool calls"):
        llm(lt.TextTensor(["hi", "yo"]), tools=[add])
    with pytest.raises(CapabilityError, match="LocalClassifier"):
        llm(lt.TextTensor(["hi"]), logprobs=True)
    assert srv.requests == 0
    assert llm(lt.TextTensor(["hi"]), logprobs=False).item() == "Echo: hi"  # False needs nothing


def test_llm_as_feedback_engine_checks_response_format_before_sending(srv):
    llm = lt.nn.LLM(_lacking(srv, "structured_output"))
    srv.reset()
    with pytest.raises(CapabilityError, match="lt.nn.LLM.afeedback"):
        asyncio.run(llm.afeedback([[{"role": "user", "content": "hi"}]],
                                  response_format={"type": "json_schema", "json_schema": {"name": "x"}}))
    assert srv.requests == 0
    assert asyncio.run(llm.afeedback([[{"role": "user", "content": "hi"}]]))[0].text == "Echo: hi"


def test_a_backend_subclass_promises_text_only_when_it_declares_so():
    with pytest.raises(CapabilityError, match="it declares: text only"):
        lt.nn.LLM(TextOnly("t"), n=2)
    assert lt.nn.LLM(TextOnly("t"))(lt.TextTensor(["a"])).item() == "ok"
    assert lt.nn.LLM(TextOnly("t", capabilities={"multiple_choices": True}), n=2).chat_params["n"] == 2


def test_embed_checks_the_embeddings_endpoint(srv):
    with pytest.raises(CapabilityError, match=r"lt.nn.Embed\(\) \(no backend\)"):
        lt.nn.Embed(TextOnly("t"))
    srv.reset()
    with pytest.raises(CapabilityError):
        lt.nn.Embed(_lacking(srv, "embeddings"))
    assert srv.requests == 0
    assert lt.nn.Embed(_backend(srv))(lt.TextTensor(["a"])).embedding.shape[0] == 1


def test_an_undeclared_backend_subclass_keeps_working_with_a_deprecation_warning():
    """A Backend subclass written before backends declared capabilities (the documented way to
    write a backend then) used to work as a TGD engine, a TextLoss judge, an Embed backend and
    with n > 1; it still does, with a DeprecationWarning that says how to declare. Before this
    was fixed each of these raised CapabilityError."""
    assert Undeclared("u").capabilities == Capabilities()  # what it reads as: text only
    p = lt.TextParameter("Answer {q}.")
    p.grad = lt.TextTensor("too long")
    with pytest.warns(DeprecationWarning, match=r"lt.optim.TGD needs structured output.*declares no capabilities") as rec:
        opt = lt.optim.TGD([p], Undeclared("u"))
    message = str(rec[0].message)
    assert "default_capabilities = Capabilities(structured_output=True)" in message
    assert "capabilities={'structured_output': True}" in message and "future release" in message
    with pytest.warns(DeprecationWarning, match=r"lt.nn.LLM.afeedback\(response_format=...\)"):
        opt.step()  # the request itself is checked too: trusted again, it sends
    assert str(p) == "Answer {q} now."
    with pytest.warns(DeprecationWarning, match="lt.nn.TextLoss"):
        lt.nn.TextLoss("Be brief.", Undeclared("u"))
    with pytest.warns(DeprecationWarning, match="lt.nn.Embed needs embeddings"):
        embed = lt.nn.Embed(Undeclared("u"))
    assert embed(lt.TextTensor(["a", "b"])).embedding.shape == (2, 2)
    with pytest.warns(DeprecationWarning, match="several choices"):
        lt.nn.LLM(Undeclared("u"), n=2)
    # Declaring, in the class or per instance, ends the warning (and makes the check real).
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lt.optim.TGD([p], Undeclared("u", capabilities={"structured_output": True}))
        with pytest.raises(CapabilityError):
            lt.optim.TGD([p], Undeclared("u", capabilities={"tools": True}))


def test_assigning_capabilities_declares_and_other_values_say_what_the_name_means():
    """A backend's capabilities is a property since backends declare them: assigning it raised
    "property 'capabilities' ... has no setter" (a subclass that kept its own data under that
    name broke with no explanation). Assigning a declaration declares; other values are refused
    with what the attribute is."""
    b = Undeclared("u")
    b.capabilities = {"structured_output": True}
    assert b.capabilities == Capabilities(structured_output=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lt.optim.TGD([lt.TextParameter("{q}")], b)  # declared now: no deprecation warning
    b.capabilities = Capabilities(tools=True)
    assert b.capabilities == Capabilities(tools=True)

    class Mine(TextOnly):
        def __init__(self, model):
            super().__init__(model)
            self.capabilities = ["chat", "vision"]

    with pytest.raises(TypeError, match=r"Mine.capabilities is what the backend declares.*got list.*another attribute name"):
        Mine("m")
