"""langtorch.testing — test your LLM pipelines offline against a real local HTTP server.

* :class:`OpenAIServer`: an OpenAI-compatible server on 127.0.0.1 (chat completions with ``n``,
  streaming, tools and ``response_format``; embeddings) with a responder you supply, latency and
  injected faults (429/500/502/malformed JSON/hangs/dropped connections), and request counters.
* :class:`Script`: a scripted responder (rules matched in order, with use counts) for
  deterministic tests of pipelines and optimization loops.
* :func:`openai_server`: a pytest fixture; ``from langtorch.testing import openai_server`` in a
  ``conftest.py`` makes it available.

See docs/testing.md.

Example:
    >>> from langtorch.testing import OpenAIServer
    >>> with OpenAIServer() as server:
    ...     server.url.startswith("http://127.0.0.1:")
    True
"""

from langtorch.testing._script import Script, ScriptError
from langtorch.testing._server import FAULTS, OpenAIServer, Reply, default_responder, tool_results

__all__ = ["FAULTS", "OpenAIServer", "Reply", "Script", "ScriptError", "default_responder", "openai_server", "tool_results"]


def __getattr__(name: str):
    # pytest is a test-time dependency: import the fixture only when asked for.
    if name == "openai_server":
        from langtorch.testing._fixtures import openai_server

        return openai_server
    raise AttributeError(f"module 'langtorch.testing' has no attribute {name!r}")
