"""``PromptTuner``: soft-prompt training on a local model (any loaded decoder or encoder; SmolLM2
by default) with JAX + optax.

The public class composes the tuner's jobs, each in its own module:

* ``_setup`` — the checked options, the frozen weights, label data, the initial prompt, the loss;
* ``_data`` — texts -> token rows -> fixed-shape padded batches -> jitted calls of an epoch;
* ``_fit`` — the training loop (evaluation points, early stopping, progress bar);
* ``_checkpoint`` — the run's state, its fingerprint, the checked save and resume;
* ``_evaluation`` — the prompt of each mode, label logits, loss/accuracy, classification;
* ``_adapters`` — hard prompts and PEFT adapters; ``_plot`` — the training curve.

Generation goes through the model's shared decode engine (:meth:`PromptTuner._generate`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.core import user_path
from langtorch.functional import prompt_tuning as PT
from langtorch.functional import sharding as S
from langtorch.models import resolve_model
from langtorch.tensor import TextTensor
from langtorch.tuning import _adapters, _evaluation, _fit, _plot, _setup
from langtorch.tuning import _checkpoint as C
from langtorch.tuning import _data as D
from langtorch.tuning._errors import PromptTuningError

__all__ = ["PromptTuner"]


class PromptTuner:
    """Train a soft prompt (``n_tokens`` virtual tokens) for a frozen local model.

    **Classification** (``labels`` given): each text is put into ``template`` and each label is
    scored by the log-probability of its *label word* after it (``" positive"``, …; with
    ``chat=True`` the text is the user turn of the chat template and the label word starts the
    assistant's answer): the sum (``label_reduction="mean"``: the mean) of the word's token
    log-probabilities, teacher-forced, so a word of several tokens (``"billing"`` is ``b`` +
    ``illing`` in SmolLM2's vocabulary) is scored whole. When every label word is one token,
    one state per row is read and only those ``K`` logits are computed. The loss is the
    cross-entropy of the softmax over the label scores. **Generation**
    (``labels=None``): targets are texts, trained with the masked causal-LM loss on the target
    tokens. With a MiniLM model the prompt is inserted after ``[CLS]`` and trained so that the
    pooled sentence embedding is closest (cosine, ``scale``) to the embedding of its label.

    The numeric work is :mod:`langtorch.functional.prompt_tuning` (jitted multi-step scan,
    AdamW + global-norm clipping + warm-up/cosine schedule, NaN guard) over
    :mod:`langtorch.functional.losses`; shapes are bucketed so a run compiles a handful of
    times and never again after warm-up.

    Args:
        backend: a local model as :func:`langtorch.models.resolve_model` accepts it: a
            ``LocalBackend``, an ``lt.nn.LLM`` on one, a :class:`langtorch.models.CausalLM`
            or ``Encoder`` (any model :func:`langtorch.models.load` reads, or the path of
            one), a ``langtorch.models.SmolLM2`` / ``MiniLM`` (or any object with ``params``,
            ``config`` and a tokenizer), ``"smollm2"`` / ``"minilm"``; default: the
            process-wide SmolLM2. The soft prompt lives in the model's embedding space; for
            Gemma the decoder scales it by ``sqrt(hidden)`` with the token embeddings. Anything else
            raises :class:`PromptTuningError` listing what is accepted.
        n_tokens: number of virtual tokens ``P`` (0: no soft prompt, for zero-shot baselines).
        labels: the label set for classification (strings), or None for generation.
        template: a template with one ``{}`` placeholder for the input text; default
            ``"Input: {}\\nLabel:"`` (decoder classification), ``"{}"`` otherwise.
        label_words: the word the model should produce for each label; default
            ``" " + label`` (``label`` with ``chat=True``, where the answer starts a new turn
            without a space). Any number of tokens; the words must tokenize differently.
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
        label_reduction: how a multi-token label word's token log-probabilities make its score:
            ``"sum"`` (the word's log-probability) or ``"mean"`` (per token, which does not
            favour shorter words). Single-token words score the same either way.

    Attributes:
        prompt: the current soft prompt, a ``[P, H]`` float32 jax array.
        history: one dict per evaluation (``epoch``, ``step``, ``train_loss``,
            ``train_accuracy``, ``val_loss``, ``val_accuracy``, ``seconds``).
        step_losses: the training loss of every optimizer step.
        label_tokens: the token ids of each label word (decoder classification), else None.

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
                 mesh: Any = None, shard_frozen: bool = False, label_reduction: str = "sum"):
        self.mesh = S.resolve_mesh(mesh)
        self.shard_frozen = bool(shard_frozen)
        if self.shard_frozen and self.mesh is None:
            raise PromptTuningError("PromptTuner: shard_frozen=True needs mesh= (a Mesh with a "
                                    "'model' axis to split the frozen weights along).")
        try:
            self.model = resolve_model(backend, owner="PromptTuner")
        except TypeError as exc:  # PromptTuner's bad input is a PromptTuningError (ValueError)
            raise PromptTuningError(str(exc)) from exc
        self.kind = "encoder" if "embeddings" in self.model.params else "decoder"
        self.labels = None if labels is None else [str(x) for x in labels]
        _setup.check_options(n_tokens=n_tokens, labels=self.labels, kind=self.kind,
                             steps_per_call=steps_per_call, dtype=dtype,
                             label_reduction=label_reduction)
        self.n_tokens = int(n_tokens)
        self.template = _setup.template_for(template, self.labels, self.kind, chat)
        self.chat, self.system = bool(chat), system
        self.init, self.init_text, self.pez, self.seed = init, init_text, bool(pez), int(seed)
        self.opt_kwargs = dict(learning_rate=learning_rate, weight_decay=weight_decay,
                               clip_norm=clip_norm, warmup_steps=warmup_steps, schedule=schedule)
        self.steps_per_call, self.length_buckets = int(steps_per_call), tuple(length_buckets)
        self.scale, self.max_new_tokens, self.progress = float(scale), int(max_new_tokens), progress
        self.dtype = dtype
        self._params = _setup.frozen_weights(self.model.params, dtype, self.mesh, shard_frozen)
        self._table = (self._params["embed"] if self.kind == "decoder"
                       else self._params["embeddings"]["word"])
        self.context = int(self.model.config.max_positions)
        self.pad_id = (int(getattr(self.model, "pad_id", 0)) if self.kind == "decoder"
                       else int(self.model.tokenizer.token_to_id("[PAD]") or 0))
        self.hidden = int(self._table.shape[1])
        self.label_reduction = label_reduction
        data, self.label_words = _setup.label_data(self, label_words)
        if self.kind == "decoder" and data is not None:
            self._label_frozen, self.label_tokens = data
            self.label_ids = self._label_frozen["label_ids"]
        else:
            self._label_frozen = None if data is None else {"label_vectors": data}
            self.label_tokens, self.label_ids = None, data
        self.prompt = _setup.init_prompt(self)
        self.history: list[dict] = []
        self.step_losses: list[float] = []
        self._train_step: PT.TrainStep | None = None
        self._compiled_for: tuple | None = None

    # ------------------------------------------------------------------ the model
    @property
    def frozen(self) -> dict:
        """The frozen pytree handed to the losses (model weights and label data)."""
        return {"model": self._params, **(self._label_frozen or {})}

    @property
    def label_extra_tokens(self) -> int:
        """Tokens a row grows by when it is scored: a multi-token label's tokens after the
        first are fed to the model (teacher forcing); 0 with single-token labels."""
        return max(len(t) for t in self.label_tokens) - 1 if self.label_tokens else 0

    def _encode(self, text: str) -> list[int]:
        if self.kind == "encoder":
            return list(self.model.tokenizer.encode(text).ids)
        return list(self.model.encode(text))

    def _decode(self, ids: Sequence[int]) -> str:
        if self.kind == "encoder":
            return self.model.tokenizer.decode(list(ids))
        return self.model.decode(list(ids))

    def _prefix_ids(self, text: str, prefix: str = "") -> list[int]:
        # The ids the model reads for `text`: template, hard-prompt prefix, chat template.
        return D.prefix_ids(self, text, prefix)

    def _prompt_for(self, mode: str, prompt: Any = None) -> tuple[jax.Array, str]:
        # The prompt the model sees in `mode` and the text put before the template.
        return _evaluation.prompt_for(self, mode, prompt)

    def prompt_embeddings(self) -> np.ndarray:
        """The ``[n_tokens, H]`` float32 soft prompt the model reads in front of every input:
        the tuned prompt, projected onto the vocabulary's embeddings for a PEZ tuner. It is
        what ``LocalBackend(adapter=tuner)`` serves and what ``predict(prompt="soft")`` uses.

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> PromptTuner(n_tokens=4, labels=["a", "b"]).prompt_embeddings().shape  # doctest: +SKIP
            (4, 576)
        """
        return np.asarray(self._prompt_for("soft")[0], np.float32)

    # ------------------------------------------------------------------ training
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
        _fit.check_args(self, val, epochs=epochs, batch_size=batch_size, max_steps=max_steps,
                        eval_every=eval_every, patience=patience)
        rows, val_rows = D.fit_data(self, texts, targets, val)
        plan = _fit.plan(len(rows), epochs, batch_size, max_steps)
        optimizer = _fit.train_step(self, plan.total_steps)
        fingerprint = C.fingerprint(self, plan.batch_size, plan.epochs, rows)
        ckpt = (user_path(checkpoint_dir, what="PromptTuner.fit: checkpoint_dir")
                / C.CHECKPOINT_NAME if checkpoint_dir is not None else None)
        run = C.Run(prompt=self.prompt, opt_state=optimizer.init(self.prompt))
        if ckpt is not None and resume and ckpt.exists():
            self.history, self.step_losses = C.restore(ckpt, run, fingerprint,
                                                       plan.steps_per_epoch, plan.epochs)
        else:
            self.history, self.step_losses = [], []
        loop = _fit.FitLoop(self, run, plan, rows, val_rows, ckpt, fingerprint,
                            eval_every=eval_every, patience=patience, callback=callback)
        loop(restore_best)
        return self

    # ------------------------------------------------------------------ inference
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
        xs, ys = D.texts(texts, "evaluation set"), D.texts(targets, "list of targets")
        p, prefix = self._prompt_for(prompt)
        return _evaluation.evaluate_rows(self, D.examples(self, xs, ys, prefix, p.shape[0]), p)

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
        shape = D.shape(texts)
        xs = D.texts(texts, "list of texts")
        p, prefix = self._prompt_for(prompt)
        if soft_prompt is not None:  # an explicit [P, H] array (SoftPromptLayer's parameter)
            p = self._prompt_for("soft", jnp.asarray(soft_prompt, jnp.float32))[0]
        if self.labels is not None:
            return _evaluation.classify(self, xs, shape, p, prefix)
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
        return _adapters.hard_prompt_ids(self)

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
        return _adapters.hard_template(self, separator)

    def adapter_classifier(self) -> Any:
        """How :meth:`predict` classifies, as a
        :class:`~langtorch.models.AdapterClassifier` (labels, label words and their token ids,
        template, ``chat``, ``system``, ``label_reduction``, ``dtype``, ``pez``): what
        :meth:`save_adapter` records and what ``LocalBackend(adapter=tuner)`` and ``langtorch
        serve`` answer with. ``None`` in generation mode and for an encoder (MiniLM).

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> PromptTuner(n_tokens=4, labels=["a", "b"]).adapter_classifier().labels  # doctest: +SKIP
            ('a', 'b')
        """
        return _adapters.classifier(self)

    def save_adapter(self, directory: str | Path) -> Path:
        """Write the prompt as a PEFT ``PROMPT_TUNING`` adapter (``adapter_config.json`` +
        ``adapter_model.safetensors`` with ``prompt_embeddings``): ``PeftModel.from_pretrained``
        loads it on the Hugging Face model of the same weights. A decoder classifier (``labels``
        given) also records :meth:`adapter_classifier` in ``langtorch_adapter.json``, so a
        served adapter answers with :meth:`predict`'s label (docs/serving.md). ``directory``
        may use ``~`` and environment variables.

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> PromptTuner(n_tokens=4, labels=["a", "b"]).save_adapter("/tmp/adapter")  # doctest: +SKIP
            PosixPath('/tmp/adapter')
        """
        return _adapters.save_adapter(self, directory)

    def load_adapter(self, directory: str | Path) -> PromptTuner:
        """Load a PEFT ``PROMPT_TUNING`` adapter (ours or PEFT's) as the current prompt
        (``~`` and environment variables in ``directory`` are expanded). Only the prompt is
        loaded: the tuner keeps its own labels and template.

        Raises:
            AdapterError: missing/corrupted files, another PEFT type, or a width that does not
                match the model.

        Example:
            >>> from langtorch.tuning import PromptTuner
            >>> PromptTuner(labels=["a", "b"]).load_adapter("/tmp/adapter").n_tokens  # doctest: +SKIP
            4
        """
        _adapters.load_adapter(self, directory)
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
        return _plot.plot(self, path)

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
