"""The shared decode engine: one worker thread per model running continuous batching.

:class:`Engine` wraps :class:`langtorch.functional.engine.SlotBatch` (the slots, prefill and
jitted decode chunks) with a queue, a worker thread and request handles. Every caller of a
model — ``LocalBackend`` requests, ``PromptTuner.predict`` in generation mode,
``SoftPromptLayer`` — submits to the engine :func:`engine_for` gives for (model, options), so
concurrent callers with the same options share the model's slots: between chunks finished sequences leave, waiting ones join, stop
strings are checked on the decoded text (a sequence ends at the first chunk boundary after its
text contains a stop string; no text from the stop on is ever returned or streamed, and the
tokens past it are not counted), and cancelled requests free their slots.

Options are explicit (:class:`EngineOptions`): ``engine_for(model)`` is the model's own engine
(its ``max_batch``, ``chunk``, dtypes and mesh), ``engine_for(model, max_slots=64)`` another one
with 64 slots; a caller never silently gets an engine built with someone else's options.

Example:
    >>> from langtorch.models import default_llm, engine_for
    >>> eng = engine_for(default_llm())  # doctest: +SKIP
    >>> eng.generate([[1, 2, 3]], max_tokens=4)[0].completion_tokens  # doctest: +SKIP
    4
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.core import release_heap as _trim_heap
from langtorch.functional import engine as E
from langtorch.functional.models import decoder, quant

__all__ = ["Engine", "EngineOptions", "Generation", "Handle", "engine_for"]


def _hold_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` may still become part of a stop string (or a
    multi-byte character being decoded)."""
    keep = 0
    while keep < len(text) and text[len(text) - 1 - keep] == "\ufffd":
        keep += 1
    longest = max((len(s) for s in stops), default=0)
    for k in range(min(longest - 1, len(text)), 0, -1):
        tail = text[len(text) - k:]
        if any(s.startswith(tail) for s in stops):
            return max(keep, k)
    return keep


@dataclasses.dataclass(eq=False)
class Handle:
    """One submitted request (its ``n`` choices) as the engine works on it.

    The callbacks run on the engine's worker thread: ``on_delta(index, text)`` for new text of a
    choice, ``on_finish(index, reason)`` when a choice ends, ``on_done(prompt_tokens,
    completion_tokens)`` once all have, ``on_error(exc)`` if the request failed;
    ``on_logprobs(index, entries)`` (optional) just before the ``on_delta`` whose text the
    entries' tokens make: one ``(token, logprob, top_ids, top_logprobs)`` per token (sequences with
    ``top_logprobs`` set).
    :meth:`cancel` ends it at the next chunk boundary and frees its slots.
    """

    seqs: list
    stops: list
    on_delta: Callable[[int, str], None]
    on_finish: Callable[[int, str], None]
    on_done: Callable[[int, int], None]
    on_error: Callable[[BaseException], None]
    on_logprobs: Callable[[int, list], None] | None = None
    cancelled: bool = False
    closed: bool = False
    _emitted: list = dataclasses.field(default_factory=list)
    _reported: set = dataclasses.field(default_factory=set)
    _lp_sent: dict = dataclasses.field(default_factory=dict)

    def cancel(self) -> None:
        """Stop this request; its sequences leave the engine before the next chunk."""
        self.cancelled = True

    @property
    def texts(self) -> list[str]:
        """The text emitted so far per choice."""
        return list(self._emitted)


class _Weights:
    """The model's params as its engines read them (the decode batch's unstacked layers), per
    (quantization, compute dtype), kept on the model and shared by all of its engines: an
    engine with other options has its own slots and cache, never its own copy of the weights
    (a quantized bf16 view and fp32 view share one int8 copy). Rebuilt when the model's
    ``params`` object changes."""

    def __init__(self, model: Any, quantization: str | None = None):
        self.quantization = quantization
        # A model that holds its weights in the per-layer decode layout hands over that copy
        # (SmolLM2.decode_params): its ``params`` may be a fresh stacked copy built on access.
        self.params = model.decode_params if hasattr(model, "decode_params") else model.params
        store = getattr(model, "__dict__", None)
        kept = None if store is None else store.get("_langtorch_engine_weights")
        if kept is None or kept[0] is not self.params:
            kept = (self.params, {})
            if store is not None:
                store["_langtorch_engine_weights"] = kept
        self._trees: dict = kept[1]

    def _key(self, dtype: Any) -> tuple:
        if dtype is not None and all(a.dtype == dtype for a in quant.leaves(self.params)):
            dtype = None  # the cast would change nothing: the same copy
        return (self.quantization, dtype)

    def get(self, dtype: Any) -> Any:
        """The kept tree for ``dtype`` (``None``: the params' own), or the params to build it
        from (quantized, cast to ``dtype``)."""
        key = self._key(dtype)
        tree = self._trees.get(key)
        if tree is not None:
            return tree
        base_key = (self.quantization, None)
        base = self._trees.get(base_key)
        if base is None:
            if self.quantization is None:
                base = self.params
            else:  # quantized once per model (seconds), kept for every engine and dtype, in
                # the decode layout (unstacked once here, so every dtype's view shares it)
                base = quant.quantize_params(self.params, self.quantization)
                if not isinstance(base["layers"], (list, tuple)):  # one jitted call, not ~500
                    base = jax.jit(decoder.unstack_layers)(base)
                self._trees[base_key] = base
        if key[1] is None:
            return base
        if isinstance(base, dict) and "lm_head" in base and not (
                isinstance(self.params, dict) and "lm_head" in self.params):
            # A kept engine tree carries the [H, V] head _with_head added for its 16-bit
            # table: cast from the tied params, not that copy (an fp32 tree keeps the tie).
            base = {k: v for k, v in base.items() if k != "lm_head"}
        return quant.cast(base, key[1])

    def keep(self, dtype: Any, tree: Any) -> None:
        self._trees.setdefault(self._key(dtype), tree)


_transpose = jax.jit(jnp.transpose)


