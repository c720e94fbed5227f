"""``langtorch serve``: the command line."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_backend", "main"]

_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _adapter(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not _ADAPTER_NAME.match(name) or not path:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PATH with NAME made of letters, digits, '_', '.', '-', got {value!r}")
    return name, path


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value!r}")
    return n


def _non_negative(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    return n


def parser() -> argparse.ArgumentParser:
    """The ``langtorch`` argument parser (sub-command ``serve``).

    Example:
        >>> from langtorch.serve._cli import parser
        >>> parser().parse_args(["serve", "--port", "0"]).port
        0
    """
    p = argparse.ArgumentParser(prog="langtorch", description="langtorch command line.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser(
        "serve", help="serve the local models with OpenAI's HTTP API",
        description="Serve the local chat model (with its adapters) and the embedding model "
                    "behind an OpenAI-compatible HTTP API: /v1/chat/completions, "
                    "/v1/embeddings, /v1/models, /health.")
    s.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=_non_negative, default=8000, help="TCP port (0: a free one)")
    s.add_argument("--model", default="smollm2",
                   help="'smollm2' (the installed SmolLM2-135M-Instruct) or a path to a Llama "
                        "GGUF file; served under this id (a file's stem)")
    s.add_argument("--embedding-model", default="minilm",
                   help="'minilm' (all-MiniLM-L6-v2) or 'none' for no /v1/embeddings")
    s.add_argument("--adapter", type=_adapter, action="append", default=[],
                   metavar="NAME=PATH",
                   help="a soft-prompt adapter directory (PromptTuner.save_adapter or PEFT), "
                        "served as MODEL:NAME; repeatable")
    s.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` (default: $LANGTORCH_API_KEY; "
                        "prefer the variable: arguments are visible to other local users)")
    s.add_argument("--max-concurrency", type=_positive, default=64,
                   help="chat requests admitted to the engine at once (default 64)")
    s.add_argument("--max-slots", type=_positive, default=16,
                   help="sequences the engine decodes together per step (default 16); admitted "
                        "requests beyond that wait inside the engine for a slot")
    s.add_argument("--max-queue", type=_non_negative, default=256,
                   help="chat requests waiting beyond that; more get 429 (default 256)")
    s.add_argument("--max-body-bytes", type=_positive, default=4 * 2**20,
                   help="largest request body; larger get 413 (default 4 MiB)")
    s.add_argument("--max-prompt-tokens", type=_positive, default=None,
                   help="longest prompt after the chat template; longer get 400 (default: the "
                        "model's context check only)")
    s.add_argument("--grace-period", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on SIGTERM/Ctrl-C (default 30)")
    s.add_argument("--retry-after", type=float, default=1.0,
                   help="Retry-After seconds of a 429 (default 1)")
    s.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip compiling before accepting requests (the first requests compile)")
    s.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="INFO logs one access line per request (never prompt content)")
    return p


def build_backend(model: str = "smollm2", adapters: Mapping[str, str] | None = None,
                  **options: Any) -> tuple[Any, str]:
    """The :class:`~langtorch.backends.LocalBackend` for ``--model``, and its served id.

    Example:
        >>> from langtorch.serve._cli import build_backend
        >>> backend, model_id = build_backend("smollm2")
        >>> model_id
        'smollm2'
    """
    from langtorch.backends import LocalBackend

    if model == "smollm2":
        llm, model_id = None, "smollm2"
    else:
        path = Path(model)
        if path.suffix != ".gguf" or not path.is_file():
            raise SystemExit(f"langtorch serve: --model expected 'smollm2' or the path of a "
                             f".gguf file, got {model!r}.")
        from langtorch.models import SmolLM2

        llm, model_id = SmolLM2(path), re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).lower()
    if adapters:
        options["adapters"] = dict(adapters)
    return LocalBackend(llm, **options), model_id


def release_heap() -> bool:
    """Hand freed heap memory back to the operating system (glibc's ``malloc_trim``).

    Compiling XLA programs allocates and frees hundreds of MB; glibc keeps freed memory in its
    arenas, so the process's resident memory stays at its peak. ``langtorch serve`` calls this
    after the warm-up (measured: 3.0 GB -> 2.1 GB RSS before the weight-copy fixes; see
    docs/serving.md, "Memory"). Returns whether it ran (``False`` where the C library is not
    glibc).

    Example:
        >>> from langtorch.serve._cli import release_heap
        >>> release_heap() in (True, False)
        True
    """
    import ctypes

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl, macOS: no malloc_trim
        return False
    trim(0)
    return True


def _release_heap_every(seconds: float) -> None:
    while release_heap():
        time.sleep(seconds)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_command(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, drain, then end the process with status 0."""
    from langtorch.serve._app import Limits, create_app, log
    from langtorch.serve._server import run_app

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api_key = args.api_key or os.environ.get("LANGTORCH_API_KEY") or None
    if args.embedding_model not in ("minilm", "none"):
        raise SystemExit(f"langtorch serve: --embedding-model expected 'minilm' or 'none', got "
                         f"{args.embedding_model!r}.")
    names = [n for n, _ in args.adapter]
    if len(set(names)) != len(names):
        raise SystemExit(f"langtorch serve: --adapter names must differ, got {names}.")
    if not _is_loopback(args.host) and api_key is None:
        log.warning("binding %s without an API key: anyone who can reach this address can use "
                    "the model (set LANGTORCH_API_KEY)", args.host)
    limits = Limits(max_concurrency=args.max_concurrency, max_queue=args.max_queue,
                    max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                    retry_after=args.retry_after)
    backend, model_id = build_backend(args.model, dict(args.adapter), max_slots=args.max_slots)
    log.info("loading %s", backend.model)
    backend.llm  # noqa: B018 - load the weights before accepting connections
    embedding_backend = backend if args.embedding_model == "minilm" else None
    if args.warmup:
        log.info("compiling (warm-up)")
        backend.warmup()
        if embedding_backend is not None:
            asyncio.run(embedding_backend.embed(["warm-up"]))
    # The warm-up's compilations leave ~0.9 GB freed but held by malloc, and serving (programs
    # compiled for new shapes, per-request buffers) keeps adding to it: hand it back now and
    # every 30 s (measured steady RSS under 64 concurrent requests: 2.5 GB -> 2.0 GB).
    release_heap()
    threading.Thread(target=_release_heap_every, args=(30.0,), name="langtorch-trim",
                     daemon=True).start()
    app = create_app(backend, model_id=model_id, embedding_backend=embedding_backend,
                     embedding_id="minilm", api_key=api_key, limits=limits)

    def ready(port: int) -> None:
        host = f"[{args.host}]" if ":" in args.host else args.host
        url = f"http://{host}:{port}/v1"
        models = ", ".join([*app_state.chat_models, *app_state.embedding_models])
        print(f"langtorch serve: listening on {url} (models: {models})\n"
              f"  export OPENAI_BASE_URL={url}", flush=True)

    from langtorch.serve._app import state_of

    app_state = state_of(app)
    asyncio.run(run_app(app, host=args.host, port=args.port, grace_period=args.grace_period,
                        on_ready=ready))
    # Requests the grace period cut off were cancelled, but the engine's (daemon) worker thread
    # drops them only at its next chunk boundary and may be inside a jitted XLA call right now;
    # interpreter finalization with a daemon thread in C++ code aborts the process (SIGABRT,
    # "FATAL: exception not rethrown") instead of exiting 0. Nothing is left to clean up once
    # the server has stopped, so flush and end the process here.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``langtorch`` console script and ``python -m langtorch``.

    Example:
        >>> from langtorch.serve._cli import main
        >>> main(["serve", "--help"])  # doctest: +SKIP
    """
    args = parser().parse_args(argv)
    if args.command == "serve":
        return serve_command(args)
    raise AssertionError(args.command)  # argparse rejects unknown commands
