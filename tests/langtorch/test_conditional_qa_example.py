"""examples/conditional_qa.py: the seed's conditional QA pipeline against the loopback server."""

import runpy
from pathlib import Path

from langtorch.backends import OpenAIBackend
from langtorch.testing import OpenAIServer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conditional_qa.py"


def test_conditional_qa_pipeline_branches(capsys):
    example = runpy.run_path(str(EXAMPLE), run_name="conditional_qa")
    with OpenAIServer(responder=example["scripted_model"]) as server:
        backend = OpenAIBackend("loopback-model", base_url=server.url, api_key="sk-loopback")
        high, low = example["main"](backend)
        requests = server.chat_requests
    assert str(high) == "水的化学式是 H₂O。" and high.metadata["confidence"] == 0.95
    assert high.metadata["final"] and high.metadata["module"] == "qa"
    assert low.metadata["module"] == "augmented_qa" and low.metadata["original_confidence"] == 0.3
    assert "瑞典学院" in str(low) and low.metadata["model"] == "loopback-model"
    out = capsys.readouterr().out
    assert "置信度高 (0.95)" in out and "置信度低 (0.30)" in out
    # high: answer + eval; low: answer + eval + augmented; then the batch of both again
    assert requests == 10 and backend.usage.total_tokens > 0
