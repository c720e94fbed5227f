"""pytest fixtures for users' own test suites (import them into a conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from langtorch.testing._server import OpenAIServer

__all__ = ["openai_server"]


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    """A running :class:`OpenAIServer`, with ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` pointing at it.

    Clients that read the environment (``openai.OpenAI()``, ``OpenAIBackend("m")``) talk to the
    loopback server without further setup. Configure it in the test (``server.latency = 0.01``,
    ``server.set_faults([...])``, ``server.responder = {...}``).

    Example:
        >>> # conftest.py
        >>> from langtorch.testing import openai_server  # noqa: F401
    """
    with OpenAIServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-loopback")
        yield server
