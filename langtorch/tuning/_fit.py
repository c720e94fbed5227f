"""The training loop of :meth:`PromptTuner.fit <langtorch.tuning.PromptTuner.fit>`.

:func:`plan` checks the arguments and sizes the run, :func:`train_step` builds (or reuses) the
jitted multi-step train step, and :class:`FitLoop` runs the epochs: jitted calls of
``steps_per_call`` steps, an evaluation point every ``eval_every`` steps and at each epoch end
(history entry, best prompt, patience, callback), a checkpoint at each epoch end and at an early
stop, and the progress bar.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from langtorch.functional import prompt_tuning as PT
from langtorch.tuning import _checkpoint as C
from langtorch.tuning import _data as D
from langtorch.tuning import _setup
from langtorch.tuning._errors import PromptTuningError
from langtorch.tuning._evaluation import evaluate_rows

if TYPE_CHECKING:
    from langtorch.tuning._tuner import PromptTuner

_MAX_STEPS = 2**31 - 1  # optax counts steps in int32


@dataclasses.dataclass(frozen=True)
class Plan:
    """The size of one run: ``epochs`` of ``steps_per_epoch`` steps, stopping at ``stop_at``."""

    epochs: int
    batch_size: int
    steps_per_epoch: int
    total_steps: int
    stop_at: int


def check_args(t: PromptTuner, val: Any, **numbers: Any) -> None:
    """Refuse a fit that cannot run: nothing to train, a number that is not a positive
    integer, ``patience`` without ``val``."""
    if t.n_tokens == 0:
        raise PromptTuningError("PromptTuner: n_tokens=0 has nothing to train; use it for "
                                "zero-shot evaluation only.")
    for name, value in numbers.items():
        if value is not None and (not D.is_int(value) or value < 1):
            raise PromptTuningError(f"PromptTuner.fit: expected {name} to be a positive "
                                    f"integer, got {value!r}.")
    if numbers.get("patience") is not None and val is None:
        raise PromptTuningError("PromptTuner.fit: patience counts validation evaluations "
                                "without improvement; pass val=(texts, targets) with it.")


def plan(n_rows: int, epochs: int, batch_size: int, max_steps: int | None) -> Plan:
    """The run's size; the schedule spans all ``epochs`` even when ``max_steps`` stops it."""
    epochs, batch_size = int(epochs), int(batch_size)
    steps_per_epoch = math.ceil(n_rows / batch_size)
    total_steps = steps_per_epoch * epochs
    if total_steps > _MAX_STEPS:
        raise PromptTuningError(
            f"PromptTuner.fit: epochs={epochs} x {steps_per_epoch} steps per epoch is "
            f"{total_steps} steps, more than the optimizer's step counter holds "
            f"({_MAX_STEPS}); use fewer epochs (max_steps does not shorten the schedule).")
    stop_at = total_steps if max_steps is None else min(int(max_steps), total_steps)
    return Plan(epochs, batch_size, steps_per_epoch, total_steps, stop_at)


def train_step(t: PromptTuner, total_steps: int) -> Any:
    """The optimizer for ``total_steps``; builds ``t._train_step`` unless the tuner's compiled
    one already has this schedule (a second fit with the same sizes does not re-trace)."""
    optimizer = PT.make_optimizer(total_steps=total_steps, **t.opt_kwargs)
    sig = (total_steps, tuple(sorted(t.opt_kwargs.items())))
    if t._train_step is None or t._compiled_for != sig:
        t._train_step = PT.make_train_step(_setup.loss_fn(t), optimizer, mesh=t.mesh,
                                           shard_frozen=t.shard_frozen)
        t._compiled_for = sig
    return optimizer