def _with_head(params: Any) -> Any:
    """``params`` with a tied bf16/fp16 embedding also stored as an ``[H, V]`` LM head.

    With the head tied to the ``[V, H]`` table, XLA:CPU transposes the whole table into a copy
    on every jitted call that computes logits in bf16 (SmolLM2: ~38 ms per decode chunk or
    prefill call); a kept ``[H, V]`` copy costs the table's bytes once (SmolLM2: 57 MB).
    Float32 and quantized tables keep the tied product (it reads ``[V, H]`` directly)."""
    if not isinstance(params, dict) or "lm_head" in params:
        return params
    embed = params.get("embed")
    if not isinstance(embed, jax.Array) or embed.dtype not in (jnp.bfloat16, jnp.float16):
        return params
    return {**params, "lm_head": _transpose(embed)}


# An engine's worker, idle after work, waits _TRIM_AFTER_S, hands freed memory back to the OS
# (langtorch.core.heap), then waits _IDLE_S more for work before it ends.
_IDLE_S = 30.0
_TRIM_AFTER_S = 1.0


class Engine:
    """Continuous batching for one model on a worker thread (see the module docstring).

    Args:
        model: an object with ``params``, ``config``, ``eos_id`` and ``decode(ids)`` (a
            :class:`~langtorch.models.SmolLM2`, or a test model).
        max_slots: most sequences decoded together.
        chunk: decode steps per jitted call.
        prefill_dtype: ``"auto"`` (default: bf16 where the machine multiplies bf16 in
            hardware, :func:`bf16_dot_units` — CPUs with bf16 dot instructions, where
            many-row matmuls run ~2x faster — else the params' dtype),
            ``"bfloat16"``, ``"float32"`` or ``None`` (the params' dtype).
        kv_dtype: the KV cache dtype (default fp32: XLA:CPU writes an fp32 cache in place, while
            it upcasts a bf16 cache to fp32 and back on every step's write; fp32 costs twice
            the memory per slot).
        decode_dtype: the decode chunks' weights, one dtype at every row count so that a
            request's greedy tokens do not depend on the requests beside it: ``"auto"``
            (default: bf16 where the machine multiplies bf16 in hardware,
            :func:`bf16_dot_units`, and the model is not quantized; else the params' dtype),
            ``None`` (the params' dtype), ``"bfloat16"`` or ``"float32"``. With bf16 weights on
            a CPU a row's logprobs are bit for bit the same alone and among up to 63 others
            while the cache stays in one length bucket (measured on a Zen 4 with SmolLM2; a
            bucket change keeps the tokens; fp32 keeps the tokens but its one-row program
            rounds differently in the last bits). Measured there (profile_engine, 2026-12-06)
            bf16 decode steps were about as fast as fp32 at one row and 1.2x faster at 16.
            ``"by_shape"`` trades that invariance for throughput: bf16 from the smallest slot
            bucket where a one-layer decode probe, :func:`bf16_decode_wins`, finds bf16 at
            least 1.2x faster than the params' dtype, the params' dtype below it (the default
            before bf16 one-row steps ran as two rows, when they were 1.9x slower).
        mesh: ``None``, ``"auto"`` or a ``jax.sharding.Mesh``: the decode slots are split
            along its ``data`` axis (see :class:`~langtorch.functional.engine.SlotBatch`).
        prefill_chunk: prompt tokens per prefill call and prompt (default 64), also the
            prefix cache's block size.
        prefill_rows: most prompts prefilled together in one call (default 16).
        prefix_cache_tokens: the prefix cache's capacity in tokens (default 4096, ``0``: off).
        quantization: ``None`` (default: the params as they are) or ``"int8"``: the engine
            runs the model with every matrix quantized to int8 with one float32 scale per
            output channel (:mod:`langtorch.functional.models.quant`; the embedding table per
            token), computing in the dtypes above. A quarter of the fp32 weights' bytes, read
            once per decode step: faster decoding where steps are bound by reading weights
            (docs/local_models.md, "int8 weights"), at the cost of the quantization error
            (the outputs are those of the model with weights ``q * scale``, not of the
            original weights). Quantized once per model and kept beside its params. Prompt
            chunks (many rows per product) multiply by the same int8 storage with int8
            products on CPUs with int8 matrix units, float products elsewhere
            (:func:`int8_dot_units`, :attr:`prefill_products`); decode steps always use int8
            products.
        decode_layout: ``"auto"`` (default), ``"rows"`` or ``"columns"``: how decode steps
            multiply the layer weights (see
            :class:`~langtorch.functional.engine.SlotBatch`). ``"auto"`` decodes fp32
            weights on a CPU with the hidden states as columns and a transposed copy of the
            layer matrices (their bytes again, kept with the weights and shared by the
            model's engines): 1.24-1.34x faster steps at 4-16 rows where measured, about even
            at one row. ``"rows"`` saves that copy.

    Scheduling: each round of the worker prefills every waiting prompt by one chunk (calls of
    up to ``prefill_rows`` prompts) and streams each call's first tokens as soon as that call
    ends, then runs one decode chunk of at most ``chunk`` steps, cut to about
    :data:`~langtorch.functional.engine.CHUNK_SECONDS` of measured step time so that requests
    arriving meanwhile wait about that long to be prefilled.

    Attributes:
        prefill_products: ``None`` (unquantized), ``"int8"`` or ``"float"``: the products the
            prompt chunks of a quantized model run.

    Use :func:`engine_for` to get the engine shared by every caller with the same options;
    constructing one directly gives a private engine (its own worker thread and cache).

    Example:
        >>> from langtorch.models import Engine
        >>> Engine.__name__
        'Engine'
    """

    def __init__(self, model: Any, *, max_slots: int = 16, chunk: int = 8,
                 prefill_dtype: str | None = "auto", kv_dtype: str = "float32",
                 mesh: Any = None, prefill_chunk: int = E.PREFILL_CHUNK,
                 prefill_rows: int = 16, prefix_cache_tokens: int = E.PREFIX_CACHE_TOKENS,
                 decode_dtype: str | None = "auto", quantization: str | None = None,
                 decode_layout: str = "auto"):
        self.model = model
        self.options = EngineOptions(max_slots=max_slots, chunk=chunk,
                                     prefill_dtype=prefill_dtype, kv_dtype=kv_dtype, mesh=mesh,
                                     prefill_chunk=prefill_chunk, prefill_rows=prefill_rows,
                                     prefix_cache_tokens=prefix_cache_tokens,
                                     decode_dtype=decode_dtype, quantization=quantization,
                                     decode_layout=decode_layout)
        if prefill_dtype == "auto":
            prefill_dtype = "bfloat16" if bf16_dot_units() else None
        dt = {"bfloat16": jnp.bfloat16, "float32": jnp.float32, None: None}
        if prefill_dtype not in dt or kv_dtype not in dt or kv_dtype is None:
            raise ValueError(f"Engine: expected dtypes 'bfloat16' or 'float32', got "
                             f"{prefill_dtype=} {kv_dtype=}.")
        weights = _Weights(model, quantization)
        trees: dict = {}

        def tree(dtype):  # one copy per dtype, shared by prefill, decode and wide decode
            key = None if dtype is None or all(
                a.dtype == dtype for a in quant.leaves(weights.params)) else dtype
            if key not in trees:
                trees[key] = _with_head(weights.get(key))
            return trees[key]

        decode_dtype = resolve_decode_dtype(decode_dtype, quantization)
        wide_rows = None
        if decode_dtype == "by_shape":
            params = tree(None)
            if not all(a.dtype == jnp.bfloat16 for a in quant.leaves(params)):
                wide_rows = _wide_rows(params, model.config, max_slots,
                                       E.resolve_decode_layout(decode_layout, params),
                                       decode_layout == "columns")
        else:
            params = tree(dt[decode_dtype])
        pre = tree(dt[prefill_dtype])
        pre_kept = pre
        if quantization is not None:
            # Prompt chunks are many-row products: int8 products only on int8 matrix units
            # (an AMX Xeon), else float products (a Zen 4: bf16, 2.6x faster at 1,024 rows).
            if not int8_dot_units():
                pre = quant.with_products(pre, "float")
        self.prefill_products = "float" if pre is not pre_kept else (
            "int8" if quantization is not None else None)
        wide = None if wide_rows is None else tree(jnp.bfloat16)
        self.batch = E.SlotBatch(params, config=model.config, prefill_params=pre,
                                 wide_params=wide, wide_rows=wide_rows,
                                 max_slots=max_slots, chunk=chunk, kv_dtype=dt[kv_dtype],
                                 eos_ids=tuple(int(e) for e in getattr(model, "eos_ids", (model.eos_id,))),
                                 mesh=mesh, prefill_chunk=self.options.prefill_chunk,
                                 prefill_rows=self.options.prefill_rows,
                                 prefix_cache_tokens=self.options.prefix_cache_tokens,
                                 decode_layout=self.options.decode_layout)
        if self.batch.mesh is None:  # (on a mesh the batch holds replicated copies)
            weights.keep(dt[decode_dtype] if decode_dtype != "by_shape" else None,
                         self.batch.params)
            if pre is pre_kept:  # (a float-products view is rebuilt, never kept: no copy)
                weights.keep(dt[prefill_dtype], self.batch.prefill_params)
            if wide is not None:
                weights.keep(jnp.bfloat16, self.batch.wide_params)
        self.config = model.config
        self._decode = model.decode
        self._waiting: collections.deque = collections.deque()
        self._owner: dict[int, tuple[Handle, int]] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._worked = False  # work done since the heap was last trimmed (see _run)

    # ---------------------------------------------------------------- submitting
    def check(self, seq: E.Sequence) -> None:
        """Raise :class:`~langtorch.functional.engine.SequenceError` (``.param``, ``.reason``)
        for a sequence that cannot run."""
        self.batch.check(seq)

    def submit(self, seqs: Sequence[E.Sequence], *, stops: Sequence[str] = (),
               on_delta: Callable[[int, str], None] = lambda i, t: None,
               on_finish: Callable[[int, str], None] = lambda i, r: None,
               on_done: Callable[[int, int], None] = lambda p, c: None,
               on_error: Callable[[BaseException], None] = lambda e: None,
               on_logprobs: Callable[[int, list], None] | None = None) -> Handle:
        """Queue one request's sequences (its choices, in order); they are validated first
        (:class:`~langtorch.functional.engine.SequenceError`, nothing queued)."""
        seqs = list(seqs)
        for s in seqs:
            self.batch.check(s)
        handle = Handle(seqs, [s for s in stops if s], on_delta, on_finish, on_done, on_error,
                        on_logprobs, _emitted=[""] * len(seqs))
        with self._cond:
            for i, s in enumerate(seqs):
                s.tag = (handle, i)
                self._waiting.append(s)
            self._ensure_thread()
            self._cond.notify()
        return handle

    def generate(self, prompts: Sequence[Sequence[int]], *, max_tokens: int | Sequence[int] = 64,
                 temperature: float | Sequence[float] = 0.0,
                 top_p: float | Sequence[float] = 1.0, seed: int | Sequence[int] = 0,
                 stops: Sequence[Sequence[str]] | None = None, prefix: Any = None) -> list:
        """Blocking: generate for many prompts; returns one :class:`Generation` per prompt in
        input order. A bad value raises :class:`~langtorch.functional.engine.SequenceError`
        before anything is queued."""
        n = len(prompts)

        def per(v, name):
            if not isinstance(v, (list, tuple, np.ndarray)):
                return [v] * n
            if len(v) != n:
                raise E.SequenceError(name, f"expected one value or one per prompt ({n}), got "
                                            f"{len(v)}.")
            return list(v)

        mt, te, tp, sd = (per(max_tokens, "max_tokens"), per(temperature, "temperature"),
                          per(top_p, "top_p"), per(seed, "seed"))
        if stops is not None:
            per(stops, "stops")
        results: list = [None] * n
        errors: list = []
        done = threading.Semaphore(0)
        handles = []
        # max_tokens as given: the check refuses 2.5 or True (int() would have cut them).
        seqs = [E.Sequence(list(p), max_tokens=mt[i], temperature=float(te[i]),
                           top_p=float(tp[i]), seed=int(sd[i]), prefix=prefix)
                for i, p in enumerate(prompts)]
        for s in seqs:  # all checked before any is queued: a bad prompt wastes no decoding
            self.batch.check(s)
        for i, seq in enumerate(seqs):
            texts = [""]
            reasons = [None]

            def on_delta(_, text, texts=texts):
                texts[0] += text

            def on_finish(_, reason, reasons=reasons):
                reasons[0] = reason

            def on_done(pt, ct, i=i, texts=texts, reasons=reasons):
                results[i] = Generation(texts[0], reasons[0], pt, ct)
                done.release()

            def on_error(exc):
                errors.append(exc)
                done.release()

            handles.append(self.submit([seq], stops=(stops[i] if stops else ()),
                                       on_delta=on_delta, on_finish=on_finish, on_done=on_done,
                                       on_error=on_error))
        for _ in range(n):
            done.acquire()
        if errors:
            raise errors[0]
        return results

    def warmup(self, batch_sizes: Sequence[int] | None = None, prompt_tokens: int = 64,
               max_tokens: int = 64) -> Engine:
        """Compile this engine's programs now: the chunked prefill for every (prompt rows, past,
        width) bucket a prompt of up to ``prompt_tokens`` uses and a decode chunk for every live-slot
        bucket (default: all of them up to ``max_slots``) at every cache-length bucket up to
        ``prompt_tokens + max_tokens``.

        Example:
            >>> from langtorch.models import default_llm, engine_for
            >>> engine_for(default_llm(), max_slots=32).warmup(batch_sizes=(1, 32))  # doctest: +SKIP
        """
        from langtorch.functional.shapes import bucket, row_bucket

        b = self.batch
        slots = sorted({row_bucket(max(b.min_rows, int(x)), E.SLOT_BUCKETS, cap=b.max_slots)
                        for x in (batch_sizes or b.slot_buckets)})
        caches = [c for c in b.cache_buckets if c <= bucket(prompt_tokens + max_tokens,
                                                               b.cache_buckets)]
        cfg = self.config

        def decode(r: int, c: int) -> None:
            empty = decoder.init_kv_cache(cfg, r, c, b.kv_dtype, per_layer=True,
                                          transposed_keys=True)  # the engine's layout
            cache = {"k": empty["k"], "v": empty["v"]}
            i32 = jnp.zeros((r,), jnp.int32)
            params, bits = b.decode_inputs(r)
            out = E.decode_chunk(params, cache, i32, i32,
                                 jnp.zeros((r,), bool), i32, i32,
                                 jnp.zeros((r,), jnp.float32), jnp.ones((r,), jnp.float32),
                                 jnp.zeros((r, 3), jnp.uint32), b.eos, None, config=cfg,
                                 steps=max(b.chunk, E.MIN_DECODE_STEPS), features=(),
                                 limit=jnp.int32(b.chunk), embed_bits=bits)
            jax.block_until_ready(out[1])

        jobs = b.prefill_warmups(max(16, prompt_tokens)) + [
            functools.partial(decode, r, c) for r in slots for c in caches]
        # Two programs compile at a time (XLA compiles one per thread): on two cores the
        # warm-up of `langtorch serve`'s engine took 45 s instead of 58 one after another.
        with concurrent.futures.ThreadPoolExecutor(
                max(1, min(2, os.cpu_count() or 1)), thread_name_prefix="langtorch-warmup") as ex:
            def run(job):
                job()
                # Each compile frees what the C heap keeps (langtorch.core.heap): a 64-slot
                # SmolLM2 warm-up peaked at 4.9 GiB resident with this, 6.6 GiB without.
                _trim_heap()

            futures = [ex.submit(run, job) for job in jobs]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                for f in futures:  # a failed compile fails the warm-up now, not after the rest
                    f.cancel()
                raise
        _trim_heap()
        return self

    def stats(self) -> dict[str, Any]:
        """The engine's counters: ``waiting`` (queued, not admitted) and the decode batch's
        (:meth:`~langtorch.functional.engine.SlotBatch.stats`: live / decoding / prefilling
        sequences, prefill calls, rows and tokens, cache resizes, and ``prefix_cache`` with
        its hits, misses, evictions and size).

        Example:
            >>> from langtorch.models import default_llm, engine_for
            >>> engine_for(default_llm()).stats()["prefix_cache"]["hits"] >= 0  # doctest: +SKIP
            True
        """
        with self._cond:
            waiting = len(self._waiting)
        return {"waiting": waiting, **self.batch.stats()}

    # ---------------------------------------------------------------- the worker
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="langtorch-engine",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        b = self.batch
        while True:
            with self._cond:
                trim = False
                while not self._waiting and not b.live:
                    if self._worked:
                        # Idle for a moment after work: the buffers and compiled programs it
                        # freed go back to the OS (outside the lock, below), once per busy
                        # spell, never between a burst's requests.
                        if not self._cond.wait(_TRIM_AFTER_S) and not self._waiting \
                                and not b.live:
                            self._worked, trim = False, True
                            break
                        continue
                    # An idle worker ends (the next submit starts another): engines kept for
                    # option sets nobody uses any more hold no thread.
                    if not self._cond.wait(_IDLE_S) and not self._waiting and not b.live:
                        self._thread = None
                        return
                take = []
                while not trim and self._waiting and len(take) < b.free:
                    s = self._waiting.popleft()
                    if not s.tag[0].cancelled and not s.tag[0].closed:
                        take.append(s)
            if trim:
                try:
                    _trim_heap()
                except Exception:  # noqa: BLE001 - a failed trim must not end the worker
                    pass
                continue
            self._worked = True
            for s in list(b.live):
                if s.tag[0].cancelled or s.tag[0].closed:
                    b.finish(s, "cancelled")
            try:
                if take:
                    for s in self._admit(take):
                        self._deliver(s)
                # First tokens go out as soon as their prompts' prefill call is done, not
                # after the other calls of a burst or the decode chunk that follows.
                b.prefill_step(on_join=self._deliver_all)
                for s in b.decode_step():
                    self._deliver(s)
            except BaseException as exc:  # noqa: BLE001 - the device failed: fail who was in it
                failed = {id(s.tag[0]): s.tag[0] for s in list(b.live) + take}
                # The cache was donated to the failed call and may be gone: start a fresh one,
                # so the engine keeps serving the requests that come next.
                b.reset("error")
                for h in failed.values():
                    self._fail(h, exc)

    def _deliver_all(self, seqs: list) -> None:
        for s in seqs:
            self._deliver(s)

    def _admit(self, take: list) -> list:
        done = []
        # Group a request's choices so they share one prefill; a failing request fails alone.
        groups: list[list] = []
        for s in take:
            if groups and groups[-1][0].tag[0] is s.tag[0]:
                groups[-1].append(s)
            else:
                groups.append([s])
        for g in groups:
            h = g[0].tag[0]
            try:
                # Only queued here: the next step() prefills every admitted prompt together.
                done.extend(self.batch.admit(g, prefill=False))
            except Exception as exc:  # noqa: BLE001 - delivered to this request only
                for s in list(self.batch.live):
                    if s.tag[0] is h:
                        self.batch.finish(s, "error")
                self._fail(h, exc)
        return done

    def _fail(self, h: Handle, exc: BaseException) -> None:
        if h.closed:
            return
        h.closed = True
        try:
            h.on_error(exc)
        except Exception:  # noqa: BLE001 - a consumer's callback must not kill the worker
            pass

    def _deliver(self, s: E.Sequence) -> None:
        h, i = s.tag
        if h.closed:
            if not s.finished:
                self.batch.finish(s, "cancelled")
            return
        if s.error is not None:  # the grammar engine failed on this sequence: fail its request
            for other in h.seqs:
                if other is not s and not other.finished:
                    self.batch.finish(other, "cancelled")
            self._fail(h, RuntimeError(f"grammar-constrained decoding failed: {s.error}"))
            return
        text = self._decode(s.tokens)
        if h.stops:
            hits = [(text.find(st), st) for st in h.stops if st in text]
            if hits:
                from langtorch.functional.generate import truncate_at_stop

                text, used, _ = truncate_at_stop(s.tokens, self._decode, h.stops)
                self.batch.finish(s, "stop", keep=used)
                # Also when the chunk that produced the stop string ended the sequence by its
                # token budget or an EOS: the answer ends at the stop string.
                s.finish_reason = "stop"
        safe = text if s.finished else text[:len(text) - _hold_back(text, h.stops)]
        if h.on_logprobs is not None and s.top_logprobs is not None:
            # A token's logprobs go out with (or before) the text it makes: all of them once
            # nothing is held back, else wait for the end.
            sent = h._lp_sent.get(i, 0)
            upto = len(s.logprobs) if (s.finished or safe == text) else sent
            if upto > sent:
                h._lp_sent[i] = upto
                self._call(h, h.on_logprobs, i, list(s.logprobs[sent:upto]))
        prev = h._emitted[i]
        if safe.startswith(prev) and len(safe) > len(prev):
            delta = safe[len(prev):]
            h._emitted[i] = safe
            self._call(h, h.on_delta, i, delta)
        elif not safe.startswith(prev):  # decoding revised earlier text (rare): resend nothing
            pass
        if s.finished and i not in h._reported:
            h._reported.add(i)
            self._call(h, h.on_finish, i, s.finish_reason)
            if len(h._reported) == len(h.seqs) and not h.closed:
                h.closed = True
                prompt = h.seqs[0].prompt_tokens if h.seqs else 0
                self._call(h, h.on_done, prompt, sum(x.completion_tokens for x in h.seqs),
                           force=True)

    def _call(self, h: Handle, fn: Callable, *args: Any, force: bool = False) -> None:
        if h.closed and not force:
            return
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - a consumer's callback must not kill the worker
            # The request fails alone, and says so: its on_error gets the exception (a consumer
            # waiting for on_done or on_error would otherwise wait forever).
            h.cancel()
            self._fail(h, exc)


