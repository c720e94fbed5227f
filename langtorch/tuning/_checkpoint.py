"""Checkpoints of :meth:`PromptTuner.fit <langtorch.tuning.PromptTuner.fit>`: the state of a run,
what a resumed run must share with the one that wrote it, and the checked write and read.

One safetensors file per run (:func:`langtorch.tuning._files.save_checkpoint`: atomic, with a
sha256 of the tensors): the prompt, the optimizer state's leaves (``opt/0000``, ...), the best
prompt, and a JSON state (position, history, step losses, running averages, fingerprint).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.tuning._errors import CheckpointError
from langtorch.tuning._files import load_checkpoint, save_checkpoint

if TYPE_CHECKING:
    from langtorch.tuning._tuner import PromptTuner

CHECKPOINT_NAME = "checkpoint.safetensors"


@dataclasses.dataclass
class Run:
    """The mutable state of one :meth:`PromptTuner.fit` (what a checkpoint holds)."""

    prompt: Any
    opt_state: Any
    epoch: int = 0            # current epoch
    batch: int = 0            # next batch of the current epoch
    global_step: int = 0      # optimizer steps taken
    since_eval: int = 0       # steps since the last history entry
    run_loss: float = 0.0     # sums over those steps
    run_acc: float = 0.0
    run_n: int = 0
    bad_evals: int = 0        # evaluations without improvement (patience)
    best: tuple = (-math.inf, None, -1)  # (score, prompt, history index)


def json_round(obj: Any) -> Any:
    """``obj`` as it comes back from JSON (tuples become lists)."""
    return json.loads(json.dumps(obj))


# The fields of the decoder config before it became DecoderConfig (langtorch <= the phase-1
# loaders): a checkpoint's fingerprint hashed ``repr(LlamaConfig(...))`` of these.
_LLAMA_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "intermediate_size", "rope_theta", "rms_norm_eps", "max_positions",
                 "tie_embeddings")


def config_repr(config: Any) -> str:
    """The text a fingerprint hashes for a model's config: for a decoder config that is a
    plain Llama (every field the old ``LlamaConfig`` lacked at its default), the old
    ``LlamaConfig(...)`` repr, so that checkpoints written before ``DecoderConfig`` still
    resume; otherwise ``repr(config)`` (every field: another architecture never matches).

    Example:
        >>> from langtorch.functional.models import decoder
        >>> config_repr(decoder.DecoderConfig(vocab_size=16))[:35]
        'LlamaConfig(vocab_size=16, hidden_s'
        >>> config_repr(decoder.DecoderConfig(architecture="qwen2"))[:14]
        'DecoderConfig('
    """
    from langtorch.functional.models.decoder import DecoderConfig

    if isinstance(config, DecoderConfig):
        old = {f: getattr(config, f) for f in _LLAMA_FIELDS}
        if config == DecoderConfig(**old):  # every other field at its default: a plain Llama
            return "LlamaConfig(" + ", ".join(f"{f}={v!r}" for f, v in old.items()) + ")"
    return repr(config)


def fingerprint(t: PromptTuner, batch_size: int, epochs: int, rows: list[tuple]) -> dict:
    """What a resumed run must share with the one that wrote the checkpoint to continue it
    exactly: the model (config and a sample of its embedding table), the weights' dtype, the
    tokenised training set (its order drives the batches) and the hyper-parameters."""
    params = t.model.params
    table = params["embed"] if t.kind == "decoder" else params["embeddings"]["word"]
    sample = np.asarray(table[::997], np.float32)
    model = hashlib.sha256(config_repr(t.model.config).encode() + sample.tobytes()).hexdigest()
    data = hashlib.sha256(json.dumps(rows, default=int).encode()).hexdigest()
    return {"n_tokens": t.n_tokens, "hidden": t.hidden, "labels": t.labels,
            "template": t.template, "chat": t.chat, "seed": t.seed,
            "pez": t.pez, "batch_size": batch_size, "epochs": epochs,
            "steps_per_call": t.steps_per_call, "dtype": t.dtype,
            "model": model[:16], "data": f"{len(rows)} examples, sha256 {data[:16]}",
            **{k: v for k, v in t.opt_kwargs.items()},
            # Only multi-token labels score differently under "sum" and "mean" (kept out of
            # the fingerprint otherwise, so checkpoints written before the option still resume).
            **({"label_reduction": t.label_reduction} if t.label_extra_tokens else {})}


def save(path: Path, run: Run, history: list[dict], step_losses: list[float],
         fingerprint: dict) -> None:
    """Write ``run`` (with the tuner's ``history`` and ``step_losses``) to ``path``."""
    leaves = jax.tree.leaves(run.opt_state)
    arrays = {"prompt": np.asarray(run.prompt)}
    arrays.update({f"opt/{i:04d}": np.asarray(x) for i, x in enumerate(leaves)})
    if run.best[1] is not None:
        arrays["best_prompt"] = np.asarray(run.best[1])
    state = {"epoch": run.epoch, "batch": run.batch, "global_step": run.global_step,
             "history": history, "step_losses": step_losses,
             "fingerprint": fingerprint,
             "best_score": run.best[0] if run.best[1] is not None else None,
             "best_index": run.best[2], "num_opt_leaves": len(leaves),
             "bad_evals": run.bad_evals, "since_eval": run.since_eval,
             "running": [run.run_loss, run.run_acc, run.run_n]}
    save_checkpoint(path, arrays, state)


def restore(path: Path, run: Run, fingerprint: dict, steps_per_epoch: int,
            epochs: int) -> tuple[list[dict], list[float]]:
    """Continue ``run`` from the checkpoint at ``path``; return its ``(history, step_losses)``.

    Raises:
        CheckpointError: an unreadable file, another setup (the fingerprint differs), or a
            training state that does not add up. ``run`` is left untouched then.
    """
    arrays, state = load_checkpoint(path)
    _check_fingerprint(path, state.get("fingerprint"), json_round(fingerprint))
    try:
        restored = _read_state(arrays, state, run, steps_per_epoch, epochs)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path} holds an inconsistent training state "
                              f"({type(exc).__name__}: {exc}). Delete it or resume from "
                              "another checkpoint.") from exc
    history, step_losses = restored.pop("history"), restored.pop("step_losses")
    for name, value in restored.items():
        setattr(run, name, value)
    return history, step_losses


