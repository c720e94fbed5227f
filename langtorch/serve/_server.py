"""Running the app: bind, serve until SIGTERM/SIGINT (or ``stop()``), drain, exit cleanly."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

from langtorch.serve._app import AccessLogger, access_log, http_log, log, state_of

__all__ = ["Server", "run_app"]


async def run_app(app: web.Application, *, host: str = "127.0.0.1", port: int = 8000,
                  grace_period: float = 30.0, stop: asyncio.Event | None = None,
                  on_ready: Callable[[int], Any] | None = None,
                  handle_signals: bool = True) -> None:
    """Serve ``app`` until ``stop`` is set or SIGTERM/SIGINT arrives, then shut down gracefully.

    Shutdown stops accepting connections, closes idle keep-alive connections, lets requests in
    flight (streams included) finish for up to ``grace_period`` seconds, cancels what is left
    (a cancelled stream frees its engine slot) and returns.

    Args:
        app: an application from :func:`langtorch.serve.create_app`.
        host: the interface to bind; 127.0.0.1 unless told otherwise.
        port: the TCP port; 0 picks a free one (``on_ready`` receives it).
        grace_period: seconds in-flight requests get to finish after the stop signal.
        stop: an event that ends serving when set (also set by the signals).
        on_ready: called with the bound port once the server accepts connections.
        handle_signals: install SIGTERM/SIGINT handlers (main thread only).

    Example:
        >>> import asyncio
        >>> from langtorch.backends import LocalBackend
        >>> from langtorch.serve import create_app, run_app
        >>> async def main():
        ...     stop = asyncio.Event()
        ...     ports = []
        ...     def ready(port):
        ...         ports.append(port)
        ...         stop.set()
        ...     await run_app(create_app(LocalBackend()), port=0, stop=stop, on_ready=ready,
        ...                   handle_signals=False)
        ...     return ports[0] > 0
        >>> asyncio.run(main())
        True
    """
    if not grace_period >= 0:
        raise ValueError(f"run_app: expected grace_period >= 0, got {grace_period!r}.")
    state = state_of(app)
    stop = stop if stop is not None else asyncio.Event()
    runner = web.AppRunner(app, handle_signals=False, access_log_class=AccessLogger,
                           access_log=access_log, logger=http_log, handler_cancellation=True,
                           shutdown_timeout=grace_period)
    await runner.setup()
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    try:
        site = web.TCPSite(runner, host, port, backlog=1024)
        await site.start()
        bound = int(runner.addresses[0][1])
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, stop.set)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):  # Windows / not the main thread
                    pass
        if on_ready is not None:
            on_ready(bound)
        await stop.wait()
        state.draining = True
        log.info("shutting down: no new connections; %d request(s) in flight get up to %g s",
                 state.in_flight, grace_period)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    log.info("stopped")


class Server:
    """An app served from a background thread: for tests, notebooks and scripts.

    Args:
        app: an application from :func:`langtorch.serve.create_app`.
        host: the interface (default 127.0.0.1).
        port: the port (default 0: a free one; read :attr:`port` / :attr:`url`).
        grace_period: seconds :meth:`stop` lets requests in flight finish.

    Example:
        >>> from langtorch.backends import LocalBackend
        >>> from langtorch.serve import Server, create_app
        >>> with Server(create_app(LocalBackend())) as server:
        ...     server.url.startswith("http://127.0.0.1:")
        True
    """

    def __init__(self, app: web.Application, *, host: str = "127.0.0.1", port: int = 0,
                 grace_period: float = 5.0):
        self.app, self.host, self.grace_period = app, host, grace_period
        self._requested_port = port
        self.port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """The base URL for an OpenAI client (``.../v1``)."""
        if self.port is None:
            raise RuntimeError("Server is not running; use `with Server(app) as s:` or start().")
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> Server:
        """Start serving in a daemon thread; returns once the port accepts connections."""
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def on_ready(port: int) -> None:
            self.port = port
            ready.set()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await run_app(self.app, host=self.host, port=self._requested_port,
                          grace_period=self.grace_period, stop=self._stop, on_ready=on_ready,
                          handle_signals=False)

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as e:  # noqa: BLE001 - reported to start()'s caller
                failure.append(e)
            finally:
                ready.set()

        self._thread = threading.Thread(target=run, name="langtorch-serve", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread = None
            raise RuntimeError(f"Server could not start: {failure[0]!r}") from failure[0]
        return self

    def stop(self) -> None:
        """Stop gracefully (requests in flight get ``grace_period``) and join the thread."""
        if self._thread is None:
            return
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=self.grace_period + 30)
        self._thread = None
        self.port = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Server({self.url if self.port is not None else 'stopped'})"