_PROBE: dict[Any, bool] = {}


def _best_time(f: Callable, *args: Any, calls: int) -> float:
    """Best of 5 rounds of ``calls`` calls of the jitted ``f`` (after one warm-up call), s."""
    import time

    jax.block_until_ready(f(*args))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            r = f(*args)
        jax.block_until_ready(r)
        times.append(time.perf_counter() - t)
    return min(times)


def _wide_rows(params: Any, config: Any, max_slots: int, layout: str = "rows",
               bf16_columns: bool = False) -> int | None:
    """The smallest slot bucket from which bf16 decode steps win here (they win at every
    larger one too: tried from the largest down), or ``None``; the params' own steps timed in
    ``layout``, the bf16 ones as columns with ``bf16_columns`` (else as rows)."""
    layers = params["layers"]
    layer = layers[0] if isinstance(layers, (list, tuple)) else jax.tree.map(
        lambda a: a[0], layers)
    buckets = sorted({r for r in E.SLOT_BUCKETS if r < max_slots} | {max_slots}, reverse=True)
    wide = None
    for r in buckets:
        if not bf16_decode_wins(layer, config, r, columns=layout == "columns",
                                bf16_columns=bf16_columns):
            break
        wide = r
    return wide


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags this machine's CPU reports (lower case; read once per process):
    x86 ``flags`` / Arm ``Features`` of ``/proc/cpuinfo`` on Linux, the ``FEAT_*`` names
    ``sysctl hw.optional.arm`` reports as 1 on macOS (e.g. ``feat_bf16``); empty elsewhere.

    Example:
        >>> from langtorch.models._engine import cpu_flags
        >>> isinstance(cpu_flags(), frozenset)
        True
    """
    import platform
    import subprocess

    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    flags.update(value.lower().split())
    except OSError:
        if platform.system() == "Darwin":
            try:
                out = subprocess.run(["sysctl", "hw.optional.arm"], capture_output=True,
                                     text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            for line in out.splitlines():
                key, _, value = line.partition(":")
                if value.strip() == "1":
                    flags.add(key.rsplit(".", 1)[-1].strip().lower())
    return frozenset(flags)


def resolve_decode_dtype(decode_dtype: str | None, quantization: str | None = None) -> str | None:
    """What a ``decode_dtype`` option means on this machine: ``"auto"`` is ``"bfloat16"`` where
    :func:`bf16_dot_units` and the model is not quantized, else ``None`` (the params' dtype);
    the other values are themselves.

    Why bf16 by default there: with a one-row product run padded to two rows or more
    (``matmul.padded_rows_product``) bf16 decode steps were about as fast as fp32 at one row and
    ~1.2x faster from 16 rows (a Zen 4, 2026-12-06), and a row computes bit for bit alike at
    every row count (``SlotBatch.min_rows``, ``decode_compiler_options``). A quantized model
    keeps its params' dtype around its int8 products.

    Example:
        >>> from langtorch.models import resolve_decode_dtype
        >>> resolve_decode_dtype("float32"), resolve_decode_dtype("auto", "int8")
        ('float32', None)
    """
    if decode_dtype == "auto":
        return "bfloat16" if bf16_dot_units() and quantization is None else None
    return decode_dtype


def bf16_dot_units() -> bool:
    """Whether this machine multiplies bf16 in hardware, the default answer of
    ``prefill_dtype="auto"`` (bf16 prompt chunks with float32 sums): on an accelerator always;
    on a CPU when it reports bf16 dot-product instructions (x86 ``avx512_bf16`` or
    ``amx_bf16``, Arm ``bf16``). Measured on 2-core cloud CPUs with them (an AMX Xeon, a Zen 4),
    bf16 products of prompt shape ran ~2x faster than fp32; without them XLA:CPU emulates bf16.
    The Arm rule is unmeasured (whether XLA:CPU uses those instructions there); on an
    accelerator bf16 is assumed to have matrix units. Pass ``prefill_dtype`` explicitly where
    the rule is wrong for your machine.

    A rule on what the CPU reports, not a timing: a probe timed at start-up chose differently
    under load (1 of 6 processes started beside a busy one, 2026-12-06), and with it the
    prompt's logits, so two processes on one machine could answer the same greedy request
    differently.

    Example:
        >>> from langtorch.models._engine import bf16_dot_units
        >>> isinstance(bf16_dot_units(), bool)
        True
    """
    if jax.default_backend() != "cpu":
        return True
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16", "feat_bf16"})


def int8_dot_units() -> bool:
    """Whether this CPU has int8 matrix units (x86 ``amx_int8``): the rule by which an
    int8-quantized engine keeps int8 products for its prompt chunks; elsewhere the int8
    values are converted exactly to the prompt's float dtype (float products). Measured: on an
    AMX Xeon the int8 products won; on a Zen 4 (AVX512-VNNI, no AMX) float products in bf16 ran
    2.6x faster at 1,024 rows. :func:`int8_products_win` times both on yours. A rule, not a
    timing, for the reason :func:`bf16_dot_units` gives.

    Example:
        >>> from langtorch.models._engine import int8_dot_units
        >>> isinstance(int8_dot_units(), bool)
        True
    """
    return jax.default_backend() == "cpu" and "amx_int8" in cpu_flags()


def int8_products_win(config: Any, rows: int, dtype: Any = jnp.bfloat16, *,
                      matrix: Any = None, ratio: float = 1.2) -> bool:
    """Whether a quantized ``[rows, hidden] @ [hidden, 2 x intermediate]`` product (a decoder
    layer's joined gate/up matrix) should keep int8 products rather than float products in
    ``dtype`` here (:data:`langtorch.functional.models.quant.PRODUCTS`): False only when the
    float product runs at least ``ratio`` x faster (best of 5 each, measured once per process
    and shape; the margin keeps a close call from flipping between runs, and with it the
    prompt's logits). ``matrix``: the model's own quantized ``[hidden, N]`` matrix to time
    (default: a random one of the config's shape). A measuring tool: the engine follows the
    rule of :func:`int8_dot_units`, which this probe confirmed on an AMX Xeon (int8 products
    won) and a Zen 4 (AVX512-BF16 and VNNI, no AMX: bf16 products 2.6x faster at 1,024 rows).

    Raises:
        ValueError: ``rows`` < 1, or ``matrix`` not a 2-D quantized matrix.

    Example:
        >>> from langtorch.functional.models import llama
        >>> from langtorch.models._engine import int8_products_win
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> isinstance(int8_products_win(cfg, 4), bool)
        True
    """

    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise ValueError(f"int8_products_win: expected rows >= 1, got {rows!r}.")
    if matrix is not None and (not quant.is_quantized(matrix) or matrix.ndim != 2):
        raise ValueError(f"int8_products_win: expected a 2-D QuantizedMatrix, got {matrix!r}.")
    dtype = jnp.dtype(dtype)
    k, n = (int(config.hidden_size), 2 * int(config.intermediate_size)) if matrix is None \
        else matrix.shape
    key = ("products", int(rows), k, n, dtype.name, ratio)
    if key not in _PROBE:
        w = quant.quantize(jax.random.normal(jax.random.key(0), (k, n), jnp.float32) * 0.05,
                           transposed=True, dtype=dtype) if matrix is None else \
            matrix.astype(dtype)
        x = jax.random.normal(jax.random.key(1), (int(rows), k), jnp.float32).astype(dtype)
        f = jax.jit(quant.quantized_dot)
        best = {}
        for products in quant.PRODUCTS:
            best[products] = _best_time(f, x, w.with_products(products), calls=2)
        _PROBE[key] = not best["int8"] >= ratio * best["float"]
    return _PROBE[key]


def bf16_decode_wins(layer: Any, config: Any, rows: int, *, context: int = 256,
                     ratio: float = 1.2, columns: bool = False,
                     bf16_columns: bool | None = None) -> bool:
    """Whether one decoder layer's decode step (``rows`` rows, one new token each, attending
    over ``context`` cached positions) runs ``ratio`` x faster with the layer's weights in bf16
    than in their own dtype here (best of 5 each, wall time; measured once per process and
    shape). The layer reads a float32 cache in the engine's layout (keys in blocks,
    ``decoder.blocked_keys``)
    and is compiled with the decode chunks' options
    (:func:`langtorch.functional.engine.decode_compiler_options`); with ``columns`` the
    layer in its own dtype runs as column-major decode steps do
    (:func:`~langtorch.functional.models.decoder.block_columns`, the layer's matrices
    transposed), and the bf16 one too with ``bf16_columns`` (default: as ``columns``). Each
    is timed in the layout the engine would decode it in.

    A whole layer, not one matmul: at a few rows the bf16 products win in isolation while the
    step loses to the activations' bf16 round trips around them (measured on an AMX Xeon: one
    [2, 576] x [576, 1536] product 1.2x faster in bf16, the 2-row decode step 1.2x slower).

    Example:
        >>> import jax
        >>> from langtorch.functional.models import decoder
        >>> from langtorch.models._engine import bf16_decode_wins
        >>> cfg = decoder.DecoderConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=2,
        ...                             num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = decoder.unstack_layers(decoder.random_params(jax.random.key(0), cfg))
        >>> isinstance(bf16_decode_wins(p["layers"][0], cfg, 2, context=16), bool)
        True
    """
    import time

    quantized = any(quant.is_quantized(a) for a in quant.leaves(layer))
    # (the layer's dtype too: two models of one config in different dtypes probe apart)
    key = ("decode", repr(config), rows, context, ratio, quantized,
           str(quant.leaves(layer)[0].dtype), columns, bf16_columns)
    if key not in _PROBE:
        c = config
        cos, sin = decoder.rope(jnp.full((rows, 1), context - 1, jnp.int32), c)
        bias = jnp.zeros((rows, 1, 1, 1, context), jnp.float32)
        kv_shape = (rows, c.num_kv_heads, context, c.head_dim)  # values; keys blocked
        best = {}
        for dt in (None, jnp.bfloat16):
            p = layer if dt is None else quant.cast(layer, dt)
            xdt = quant.leaves(p)[0].dtype
            x = jnp.ones((rows, 1, c.hidden_size), xdt)
            values = jnp.ones(kv_shape, jnp.float32)
            keys = decoder.blocked_keys(jnp.ones(kv_shape, jnp.float32))  # the cache's layout
            cols = columns if dt is None or bf16_columns is None else bf16_columns
            if cols:
                p = decoder.arrange_columns({"layers": (p,)})["layers"][0]
                x = x[:, 0].T  # [H, R]

            def step(p, x, keys, values, cols=cols):
                return decoder.layer(p, x, ((cos, sin),) * 2, (bias, bias),
                                     lambda k, v: (keys, values, None), config=c,
                                     transposed_keys=True, columns=cols)[0]

            # Compiled as the decode chunks are (decode_compiler_options): the probe times the
            # products the engine would run, not XLA:CPU's default choice of library.
            f = jax.jit(step, compiler_options=E.decode_compiler_options() or None)
            f(p, x, keys, values).block_until_ready()
            times = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(4):
                    r = f(p, x, keys, values)
                r.block_until_ready()
                times.append(time.perf_counter() - t)
            best[dt] = min(times)
        _PROBE[key] = best[None] >= ratio * best[jnp.bfloat16]
    return _PROBE[key]


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generated continuation (what :meth:`Engine.generate` and ``SmolLM2.generate`` return).

    Attributes:
        text: the generated text (special tokens and the text from a stop string on removed).
        finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"``.
        prompt_tokens: tokens of the prompt (soft-prompt virtual tokens included).
        completion_tokens: tokens generated (up to the stop point, EOS included).

    Example:
        >>> from langtorch.models import Generation
        >>> Generation("hi", "stop", 10, 2).completion_tokens
        2
    """

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


Result = Generation  # the engine's former name for the same record (private module)

_DTYPES = ("bfloat16", "float32")
#: The values ``decode_dtype`` takes (:class:`Engine`).
DECODE_DTYPES = ("auto", None, "bfloat16", "float32", "by_shape")


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """How an engine is built; :func:`engine_for` keeps one engine per (model, options).

    Attributes:
        max_slots: most sequences decoded together (>= 1).
        chunk: decode steps per jitted call (>= 1).
        prefill_dtype: ``"auto"``, ``"bfloat16"``, ``"float32"`` or ``None`` (the params'
            dtype); see :class:`Engine`.
        kv_dtype: ``"float32"`` (default) or ``"bfloat16"``; see :class:`Engine`.
        mesh: ``None`` or a ``jax.sharding.Mesh`` (``"auto"`` is resolved to one).
        prefill_chunk: prompt tokens per prefill call and prompt (>= 1; default 64); also the
            block size of the prefix cache (prompts share keys/values in whole blocks).
        prefill_rows: most prompts prefilled together in one call (>= 1; default 16).
        prefix_cache_tokens: capacity of the prefix cache in tokens (>= 0; default 4096,
            ``0`` turns it off). Each token costs ``2 * layers * kv_heads * head_dim`` KV-dtype
            values (SmolLM2-135M with the fp32 cache: 46 KB, so 4096 tokens are ~190 MB).
        decode_dtype: ``"auto"`` (default: bf16 where the machine has bf16 dot units and the
            model is not quantized),
            ``None`` (the params' dtype), ``"bfloat16"``, ``"float32"`` or ``"by_shape"``
            (dtype per shape, not batch-invariant); see :class:`Engine`.
        quantization: ``None`` (default) or ``"int8"`` (weight-only int8); see
            :class:`Engine`.
        decode_layout: ``"auto"`` (default), ``"rows"`` or ``"columns"``; see
            :class:`Engine`.

    Example:
        >>> from langtorch.models import EngineOptions
        >>> EngineOptions(max_slots=64).max_slots, EngineOptions() == EngineOptions()
        (64, True)
    """

    max_slots: int = 16
    chunk: int = 8
    prefill_dtype: str | None = "auto"
    kv_dtype: str = "float32"
    mesh: Any = None
    prefill_chunk: int = E.PREFILL_CHUNK
    prefill_rows: int = 16
    prefix_cache_tokens: int = E.PREFIX_CACHE_TOKENS
    decode_dtype: str | None = "auto"
    quantization: str | None = None
    decode_layout: str = "auto"

    def __post_init__(self) -> None:
        for name, low in (("max_slots", 1), ("chunk", 1), ("prefill_chunk", 1),
                          ("prefill_rows", 1), ("prefix_cache_tokens", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"EngineOptions: expected {name} as an integer >= {low}, got "
                                 f"{v!r}.")
            object.__setattr__(self, name, int(v))
        if self.prefill_dtype not in (*_DTYPES, "auto", None):
            raise ValueError(f"EngineOptions: expected prefill_dtype 'auto', 'bfloat16', "
                             f"'float32' or None, got {self.prefill_dtype!r}.")
        if self.kv_dtype not in _DTYPES:
            raise ValueError(f"EngineOptions: expected kv_dtype 'bfloat16' or 'float32', got "
                             f"{self.kv_dtype!r}.")
        if self.decode_dtype not in DECODE_DTYPES:
            raise ValueError(f"EngineOptions: expected decode_dtype 'auto', None, 'bfloat16', "
                             f"'float32' or 'by_shape', got {self.decode_dtype!r}.")
        if self.decode_layout not in E.DECODE_LAYOUTS:
            raise ValueError(f"EngineOptions: expected decode_layout 'auto', 'rows' or "
                             f"'columns', got {self.decode_layout!r}.")
        if self.decode_layout == "columns" and self.quantization is not None:
            raise ValueError("EngineOptions: decode_layout='columns' is for float weights; "
                             f"quantization={self.quantization!r} decodes as rows (use 'auto' "
                             "or 'rows').")
        if self.quantization not in (*quant.QUANTIZATIONS, None):
            raise ValueError(f"EngineOptions: expected quantization None or "
                             f"{' or '.join(map(repr, quant.QUANTIZATIONS))}, got "
                             f"{self.quantization!r}.")
        if self.mesh is not None:
            from langtorch.functional.sharding import resolve_mesh

            object.__setattr__(self, "mesh", resolve_mesh(self.mesh))

    @classmethod
    def of(cls, model: Any, **overrides: Any) -> EngineOptions:
        """The model's own options (its ``max_batch``, ``chunk``, ``prefill_dtype``,
        ``kv_dtype``, ``mesh``, ``decode_dtype``, ``quantization`` and ``decode_layout``
        attributes where it has them), with
        ``overrides`` applied
        (``None`` values are ignored: "the model's").

        Example:
            >>> import types
            >>> from langtorch.models import EngineOptions
            >>> m = types.SimpleNamespace(max_batch=8, chunk=4)
            >>> EngineOptions.of(m).max_slots, EngineOptions.of(m, max_slots=64).max_slots
            (8, 64)
        """
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"EngineOptions: unknown options {sorted(unknown)}; expected "
                            f"{[f.name for f in dataclasses.fields(cls)]}.")
        own = {"max_slots": getattr(model, "max_batch", None),
               "chunk": getattr(model, "chunk", None),
               "prefill_dtype": getattr(model, "prefill_dtype", None),
               "kv_dtype": getattr(model, "kv_dtype", None),
               "mesh": getattr(model, "mesh", None),
               "decode_dtype": getattr(model, "decode_dtype", None),
               "quantization": getattr(model, "quantization", None),
               "decode_layout": getattr(model, "decode_layout", None)}
        kw = {k: v for k, v in own.items() if v is not None}
        for name in ("prefill_dtype", "decode_dtype"):
            if name not in kw and hasattr(model, name):
                kw[name] = None  # the model asked for its params' dtype explicitly
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)


