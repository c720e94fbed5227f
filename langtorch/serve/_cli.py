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

from langtorch.core import release_heap  # (used by serve and tests)

__all__ = ["build_backend", "main"]

_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _adapter(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    model, colon, short = name.rpartition(":")
    if not sep or not _ADAPTER_NAME.match(short) or not path or (
            colon and not _ADAPTER_NAME.match(model)):
        raise argparse.ArgumentTypeError(
            f"expected [MODEL:]NAME=PATH with MODEL and NAME made of letters, digits, '_', '.', "
            f"'-', got {value!r}")
    return name, path


def _served_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text).lower() or "model"


def _named(value: str, what: str) -> tuple[str | None, Path]:
    """``(NAME or None, path)`` of ``--model`` / ``--embedding-model`` ``[NAME=]PATH`` (``~``
    and ``$VARS`` expanded); a value that is itself an existing path is never split."""
    from langtorch.core import user_path

    try:
        whole = user_path(value, what=what)
    except ValueError as exc:
        raise SystemExit(f"langtorch serve: {what}: {exc}") from None
    if whole.exists():
        return None, whole
    name, sep, rest = value.partition("=")
    if sep and _ADAPTER_NAME.match(name) and rest:
        try:
            return name, user_path(rest, what=what)
        except ValueError as exc:
            raise SystemExit(f"langtorch serve: {what}: {exc}") from None
    return None, whole


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
    s.add_argument("--model", action="append", default=None, metavar="[NAME=]PATH",
                   help="a chat model: 'smollm2' (the installed SmolLM2-135M-Instruct, the "
                        "default), a Hugging Face model directory or a .gguf file of any "
                        "architecture langtorch.models.load reads; served under NAME (default: "
                        "the directory or file name); repeatable, the first is the default "
                        "model")
    s.add_argument("--embedding-model", default="minilm", metavar="minilm|none|[NAME=]PATH",
                   help="'minilm' (all-MiniLM-L6-v2), 'none' for no /v1/embeddings, or a "
                        "sentence-transformers directory (served under NAME, default its "
                        "directory name)")
    s.add_argument("--adapter", type=_adapter, action="append", default=[],
                   metavar="[MODEL:]NAME=PATH",
                   help="a soft-prompt adapter directory (PromptTuner.save_adapter or PEFT; ~ "
                        "and $VARS expanded) of MODEL (default: the first --model), served as "
                        "MODEL:NAME; an adapter saved from a label-mode PromptTuner answers with "
                        "one of its labels, as predict does; repeatable")
    s.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` (default: $LANGTORCH_API_KEY; "
                        "prefer the variable: arguments are visible to other local users)")
    s.add_argument("--max-concurrency", type=_positive, default=64,
                   help="chat requests admitted to the engine at once (default 64)")
    s.add_argument("--max-slots", type=_positive, default=16,
                   help="sequences the engine decodes together per step (default 16); admitted "
                        "requests beyond that wait inside the engine for a slot")
    s.add_argument("--decode-dtype", choices=("auto", "bfloat16", "float32", "by_shape"),
                   default=None,
                   help="the decode steps' weights dtype (default: the model's own; auto: "
                        "bf16 where the CPU has bf16 dot instructions; auto, bfloat16 and "
                        "float32 are the same at every batch size: an answer never depends on "
                        "the requests beside it); by_shape: bf16 for many-row steps where "
                        "faster here (answers can change with the batch)")
    s.add_argument("--quantization", choices=("int8",), default=None,
                   help="run the model with int8 weights (one float32 scale per output "
                        "channel): faster decoding, the quantized model's answers (default: "
                        "the weights as loaded)")
    s.add_argument("--decode-layout", choices=("auto", "rows", "columns"), default=None,
                   help="how decode steps lay out their products (default: the model's own, "
                        "auto: hidden states as columns on a CPU for float32 weights, else "
                        "rows; columns: always columns, which keeps a transposed copy of the "
                        "layer matrices and is refused with --quantization; rows: no copy)")
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


def _load_model(model: str) -> tuple[Any, str]:
    """``(model or None for the default SmolLM2, served id)`` of one ``--model`` value."""
    if model == "smollm2":
        return None, "smollm2"
    name, path = _named(model, "--model")
    if not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
        raise SystemExit(f"langtorch serve: --model expected 'smollm2', or [NAME=]PATH of a "
                         f"Hugging Face model directory or a .gguf file, got {model!r} "
                         f"({path} is no such directory or .gguf file).")
    from langtorch.errors import LangTorchError
    from langtorch.models import load

    try:
        llm = load(path, name=name)
    except LangTorchError as exc:
        raise SystemExit(f"langtorch serve: --model {model!r}: {exc}") from None
    if not hasattr(llm, "apply_chat_template"):
        raise SystemExit(f"langtorch serve: --model {model!r} is an encoder, not a chat model; "
                         "serve it with --embedding-model.")
    return llm, name or _served_id(path.stem if path.is_file() else path.name)


def build_backend(model: str = "smollm2", adapters: Mapping[str, str] | None = None,
                  **options: Any) -> tuple[Any, str]:
    """The :class:`~langtorch.backends.LocalBackend` for one ``--model`` value, and its served
    id: ``"smollm2"``, or ``[NAME=]PATH`` of a Hugging Face directory or ``.gguf`` file of any
    architecture :func:`langtorch.models.load` reads (the id is NAME, else the file's stem or
    the directory's name, lower-cased).

    Example:
        >>> from langtorch.serve._cli import build_backend
        >>> backend, model_id = build_backend("smollm2")
        >>> model_id
        'smollm2'
    """
    from langtorch.backends import LocalBackend

    llm, model_id = _load_model(model)
    if adapters:
        options["adapters"] = dict(adapters)
    return LocalBackend(llm, **options), model_id


def _release_heap_every(seconds: float) -> None:
    # (main() has just trimmed: the first trim here is one period later.)
    while True:
        time.sleep(seconds)
        if not release_heap():
            return


def build_backends(models: Sequence[str] | None, adapters: Sequence[tuple[str, str]] = (),
                   **options: Any) -> dict[str, Any]:
    """Served id -> :class:`~langtorch.backends.LocalBackend` for every ``--model`` value (the
    first is the default model; none: SmolLM2); an ``--adapter [MODEL:]NAME=PATH`` goes to
    MODEL, else to the first model.

    Example:
        >>> from langtorch.serve._cli import build_backends
        >>> list(build_backends(["smollm2"], [("sst", "path/to/adapter")]))  # doctest: +SKIP
        ['smollm2']
    """
    from langtorch.backends import LocalBackend

    loaded: dict[str, Any] = {}
    for m in list(models or ()) or ["smollm2"]:
        llm, model_id = _load_model(m)
        if model_id in loaded:
            raise SystemExit(f"langtorch serve: two --model values are served as {model_id!r}; "
                             "name them with --model NAME=PATH.")
        loaded[model_id] = llm
    first = next(iter(loaded))
    mine: dict[str, dict[str, str]] = {k: {} for k in loaded}
    for name, path in adapters:
        target, colon, short = name.rpartition(":")
        target = target if colon else first
        if target not in loaded:
            raise SystemExit(f"langtorch serve: --adapter {name!r} names no served model "
                             f"(served: {', '.join(loaded)}).")
        if short in mine[target]:
            raise SystemExit(f"langtorch serve: --adapter names must differ per model, got "
                             f"{short!r} twice for {target!r}.")
        mine[target][short] = path
    from langtorch.errors import LangTorchError

    backends = {}
    for k, llm in loaded.items():
        try:
            backends[k] = LocalBackend(llm, **({"adapters": mine[k]} if mine[k] else {}),
                                       **options)
        except (LangTorchError, ValueError) as exc:  # an adapter that is missing or misfits
            what = f"--adapter for {k!r}" if mine[k] else f"--model {k!r}"
            raise SystemExit(f"langtorch serve: {what}: {exc}") from None
    return backends


def build_embedding_backend(value: str, chat_backend: Any = None) -> tuple[Any, str | None]:
    """``(backend, served id)`` for ``--embedding-model``: ``"minilm"`` (the chat backend's
    MiniLM), ``"none"`` (``(None, None)``), or ``[NAME=]PATH`` of a sentence-transformers
    directory (a LocalBackend embedding with it; the id is NAME, else the directory's name).

    Example:
        >>> from langtorch.serve._cli import build_embedding_backend
        >>> build_embedding_backend("none")
        (None, None)
    """
    from langtorch.backends import LocalBackend

    if value == "none":
        return None, None
    if value == "minilm":
        return (chat_backend if chat_backend is not None else LocalBackend()), "minilm"
    name, path = _named(value, "--embedding-model")
    if not (path / "modules.json").is_file():
        raise SystemExit(f"langtorch serve: --embedding-model expected 'minilm', 'none' or "
                         f"[NAME=]PATH of a sentence-transformers directory (with modules.json), "
                         f"got {value!r}.")
    from langtorch.errors import LangTorchError
    from langtorch.models import load

    try:
        encoder = load(path, name=name)
    except LangTorchError as exc:
        raise SystemExit(f"langtorch serve: --embedding-model {value!r}: {exc}") from None
    return LocalBackend(embedder=encoder), name or _served_id(path.name)


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
    if not _is_loopback(args.host) and api_key is None:
        log.warning("binding %s without an API key: anyone who can reach this address can use "
                    "the model (set LANGTORCH_API_KEY)", args.host)
    limits = Limits(max_concurrency=args.max_concurrency, max_queue=args.max_queue,
                    max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                    retry_after=args.retry_after)
    if args.decode_layout == "columns" and args.quantization is not None:
        raise SystemExit("langtorch serve: --decode-layout columns is for float weights; "
                         f"--quantization {args.quantization} decodes as rows.")
    backends = build_backends(args.model, args.adapter, max_slots=args.max_slots,
                              decode_dtype=args.decode_dtype, quantization=args.quantization,
                              decode_layout=args.decode_layout)
    model_id, backend = next(iter(backends.items()))
    for k, b in backends.items():
        log.info("loading %s", b.model)
        try:  # load the weights before accepting connections; refuse a misfitting adapter
            b.check_adapters()
        except ValueError as exc:
            raise SystemExit(f"langtorch serve: --adapter for {k!r}: {exc}") from None
    embedding_backend, embedding_id = build_embedding_backend(args.embedding_model, backend)
    if args.warmup:
        log.info("compiling (warm-up)")
        for b in backends.values():
            b.warmup()
        if embedding_backend is not None:
            asyncio.run(embedding_backend.embed(["warm-up"]))
    # The engines trim after their own warm-up and when idle (langtorch.core.heap); the
    # embedding warm-up (or, with --no-warmup, loading) leaves freed memory held by malloc too,
    # and serving keeps adding to it: hand it back now and every 30 s (measured steady RSS
    # under 64 concurrent requests: 2.5 GB -> 2.0 GB, before the engines trimmed).
    if release_heap():  # (False where the C library has no malloc_trim: no thread either)
        threading.Thread(target=_release_heap_every, args=(30.0,), name="langtorch-trim",
                         daemon=True).start()
    app = create_app(backend, model_id=model_id, embedding_backend=embedding_backend,
                     embedding_id=embedding_id, api_key=api_key, limits=limits,
                     models={k: b for k, b in backends.items() if k != model_id})

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
