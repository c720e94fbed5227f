"""Prompt-tuning machinery: optimizer, jitted multi-step train step, NaN guard, batching, PEZ.

:func:`make_train_step` turns a loss ``loss(prompt, frozen, batch) -> (scalar, metrics)`` (see
:mod:`langtorch.functional.losses`) into one jitted function that runs ``S`` optimizer steps per
call under ``lax.scan``. Gradients are taken for the prompt only (``argnums=0``); the frozen
weights are a jit *argument*, so the compiled program does not embed 135M constants and one
compile serves every call with the same shapes. :func:`pad_rows` pads token ids to a few length
buckets, so mixed-length data compiles once per bucket and never again after warm-up.

Example:
    >>> import functools, jax, jax.numpy as jnp
    >>> from langtorch.functional.prompt_tuning import make_optimizer, make_train_step
    >>> def loss(prompt, frozen, batch):          # a toy quadratic
    ...     return jnp.sum((prompt - frozen["goal"]) ** 2) * batch["scale"], {}
    >>> opt = make_optimizer(0.1, total_steps=100, warmup_steps=0)
    >>> step = make_train_step(loss, opt)
    >>> prompt = jnp.zeros((2, 3)); state = opt.init(prompt)
    >>> batches = {"scale": jnp.ones((5,))}       # 5 steps in one call
    >>> prompt, state, metrics = step(prompt, state, batches, {"goal": jnp.ones((2, 3))})
    >>> metrics["loss"].shape, bool(metrics["loss"][-1] < metrics["loss"][0]), step.num_compiles
    ((5,), True, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from langtorch.functional import sharding as S
from langtorch.functional.errors import LangTorchError
from langtorch.functional.shapes import DEFAULT_LENGTH_BUCKETS, bucket
from langtorch.functional.soft_prompt import nearest_tokens

__all__ = [
    "DEFAULT_LENGTH_BUCKETS",
    "NonFiniteLossError",
    "TrainStep",
    "make_optimizer",
    "make_train_step",
    "nearest_tokens",
    "label_positions",
    "pad_rows",
    "stack_batches",
    "generate_with_prompt",
]


class NonFiniteLossError(LangTorchError, FloatingPointError):
    """A train step produced a NaN/inf loss or gradient; the update was not applied.

    Attributes:
        params: the last good prompt (before the failing step).
        opt_state: the optimizer state that goes with ``params``.
        step: index (within the call) of the first non-finite step.
        metrics: the per-step metrics of the call (the failing step's loss included).

    Example:
        >>> err = NonFiniteLossError("loss is nan", params=None, opt_state=None, step=0)
        >>> isinstance(err, FloatingPointError), err.step
        (True, 0)
    """

    def __init__(self, message: str, *, params: Any, opt_state: Any, step: int,
                 metrics: dict | None = None):
        super().__init__(message)
        self.params, self.opt_state, self.step, self.metrics = params, opt_state, step, metrics


def make_optimizer(learning_rate: float = 3e-3, *, total_steps: int = 1000,
                   warmup_steps: int | None = None, clip_norm: float = 1.0,
                   weight_decay: float = 0.0,
                   schedule: str = "cosine") -> optax.GradientTransformation:
    """AdamW behind global-norm clipping, with linear warm-up and a decay schedule.

    Args:
        learning_rate: peak learning rate (soft prompts like large rates: 1e-3 .. 3e-1).
        total_steps: steps over which the schedule runs.
        warmup_steps: linear warm-up length (default 5% of ``total_steps``).
        clip_norm: maximum global gradient norm.
        weight_decay: AdamW decoupled weight decay.
        schedule: ``"cosine"`` (decay to 10% of the peak), ``"linear"`` (to 0) or
            ``"constant"``.

    Example:
        >>> import jax.numpy as jnp
        >>> opt = make_optimizer(1e-2, total_steps=10)
        >>> state = opt.init(jnp.zeros(3))
        >>> updates, state = opt.update(jnp.ones(3), state, jnp.zeros(3))
        >>> updates.shape
        (3,)
    """
    total_steps = max(int(total_steps), 1)
    warmup = max(1, total_steps // 20) if warmup_steps is None else int(warmup_steps)
    if schedule == "cosine":
        if warmup:
            sched = optax.warmup_cosine_decay_schedule(
                0.0, learning_rate, warmup, max(total_steps, warmup + 1),
                end_value=0.1 * learning_rate)
        else:
            sched = optax.cosine_decay_schedule(learning_rate, total_steps, alpha=0.1)
    elif schedule == "linear":
        sched = optax.join_schedules(
            [optax.linear_schedule(0.0, learning_rate, max(warmup, 1)),
             optax.linear_schedule(learning_rate, 0.0, max(total_steps - warmup, 1))], [warmup])
    elif schedule == "constant":
        sched = optax.constant_schedule(learning_rate)
    else:
        raise ValueError(f"make_optimizer: expected schedule 'cosine', 'linear' or 'constant', "
                         f"got {schedule!r}.")
    return optax.chain(optax.clip_by_global_norm(clip_norm),
                       optax.adamw(sched, weight_decay=weight_decay))


class TrainStep:
    """A jitted ``(prompt, opt_state, batches, frozen) -> (prompt, opt_state, metrics)``.

    ``batches`` is a pytree whose leaves carry a leading step axis ``S``: the call runs ``S``
    optimizer steps under ``lax.scan``. A batch may hold a boolean ``"active"`` scalar: an
    inactive step computes nothing useful and applies no update (pad the step axis with inactive
    batches to keep ``S`` fixed). Metrics come back per step (``[S]`` arrays): ``loss``,
    ``grad_norm``, ``finite``, ``active`` and whatever the loss reports.

    Built by :func:`make_train_step`; see there for an example.
    """

    def __init__(self, loss_fn: Callable, optimizer: optax.GradientTransformation,
                 donate: bool = False, mesh: Any = None, shard_frozen: bool = False):
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self._traces = 0
        self.mesh = S.resolve_mesh(mesh)
        self.shard_frozen = bool(shard_frozen)
        if self.shard_frozen and self.mesh is None:
            raise ValueError("shard_frozen: needs mesh= (a Mesh with a 'model' axis to split "
                             "the frozen weights along).")

        def run(prompt, opt_state, batches, frozen):
            # Runs once per new input signature (shapes/dtypes): the recompile counter.
            self._traces += 1
            grad_fn = jax.value_and_grad(loss_fn, argnums=0, has_aux=True)

            def body(carry, batch):
                prompt, opt_state, bad = carry
                active = jnp.asarray(batch.get("active", True), bool) if isinstance(
                    batch, dict) else jnp.asarray(True)
                (loss, aux), grads = grad_fn(prompt, frozen, batch)
                updates, new_state = optimizer.update(grads, opt_state, prompt)
                new_prompt = optax.apply_updates(prompt, updates)
                gnorm = optax.tree.norm(grads)
                finite = jnp.isfinite(loss) & jnp.isfinite(gnorm)
                finite = finite & jnp.all(jnp.array(
                    [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(new_prompt)]))
                # Once a step is bad, no later step of this call applies: the carried state is
                # the last good one, which the caller gets back inside the error.
                apply = active & finite & ~bad
                keep = lambda new, old: jax.tree.map(  # noqa: E731
                    lambda a, b: jnp.where(apply, a, b), new, old)
                carry = (keep(new_prompt, prompt), keep(new_state, opt_state),
                         bad | (active & ~finite))
                metrics = {"loss": loss.astype(jnp.float32), "grad_norm": gnorm,
                           "finite": finite, "active": active, **aux}
                return carry, metrics

            (prompt, opt_state, _), metrics = jax.lax.scan(
                body, (prompt, opt_state, jnp.asarray(False)), batches)
            return prompt, opt_state, metrics

        donate_argnums = (0, 1) if donate else ()
        if self.mesh is None:
            self.jitted = jax.jit(run, donate_argnums=donate_argnums)
        else:
            # The prompt, optimizer state and metrics come out replicated; the batch goes in
            # split along `data`, so XLA all-reduces the gradient of the batch-mean loss.
            rep = S.replicated(self.mesh)
            self.jitted = jax.jit(run, donate_argnums=donate_argnums,
                                  out_shardings=(rep, rep, rep))

    def place(self, prompt, opt_state, batches, frozen):
        """Put the arguments on the mesh: prompt and optimizer state replicated, every batch
        leaf with a batch axis (``[S, B, ...]``) split along ``data`` on ``B``, the frozen
        weights replicated (or split along ``model`` with ``shard_frozen``). Without a mesh
        the arguments are returned unchanged.

        Raises:
            ValueError: a batch axis that the ``data`` axis does not divide (pad the batch with
                zero-weight rows), or arrays explicitly placed elsewhere.
        """
        mesh = self.mesh
        if mesh is None:
            return prompt, opt_state, batches, frozen
        d = S.data_size(mesh)

        def put_batch(a):
            S.check_placement(a, mesh, name="batches", want=S.data_sharding(
                mesh, np.ndim(a), axis=1) if np.ndim(a) >= 2 else S.replicated(mesh))
            if np.ndim(a) < 2:
                return jax.device_put(a, S.replicated(mesh))
            if np.shape(a)[1] % d:
                raise ValueError(f"batches: the batch axis has {np.shape(a)[1]} rows, not a "
                                 f"multiple of the mesh's data axis ({d}); pad it with "
                                 f"zero-weight rows.")
            return jax.device_put(a, S.data_sharding(mesh, np.ndim(a), axis=1))

        frozen = (S.shard_params if self.shard_frozen else S.replicate)(frozen, mesh,
                                                                        name="frozen")
        return (S.replicate(prompt, mesh, name="prompt"),
                S.replicate(opt_state, mesh, name="opt_state"),
                jax.tree.map(put_batch, batches), frozen)

    @property
    def num_compiles(self) -> int:
        """How many times the step was traced (= compiled): one per distinct input signature."""
        return self._traces

    def __call__(self, prompt, opt_state, batches, frozen):
        """Run the steps; raise :class:`NonFiniteLossError` (holding the last good state) if a
        loss or gradient is NaN/inf."""
        new_prompt, new_state, metrics = self.jitted(*self.place(prompt, opt_state, batches,
                                                                  frozen))
        finite = np.asarray(metrics["finite"])
        active = np.asarray(metrics["active"])
        bad = np.flatnonzero(active & ~finite)
        if bad.size:
            k = int(bad[0])
            loss = float(np.asarray(metrics["loss"])[k])
            gnorm = float(np.asarray(metrics["grad_norm"])[k])
            raise NonFiniteLossError(
                f"train step {k} of this call produced a non-finite value (loss={loss}, "
                f"grad_norm={gnorm}); expected finite numbers. The update was not applied: "
                "`err.params` / `err.opt_state` hold the last good state. Lower the learning "
                "rate, check the batch for empty targets, or train in float32.",
                params=new_prompt, opt_state=new_state, step=k,
                metrics=jax.tree.map(np.asarray, metrics))
        return new_prompt, new_state, metrics


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, *,
                    donate: bool = False, mesh: Any = None,
                    shard_frozen: bool = False) -> TrainStep:
    """Build the jitted multi-step train function for ``loss_fn``.

    Args:
        loss_fn: ``loss(prompt, frozen, batch) -> (scalar loss, dict of scalar metrics)``;
            differentiated with respect to ``prompt`` only.
        optimizer: an optax transformation (see :func:`make_optimizer`).
        donate: donate the prompt and optimizer-state buffers to the call (saves a copy; the
            arrays passed in become invalid).
        mesh: ``None``, ``"auto"`` or a ``jax.sharding.Mesh`` with a ``data`` axis: the batch
            axis (axis 1 of every batch leaf) is split along ``data``, the prompt and optimizer
            state replicated, and XLA reduces the gradients (``jit`` with ``out_shardings``;
            see :meth:`TrainStep.place`).
        shard_frozen: split the frozen weights along the mesh's ``model`` axis instead of
            replicating them (:func:`langtorch.functional.sharding.shard_params`).

    Returns:
        A :class:`TrainStep`: ``step(prompt, opt_state, batches, frozen)`` with a leading step
        axis on every leaf of ``batches``; ``step.num_compiles`` counts compilations.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> step = make_train_step(lambda p, f, b: (jnp.sum(p * b["x"]), {}), optax.sgd(0.5))
        >>> p, s, m = step(jnp.ones(2), optax.sgd(0.5).init(jnp.ones(2)),
        ...                {"x": jnp.ones((3, 2))}, {})
        >>> p.tolist(), m["loss"].tolist()
        ([-0.5, -0.5], [2.0, 1.0, 0.0])
    """
    return TrainStep(loss_fn, optimizer, donate=donate, mesh=mesh, shard_frozen=shard_frozen)


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, *, length: int | None = None,
             buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
             batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token rows to a bucketed length (and optionally a fixed batch size).

    Args:
        rows: token id lists.
        pad_id: id written into padding slots (masked anyway).
        length: pad to exactly this length (must fit); default: the bucket of the longest row.
        buckets: length buckets.
        batch_size: add all-padding rows up to this many rows (their mask is 0).

    Returns:
        ``(ids [B, L] int32, mask [B, L] int32)``.

    Example:
        >>> ids, mask = pad_rows([[5, 6, 7], [8]], 0, buckets=(4, 8), batch_size=3)
        >>> ids.tolist(), mask.sum(1).tolist()
        ([[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0]], [3, 1, 0])
    """
    longest = max((len(r) for r in rows), default=1)
    if length is None:
        length = bucket(max(longest, 1), buckets)
    if longest > length:
        raise ValueError(f"pad_rows: a row has {longest} tokens, more than length={length}.")
    n = len(rows) if batch_size is None else batch_size
    if n < len(rows):
        raise ValueError(f"pad_rows: {len(rows)} rows do not fit batch_size={batch_size}.")
    ids = np.full((n, length), pad_id, np.int32)
    mask = np.zeros((n, length), np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return ids, mask


def label_positions(labels: np.ndarray, *, ignore_index: int = -100,
                    buckets: Sequence[int] = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                              8192)) -> tuple[np.ndarray, np.ndarray]:
    """The labelled columns of ``labels [B, T]`` as ``(positions [B, K], valid [B, K])``.

    ``K`` is the bucket of the largest per-row count (at most ``T``), so a batch of short
    targets sends only ``B*K`` hidden states through the output head
    (:func:`langtorch.functional.losses.decoder_lm_loss` reads them from the batch).

    Example:
        >>> import numpy as np
        >>> pos, valid = label_positions(np.array([[-100, 5, 6], [-100, -100, 7]]), buckets=(2,))
        >>> pos.tolist(), valid.tolist()
        ([[1, 2], [2, 0]], [[1, 1], [1, 0]])
    """
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"label_positions: expected labels [B, T], got shape {labels.shape}.")
    mask = labels != ignore_index
    counts = mask.sum(1)
    k = min(bucket(max(int(counts.max(initial=0)), 1), buckets), labels.shape[1])
    pos = np.zeros((labels.shape[0], k), np.int32)
    valid = np.zeros((labels.shape[0], k), np.int32)
    for i, row in enumerate(mask):
        cols = np.flatnonzero(row)
        pos[i, :cols.size], valid[i, :cols.size] = cols, 1
    return pos, valid


