"""The answers of :class:`~langtorch.nn.LLM`: a call's completions -> a TextTensor of the input's
shape (``n > 1`` adds a samples axis) with per-entry metadata; failed entries raised as typed
errors (a :class:`~langtorch.errors.BatchError` with the partial output when others succeeded)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from langtorch.errors import ParseError
from langtorch.nn._requests import _parse
from langtorch.nn._tool_loop import _assistant_message, _Thread
from langtorch.runtime import CallResult, raise_for_errors
from langtorch.tensor import TextTensor


def build_output(x: TextTensor, result: CallResult, n: int | None, parser: Any,
                 requests: list[dict[str, Any]] | None = None, added: list[bool] | None = None,
                 threads: list[list[_Thread]] | None = None) -> TextTensor:
    k = n or 1
    shape = x.shape + ((n,) if n is not None and n > 1 else ())
    size = len(result.completions) * k
    texts = [""] * size
    cols: dict[str, np.ndarray] = {
        "prompt_tokens": np.zeros(size, np.int64),
        "completion_tokens": np.zeros(size, np.int64),
        "model": np.full(size, "", dtype=object),
        "finish_reason": np.full(size, "", dtype=object),
        "cached": np.zeros(size, bool),
    }
    extra: dict[str, np.ndarray] = {}
    errors = dict(result.errors)
    for i, completion in enumerate(result.completions):
        if completion is None:
            continue
        for j, choice in enumerate(completion.choices[:k]):
            at = i * k + j
            texts[at] = choice.text
            cols["model"][at] = completion.model
            cols["finish_reason"][at] = choice.finish_reason or ""
            cols["cached"][at] = completion.cached
            if j == 0:
                cols["prompt_tokens"][at] = completion.usage.prompt_tokens
                cols["completion_tokens"][at] = completion.usage.completion_tokens
            message = choice.message or {}
            if message.get("tool_calls"):
                extra.setdefault("tool_calls", np.full(size, None, dtype=object))[at] = message["tool_calls"]
            if choice.logprobs is not None:
                extra.setdefault("logprobs", np.full(size, None, dtype=object))[at] = choice.logprobs
            if parser is not None:
                column = extra.setdefault("parsed", np.full(size, None, dtype=object))
                index = tuple(int(v) for v in np.unravel_index(at, shape)) if shape else ()
                try:
                    column[at] = _parse(choice.text, parser, index)
                except ParseError as e:
                    errors.setdefault(i, e)
    if threads is not None:
        # The tool loop: every call made (with its result or error), and the rounds taken.
        extra["tool_calls"] = np.full(size, None, dtype=object)
        extra["tool_rounds"] = np.zeros(size, np.int64)
        for i, ths in enumerate(threads):
            for j, th in enumerate(ths[:k]):
                extra["tool_calls"][i * k + j] = list(th.calls)
                extra["tool_rounds"][i * k + j] = th.rounds
    if "messages" in x.metadata and requests is not None:
        # A chat entry's answer carries its conversation (system prompt aside), ending with
        # the assistant turn: answer.reply(...) makes the next turn.
        conversations = np.full(size, None, dtype=object)
        for i, completion in enumerate(result.completions):
            if completion is None:
                continue
            for j, choice in enumerate(completion.choices[:k]):
                sent = threads[i][j].messages if threads is not None else requests[i]["messages"]
                sent = sent[1:] if added and added[i] else sent
                conversations[i * k + j] = [dict(m) for m in sent] + [_assistant_message(choice)]
        extra["messages"] = conversations
        if "system" in x.metadata:
            extra["system"] = np.repeat(x.metadata.column("system").reshape(-1), k)
    metadata = {key: col.astype(str) if key in ("model", "finish_reason") else col
                for key, col in {**cols, **extra}.items()}
    out = TextTensor(np.array(texts, dtype=object).astype(str).reshape(shape) if shape else texts[0],
                     template=False)
    for key, col in metadata.items():
        out.metadata[key] = col.reshape(shape)
    # Errors keyed by entry index tuples of the input (the request granularity).
    if errors:
        keyed = {(tuple(int(v) for v in np.unravel_index(i, x.shape)) if x.shape else ()): e
                 for i, e in sorted(errors.items())}
        failed = dataclasses.replace(result, errors=dict(sorted(errors.items())))
        try:
            raise_for_errors(failed, results=out)
        except Exception as exc:
            if hasattr(exc, "errors"):
                exc.errors = keyed
            raise
    return out
