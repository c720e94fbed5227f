"""Shared fixtures: one loopback OpenAI-compatible server per test module, reset before each test."""

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
