"""``PromptTuner``: soft-prompt training on a local model (SmolLM2 or MiniLM) with JAX + optax."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import numbers
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.functional import losses as L
from langtorch.functional import prompt_tuning as PT
from langtorch.functional import sharding as S
from langtorch.functional.soft_prompt import init_soft_prompt, init_soft_prompt_from_vocab
from langtorch.tensor import TextTensor
from langtorch.tuning._errors import AdapterError, CheckpointError, PromptTuningError
from langtorch.tuning._files import (
    load_checkpoint,
    load_peft_adapter,
    save_checkpoint,
    save_peft_adapter,
)

__all__ = ["PromptTuner"]

CHECKPOINT_NAME = "checkpoint.safetensors"
_EVAL_BATCH = 32
_MAX_STEPS = 2**31 - 1  # optax counts steps in int32
_LABEL_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclasses.dataclass
class _Run:
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


def _is_int(value: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _texts(x: Any, what: str) -> list[str]:
    if isinstance(x, str):
        x = [x]
    texts = getattr(x, "texts", None)
    flat = np.asarray(texts).reshape(-1).tolist() if texts is not None else [str(s) for s in x]
    if not flat:
        raise PromptTuningError(f"PromptTuner: expected a non-empty {what}, got 0 entries.")
    return [str(s) for s in flat]


def _shape(x: Any) -> tuple[int, ...]:
    if isinstance(x, str):
        return ()
    return tuple(getattr(x, "shape", (len(x),)))


def _resolve_model(backend: Any) -> Any:
    if backend is None or backend == "smollm2":
        from langtorch.models import default_llm

        return default_llm()
    if backend == "minilm":
        from langtorch.models import default_embedder

        return default_embedder()
    if hasattr(backend, "params") and hasattr(backend, "config"):
        return backend
    llm = getattr(type(backend), "llm", None)
    if llm is not None:  # LocalBackend: the model behind it
        return backend.llm
    raise PromptTuningError(
        f"PromptTuner: expected a local model (LocalBackend, langtorch.models.SmolLM2 or MiniLM, "
        f"'smollm2', 'minilm'), got {type(backend).__name__}. Soft prompts need the model's "
        "weights; train on the local model and use `hard_template()` with API backends.")


class PromptTuner:
    """Train a soft prompt (``n_tokens`` virtual tokens) for a frozen local model.

    **Classification** (``labels`` given): each text is put into ``template`` and the model's
    next-token logits at the end are read for one *label word* per label (``" positive"``, …;
    with ``chat=True`` the text is the user turn of the chat template and the label word starts
    the assistant's answer). Only those ``K`` logits are computed. **Generation**
    (``labels=None``): targets are texts, trained with the masked causal-LM loss on the target
    tokens. With a MiniLM model the prompt is inserted after ``[CLS]`` and trained so that the
    pooled sentence embedding is closest (cosine, ``scale``) to the embedding of its label.

    The numeric work is :mod:`langtorch.functional.prompt_tuning` (jitted multi-step scan,
    AdamW + global-norm clipping + warm-up/cosine schedule, NaN guard) over
    :mod:`langtorch.functional.losses`; shapes are bucketed so a run compiles a handful of
    times and never again after warm-up.

    Args:
        backend: ``LocalBackend``, a ``langtorch.models.SmolLM2`` / ``MiniLM`` (or any object
            with ``params``, ``config`` and a tokenizer), ``"smollm2"`` / ``"minilm"``;
            default: the process-wide SmolLM2.
        n_tokens: number of virtual tokens ``P`` (0: no soft prompt, for zero-shot baselines).
        labels: the label set for classification (strings), or None for generation.
        template: a template with one ``{}`` placeholder for the input text; default
            ``"Input: {}\\nLabel:"`` (decoder classification), ``"{}"`` otherwise.
        label_words: the word the model should produce for each label; default
            ``" " + label`` (``label`` with ``chat=True``). Each must be one token.
        chat: put the filled template into the model's chat template as the user turn.
        system: system prompt for ``chat=True``.
        init: ``"vocab"`` (random vocabulary rows), ``"text"`` (the tokens of ``init_text``,
            repeated to ``n_tokens``) or ``"random"`` (Gaussian, std 0.02... scaled to the
            embedding norm).
        init_text: text for ``init="text"``.
        learning_rate, weight_decay, clip_norm, warmup_steps, schedule: see
            :func:`langtorch.functional.prompt_tuning.make_optimizer`.
        pez: train a hard prompt (PEZ): the model sees the nearest vocabulary embeddings,
            gradients update the continuous prompt through a straight-through estimator.
        dtype: ``"float32"`` or ``"bfloat16"`` for the frozen weights (the prompt stays fp32);
            bf16 products accumulate in fp32, and on CPUs with fast bf16 dot units the bf16
            train step is faster than fp32.
        steps_per_call: optimizer steps run inside one jitted call (``lax.scan``).
        length_buckets: padded sequence lengths.
        scale: inverse temperature of the MiniLM cosine classifier.
        max_new_tokens: generation length for :meth:`predict` in generation mode.
        seed: seeds the prompt init and the data order (per epoch).
        mesh: ``None``, ``"auto"`` or a ``jax.sharding.Mesh`` with a ``data`` axis: training
            batches are split along ``data`` (padded with zero-weight rows to a multiple of its
            size), the prompt and optimizer state replicated, gradients reduced by XLA; the
            frozen weights are replicated on the mesh (docs/scaling.md).
        shard_frozen: with a mesh that has a ``model`` axis, split the frozen weights along it
            instead of replicating them.
        progress: show a tqdm progress bar during :meth:`fit`.

    Attributes:
        prompt: the current soft prompt, a ``[P, H]`` float32 jax array.
        history: one dict per evaluation (``epoch``, ``step``, ``train_loss``,
            ``train_accuracy``, ``val_loss``, ``val_accuracy``, ``seconds``).
        step_losses: the training loss of every optimizer step.

    Example:
        >>> import langtorch as lt
        >>> from langtorch.tuning import PromptTuner
        >>> from langtorch.datasets import load_sentiment
        >>> tuner = PromptTuner(n_tokens=20, labels=["negative", "positive"],
        ...                     template="Review: {}\\nSentiment:")        # doctest: +SKIP
        >>> tuner.fit(*load_sentiment("train"), val=load_sentiment("val"), epochs=2)  # doctest: +SKIP
        >>> tuner.predict(lt.TextTensor(["I loved it"])).tolist()        # doctest: +SKIP
        ['positive']
    """

    HARD_SEPARATOR = "\n"
    """Text between the recovered hard prompt and the template (:meth:`hard_template`)."""

    def __init__(self, backend: Any = None, n_tokens: int = 20, labels: Sequence[str] | None = None,
                 template: str | None = None, *, label_words: Sequence[str] | None = None,
                 chat: bool = False, system: str | None = None, init: str = "vocab",
                 init_text: str | None = None, learning_rate: float = 3e-2,
                 weight_decay: float = 0.0, clip_norm: float = 1.0,
                 warmup_steps: int | None = None, schedule: str = "cosine", pez: bool = False,
                 dtype: str = "float32", steps_per_call: int = 4,
                 length_buckets: Sequence[int] = PT.DEFAULT_LENGTH_BUCKETS, scale: float = 20.0,
                 max_new_tokens: int = 32, seed: int = 0, progress: bool = True,
                 mesh: Any = None, shard_frozen: bool = False):
        self.mesh = S.resolve_mesh(mesh)
        self.shard_frozen = bool(shard_frozen)
        if self.shard_frozen and self.mesh is None:
            raise PromptTuningError("PromptTuner: shard_frozen=True needs mesh= (a Mesh with a "
                                    "'model' axis to split the frozen weights along).")
        self.model = _resolve_model(backend)
        params = self.model.params
        self.kind = "encoder" if "embeddings" in params else "decoder"
        if n_tokens < 0:
            raise PromptTuningError(f"PromptTuner: expected n_tokens >= 0, got {n_tokens}.")
        self.n_tokens = int(n_tokens)
        self.labels = None if labels is None else [str(x) for x in labels]
        if self.labels is not None and (len(self.labels) < 2 or
                                        len(set(self.labels)) != len(self.labels)):
            raise PromptTuningError(f"PromptTuner: expected at least two distinct labels, got "
                                    f"{self.labels}.")
        if self.kind == "encoder" and self.labels is None:
            raise PromptTuningError("PromptTuner: a MiniLM (encoder) model can only classify; "
                                    "pass labels=[...].")
        if template is None:
            template = "Input: {}\nLabel:" if (self.labels and self.kind == "decoder"
                                                 and not chat) else "{}"
        if template.count("{}") != 1:
            raise PromptTuningError(f"PromptTuner: expected a template with exactly one '{{}}' "
                                    f"placeholder, got {template!r}.")
        self.template, self.chat, self.system = template, bool(chat), system
        self.init, self.init_text, self.pez, self.seed = init, init_text, bool(pez), int(seed)
        self.opt_kwargs = dict(learning_rate=learning_rate, weight_decay=weight_decay,
                               clip_norm=clip_norm, warmup_steps=warmup_steps, schedule=schedule)
        if not _is_int(steps_per_call) or steps_per_call < 1:
            raise PromptTuningError(f"PromptTuner: expected steps_per_call to be a positive "
                                    f"integer, got {steps_per_call!r}.")
        self.steps_per_call, self.length_buckets = int(steps_per_call), tuple(length_buckets)
        self.scale, self.max_new_tokens, self.progress = float(scale), int(max_new_tokens), progress
        if dtype not in ("float32", "bfloat16"):
            raise PromptTuningError(f"PromptTuner: expected dtype 'float32' or 'bfloat16', got "
                                    f"{dtype!r}.")
        self.dtype = dtype
        jd = jnp.float32 if dtype == "float32" else jnp.bfloat16
        self._params = jax.tree.map(lambda a: jnp.asarray(a, jd), params)
        if self.mesh is not None:  # placed once; every train call finds them in place
            self._params = (S.shard_params if shard_frozen else S.replicate)(
                self._params, self.mesh, name="frozen")
        if self.kind == "decoder":
            self._table = self._params["embed"]
            self.context = int(self.model.config.max_positions)
            self.pad_id = int(getattr(self.model, "pad_id", 0))
        else:
            self._table = self._params["embeddings"]["word"]
            self.context = int(self.model.config.max_positions)
            self.pad_id = int(self.model.tokenizer.token_to_id("[PAD]") or 0)
        self.hidden = int(self._table.shape[1])
        self.label_ids = self._label_ids(label_words)
        self.prompt = self._init_prompt()
        self.history: list[dict] = []
        self.step_losses: list[float] = []
        self._train_step: PT.TrainStep | None = None
        self._compiled_for: tuple | None = None
        cfg = self.model.config
        if self.kind == "decoder":
            self._logits_fn = jax.jit(functools.partial(L.decoder_label_logits, config=cfg))
            # One jitted evaluation loss for the tuner's life (generation mode): built once, it
            # compiles once per padded shape instead of re-tracing on every evaluate().
            self._lm_loss_fn = jax.jit(functools.partial(L.decoder_lm_loss, config=cfg,
                                                         pez=self.pez))
        else:
            self._logits_fn = jax.jit(functools.partial(L.encoder_label_logits, config=cfg,
                                                        scale=self.scale))

    # ------------------------------------------------------------------ setup helpers
    def _encode(self, text: str) -> list[int]:
        if self.kind == "encoder":
            return list(self.model.tokenizer.encode(text).ids)
        return list(self.model.encode(text))

    def _decode(self, ids: Sequence[int]) -> str:
        if self.kind == "encoder":
            return self.model.tokenizer.decode(list(ids))
        return self.model.decode(list(ids))

    def _label_ids(self, label_words):
        if self.labels is None:
            return None
        if self.kind == "encoder":
            words = list(label_words) if label_words is not None else self.labels
            vecs = np.asarray(self.model.embed_texts(words), np.float32)
            return jnp.asarray(vecs)
        if label_words is None:
            label_words = self.labels if self.chat else [" " + x for x in self.labels]
        if len(label_words) != len(self.labels):
            raise PromptTuningError(f"PromptTuner: expected one label word per label "
                                    f"({len(self.labels)}), got {len(label_words)}.")
        ids = []
        for label, word in zip(self.labels, label_words):
            toks = self._encode(word)
            if len(toks) != 1:
                pieces = [self._decode([t]) for t in toks]
                raise PromptTuningError(
                    f"PromptTuner: label {label!r} (label word {word!r}) is {len(toks)} tokens "
                    f"{pieces}; expected exactly one token. Pass label_words=[...] with "
                    "single-token words (a leading space often helps: ' positive').")
            ids.append(toks[0])
        if len(set(ids)) != len(ids):
            raise PromptTuningError(f"PromptTuner: label words {list(label_words)} map to "
                                    f"repeated token ids {ids}; expected distinct tokens.")
        self.label_words = list(label_words)
        return jnp.asarray(ids, jnp.int32)

    def _init_prompt(self) -> jax.Array:
        p, h = self.n_tokens, self.hidden
        if p == 0:
            return jnp.zeros((0, h), jnp.float32)
        key = jax.random.key(self.seed)
        table = self._table.astype(jnp.float32)
        if self.init == "vocab":
            # Sample among the first 5000 ids: common tokens, no byte-level or rare pieces.
            sub = table[: min(5000, table.shape[0])]
            return init_soft_prompt_from_vocab(key, sub, p)
        if self.init == "text":
            if not self.init_text:
                raise PromptTuningError("PromptTuner: init='text' needs init_text='...'.")
            ids = self._encode(self.init_text)
            if self.kind == "encoder":
                ids = ids[1:-1]  # drop [CLS]/[SEP]
            if not ids:
                raise PromptTuningError(f"PromptTuner: init_text {self.init_text!r} has no "
                                        "tokens.")
            ids = (ids * math.ceil(p / len(ids)))[:p]
            return jnp.take(table, jnp.asarray(ids), axis=0)
        if self.init == "random":
            rms = float(jnp.sqrt(jnp.mean(table[:5000] ** 2)))
            return init_soft_prompt(key, p, h, scale=rms)
        raise PromptTuningError(f"PromptTuner: expected init 'vocab', 'text' or 'random', got "
                                f"{self.init!r}.")

    @property
    def frozen(self) -> dict:
        """The frozen pytree handed to the losses (model weights and label data)."""
        if self.labels is None:
            return {"model": self._params}
        key = "label_vectors" if self.kind == "encoder" else "label_ids"
        return {"model": self._params, key: self.label_ids}

    def _loss_fn(self):
        cfg = self.model.config
        if self.kind == "encoder":
            return functools.partial(L.encoder_classification_loss, config=cfg, scale=self.scale,
                                     pez=self.pez)
        if self.labels is None:
            return functools.partial(L.decoder_lm_loss, config=cfg, pez=self.pez)
        return functools.partial(L.decoder_classification_loss, config=cfg, pez=self.pez)

    # ------------------------------------------------------------------ data
    def _prefix_ids(self, text: str, prefix: str = "") -> list[int]:
        # A hard-prompt prefix is joined as in hard_template(): what any backend would see.
        prefix = prefix + self.HARD_SEPARATOR if prefix else ""
        filled = prefix + self.template.replace("{}", text)
        if self.kind == "decoder" and self.chat:
            msgs = ([{"role": "system", "content": self.system}] if self.system else [])
            msgs.append({"role": "user", "content": filled})
            return self._encode(self.model.apply_chat_template(msgs))
        return self._encode(filled)

    def _check_len(self, n: int, text: str, p: int) -> None:
        if n + p > self.context:
            raise PromptTuningError(
                f"PromptTuner: an input is {n} tokens; with the {p}-token prompt that is "
                f"{n + p}, more than the model's context of {self.context} tokens "
                f"(input starts {text[:60]!r}). Shorten the inputs or use fewer virtual tokens.")

    def _examples(self, texts: list[str], targets: list[str] | None, prefix: str = "",
                  p: int | None = None) -> list[tuple]:
        p = self.n_tokens if p is None else p
        out = []
        if self.labels is not None and targets is not None:
            index = {lab: i for i, lab in enumerate(self.labels)}
            bad = [t for t in targets if t not in index]
            if bad:
                raise PromptTuningError(f"PromptTuner: target {bad[0]!r} is not in the label "
                                        f"set {self.labels} ({len(bad)} such targets).")
        for i, text in enumerate(texts):
            ids = self._prefix_ids(text, prefix)
            if self.labels is not None:
                self._check_len(len(ids), text, p)
                target = index[targets[i]] if targets is not None else 0
                out.append((ids, len(ids) - 1, target))
            else:
                tgt = self._encode(targets[i]) + [int(self.model.eos_id)] if targets else []
                self._check_len(len(ids) + len(tgt), text, p)
                out.append((ids, tgt))
        return out

    def _label_k(self, rows: list[tuple], length: int) -> int:
        """Generation mode: the static number of label columns for rows padded to ``length``."""
        longest = max((len(r[1]) for r in rows), default=1)
        return min(PT.bucket(max(longest, 1), _LABEL_BUCKETS), length)

    def _batch(self, rows: list[tuple], batch_size: int, length: int,
               label_k: int | None = None) -> dict:
        if self.labels is not None:
            ids, mask = PT.pad_rows([r[0] for r in rows], self.pad_id, length=length,
                                    batch_size=batch_size)
            index = np.zeros(batch_size, np.int32)
            target = np.zeros(batch_size, np.int32)
            weight = np.zeros(batch_size, np.float32)
            for i, r in enumerate(rows):
                index[i], target[i], weight[i] = r[1], r[2], 1.0
            b = {"ids": ids, "mask": mask, "target": target, "weight": weight}
            if self.kind == "decoder":
                b["index"] = index
            return b
        seqs = [r[0] + r[1] for r in rows]
        ids, mask = PT.pad_rows(seqs, self.pad_id, length=length, batch_size=batch_size)
        labels = np.full_like(ids, L.IGNORE_INDEX)
        for i, r in enumerate(rows):
            labels[i, len(r[0]):len(r[0]) + len(r[1])] = r[1]
        k = label_k if label_k is not None else self._label_k(rows, length)
        pos, valid = PT.label_positions(labels, buckets=(k,))
        return {"ids": ids, "mask": mask, "labels": labels, "label_positions": pos,
                "label_valid": valid}

    def _row_len(self, r: tuple) -> int:
        return len(r[0]) + (len(r[1]) if self.labels is None else 0)

    def _calls(self, examples: list[tuple], batch_size: int, epoch: int, start: int = 0,
               budget: int | None = None):
        """Yield ``(stacked batches, active [S] bool, next batch index)`` for one epoch.

        The epoch's batches are grouped into calls of ``steps_per_call`` exactly as in an
        uninterrupted run (same groups, same padded length), whatever ``start`` is: batches
        before ``start`` (already trained before a resume) and past ``budget`` (``max_steps``)
        ride along as inactive steps, so a resumed run computes bit-identical updates.
        """
        order = np.random.default_rng([self.seed, epoch]).permutation(len(examples))
        batches = [[examples[j] for j in order[i:i + batch_size]]
                   for i in range(0, len(order), batch_size)]
        s = self.steps_per_call
        left = math.inf if budget is None else budget
        for i in range(0, len(batches), s):
            if i + s <= start:
                continue
            if left <= 0:
                return
            group = batches[i:i + s]
            length = PT.bucket(max(self._row_len(r) for g in group for r in g),
                               self.length_buckets)
            k = None if self.labels is not None else self._label_k(
                [r for g in group for r in g], length)
            active = np.zeros(s, bool)
            for j in range(len(group)):
                if i + j >= start and left > 0:
                    active[j], left = True, left - 1
            if not active.any():
                return
            rows = -(-batch_size // S.data_size(self.mesh)) * S.data_size(self.mesh)
            stacked = [dict(self._batch(g, rows, length, k), active=np.asarray(a))
                       for a, g in zip(active, group)]
            while len(stacked) < s:  # keep the step axis fixed: inactive steps apply nothing
                stacked.append(dict(self._batch([], rows, length, k),
                                    active=np.asarray(False)))
            yield PT.stack_batches(stacked), active, i + int(np.flatnonzero(active)[-1]) + 1

    # ------------------------------------------------------------------ training
    def _optimizer(self, total_steps: int):
        return PT.make_optimizer(total_steps=total_steps, **self.opt_kwargs)

    def _fingerprint(self, batch_size: int, epochs: int, examples: list[tuple]) -> dict:
        # What a resumed run must share with the one that wrote the checkpoint to continue it
        # exactly: the model (config and a sample of its embedding table), the weights' dtype,
        # the tokenised training set (its order drives the batches) and the hyper-parameters.
        params = self.model.params
        table = params["embed"] if self.kind == "decoder" else params["embeddings"]["word"]
        sample = np.asarray(table[::997], np.float32)
        model = hashlib.sha256(repr(self.model.config).encode() + sample.tobytes()).hexdigest()
        data = hashlib.sha256(json.dumps(examples, default=int).encode()).hexdigest()
        return {"n_tokens": self.n_tokens, "hidden": self.hidden, "labels": self.labels,
                "template": self.template, "chat": self.chat, "seed": self.seed,
                "pez": self.pez, "batch_size": batch_size, "epochs": epochs,
                "steps_per_call": self.steps_per_call, "dtype": self.dtype,
                "model": model[:16], "data": f"{len(examples)} examples, sha256 {data[:16]}",
                **{k: v for k, v in self.opt_kwargs.items()}}

    def _fit_data(self, texts, targets, val):
        xs, ys = _texts(texts, "training set"), _texts(targets, "list of targets")
        if len(xs) != len(ys):
            raise PromptTuningError(f"PromptTuner: expected as many targets as texts, got "
                                    f"{len(xs)} texts and {len(ys)} targets.")
        examples, val_examples = self._examples(xs, ys), None
        if val is not None:
            if isinstance(val, (str, bytes)) or not isinstance(val, Sequence) or len(val) != 2:
                raise PromptTuningError("PromptTuner.fit: expected val=(texts, targets), got "
                                        f"{type(val).__name__}"
                                        + (f" of length {len(val)}" if hasattr(val, "__len__")
                                           else "") + ".")
            vx, vy = _texts(val[0], "validation set"), _texts(val[1], "validation targets")
            if len(vx) != len(vy):
                raise PromptTuningError(f"PromptTuner: validation has {len(vx)} texts and "
                                        f"{len(vy)} targets.")
            val_examples = self._examples(vx, vy)
        return examples, val_examples

    def fit(self, texts: Any, targets: Any, val: tuple[Any, Any] | None = None, *,
            epochs: int = 3, batch_size: int = 8, patience: int | None = None,
            eval_every: int | None = None, max_steps: int | None = None,
            checkpoint_dir: str | Path | None = None, resume: bool = True,
            restore_best: bool = True,
            callback: Callable[[dict], Any] | None = None) -> PromptTuner:
        """Train the soft prompt.

        Args:
            texts: inputs (TextTensor or list of str).
            targets: labels (classification) or target texts (generation), same length.
            val: optional ``(texts, targets)`` evaluated after every epoch (and every
                ``eval_every`` steps); drives early stopping and ``restore_best``.
            epochs: passes over the data (the learning-rate schedule spans all of them).
            batch_size: examples per optimizer step (the last batch is padded with zero-weight
                rows, so the shape never changes).
            patience: stop after this many evaluations without improvement of the validation
                accuracy (loss in generation mode); needs ``val``.
            eval_every: also evaluate every this many optimizer steps (rounded up to whole
                calls of ``steps_per_call``).
            max_steps: stop after exactly this many optimizer steps in total (counting the
                steps of a resumed checkpoint); the schedule still spans ``epochs``, so a run
                stopped by ``max_steps`` and resumed without it ends as an uninterrupted run.
            checkpoint_dir: write ``checkpoint.safetensors`` there (atomically) after every
                epoch and when training stops early; it records the position inside the epoch,
                so with ``resume=True`` training continues at the next unseen batch, giving the
                same result as an uninterrupted run.
            resume: see ``checkpoint_dir``.
            restore_best: end with the prompt of the best evaluation (needs ``val``).
            callback: called with each new ``history`` entry; a truthy return stops training
                (e.g. ``lambda h: h["val_accuracy"] >= 0.9``).

        Returns:
            ``self``.

        Raises:
            PromptTuningError: empty data, unknown labels, too-long inputs, ``n_tokens=0``,
                non-positive ``epochs`` / ``batch_size`` / ``max_steps`` / ``eval_every`` /
                ``patience``, ``patience`` without ``val``, ``val`` not a pair.
            NonFiniteLossError: a step gave NaN/inf; the tuner keeps the last good prompt.
            CheckpointError: the checkpoint to resume from is corrupted, inconsistent, or from
                another setup (model, dtype, training data, hyper-parameters).

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> t = PromptTuner(labels=["no", "yes"])                     # doctest: +SKIP
            >>> t.fit(["is it?", "it is"], ["no", "yes"], epochs=1).history[-1]["epoch"]  # doctest: +SKIP
            1
        """
        if self.n_tokens == 0:
            raise PromptTuningError("PromptTuner: n_tokens=0 has nothing to train; use it for "
                                    "zero-shot evaluation only.")
        for name, value in (("epochs", epochs), ("batch_size", batch_size),
                            ("max_steps", max_steps), ("eval_every", eval_every),
                            ("patience", patience)):
            if value is not None and (not _is_int(value) or value < 1):
                raise PromptTuningError(f"PromptTuner.fit: expected {name} to be a positive "
                                        f"integer, got {value!r}.")
        epochs, batch_size = int(epochs), int(batch_size)
        max_steps = None if max_steps is None else int(max_steps)
        if patience is not None and val is None:
            raise PromptTuningError("PromptTuner.fit: patience counts validation evaluations "
                                    "without improvement; pass val=(texts, targets) with it.")
        examples, val_examples = self._fit_data(texts, targets, val)
        steps_per_epoch = math.ceil(len(examples) / batch_size)
        total_steps = steps_per_epoch * epochs
        if total_steps > _MAX_STEPS:
            raise PromptTuningError(
                f"PromptTuner.fit: epochs={epochs} x {steps_per_epoch} steps per epoch is "
                f"{total_steps} steps, more than the optimizer's step counter holds "
                f"({_MAX_STEPS}); use fewer epochs (max_steps does not shorten the schedule).")
        stop_at = total_steps if max_steps is None else min(max_steps, total_steps)
        optimizer = self._optimizer(total_steps)
        sig = (total_steps, tuple(sorted(self.opt_kwargs.items())))
        if self._train_step is None or self._compiled_for != sig:
            self._train_step = PT.make_train_step(self._loss_fn(), optimizer, mesh=self.mesh,
                                                  shard_frozen=self.shard_frozen)
            self._compiled_for = sig
        fingerprint = self._fingerprint(batch_size, epochs, examples)
        ckpt = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
        run = _Run(prompt=self.prompt, opt_state=optimizer.init(self.prompt))
        if ckpt is not None and resume and ckpt.exists():
            self._restore(ckpt, run, fingerprint, steps_per_epoch, epochs)
        else:
            self.history, self.step_losses = [], []
        from tqdm.auto import tqdm

        bar = tqdm(total=stop_at, initial=min(run.global_step, stop_at),
                   disable=not self.progress, desc="prompt tuning", unit="step", leave=True)
        t0 = time.perf_counter()
        stopped = False
        try:
            while run.epoch < epochs and run.global_step < stop_at and not stopped:
                for batches, active, nxt in self._calls(examples, batch_size, run.epoch,
                                                        run.batch, stop_at - run.global_step):
                    self._train_call(run, batches, active, bar)
                    run.batch = nxt
                    epoch_done = nxt >= steps_per_epoch
                    if (eval_every and run.since_eval >= eval_every and not epoch_done
                            and run.global_step < stop_at):
                        stopped = self._eval_point(run, val_examples, steps_per_epoch, t0, bar,
                                                   patience, callback)
                        if stopped:
                            break
                if run.batch >= steps_per_epoch:  # the epoch is complete
                    stopped = self._eval_point(run, val_examples, steps_per_epoch, t0, bar,
                                               patience, callback) or stopped
                    run.epoch, run.batch = run.epoch + 1, 0
                    if ckpt is not None:
                        self._save(ckpt, run, fingerprint)
                else:  # stopped inside the epoch (max_steps, patience, callback)
                    if ckpt is not None:  # the position is saved before the final evaluation
                        self._save(ckpt, run, fingerprint)
                    if run.since_eval:  # the last entry reaches the callback too
                        self._eval_point(run, val_examples, steps_per_epoch, t0, bar, None,
                                         callback)
                    break
            self.prompt = run.prompt
            restored = restore_best and run.best[1] is not None
            if restored:
                self.prompt = jnp.asarray(run.best[1], jnp.float32)
            bar.set_postfix_str(self._summary(run, restored), refresh=True)
        finally:
            bar.close()
        return self

    def _train_call(self, run: _Run, batches: dict, active: np.ndarray, bar) -> None:
        """One jitted call of ``steps_per_call`` steps; bookkeeping for the active ones."""
        try:
            run.prompt, run.opt_state, m = self._train_step(run.prompt, run.opt_state, batches,
                                                            self.frozen)
        except PT.NonFiniteLossError as err:
            self.prompt = err.params
            raise
        losses = np.asarray(m["loss"])[active]
        n = int(active.sum())
        self.step_losses += [float(v) for v in losses]
        run.global_step += n
        run.since_eval += n
        run.run_loss += float(losses.sum())
        if "accuracy" in m:
            run.run_acc += float(np.asarray(m["accuracy"])[active].sum())
        run.run_n += n
        bar.update(n)
        bar.set_postfix(self._postfix(run), refresh=False)

    def _postfix(self, run: _Run) -> dict:
        post = {"loss": f"{run.run_loss / max(run.run_n, 1):.4f}"}
        if self.labels is not None:
            post["acc"] = f"{run.run_acc / max(run.run_n, 1):.3f}"
        last = self.history[-1] if self.history else None
        if last is not None and last.get("val_loss") is not None:
            key = "val_acc" if self.labels is not None else "val_loss"
            value = last["val_accuracy"] if self.labels is not None else last["val_loss"]
            post[f"{key}@{last['step']}"] = f"{value:.3f}"
        return post

    def _summary(self, run: _Run, restored: bool) -> str:
        text = f"done: {run.global_step} steps"
        if run.best[1] is not None:
            entry = self.history[run.best[2]]
            metric = "val_accuracy" if self.labels is not None else "val_loss"
            text += f", best {metric} {entry[metric]:.4f} at step {entry['step']}"
            text += " (restored)" if restored else " (not restored: ended with the last prompt)"
        return text

    def _eval_point(self, run: _Run, val_examples, steps_per_epoch: int, t0: float, bar,
                    patience: int | None, callback) -> bool:
        """The one evaluation path of :meth:`fit`: a history entry (train averages since the
        previous one, validation metrics), the best prompt, patience; returns "stop"."""
        if not run.run_n and (val_examples is None or (
                self.history and self.history[-1]["step"] == run.global_step)):
            return False
        self.prompt = run.prompt
        entry = {"epoch": round(run.global_step / steps_per_epoch, 4),
                 "step": int(run.global_step),
                 "train_loss": run.run_loss / max(run.run_n, 1),
                 "train_accuracy": (run.run_acc / max(run.run_n, 1)) if self.labels else None,
                 "val_loss": None, "val_accuracy": None,
                 "seconds": round(time.perf_counter() - t0, 3)}
        if val_examples is not None:
            metrics = self._evaluate_examples(val_examples, run.prompt)
            entry["val_loss"], entry["val_accuracy"] = metrics["loss"], metrics.get("accuracy")
            score = metrics["accuracy"] if self.labels else -metrics["loss"]
            if score > run.best[0]:
                run.best = (score, np.asarray(run.prompt), len(self.history))
                run.bad_evals = 0
            else:
                run.bad_evals += 1
        self.history.append(entry)
        run.since_eval, run.run_loss, run.run_acc, run.run_n = 0, 0.0, 0.0, 0
        bar.set_postfix(self._postfix(run), refresh=True)
        stop = patience is not None and run.bad_evals >= patience
        if callback is not None and callback(entry):
            stop = True
        return stop

    # ------------------------------------------------------------------ checkpoints
    def _save(self, path, run: _Run, fingerprint) -> None:
        leaves = jax.tree.leaves(run.opt_state)
        arrays = {"prompt": np.asarray(run.prompt)}
        arrays.update({f"opt/{i:04d}": np.asarray(x) for i, x in enumerate(leaves)})
        if run.best[1] is not None:
            arrays["best_prompt"] = np.asarray(run.best[1])
        state = {"epoch": run.epoch, "batch": run.batch, "global_step": run.global_step,
                 "history": self.history, "step_losses": self.step_losses,
                 "fingerprint": fingerprint,
                 "best_score": run.best[0] if run.best[1] is not None else None,
                 "best_index": run.best[2], "num_opt_leaves": len(leaves),
                 "bad_evals": run.bad_evals, "since_eval": run.since_eval,
                 "running": [run.run_loss, run.run_acc, run.run_n]}
        save_checkpoint(path, arrays, state)

    def _restore(self, path, run: _Run, fingerprint, steps_per_epoch: int, epochs: int) -> None:
        arrays, state = load_checkpoint(path)
        want = json_round(fingerprint)
        got = state.get("fingerprint")
        if got != want:
            diff = (sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
                    if isinstance(got, dict) else ["fingerprint"])
            raise CheckpointError(
                f"checkpoint {path} was written by a different setup (differs in "
                f"{', '.join(diff)}: checkpoint "
                f"{ {k: got.get(k) for k in diff} if isinstance(got, dict) else got}, now "
                f"{ {k: want.get(k) for k in diff} }). Use another checkpoint_dir or resume=False.")
        leaves, treedef = jax.tree.flatten(run.opt_state)
        try:
            if state.get("num_opt_leaves") != len(leaves):
                raise ValueError(f"its optimizer state has {state.get('num_opt_leaves')} arrays, "
                                 f"expected {len(leaves)}")
            restored = []
            for i, t in enumerate(leaves):
                a = arrays[f"opt/{i:04d}"]
                if a.size != np.size(t) or a.ndim > max(np.ndim(t), 1):
                    raise ValueError(f"optimizer array {i} has shape {a.shape}, expected "
                                     f"{np.shape(t)}")
                # (scalars come back as [1]: the writer's ascontiguousarray makes them 1-d; a
                # [1] step count would re-trace the train step after every resume)
                restored.append(jnp.asarray(a.reshape(np.shape(t)), dtype=np.asarray(t).dtype))
            prompt = arrays["prompt"]
            if prompt.shape != tuple(run.prompt.shape):
                raise ValueError(f"its prompt has shape {prompt.shape}, expected "
                                 f"{tuple(run.prompt.shape)}")
            epoch, batch = int(state["epoch"]), int(state.get("batch", 0))
            global_step = int(state["global_step"])
            # Every batch before (epoch, batch) was trained: the position and the step count
            # must agree, or resuming would skip or repeat data.
            if not (0 <= epoch <= epochs and 0 <= batch < steps_per_epoch
                    and global_step == epoch * steps_per_epoch + batch):
                raise ValueError(f"position epoch {epoch}, batch {batch}, step {global_step} is "
                                 f"impossible with {steps_per_epoch} steps per epoch")
            bad_evals, since_eval = int(state.get("bad_evals", 0)), int(state.get("since_eval", 0))
            run_loss, run_acc, run_n = state.get("running", [0.0, 0.0, 0])
            run_loss, run_acc, run_n = float(run_loss), float(run_acc), int(run_n)
            history, step_losses = list(state["history"]), [float(v) for v in state["step_losses"]]
            if len(step_losses) != global_step:
                raise ValueError(f"it holds {len(step_losses)} step losses for {global_step} "
                                 "steps")
            best = run.best
            if arrays.get("best_prompt") is not None:
                best = (float(state["best_score"]), arrays["best_prompt"],
                        int(state["best_index"]))
                if best[1].shape != prompt.shape or not 0 <= best[2] < len(history):
                    raise ValueError("its best prompt does not match its history")
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {path} holds an inconsistent training state "
                                  f"({type(exc).__name__}: {exc}). Delete it or resume from "
                                  "another checkpoint.") from exc
        run.prompt, run.opt_state = jnp.asarray(prompt), jax.tree.unflatten(treedef, restored)
        run.epoch, run.batch, run.global_step = epoch, batch, global_step
        run.bad_evals, run.since_eval = bad_evals, since_eval
        run.run_loss, run.run_acc, run.run_n = run_loss, run_acc, run_n
        self.history, self.step_losses = history, step_losses
        run.best = best

    # ------------------------------------------------------------------ inference
    def _eval_batches(self, examples, batch_size=_EVAL_BATCH):
        order = sorted(range(len(examples)), key=lambda i: self._row_len(examples[i]))
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            rows = [examples[j] for j in idx]
            length = PT.bucket(max(self._row_len(r) for r in rows), self.length_buckets)
            yield idx, self._batch(rows, batch_size, length)

    def _label_logits(self, examples, prompt) -> np.ndarray:
        out = np.zeros((len(examples), len(self.labels)), np.float32)
        frozen = self.frozen
        for idx, b in self._eval_batches(examples):
            b = {k: v for k, v in b.items() if k not in ("target", "weight")}
            logits = np.asarray(self._logits_fn(prompt, frozen, b))
            out[idx] = logits[:len(idx)]
        return out

    def _evaluate_examples(self, examples, prompt=None) -> dict:
        prompt = self.prompt if prompt is None else prompt
        if self.labels is not None:
            logits = self._label_logits(examples, prompt)
            target = np.array([e[2] for e in examples])
            logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
            return {"loss": float(-logp[np.arange(len(target)), target].mean()),
                    "accuracy": float((logits.argmax(1) == target).mean())}
        total, count = 0.0, 0.0
        for _, b in self._eval_batches(examples, 8):
            loss, aux = self._lm_loss_fn(prompt, self.frozen, b)
            total += float(loss) * float(aux["tokens"])
            count += float(aux["tokens"])
        return {"loss": total / max(count, 1.0)}

    def _prompt_for(self, mode: str, prompt: Any = None) -> tuple[jax.Array, str]:
        # The prompt the model sees in `mode` (the PEZ projection of `prompt`, default the
        # tuner's own, for a PEZ tuner), and the text put before the template.
        if mode == "soft":
            prompt = self.prompt if prompt is None else prompt
            return (L.straight_through_project(prompt, self._table) if self.pez
                    else prompt), ""
        if mode == "hard":
            return jnp.zeros((0, self.hidden), jnp.float32), self.hard_prompt()
        if mode == "none":
            return jnp.zeros((0, self.hidden), jnp.float32), ""
        raise PromptTuningError(f"PromptTuner: expected prompt 'soft', 'hard' or 'none', got "
                                f"{mode!r}.")

    def evaluate(self, texts: Any, targets: Any, *, prompt: str = "soft") -> dict:
        """Loss and accuracy (classification) on a labelled set.

        Args:
            texts, targets: the data.
            prompt: ``"soft"`` (the trained prompt), ``"hard"`` (the recovered hard prompt as
                text in front of the template: what any backend would see) or ``"none"``
                (zero-shot with the template only).

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> PromptTuner(n_tokens=0, labels=["no", "yes"]).evaluate(["Is water wet?"], ["yes"])  # doctest: +SKIP
            {'loss': 0.61, 'accuracy': 1.0}
        """
        xs, ys = _texts(texts, "evaluation set"), _texts(targets, "list of targets")
        p, prefix = self._prompt_for(prompt)
        examples = self._examples(xs, ys, prefix=prefix, p=p.shape[0])
        return self._evaluate_examples(examples, p)

    def predict(self, texts: Any, *, prompt: str = "soft",
                soft_prompt: Any = None) -> TextTensor:
        """Labels (classification) or generated texts for ``texts``, as a TextTensor of the
        input's shape; classification adds ``metadata["confidence"]`` (softmax over labels).

        Generation runs greedily on the model's shared decode engine (the one ``LocalBackend``
        uses) with the prompt in front, ``max_new_tokens`` per text. ``soft_prompt`` replaces
        the tuner's continuous prompt (``SoftPromptLayer`` passes its parameter); with
        ``pez=True`` it is projected onto the vocabulary as the trained prompt is.

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> t = PromptTuner(n_tokens=0, labels=["negative", "positive"])  # doctest: +SKIP
            >>> t.predict(["I hated it"]).tolist()                              # doctest: +SKIP
            ['negative']
        """
        shape = _shape(texts)
        xs = _texts(texts, "list of texts")
        p, prefix = self._prompt_for(prompt)
        if soft_prompt is not None:  # an explicit [P, H] array (SoftPromptLayer's parameter)
            p = self._prompt_for("soft", jnp.asarray(soft_prompt, jnp.float32))[0]
        if self.labels is not None:
            logits = self._label_logits(self._examples(xs, None, prefix, p.shape[0]), p)
            probs = np.exp(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True))
            out = [self.labels[i] for i in logits.argmax(1)]
            conf = probs.max(1).reshape(shape)
            return TextTensor(np.array(out, dtype=object).reshape(shape).tolist() if shape
                              else out[0], metadata={"confidence": conf}, template=False)
        gens = self._generate([self._prefix_ids(x, prefix) for x in xs], p)
        arr = np.array(gens, dtype=object).reshape(shape)
        return TextTensor(arr.tolist() if shape else gens[0], template=False)

    def _generate(self, rows: list[list[int]], prompt) -> list[str]:
        # One decode engine for everything: the model's shared one (see LocalBackend).
        from langtorch.models import engine_for

        engine = getattr(self.model, "engine", None) or engine_for(self.model)
        prefix = None if prompt.shape[0] == 0 else np.asarray(prompt, np.float32)
        out = engine.generate(rows, max_tokens=self.max_new_tokens, temperature=0.0,
                              prefix=prefix)
        return [r.text for r in out]

    # ------------------------------------------------------------------ hard prompts, adapters
    def hard_prompt_ids(self) -> list[int]:
        """Ids of the vocabulary tokens nearest to each virtual token (PEZ projection).

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> len(PromptTuner(n_tokens=5, labels=["a", "b"]).hard_prompt_ids())  # doctest: +SKIP
            5
        """
        if self.n_tokens == 0:
            return []
        return [int(i) for i in np.asarray(PT.nearest_tokens(self.prompt, self._table))]

    def hard_prompt(self) -> str:
        """The recovered hard prompt: the nearest vocabulary tokens decoded to text.

        Train with ``pez=True`` for a hard prompt that works as well as the model saw it during
        training; a plain soft prompt's projection is only an approximation.

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> isinstance(PromptTuner(n_tokens=3, labels=["a", "b"]).hard_prompt(), str)  # doctest: +SKIP
            True
        """
        return self._decode(self.hard_prompt_ids())

    def hard_template(self, separator: str | None = None) -> TextTensor:
        """A template TextTensor (one ``{}`` placeholder) = hard prompt + ``separator`` +
        ``template``, usable with any backend: ``tuner.hard_template() + texts`` or
        ``lt.TLayer(...)``. ``evaluate(prompt="hard")`` scores exactly this text.

        Args:
            separator: text between the hard prompt and the template (default
                :attr:`HARD_SEPARATOR`, a newline); nothing is added when there is no hard
                prompt (``n_tokens=0``). ``evaluate(prompt="hard")`` joins with
                :attr:`HARD_SEPARATOR` (set it on the tuner to score another separator).

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> t = PromptTuner(n_tokens=0, labels=["a", "b"], template="Q: {}\\nA:")  # doctest: +SKIP
            >>> t.hard_template().item()                                               # doctest: +SKIP
            'Q: {}\\nA:'
        """
        if separator is not None and not isinstance(separator, str):
            raise PromptTuningError(f"PromptTuner.hard_template: expected separator to be a "
                                    f"str, got {type(separator).__name__}.")
        sep = self.HARD_SEPARATOR if separator is None else separator
        hard = self.hard_prompt()
        if not hard:
            return TextTensor(self.template)
        hard = (hard + sep).replace("{", "{{").replace("}", "}}")
        return TextTensor(hard + self.template)

    def save_adapter(self, directory: str | Path) -> Path:
        """Write the prompt as a PEFT ``PROMPT_TUNING`` adapter (``adapter_config.json`` +
        ``adapter_model.safetensors`` with ``prompt_embeddings``): ``PeftModel.from_pretrained``
        loads it on the Hugging Face model of the same weights.

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> PromptTuner(n_tokens=4, labels=["a", "b"]).save_adapter("/tmp/adapter")  # doctest: +SKIP
            PosixPath('/tmp/adapter')
        """
        if self.n_tokens == 0:
            raise PromptTuningError("PromptTuner: n_tokens=0: there is no prompt to save.")
        cfg = self.model.config
        task = "FEATURE_EXTRACTION" if self.kind == "encoder" else "CAUSAL_LM"
        return save_peft_adapter(
            directory, np.asarray(self.prompt), task_type=task,
            base_model=getattr(self.model, "name", None),
            num_layers=int(cfg.num_layers), num_heads=int(cfg.num_heads),
            init_text=self.init_text if self.init == "text" else None)

    def load_adapter(self, directory: str | Path) -> PromptTuner:
        """Load a PEFT ``PROMPT_TUNING`` adapter (ours or PEFT's) as the current prompt.

        Raises:
            AdapterError: missing/corrupted files, another PEFT type, or a width that does not
                match the model.

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> PromptTuner(labels=["a", "b"]).load_adapter("/tmp/adapter").n_tokens  # doctest: +SKIP
            4
        """
        prompt, config = load_peft_adapter(directory)
        if prompt.shape[1] != self.hidden:
            raise AdapterError(f"adapter {directory}: prompt width {prompt.shape[1]} does not "
                               f"match the model's embedding width {self.hidden}; it was "
                               f"trained for another model ({config.get('base_model_name_or_path')}).")
        self.prompt = jnp.asarray(prompt, jnp.float32)
        self.n_tokens = int(prompt.shape[0])
        return self

    # ------------------------------------------------------------------ reporting
    def plot(self, path: str | Path) -> Path:
        """Save a PNG with the training loss per step and the validation accuracy/loss.

        Needs matplotlib, the ``plot`` extra: ``pip install "langtorch-jax[plot]"``.

        Raises:
            ImportError: matplotlib is not installed (the message names the extra).

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> tuner = PromptTuner(labels=["a", "b"])            # doctest: +SKIP
            >>> tuner.plot("loss.png")                              # doctest: +SKIP
            PosixPath('loss.png')
        """
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError(
                "PromptTuner.plot needs matplotlib, which is not installed; install the "
                'plot extra: pip install "langtorch-jax[plot]"') from exc
        path = Path(path)
        fig, ax = plt.subplots(figsize=(7, 4))
        losses = np.asarray(self.step_losses, float)
        if losses.size:
            ax.plot(np.arange(1, losses.size + 1), losses, alpha=0.35, label="train loss (step)")
            k = max(1, losses.size // 20)
            smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
            ax.plot(np.arange(k, losses.size + 1), smooth, label=f"train loss ({k}-step mean)")
        vsteps = [h["step"] for h in self.history if h.get("val_loss") is not None]
        if vsteps:
            ax.plot(vsteps, [h["val_loss"] for h in self.history if h.get("val_loss") is not None],
                    "o-", color="tab:red", label="val loss")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss")
        if self.labels and vsteps:
            ax2 = ax.twinx()
            ax2.plot(vsteps, [h["val_accuracy"] for h in self.history
                              if h.get("val_loss") is not None], "s--", color="tab:green",
                     label="val accuracy")
            ax2.set_ylabel("accuracy")
            ax2.set_ylim(0, 1.05)
            ax2.legend(loc="lower right", fontsize=8)
        ax.legend(loc="lower left", fontsize=8)
        ax.set_title(f"prompt tuning, P={self.n_tokens}")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def as_module(self):
        """This tuner's soft prompt as a :class:`~langtorch.tuning.SoftPromptLayer` (a
        ``TLayer``) for ``TChain``s.

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> layer = PromptTuner(labels=["a", "b"]).as_module()   # doctest: +SKIP
        """
        from langtorch.tuning._layer import SoftPromptLayer

        return SoftPromptLayer(self)

    def __repr__(self) -> str:
        mode = "generation" if self.labels is None else f"labels={self.labels}"
        return (f"PromptTuner({getattr(self.model, 'name', type(self.model).__name__)}, "
                f"n_tokens={self.n_tokens}, {mode})")


def json_round(obj: Any) -> Any:
    """``obj`` as it comes back from JSON (tuples become lists)."""
    import json

    return json.loads(json.dumps(obj))