_LOCK = threading.Lock()


def engine_for(model: Any, options: EngineOptions | None = None, **overrides: Any) -> Engine:
    """The engine for ``model`` built with ``options``, shared by every caller that asks for
    the same options (created on first use).

    ``options`` default to the model's own (:meth:`EngineOptions.of`); keyword ``overrides``
    (``max_slots``, ``chunk``, ``prefill_dtype``, ``kv_dtype``, ``mesh``, ``prefill_chunk``,
    ``prefill_rows``, ``prefix_cache_tokens``, ``decode_dtype``, ``quantization``,
    ``decode_layout``) change some of them.
    Different options give a different engine (its own slots, cache and worker thread, the
    weights shared), never the one another caller created first.

    Example:
        >>> from langtorch.models import default_llm, engine_for
        >>> llm = default_llm()  # doctest: +SKIP
        >>> engine_for(llm) is engine_for(llm)  # doctest: +SKIP
        True
        >>> engine_for(llm, max_slots=64).batch.max_slots  # doctest: +SKIP
        64
    """
    opts = EngineOptions.of(model) if options is None else options
    if overrides:
        opts = dataclasses.replace(opts, **{k: v for k, v in overrides.items() if v is not None})
    with _LOCK:
        engines = model.__dict__.setdefault("_langtorch_engines", {}) if hasattr(
            model, "__dict__") else None
        if engines is None:
            raise TypeError(f"engine_for: expected a model object that can hold its engines, "
                            f"got {type(model).__name__}.")
        eng = engines.get(opts)
        if eng is None:
            # Every option, by name (an option left out here would be silently ignored).
            eng = Engine(model, **{f.name: getattr(opts, f.name)
                                   for f in dataclasses.fields(opts)})
            engines[opts] = eng
        return eng
