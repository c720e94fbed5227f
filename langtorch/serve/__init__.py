"""langtorch.serve — the local models behind an OpenAI-compatible HTTP server.

``langtorch serve`` (or ``python -m langtorch serve``) starts it from the shell; from Python:

* :func:`create_app` — an aiohttp application serving a backend (chat, embeddings, models, health).
* :func:`run_app` — serve it until SIGTERM/Ctrl-C (or an event), then drain gracefully.
* :class:`Server` — the same in a background thread (tests, notebooks).
* :class:`Limits` — body size, prompt length, concurrency and queue bounds.

Example:
    >>> from openai import OpenAI
    >>> from langtorch.backends import LocalBackend
    >>> from langtorch.serve import Server, create_app
    >>> with Server(create_app(LocalBackend())) as server:  # doctest: +SKIP
    ...     client = OpenAI(base_url=server.url, api_key="unused")
    ...     client.chat.completions.create(model="smollm2", max_tokens=8, temperature=0,
    ...         messages=[{"role": "user", "content": "Hi"}]).choices[0].finish_reason
    'length'
"""

from langtorch.serve._app import Limits, create_app
from langtorch.serve._cli import main
from langtorch.serve._server import Server, run_app

__all__ = ["Limits", "Server", "create_app", "main", "run_app"]
