"""Streaming of :class:`~langtorch.nn.LLM` (``stream=True``): the text deltas of one entry, or
``(index, delta)`` pairs of several, as they arrive; and a synchronous iterator over them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np

from langtorch.backends.base import Backend
from langtorch.core.sync import run_sync
from langtorch.runtime import astream
from langtorch.tensor import TextTensor


async def astream_entries(backend: Backend, x: TextTensor, requests: list[dict[str, Any]]) -> AsyncIterator[Any]:
    if len(requests) == 1:
        async for delta in astream(backend, requests[0]):
            if delta:
                yield delta
        return
    queue: asyncio.Queue = asyncio.Queue()
    indices = [tuple(int(v) for v in np.unravel_index(i, x.shape)) for i in range(len(requests))]

    async def pump(index: tuple[int, ...], request: dict[str, Any]) -> None:
        try:
            async for delta in astream(backend, request):
                if delta:
                    await queue.put((index, delta))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            await queue.put((index, e))
        finally:
            await queue.put((index, None))

    tasks = [asyncio.ensure_future(pump(i, r)) for i, r in zip(indices, requests)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for t in tasks:
            t.cancel()


def sync_iter(agen: AsyncIterator[Any]) -> Iterator[Any]:
    """Drive an async iterator that lives on the runtime loop from synchronous code."""
    try:
        while True:
            try:
                item = run_sync(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        # A consumer that stops early (break, an exception) must not leave the stream's tasks
        # and connections pending on the runtime loop.
        run_sync(agen.aclose())
