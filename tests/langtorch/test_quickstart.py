"""The README's main job runs end to end (offline: the loopback server and local models)."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quickstart_runs():
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Translate into French: Hello, world!" in out
    assert "prompt grid (2, 3)" in out
    assert "answers (2, 3)" in out
    assert "retrieved for 'Where is the Eiffel Tower?': 'The Eiffel Tower is in Paris.'" in out
    assert "local answers: ['" in out and "Paris" in out
    assert "restored prompt: Reply with a single word: {}" in out
    assert ("RAG passages (2, 2) | best for 'Where is the Eiffel Tower?': 'The Eiffel Tower is in Paris "
            "and was finished in 1889.' (fact-0, cosine") in out
    assert "RAG answers: ['" in out
    assert "tool calls: [('word_count', {'text': 'echo'}, '1')]" in out and "tool answer: Echo: 1" in out