@dataclasses.dataclass
class FitLoop:
    """One :meth:`fit` from ``run``'s position to its end; writes the tuner's ``prompt``,
    ``history`` and ``step_losses``."""

    tuner: PromptTuner
    run: C.Run
    plan: Plan
    rows: list[tuple]
    val_rows: list[tuple] | None
    checkpoint: Path | None
    fingerprint: dict
    eval_every: int | None = None
    patience: int | None = None
    callback: Callable[[dict], Any] | None = None

    def __call__(self, restore_best: bool) -> None:
        from tqdm.auto import tqdm

        run, plan = self.run, self.plan
        self.bar = tqdm(total=plan.stop_at, initial=min(run.global_step, plan.stop_at),
                        disable=not self.tuner.progress, desc="prompt tuning", unit="step",
                        leave=True)
        self.t0 = time.perf_counter()
        stopped = False
        try:
            while run.epoch < plan.epochs and run.global_step < plan.stop_at and not stopped:
                stopped = self._train_epoch()
                if run.batch < plan.steps_per_epoch:  # stopped inside the epoch
                    self._stop_inside_epoch()
                    break
                stopped = self._end_epoch() or stopped
            self._finish(restore_best)
        finally:
            self.bar.close()

    # ------------------------------------------------------------------ the steps of a run
    def _train_epoch(self) -> bool:
        """Train the rest of the current epoch (up to ``stop_at``); True: a mid-epoch
        evaluation asked to stop."""
        run, plan = self.run, self.plan
        for batches, active, nxt in D.calls(self.tuner, self.rows, plan.batch_size, run.epoch,
                                            run.batch, plan.stop_at - run.global_step):
            self._train_call(batches, active)
            run.batch = nxt
            epoch_done = nxt >= plan.steps_per_epoch
            if (self.eval_every and run.since_eval >= self.eval_every and not epoch_done
                    and run.global_step < plan.stop_at):
                if self._eval_point(self.patience):
                    return True
        return False

    def _end_epoch(self) -> bool:
        stop = self._eval_point(self.patience)
        self.run.epoch, self.run.batch = self.run.epoch + 1, 0
        self._save()
        return stop

    def _stop_inside_epoch(self) -> None:
        """``max_steps``, patience or the callback stopped the run inside an epoch."""
        self._save()  # the position is saved before the final evaluation
        if self.run.since_eval:  # the last entry reaches the callback too
            self._eval_point(None)

    def _finish(self, restore_best: bool) -> None:
        run, t = self.run, self.tuner
        t.prompt = run.prompt
        restored = restore_best and run.best[1] is not None
        if restored:
            t.prompt = jnp.asarray(run.best[1], jnp.float32)
        self.bar.set_postfix_str(self._summary(restored), refresh=True)

    def _save(self) -> None:
        if self.checkpoint is not None:
            C.save(self.checkpoint, self.run, self.tuner.history, self.tuner.step_losses,
                   self.fingerprint)

    def _train_call(self, batches: dict, active: np.ndarray) -> None:
        """One jitted call of ``steps_per_call`` steps; bookkeeping for the active ones."""
        run, t = self.run, self.tuner
        try:
            run.prompt, run.opt_state, m = t._train_step(run.prompt, run.opt_state, batches,
                                                         t.frozen)
        except PT.NonFiniteLossError as err:
            t.prompt = err.params
            raise
        losses = np.asarray(m["loss"])[active]
        n = int(active.sum())
        t.step_losses += [float(v) for v in losses]
        run.global_step += n
        run.since_eval += n
        run.run_loss += float(losses.sum())
        if "accuracy" in m:
            run.run_acc += float(np.asarray(m["accuracy"])[active].sum())
        run.run_n += n
        self.bar.update(n)
        self.bar.set_postfix(self._postfix(), refresh=False)

    def _eval_point(self, patience: int | None) -> bool:
        """The one evaluation path of :meth:`fit`: a history entry (train averages since the
        previous one, validation metrics), the best prompt, patience; returns "stop"."""
        run, t = self.run, self.tuner
        if not run.run_n and (self.val_rows is None or (
                t.history and t.history[-1]["step"] == run.global_step)):
            return False
        t.prompt = run.prompt
        entry = {"epoch": round(run.global_step / self.plan.steps_per_epoch, 4),
                 "step": int(run.global_step),
                 "train_loss": run.run_loss / max(run.run_n, 1),
                 "train_accuracy": (run.run_acc / max(run.run_n, 1)) if t.labels else None,
                 "val_loss": None, "val_accuracy": None,
                 "seconds": round(time.perf_counter() - self.t0, 3)}
        if self.val_rows is not None:
            metrics = evaluate_rows(t, self.val_rows, run.prompt)
            entry["val_loss"], entry["val_accuracy"] = metrics["loss"], metrics.get("accuracy")
            score = metrics["accuracy"] if t.labels else -metrics["loss"]
            if score > run.best[0]:
                run.best = (score, np.asarray(run.prompt), len(t.history))
                run.bad_evals = 0
            else:
                run.bad_evals += 1
        t.history.append(entry)
        run.since_eval, run.run_loss, run.run_acc, run.run_n = 0, 0.0, 0.0, 0
        self.bar.set_postfix(self._postfix(), refresh=True)
        stop = patience is not None and run.bad_evals >= patience
        if self.callback is not None and self.callback(entry):
            stop = True
        return stop

    # ------------------------------------------------------------------ the progress bar
    def _postfix(self) -> dict:
        """Train loss/accuracy since the last evaluation; right after one (nothing trained
        since), the averages that evaluation recorded — never the emptied running sums."""
        run, t = self.run, self.tuner
        last = t.history[-1] if t.history else None
        post = {}
        if run.run_n:
            post["loss"] = f"{run.run_loss / run.run_n:.4f}"
            if t.labels is not None:
                post["acc"] = f"{run.run_acc / run.run_n:.3f}"
        elif last is not None:
            post["loss"] = f"{last['train_loss']:.4f}"
            if last.get("train_accuracy") is not None:
                post["acc"] = f"{last['train_accuracy']:.3f}"
        if last is not None and last.get("val_loss") is not None:
            key = "val_acc" if t.labels is not None else "val_loss"
            value = last["val_accuracy"] if t.labels is not None else last["val_loss"]
            post[f"{key}@{last['step']}"] = f"{value:.3f}"
        return post

    def _summary(self, restored: bool) -> str:
        run, t = self.run, self.tuner
        text = f"done: {run.global_step} steps"
        last = t.history[-1] if t.history else None
        if last is not None:
            text += f", loss {last['train_loss']:.4f}"
            if last.get("train_accuracy") is not None:
                text += f" acc {last['train_accuracy']:.3f}"
        if run.best[1] is not None:
            entry = t.history[run.best[2]]
            metric = "val_accuracy" if t.labels is not None else "val_loss"
            text += f", best {metric} {entry[metric]:.4f} at step {entry['step']}"
            text += " (restored)" if restored else " (not restored: ended with the last prompt)"
        return text
