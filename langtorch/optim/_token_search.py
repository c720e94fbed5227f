"""TokenSearch: gradient-guided discrete search over a ``{slot}`` of a prompt, on a local model.

The seed article's ``LearnablePromptLayer`` (a trainable ``{style}`` slot decoded to tokens),
done for real: GCG / AutoPrompt on the frozen local Llama, through the pure-JAX pieces of
:mod:`langtorch.functional.token_search`. The result is plain text, usable with any backend.

One ``step()`` runs ``steps_per_call`` GCG iterations on a batch of the examples given to the
constructor (``inputs=``, ``targets=``; all of them, or the next ``batch_size`` each step):

1. every example's full prompt (the template filled with the input and a sentinel for the slot,
   put into the chat template) is split at the slot into prefix and suffix token ids, the
   batch is left padded to fixed length and row buckets (one compiled program per bucket);
2. the gradient of the label-word loss w.r.t. the slot's one-hot tokens shortlists, per position,
   the ``top_k`` most promising allowed tokens; ``2 * num_candidates`` one-token swaps are
   sampled from the shortlists;
3. **re-tokenization filter** (as nanoGCG's ``filter_ids``): a candidate is kept only if the
   text the user will get - the prompt rendered with the decoded slot and tokenized whole -
   gives exactly ``prefix + candidate + suffix`` for every example of the batch. Byte-level BPE
   can merge tokens across the slot's edges or re-split the slot; scoring such a candidate
   would rate ids that no text produces;
4. ``num_candidates`` survivors are scored exactly in one fixed-shape batched call and the best
   replaces the slot if it lowers the loss (the slot never gets worse on the batch).

After the iterations the decoded slot is written into the parameter and scored *as text*
(every prompt re-rendered and re-tokenized whole, like :class:`langtorch.nn.LocalClassifier`
does): the history's ``score`` is that train accuracy, the number a user of the text gets.

Cost, in model forward passes of one example (the unit of ``max_forward_passes``), for a batch
of ``n`` examples: ``n`` for the gradient at the start of a step, ``n * num_candidates`` per
iteration, ``n`` per later iteration after a move (a fresh gradient), and ``n`` for the text
score; at most ``n * (steps_per_call * (num_candidates + 1) + 1)`` (:meth:`TokenSearch.estimate`).
A gradient pass counts once although its backward costs about two forwards more (the
convention of :class:`~langtorch.functional.token_search.TokenSearchResult`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from langtorch.errors import BudgetExceededError
from langtorch.functional import prompt_tuning as PT
from langtorch.functional import token_search as ts
from langtorch.functional.shapes import row_bucket
from langtorch.models import label_logits, resolve_model
from langtorch.optim._base import TextOptimizer
from langtorch.optim._data import Examples, split_step_args
from langtorch.optim._token_setup import (
    _INPUT,
    allowed_tokens,
    check_labels,
    encode_many,
    filler,
    first_tokens,
    parse_slot_template,
)

__all__ = ["TokenSearch"]

_SENTINEL = "\ue000slot\ue000"  # private-use characters: no template, input or tokenizer has them
_ROW_BUCKETS = (8,)  # rows of a scored batch: 8, then doubling (functional.shapes.row_bucket)
_OVERSAMPLE = 2  # candidates sampled per scored candidate (the filter drops some)


def _flat_texts(x: Any, what: str) -> list[str]:
    if isinstance(x, str):
        return [x]
    texts = getattr(x, "texts", None)
    flat = np.asarray(texts).reshape(-1).tolist() if texts is not None else list(x)
    return [str(s) for s in flat]


def _check_int(name: str, v: Any, lo: int) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
        raise ValueError(f"TokenSearch: expected an int {name} >= {lo}, got {v!r}.")
    return int(v)


class TokenSearch(TextOptimizer):
    """Gradient-guided discrete token search (GCG / AutoPrompt) over a slot of a prompt.

    The parameter holds the slot's text (e.g. ``TextParameter("neutral")``); ``template`` is the
    full prompt with the slot and ``{input}`` placeholders. The model classifies each filled
    prompt by its next-token logits for one label word per label (as
    :class:`langtorch.nn.LocalClassifier`); the search looks for the slot tokens that minimise
    the label cross-entropy on the training batch (plus, with ``fluency_weight > 0``, the model's
    own negative log-likelihood of the slot tokens, so that the result reads as text). See the
    module docstring for the algorithm and its cost.

    Allowed slot tokens: printable ASCII (no newline tokens unless ``allow_newlines``), not
    whitespace only, no special tokens, no token with ``{`` or ``}`` (they would break the
    template), and tokens whose text tokenizes back to themselves.

    Args:
        params: one 0-d TextParameter (or ``(name, parameter)`` pair), the slot text. With
            ``requires_grad=False`` a step changes nothing and costs nothing.
        model: a :class:`langtorch.models.CausalLM` (any decoder
            :func:`langtorch.models.load` reads, or the path of one), a
            :class:`langtorch.models.SmolLM2`, a ``LocalBackend``, or any object with
            ``params`` (decoder weights), ``config``, ``encode``, ``decode`` (and
            ``apply_chat_template`` when ``chat_template``); default: the process-wide SmolLM2.
        template: the prompt, with the slot placeholder and ``{input}``, e.g.
            ``"Review: {input}\\n{style}\\nAnswer:"``.
        slot: the slot's field name; default: the template's only field other than ``input``.
        labels: the label set (distinct strings); targets are these strings.
        inputs, targets: the examples the search scores on (texts filling ``{input}``, and
            their labels).
        batch_size: search each step on the next minibatch of this many examples (seeded by
            ``seed``); ``None``: on all of them.
        label_words: the word the model answers with per label (default: the labels; with
            ``chat_template=False``, ``" " + label``); each must be one token (a
            multi-token word raises ``ValueError``: use ``LocalClassifier`` or
            ``PromptTuner`` for those).
        n_tokens: slot length; the parameter's text is tokenized and padded (with ``" x"``
            tokens, or ``"x"`` where ``" x"`` is not one token) or truncated to it. Default: the
            text's own token count. Tokens of the text that are not allowed (below) start as
            the filler too.
        top_k: shortlist size per slot position.
        num_candidates: candidates scored per iteration.
        steps_per_call: GCG iterations per :meth:`step`.
        fluency_weight: weight of the slot's own NLL in the objective (0: task loss only).
        chat_template: put each prompt into the model's chat template as the user turn.
        system: the chat's system prompt (default: the chat template's own).
        allow_newlines: also allow tokens with newlines.
        dtype: ``"float32"`` or ``"bfloat16"`` weights for the search.
        chunk_size: candidates scored together (bounds memory); default: about 256 rows a chunk
            (fewer with fluency, whose ``[rows, S, V]`` logits dominate).
        seed: seeds the candidate sampling (iteration ``i`` uses ``fold_in(key(seed), i)``).
        max_forward_passes: budget of model forward passes; a step that could exceed it raises
            :class:`~langtorch.errors.BudgetExceededError` before doing anything.
        max_calls: the base budget of backend requests (TokenSearch itself sends none).

    Attributes:
        forward_passes: model forward passes spent by :meth:`step` so far.
        history: one row per step: ``step``, ``param``, ``value`` (the new text), ``score``
            (train accuracy of the text), ``loss`` (its label cross-entropy), ``objective``
            (the searched loss, fluency included, on token ids), ``forward_passes``
            (cumulative), ``step_forward_passes``, ``moves``, ``retokenizes`` (whether the text
            tokenizes back to the searched ids in every prompt), ``calls``, ``tokens``.

    Raises:
        ValueError: a template without the slot or ``{input}`` field (or with other fields, or
            the slot twice), fewer than two or repeated labels, label words sharing a first
            token, a parameter that is not 0-d or more than one parameter, an empty slot text
            without ``n_tokens``, bad search options.
        TypeError: a model that is not a local JAX model.

    Example:
        >>> import jax, langtorch as lt
        >>> from langtorch.functional.models import llama
        >>> class Chars:  # a tiny random Llama with a character-level tokenizer
        ...     config = llama.LlamaConfig(vocab_size=128, hidden_size=16, num_layers=1,
        ...                                num_heads=2, num_kv_heads=1, head_dim=8,
        ...                                intermediate_size=16)
        ...     params = llama.random_params(jax.random.key(0), config)
        ...     def encode(self, text): return [ord(c) for c in text]
        ...     def decode(self, ids): return "".join(map(chr, ids))
        >>> style = lt.TextParameter("abc")
        >>> opt = lt.optim.TokenSearch([style], Chars(), template="{input} {style}:",
        ...                            labels=["y", "n"], label_words=["y", "n"],
        ...                            inputs=["good", "bad"], targets=["y", "n"],
        ...                            chat_template=False, top_k=8,
        ...                            num_candidates=8, steps_per_call=2)
        >>> opt.estimate()
        {'forward_passes': 38, 'calls': 0}
        >>> acc = opt.step()
        >>> len(str(style)), opt.forward_passes <= 38, "{" in str(style)
        (3, True, False)
    """

    def __init__(self, params: Any, model: Any = None, *, template: str, slot: str | None = None,
                 labels: Sequence[str], label_words: Sequence[str] | None = None,
                 inputs: Any = None, targets: Any = None, batch_size: int | None = None,
                 n_tokens: int | None = None, top_k: int = 64, num_candidates: int = 64,
                 steps_per_call: int = 5, fluency_weight: float = 0.0, chat_template: bool = True,
                 system: str | None = None, allow_newlines: bool = False, dtype: str = "float32",
                 chunk_size: int | None = None, seed: int = 0,
                 max_forward_passes: int | None = None, max_calls: int | None = None):
        defaults = {"top_k": _check_int("top_k", top_k, 1),
                    "num_candidates": _check_int("num_candidates", num_candidates, 1),
                    "steps_per_call": _check_int("steps_per_call", steps_per_call, 1)}
        w = float(fluency_weight) if isinstance(fluency_weight, (int, float)) else float("nan")
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"TokenSearch: expected a finite fluency_weight >= 0, got {fluency_weight!r}.")
        defaults["fluency_weight"] = w
        super().__init__(params, defaults, max_calls=max_calls)
        ps = self.parameters()
        if len(ps) != 1:
            raise ValueError(f"TokenSearch searches one slot, so it takes one TextParameter; got "
                             f"{len(ps)}. Use one TokenSearch per slot.")
        self.param = ps[0]
        if self.param.ndim != 0:
            raise ValueError(f"TokenSearch needs a 0-d TextParameter (one slot text); "
                             f"{self.name_of(self.param)!r} has shape {self.param.shape}.")
        if max_forward_passes is not None:
            _check_int("max_forward_passes", max_forward_passes, 0)
        if n_tokens is not None:
            n_tokens = _check_int("n_tokens", n_tokens, 1)
        if chunk_size is not None:
            chunk_size = _check_int("chunk_size", chunk_size, 1)
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"TokenSearch: expected dtype 'float32' or 'bfloat16', got {dtype!r}.")
        self.max_forward_passes = max_forward_passes
        self.forward_passes = 0
        self.n_tokens, self.chunk_size, self.seed = n_tokens, chunk_size, int(seed)
        self.chat_template, self.system = bool(chat_template), system
        self.allow_newlines, self.dtype = bool(allow_newlines), dtype
        self.template, self.slot = parse_slot_template(template, slot)
        self.labels = check_labels(labels)
        if (inputs is None) != (targets is None):
            raise ValueError("TokenSearch needs both inputs= and targets= (the examples it searches "
                             "on), or neither")
        if batch_size is not None and inputs is None:
            raise ValueError("TokenSearch: batch_size needs inputs= and targets=")
        self.examples = (None if inputs is None else
                         Examples(inputs, targets, batch_size=batch_size, seed=seed, owner="TokenSearch"))

        self.model = resolve_model(model, decoder=True, owner="TokenSearch")
        if self.chat_template and not hasattr(self.model, "apply_chat_template"):
            raise TypeError(f"TokenSearch: chat_template=True needs a model with "
                            f"apply_chat_template; {type(self.model).__name__} has none (pass "
                            "chat_template=False to use the prompts as they are).")
        self.config = self.model.config
        jd = jnp.float32 if dtype == "float32" else jnp.bfloat16
        self._params = jax.tree.map(lambda a: jnp.asarray(a, jd), self.model.params)
        self.vocab_size = int(self._params["embed"].shape[0])
        self.pad_id = int(getattr(self.model, "pad_id", 0) or 0)
        if label_words is None:
            label_words = self.labels if self.chat_template else [" " + x for x in self.labels]
        self.label_words = [str(x) for x in label_words]
        self.label_ids = first_tokens(self.model, self.labels, self.label_words,
                                      self.chat_template)
        if self.examples is not None:
            self._data(self.examples.inputs, self.examples.targets)  # bad examples fail here, early
        self._frozen = {"model": self._params, "label_ids": jnp.asarray(self.label_ids, jnp.int32)}
        self._empty_prompt = jnp.zeros((0, int(self._params["embed"].shape[1])), jnp.float32)
        self.allowed = allowed_tokens(self.model, self.vocab_size, self.allow_newlines)
        n_allowed = int(self.allowed.sum())
        if defaults["top_k"] > n_allowed:
            raise ValueError(f"TokenSearch: top_k={top_k} is more than the {n_allowed} allowed "
                             "slot tokens; lower top_k.")
        self._allowed_j = jnp.asarray(self.allowed)
        self.state[id(self.param)] = self._init_state(str(self.param))

    # ------------------------------------------------------------------ setup
    def _init_state(self, text: str) -> dict[str, Any]:
        ids = [int(i) for i in self.model.encode(text)] if text else []
        if self.n_tokens is None:
            if not ids:
                raise ValueError(f"TokenSearch: the parameter {self.name_of(self.param)!r} is empty, "
                                 "so it gives no slot length; pass n_tokens=... (the slot is then "
                                 "filled with ' x' tokens) or give it a starting text.")
        else:
            ids = (ids + [filler(self.model, self.allowed)] * self.n_tokens)[:self.n_tokens]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"TokenSearch: the slot text encodes to ids {bad[:5]} outside the "
                             f"model's vocabulary of {self.vocab_size}.")
        # A token the search may not use (a brace, a newline, a special token) would stay in the
        # slot until swapped out: start from the filler there instead.
        ids = [i if self.allowed[i] else filler(self.model, self.allowed) for i in ids]
        return {"slot_ids": ids, "text": text, "iteration": 0}

    # ------------------------------------------------------------------ prompts
    def render(self, x: str, slot_text: str) -> str:
        """The full prompt the model reads for input ``x`` with ``slot_text`` in the slot (chat
        template applied when ``chat_template``); what :class:`~langtorch.nn.LocalClassifier`
        reads for the filled template.

        Example:
            >>> import langtorch as lt
            >>> opt = lt.optim.TokenSearch([lt.TextParameter("calm")], template="{input} {s}",
            ...                            labels=["a", "b"])  # doctest: +SKIP
            >>> opt.render("hi", "calm")[-30:]  # doctest: +SKIP
            'user\\nhi calm<|im_end|>\\n<|im_start|>assistant\\n'
        """
        user = self.template.render({_INPUT: x, self.slot: slot_text})
        if not self.chat_template:
            return user
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        msgs.append({"role": "user", "content": user})
        return self.model.apply_chat_template(msgs)

    def _pieces(self, xs: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        """Prefix and suffix token ids of each example: its full prompt split at the slot."""
        pre_texts, suf_texts = [], []
        for x in xs:
            full = self.render(x, _SENTINEL)
            if full.count(_SENTINEL) != 1:
                raise ValueError(f"TokenSearch: the rendered prompt of input {x[:40]!r} does not "
                                 "hold the slot exactly once (the chat template dropped or repeated "
                                 "it).")
            a, b = full.split(_SENTINEL)
            pre_texts.append(a)
            suf_texts.append(b)
        return encode_many(self.model, pre_texts), encode_many(self.model, suf_texts)

    def _retokenizes(self, cands: np.ndarray, xs: list[str], pre: list[list[int]],
                     suf: list[list[int]]) -> np.ndarray:
        """``[M]`` bool: candidate ``m``'s decoded text, rendered into every prompt and tokenized
        whole, gives back exactly ``prefix + candidate + suffix``."""
        keep = np.ones(len(cands), bool)
        texts = [str(self.model.decode([int(i) for i in c])) for c in cands]
        for i, x in enumerate(xs):  # one example at a time: most rejections happen at the first
            live = np.flatnonzero(keep)
            if not live.size:
                break
            got = encode_many(self.model, [self.render(x, texts[m]) for m in live])
            for m, ids in zip(live, got):
                keep[m] = list(ids) == pre[i] + [int(t) for t in cands[m]] + suf[i]
        return keep

    def _data(self, inputs: Any, targets: Any) -> tuple[list[str], list[int]]:
        xs = _flat_texts(inputs, "inputs")
        ys = _flat_texts(targets, "targets")
        if not xs:
            raise ValueError("TokenSearch: expected a non-empty batch of inputs, got 0 entries.")
        if len(xs) != len(ys):
            raise ValueError(f"TokenSearch: expected one target per input, got {len(xs)} inputs "
                             f"and {len(ys)} targets.")
        index = {lab: i for i, lab in enumerate(self.labels)}
        bad = [y for y in ys if y not in index]
        if bad:
            raise ValueError(f"TokenSearch: target {bad[0]!r} is not one of the labels "
                             f"{self.labels} ({len(bad)} such targets).")
        return xs, [index[y] for y in ys]

    # ------------------------------------------------------------------ scoring as text
    def _text_scores(self, xs: list[str], targets: list[int], slot_text: str
                     ) -> tuple[float, float, list[list[int]]]:
        """(label cross-entropy, accuracy, token rows) of the prompts with ``slot_text``,
        rendered and tokenized whole, scored in LocalClassifier's layout (right padding)."""
        rows = encode_many(self.model, [self.render(x, slot_text) for x in xs])
        ctx = int(self.config.max_positions)
        longest = max(len(r) for r in rows)
        if longest > ctx:
            raise ValueError(f"TokenSearch: a prompt is {longest} tokens, more than the model's "
                             f"context of {ctx}.")
        length = PT.bucket(longest)
        logits = []
        for start in range(0, len(rows), 32):
            group = rows[start:start + 32]
            ids, mask = PT.pad_rows(group, self.pad_id, length=length,
                                    batch_size=row_bucket(len(group), _ROW_BUCKETS))
            index = np.zeros(ids.shape[0], np.int32)
            index[:len(group)] = [len(r) - 1 for r in group]
            out = label_logits(self._empty_prompt, self._frozen,
                               {"ids": ids, "mask": mask, "index": index}, config=self.config)
            logits.append(np.asarray(out, np.float64)[:len(group)])
        lg = np.concatenate(logits)
        logp = lg - np.logaddexp.reduce(lg, axis=-1, keepdims=True)
        t = np.asarray(targets)
        loss = float(-logp[np.arange(len(t)), t].mean())
        acc = float((lg.argmax(-1) == t).mean())
        return loss, acc, rows

    def evaluate(self, inputs: Any, targets: Any, text: str | None = None) -> dict[str, float]:
        """Loss and accuracy of a slot text (default: the parameter's) on a labelled set, scored
        as text (each prompt rendered and tokenized whole). Not counted in the budget.

        Example:
            >>> opt.evaluate(val_texts, val_labels)  # doctest: +SKIP
            {'loss': 0.41, 'accuracy': 0.88}
        """
        xs, ys = self._data(inputs, targets)
        loss, acc, _ = self._text_scores(xs, ys, str(self.param) if text is None else str(text))
        return {"loss": loss, "accuracy": acc}

    # ------------------------------------------------------------------ optimizer
    def estimate(self, inputs: Any = None) -> dict[str, int]:
        """Most forward passes one ``step()`` can spend (see the module docstring), for a batch of
        ``inputs`` when given, else for the step's batch of the examples; ``calls`` (backend
        requests) is always 0."""
        if inputs is None:
            if self.examples is None:
                raise ValueError("TokenSearch.estimate() needs inputs, or examples given to the "
                                 "constructor (inputs=..., targets=...)")
            inputs = self.examples.batch(0)[0]  # the first batch of an epoch is a full one
        n = len(_flat_texts(inputs, "inputs"))
        if not self.param.requires_grad:
            return {"forward_passes": 0, "calls": 0}
        g = self.param_groups[0]
        t, c = g["steps_per_call"], g["num_candidates"]
        return {"forward_passes": n * (t * (c + 1) + 1), "calls": 0}

    def _chunk(self, rows: int, s: int, c: int) -> int:
        if self.chunk_size is not None:
            return min(self.chunk_size, c)
        cap = max(1, 256 // rows)
        if self.param_groups[0]["fluency_weight"] > 0:
            cap = min(cap, max(1, int(2e8 // (rows * s * self.vocab_size * 4))))
        n_chunks = -(-c // min(cap, c))
        return -(-c // n_chunks)  # even chunks: little padding

    def _slot_ids(self) -> list[int]:
        st = self.state.get(id(self.param))
        if st is None or st["text"] != str(self.param):  # the text was changed from outside
            it = 0 if st is None else st["iteration"]
            st = self._init_state(str(self.param))
            st["iteration"] = it
            self.state[id(self.param)] = st
        return list(st["slot_ids"])

    def step(self, closure: Callable[[], Any] | None = None, *data: Any, **named: Any) -> float:
        """Run ``steps_per_call`` GCG iterations on the step's batch of the examples given to the
        constructor, and write the new slot text.

        ``step(inputs, targets)``, the form of earlier releases, still runs on that batch, with
        a DeprecationWarning.

        Returns:
            the train accuracy of the new text on the batch (scored as text), or the closure's
            score when one is given (called after the update); ``nan`` when the parameter does
            not require grad (nothing is done).

        Raises:
            BudgetExceededError: the step could exceed ``max_forward_passes`` (raised before
                any work; the parameter and the optimizer state are unchanged).
            ValueError: no examples, empty batch, unknown targets, a prompt longer than the
                context.
        """
        closure, legacy = split_step_args("TokenSearch", closure, data, named, ("inputs", "targets"))
        p = self.param
        if not p.requires_grad:
            return float("nan") if closure is None else self._closure_score(closure)
        if legacy is None and self.examples is None:
            raise ValueError("TokenSearch.step() has no examples to search on: give them to the "
                             "constructor, TokenSearch(..., inputs=..., targets=...)")
        xs, ys = self._data(*(legacy or self.examples.batch(self.step_count)))
        need = self.estimate(xs)["forward_passes"]
        if self.max_forward_passes is not None and self.forward_passes + need > self.max_forward_passes:
            left = self.max_forward_passes - self.forward_passes
            raise BudgetExceededError(
                f"TokenSearch.step can use up to {need} model forward passes and the budget has "
                f"{left} of {self.max_forward_passes} left; nothing was run. Use a smaller batch, "
                "fewer candidates or fewer steps_per_call.",
                spent=float(self.forward_passes), budget=float(self.max_forward_passes))
        slot = np.asarray(self._slot_ids(), np.int32)
        st = self.state[id(p)]
        pre, suf = self._pieces(xs)
        slot, objective, moves, spent = self._iterate(xs, ys, slot, pre, suf, st)
        text = str(self.model.decode([int(i) for i in slot]))
        text_loss, acc, rows = self._text_scores(xs, ys, text)
        spent += len(xs)
        retok = all(r == pre[i] + slot.tolist() + suf[i] for i, r in enumerate(rows))
        p.data = text
        st["slot_ids"], st["text"] = [int(i) for i in slot], str(p)
        self.forward_passes += spent
        self._record(p, acc, loss=text_loss, objective=objective, forward_passes=self.forward_passes,
                     step_forward_passes=spent, moves=moves, retokenizes=bool(retok))
        self.step_count += 1
        return acc if closure is None else self._closure_score(closure)

    def _iterate(self, xs: list[str], ys: list[int], slot: np.ndarray, pre: list[list[int]],
                 suf: list[list[int]], st: dict[str, Any]) -> tuple[np.ndarray, float, int, int]:
        """The GCG iterations of one step (the module docstring's 1-4): ``(slot ids, searched
        loss, moves, forward passes spent)``; ``st["iteration"]`` advances the RNG position."""
        g = self.param_groups[0]
        top_k, c, w = g["top_k"], g["num_candidates"], g["fluency_weight"]
        n, s = len(xs), len(slot)
        batch = ts.make_slot_batch(pre, suf, targets=ys, label_ids=self.label_ids, num_slots=s,
                                   pad_id=self.pad_id, batch_size=row_bucket(n, _ROW_BUCKETS))
        if batch.ids.shape[1] > int(self.config.max_positions):
            raise ValueError(f"TokenSearch: a prompt is longer than the model's context of "
                             f"{self.config.max_positions} tokens.")
        chunk = self._chunk(int(batch.ids.shape[0]), s, c)
        opts = dict(config=self.config, fluency_weight=w)
        base_key = jax.random.key(self.seed)
        spent = n
        loss, grad = ts.slot_gradients(self._params, batch, jnp.asarray(slot), **opts)
        current = float(loss)
        moves, stale = 0, False
        for _ in range(g["steps_per_call"]):
            if stale:
                _, grad = ts.slot_gradients(self._params, batch, jnp.asarray(slot), **opts)
                spent, stale = spent + n, False
            key = jax.random.fold_in(base_key, st["iteration"])
            st["iteration"] += 1
            raw = np.asarray(ts.candidate_swaps(grad, jnp.asarray(slot), key, top_k=top_k,
                                                num_candidates=_OVERSAMPLE * c,
                                                allowed_mask=self._allowed_j))
            raw = np.unique(raw[(raw != slot[None]).any(1)], axis=0)
            raw = raw[np.random.default_rng([self.seed, st["iteration"]]).permutation(len(raw))]
            cands = raw[self._retokenizes(raw, xs, pre, suf)][:c]
            if not len(cands):
                continue
            padded = np.concatenate([cands, np.repeat(cands[-1:], c - len(cands), axis=0)])
            scores = ts.score_candidates(self._params, batch, jnp.asarray(padded),
                                         chunk_size=chunk, **opts)
            spent += n * c
            total = np.asarray(scores.total)[:len(cands)]
            best = int(np.argmin(total))
            if total[best] < current:
                slot, current, stale, moves = cands[best].astype(np.int32), float(total[best]), True, moves + 1
        return slot, current, moves, spent

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Base state plus ``forward_passes``; the slot's token ids, its text and the RNG
        position (``iteration``) are plain ints/str in ``state[0]`` (``torch.load`` with
        ``weights_only=True`` reads it back)."""
        sd = super().state_dict()
        sd["forward_passes"] = int(self.forward_passes)
        sd["max_forward_passes"] = None if self.max_forward_passes is None else int(self.max_forward_passes)
        sd["seed"] = int(self.seed)
        return sd

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore :meth:`state_dict` (slot ids, RNG position, history, forward-pass count)."""
        super().load_state_dict(state_dict)
        self.forward_passes = int(state_dict.get("forward_passes", 0))
        # The limit given to this optimizer stands: a saved state never loosens a budget.
        saved = state_dict.get("max_forward_passes")
        if saved is not None:
            self.max_forward_passes = (int(saved) if self.max_forward_passes is None
                                       else min(int(saved), int(self.max_forward_passes)))
        self.seed = int(state_dict.get("seed", self.seed))
        if self.examples is not None:
            self.examples.seed = self.seed  # the minibatches follow the restored seed too
        st = self.state.get(id(self.param))
        if st is not None:
            st["slot_ids"] = [int(i) for i in st["slot_ids"]]
            st["iteration"] = int(st["iteration"])