def _check_fingerprint(path: Path, got: Any, want: dict) -> None:
    if got == want:
        return
    diff = (sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            if isinstance(got, dict) else ["fingerprint"])
    raise CheckpointError(
        f"checkpoint {path} was written by a different setup (differs in "
        f"{', '.join(diff)}: checkpoint "
        f"{ {k: got.get(k) for k in diff} if isinstance(got, dict) else got}, now "
        f"{ {k: want.get(k) for k in diff} }). Use another checkpoint_dir or resume=False.")


def _read_state(arrays: dict, state: dict, run: Run, steps_per_epoch: int,
                epochs: int) -> dict[str, Any]:
    """The checkpoint's fields of ``run`` (and ``history``, ``step_losses``), checked against
    each other and the run's shapes; a ValueError/KeyError/TypeError says what does not fit."""
    opt_state = _read_opt_state(arrays, state, run.opt_state)
    prompt = arrays["prompt"]
    if prompt.shape != tuple(run.prompt.shape):
        raise ValueError(f"its prompt has shape {prompt.shape}, expected "
                         f"{tuple(run.prompt.shape)}")
    epoch, batch = int(state["epoch"]), int(state.get("batch", 0))
    global_step = int(state["global_step"])
    # Every batch before (epoch, batch) was trained: the position and the step count must
    # agree, or resuming would skip or repeat data.
    if not (0 <= epoch <= epochs and 0 <= batch < steps_per_epoch
            and global_step == epoch * steps_per_epoch + batch):
        raise ValueError(f"position epoch {epoch}, batch {batch}, step {global_step} is "
                         f"impossible with {steps_per_epoch} steps per epoch")
    bad_evals, since_eval = int(state.get("bad_evals", 0)), int(state.get("since_eval", 0))
    run_loss, run_acc, run_n = state.get("running", [0.0, 0.0, 0])
    run_loss, run_acc, run_n = float(run_loss), float(run_acc), int(run_n)
    history, step_losses = list(state["history"]), [float(v) for v in state["step_losses"]]
    if len(step_losses) != global_step:
        raise ValueError(f"it holds {len(step_losses)} step losses for {global_step} steps")
    best = run.best
    if arrays.get("best_prompt") is not None:
        best = (float(state["best_score"]), arrays["best_prompt"], int(state["best_index"]))
        if best[1].shape != prompt.shape or not 0 <= best[2] < len(history):
            raise ValueError("its best prompt does not match its history")
    return {"opt_state": opt_state, "prompt": jnp.asarray(prompt), "epoch": epoch,
            "batch": batch, "global_step": global_step, "bad_evals": bad_evals,
            "since_eval": since_eval, "run_loss": run_loss, "run_acc": run_acc, "run_n": run_n,
            "best": best, "history": history, "step_losses": step_losses}


def _read_opt_state(arrays: dict, state: dict, like: Any) -> Any:
    """The optimizer state in the checkpoint, shaped and typed like ``like`` (a fresh one)."""
    leaves, treedef = jax.tree.flatten(like)
    if state.get("num_opt_leaves") != len(leaves):
        raise ValueError(f"its optimizer state has {state.get('num_opt_leaves')} arrays, "
                         f"expected {len(leaves)}")
    restored = []
    for i, t in enumerate(leaves):
        a = arrays[f"opt/{i:04d}"]
        if a.size != np.size(t) or a.ndim > max(np.ndim(t), 1):
            raise ValueError(f"optimizer array {i} has shape {a.shape}, expected "
                             f"{np.shape(t)}")
        # (scalars come back as [1]: the writer's ascontiguousarray makes them 1-d; a [1] step
        # count would re-trace the train step after every resume)
        restored.append(jnp.asarray(a.reshape(np.shape(t)), dtype=np.asarray(t).dtype))
    return jax.tree.unflatten(treedef, restored)
