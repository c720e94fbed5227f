"""Shared fixtures: one loopback OpenAI-compatible server per test module, reset before each test;
a tiny random Llama that speaks SmolLM2's tokenizer."""

import dataclasses

import pytest

from langtorch.testing import OpenAIServer


@pytest.fixture(scope="module")
def server():
    # Hang faults last 3 s, past every client timeout these tests use, but short enough that a
    # hung handler is gone before the module's next tests.
    with OpenAIServer(hang_seconds=3) as s:
        yield s


@pytest.fixture
def srv(server):
    """The module's server with counters, faults, responder, latency and Retry-After reset."""
    server.reset()
    server.set_faults(None)
    server.responder = None
    server.latency = 0.0
    server.retry_after = 0.05
    return server


@dataclasses.dataclass
class TinyLM:
    """A 1-layer random Llama that speaks SmolLM2's tokenizer and chat template: real text
    handling, tiny compiles."""

    params: dict
    config: object
    tok: object
    name: str = "tiny-llama"

    def encode(self, text):
        return self.tok.encode(text)

    def decode(self, ids):
        return self.tok.decode(ids)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return self.tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    @property
    def pad_id(self):
        return self.tok.pad_id

    @property
    def eos_id(self):
        return self.tok.eos_id


@pytest.fixture(scope="session")
def tiny_lm():
    """``tiny_lm(config)``: a :class:`TinyLM` with random weights (key 0) for a LlamaConfig."""

    def make(config):
        import jax

        from langtorch.functional.models import llama
        from langtorch.models import default_llm

        return TinyLM(llama.random_params(jax.random.key(0), config), config, default_llm())

    return make