def stack_batches(batches: Sequence[dict]) -> dict:
    """Stack same-shaped batches on a new leading step axis (numpy; for :class:`TrainStep`).

    Example:
        >>> import numpy as np
        >>> stack_batches([{"x": np.zeros(2)}, {"x": np.ones(2)}])["x"].shape
        (2, 2)
    """
    if not batches:
        raise ValueError("stack_batches: expected at least one batch, got none.")
    return jax.tree.map(lambda *xs: np.stack(xs), *batches)


def generate_with_prompt(params: Any, prompt: jax.Array, ids: Any, mask: Any, *,
                         config: Any, max_new_tokens: int, eos_id: int) -> np.ndarray:
    """Greedy decoding with a soft prompt in front: ``[B, max_new_tokens]`` token ids.

    A thin layout adapter over the decode engine (:meth:`langtorch.functional.engine.SlotBatch.
    run`): each row's tokens (where ``mask`` is 1) decode after ``prompt``; after a row emits
    ``eos_id`` it keeps emitting ``eos_id``. Host-side (not jittable): the engine batches rows
    itself.

    Args:
        params: Llama parameters.
        prompt: ``[P, H]`` soft prompt (``P`` may be 0).
        ids: ``[B, T]`` token ids (left- or right-padded).
        mask: ``[B, T]`` 1 for real tokens.
        config: the decoder's :class:`~langtorch.functional.models.llama.LlamaConfig`.
        max_new_tokens: tokens to generate.
        eos_id: end-of-sequence id.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from langtorch.functional.models import llama
        >>> cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2,
        ...                         num_kv_heads=1, head_dim=4, intermediate_size=8)
        >>> p = llama.random_params(jax.random.key(0), cfg)
        >>> out = generate_with_prompt(p, jnp.zeros((2, 8)), jnp.array([[0, 3, 4]]),
        ...                            jnp.array([[0, 1, 1]]), config=cfg, max_new_tokens=4,
        ...                            eos_id=15)
        >>> out.shape
        (1, 4)
    """
    from langtorch.functional.engine import Sequence, SlotBatch

    ids, mask = np.asarray(ids), np.asarray(mask)
    rows = [ids[r][mask[r] > 0].tolist() for r in range(ids.shape[0])]
    prefix = None if prompt.shape[0] == 0 else np.asarray(prompt, np.float32)
    batch = SlotBatch(params, config=config, max_slots=max(1, min(32, len(rows))), chunk=16,
                      kv_dtype=params["embed"].dtype, eos_ids=(eos_id,))
    seqs = batch.run([Sequence(r, max_tokens=max_new_tokens, prefix=prefix) for r in rows])
    out = np.full((len(rows), max_new_tokens), eos_id, np.int32)
    for r, s in enumerate(seqs):
        out[r, :len(s.tokens)] = s.tokens
    return out
