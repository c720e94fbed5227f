"""Text-prompt optimizers at equal budgets, fully offline on SmolLM2-135M-Instruct.

Every method is scored by :class:`langtorch.nn.LocalClassifier` — label-word scoring at the start
of the assistant's answer of SmolLM2's chat template, the zero-shot chat-template setup of
docs/prompt_tuning.md — and gets the SAME budget of model forward passes, counted as examples
scored (``candidates x minibatch`` included; bootstrap runs included; a soft-prompt training
example or a token-search gradient pass counts once although its backward costs about two more
forwards). The final test-split evaluation is not charged to any method.

Tasks
  (a) ``sentiment``: ``langtorch.datasets.load_sentiment`` (train 250 / val 84 / test 82), labels
      ``negative``/``positive``; the initial prompt is the documented chat-template baseline
      (0.866 on test).
  (b) ``key``: the same sentences, but each seed plants an arbitrary pair of label words (e.g.
      positive -> "blue", negative -> "red"); the initial prompt names the two words but not the
      mapping. Its known optimum is the prompt that states the mapping (``key_prompt``, reported
      as the *ceiling*); a method "recovers the key" when its test accuracy reaches
      ``--recover-threshold``.

Methods (each one function ``fn(ctx) -> Final``, registered with ``@method``; adding a method is
adding one function):
  initial         the initial prompt (budget 0)
  key_prompt      (b) only: the prompt stating the mapping (budget 0; the ceiling)
  random_search   random mutants of the initial prompt on one fixed train minibatch, keep best
  search          ``lt.optim.Search`` with a deterministic phrase-bank/word-edit mutation proposer
  search_llm      ``lt.optim.Search`` with SmolLM2 (``LocalBackend``) rewriting the instruction
  fewshot         ``lt.optim.FewShot``: demos bootstrapped from the classifier's correct train
                  runs, written as earlier chat turns (user: review, assistant: label) in the
                  ``{demos}`` slot; demo sets chosen on val minibatches
  soft_prompt     ``PromptTuner`` (P=20, init from the instruction, lr 1e-2, batch 8: the quick
                  settings of docs/prompt_tuning.md) for budget/8 steps — the upper bound
  token_search    HOOK (see ``token_search_hook``): ``lt.optim.TokenSearch`` (GCG) over the
  token_search_fluent   instruction's tokens, without / with the fluency term

Output: one JSON line per task (per-method mean/std over seeds, accuracies, forward passes,
seconds, budget, wall time, load average), then a markdown table.

    python tests/benchmarks/bench_text_optim.py                 # full: 5 seeds, budget 768
    python tests/benchmarks/bench_text_optim.py --smoke         # 1 seed, budget 96, ~10 min
    python tests/benchmarks/bench_text_optim.py --methods initial,fewshot --tasks sentiment
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import langtorch as lt
from langtorch.datasets import load_sentiment
from langtorch.nn import LocalClassifier

CONCEPTS = ("negative", "positive")  # the sentiment classes, in label order
INSTRUCTION = "Is the sentiment of this review positive or negative? Answer with one word."
FIELD = "Review: {}"
SOFT_INIT_TEXT = "Classify the sentiment of the review as positive or negative."
# Neutral single-token pairs: no built-in valence, so only a stated mapping (or data) can tell.
KEY_PAIRS = [("blue", "red"), ("north", "south"), ("alpha", "beta"), ("cat", "dog"),
             ("left", "right"), ("apple", "stone"), ("green", "gold"), ("moon", "river")]


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------- tasks
@dataclasses.dataclass
class Task:
    name: str
    labels: list[str]                   # label words, in CONCEPTS order
    initial: str                        # template with one {} (the review)
    key_prompt: str | None              # the known optimum of the planted-key task
    train: tuple[list[str], list[str]]
    val: tuple[list[str], list[str]]
    test: tuple[list[str], list[str]]


def _split(name: str, mapping: dict[str, str], limit: int | None = None):
    x, y = load_sentiment(name)
    xs, ys = x.tolist(), [mapping[t] for t in y.tolist()]
    return (xs[:limit], ys[:limit]) if limit else (xs, ys)


def make_task(name: str, seed: int, test_limit: int | None) -> Task:
    if name == "sentiment":
        m = {c: c for c in CONCEPTS}
        labels = list(CONCEPTS)
        initial, key = INSTRUCTION + "\n" + FIELD, None
    elif name == "key":
        rng = random.Random(f"key-{seed}")
        pair = list(KEY_PAIRS[seed % len(KEY_PAIRS)])
        rng.shuffle(pair)                       # which word means positive: random per seed
        labels = pair                           # [word for negative, word for positive]
        m = dict(zip(CONCEPTS, labels))
        shown = labels[:]
        rng.shuffle(shown)                      # the initial prompt names both, in random order
        initial = (f"Classify this review. Answer with one word: {shown[0]} or {shown[1]}.\n"
                   + FIELD)
        key = (f"If the review is positive, answer {m['positive']}. If it is negative, answer "
               f"{m['negative']}.\n" + FIELD)
    else:
        raise SystemExit(f"unknown task {name!r}; use sentiment, key")
    return Task(name, labels, initial, key, _split("train", m), _split("val", m),
                _split("test", m, test_limit))


# ---------------------------------------------------------------------------------- context
@dataclasses.dataclass
class Ctx:
    task: Task
    seed: int
    budget: int
    clf: LocalClassifier
    args: argparse.Namespace

    def rng(self, what: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, sum(map(ord, what))])

    def minibatch(self, what: str, size: int, split: str = "train", step: int = 0):
        xs, ys = getattr(self.task, split)
        rng = np.random.default_rng([self.seed, sum(map(ord, what)), step])
        # Stratified: the same number per label, so a prompt (or demo set) that only shifts
        # the label prior cannot win a small minibatch by luck of its label mix.
        by_label = [np.flatnonzero(np.asarray(ys) == lab) for lab in self.task.labels]
        per = max(1, size // len(by_label))
        idx = np.concatenate([rng.choice(ids, size=min(per, len(ids)), replace=False)
                              for ids in by_label])
        rng.shuffle(idx)
        return (lt.TextTensor([xs[i] for i in idx], template=False),
                lt.TextTensor([ys[i] for i in idx], template=False))


@dataclasses.dataclass
class Final:
    """What a method ends with: a prompt (scored with the task's classifier), a module, or an
    accuracy it measured itself (soft prompts); ``passes`` when the classifier did not count."""

    prompt: str | None = None
    module: Any = None
    test_accuracy: float | None = None
    passes: int | None = None
    info: dict = dataclasses.field(default_factory=dict)


METHODS: dict[str, Callable[[Ctx], Final]] = {}


def method(name: str, tasks: tuple[str, ...] = ("sentiment", "key")):
    def register(fn):
        fn.tasks = tasks
        METHODS[name] = fn
        return fn
    return register


class LabelLogProb(lt.nn.MetricLoss):
    """Score = log-probability of the target label (from the classifier's
    ``metadata["label_logprobs"]``) instead of 0/1 exact match: the same forward passes, far less
    selection noise on small minibatches (APE's log-probability score). Feedback texts and the
    provenance node are MetricLoss's."""

    def __init__(self, labels: list[str]):
        super().__init__("exact_match")
        self.labels, self.name = list(labels), "label_logprob"

    def forward(self, predictions: Any, targets: Any) -> lt.TextTensor:
        out = super().forward(predictions, targets)
        logp = np.stack([np.asarray(v, np.float64) for v in
                         predictions.metadata.column("label_logprobs").reshape(-1)])
        logp = logp.reshape(predictions.shape + (len(self.labels),))
        target = targets if isinstance(targets, lt.TextTensor) else lt.TextTensor(targets, template=False)
        t_idx = np.vectorize(self.labels.index, otypes=[np.int64])(np.asarray(target.tolist(), dtype=object))
        t_idx = np.broadcast_to(t_idx, out.shape)
        logp = np.broadcast_to(logp, out.shape + (len(self.labels),))
        out.metadata["score"] = np.take_along_axis(logp, t_idx[..., None], axis=-1)[..., 0]
        return out


def metric_of(ctx: Ctx) -> Any:
    return LabelLogProb(ctx.task.labels) if ctx.args.score == "logprob" else "exact_match"


def accuracy(module: Any, xs: list[str], ys: list[str]) -> float:
    with lt.no_grad():
        out = module(lt.TextTensor(xs, template=False))
    return float(np.mean(np.asarray(out.tolist()) == np.asarray(ys)))


# ---------------------------------------------------------------------------------- mutations
QUESTIONS = [
    "Is the sentiment of this review positive or negative?",
    "Is this review positive or negative?",
    "Classify the sentiment of the review.",
    "Decide whether the review below is positive or negative.",
    "What is the overall sentiment of this review?",
    "Does the reviewer like it or not?",
    "Is the customer satisfied or dissatisfied?",
    "Is the writer happy or unhappy with it?",
    "Overall, is this a favourable or an unfavourable review?",
    "Read the review and judge its overall verdict.",
    "Classify this review.",
]
HINTS = [
    "Answer with one word.",
    "Answer with one word: {a} or {b}.",
    "Reply with {a} or {b} only.",
    "Answer {a} if the review is {c1} and {b} if it is {c2}.",
    "Judge the overall verdict, not single details.",
    "Watch for sarcasm and negation.",
    "Mixed reviews count by their final verdict.",
    "Think about how the reviewer feels.",
    "Be accurate.",
]
FIELDS = ["Review: {}", "Text: {}", "Customer review: {}", "Input: {}", "Review:\n{}"]
SYNONYMS = {"review": ["text", "comment", "opinion"], "sentiment": ["tone", "feeling", "opinion"],
            "positive": ["good", "favourable"], "negative": ["bad", "unfavourable"],
            "answer": ["reply", "respond"], "word": ["word only", "term"],
            "classify": ["label", "judge"], "overall": ["general", "final"]}


def _parts(prompt: str) -> tuple[list[str], str]:
    head, _, field = prompt.rpartition("\n")
    if "{}" not in field:  # e.g. "Review:\n{}": the field spans two lines
        head, _, field2 = head.rpartition("\n")
        field = field2 + "\n" + field
    sentences = [s for s in re.split(r"(?<=[.?!])\s+", head.strip()) if s]
    return sentences, field


def _join(sentences: list[str], field: str) -> str:
    return " ".join(sentences).strip() + "\n" + field


def mutate(prompt: str, labels: list[str], rng: random.Random) -> str:
    """One random edit of the instruction: swap the question, add/drop a hint, a word-level
    edit (delete / swap / synonym), or another field name. Knows the label words and the two
    sentiment concepts, never which word goes with which concept."""
    sentences, field = _parts(prompt)
    op = rng.choice(["question", "hint", "hint", "drop", "word", "word", "field", "order"])
    if op == "question":
        qs = [i for i, s in enumerate(sentences) if s.endswith("?")]
        q = rng.choice(QUESTIONS)
        if qs:
            sentences[rng.choice(qs)] = q
        else:
            sentences.insert(0, q)
    elif op == "hint":
        a, b = rng.sample(labels, 2)
        c1, c2 = rng.sample(list(CONCEPTS), 2)
        h = rng.choice(HINTS).format(a=a, b=b, c1=c1, c2=c2)
        if h not in sentences:
            sentences.insert(rng.randint(0, len(sentences)), h)
    elif op == "drop" and len(sentences) > 1:
        sentences.pop(rng.randrange(len(sentences)))
    elif op == "word" and sentences:
        i = rng.randrange(len(sentences))
        words = sentences[i].split()
        j = rng.randrange(len(words))
        kind = rng.choice(["delete", "swap", "synonym"])
        bare = words[j].strip(".?!,:").lower()
        if kind == "synonym" and bare in SYNONYMS:
            words[j] = words[j].lower().replace(bare, rng.choice(SYNONYMS[bare]))
        elif kind == "swap" and len(words) > 1:
            k = min(j + 1, len(words) - 1) if j < len(words) - 1 else j - 1
            words[j], words[k] = words[k], words[j]
        elif len(words) > 2:
            del words[j]
        s = " ".join(words)
        sentences[i] = s[:1].upper() + s[1:] if s else s
    elif op == "field":
        field = rng.choice(FIELDS)
    elif op == "order" and len(sentences) > 1:
        rng.shuffle(sentences)
    return _join([s for s in sentences if s], field)


def mutation_proposer(labels: list[str], edits: tuple[int, int] = (1, 2)):
    """A Search proposer ``(value, k, rng) -> k candidates``: each 1-2 random edits of value."""
    def propose(value: str, k: int, rng: random.Random) -> list[str]:
        out: list[str] = []
        for _ in range(8 * k):
            c = value
            for _ in range(rng.randint(*edits)):
                c = mutate(c, labels, rng)
            if c != value and c not in out and c.count("{}") == 1:
                out.append(c)
            if len(out) == k:
                break
        return out
    return propose


# ---------------------------------------------------------------------------------- methods
@method("initial")
def initial(ctx: Ctx) -> Final:
    return Final(prompt=ctx.task.initial)


@method("key_prompt", tasks=("key",))
def key_prompt(ctx: Ctx) -> Final:
    return Final(prompt=ctx.task.key_prompt)


@method("random_search")
def random_search(ctx: Ctx) -> Final:
    m = ctx.args.minibatch * 2  # one fixed minibatch for all candidates: larger than Search's
    n_cands = max(1, ctx.budget // m)
    rng = random.Random(f"random-{ctx.seed}")
    cands = [ctx.task.initial]
    for _ in range(50 * n_cands):
        if len(cands) == n_cands:
            break
        c = ctx.task.initial
        for _ in range(rng.randint(1, 3)):
            c = mutate(c, ctx.task.labels, rng)
        if c not in cands and c.count("{}") == 1:
            cands.append(c)
    x, y = ctx.minibatch("random", m)
    layer = lt.TLayer(ctx.task.initial, ctx.clf)
    scores = np.concatenate([
        lt.optim.evaluate_candidates(layer, "prompt", cands[i:i + 8], x, y, metric_of(ctx))
        for i in range(0, len(cands), 8)])
    best = int(np.argmax(scores))  # ties keep the earliest (the initial prompt first)
    return Final(prompt=cands[best], info={"candidates": len(cands), "minibatch": m,
                                           "train_score": float(scores[best])})


def _search(ctx: Ctx, proposer: Any, what: str) -> Final:
    m, c = ctx.args.minibatch, ctx.args.candidates
    layer = lt.TLayer(ctx.task.initial, ctx.clf)
    opt = lt.optim.Search(layer.named_text_parameters(), proposer, c, module=layer,
                          metric=metric_of(ctx), seed=ctx.seed)
    step = 0
    while ctx.clf.forward_passes + (c + 1) * m <= ctx.budget:
        x, y = ctx.minibatch(what, m, step=step)
        opt.step(x, y)
        step += 1
    tried = [h for h in opt.history if h["value"] != ctx.task.initial]
    # Per step the history lists the current value first, then the candidates: a move is a
    # step whose kept value is not its first entry.
    firsts = {}
    for h in opt.history:
        firsts.setdefault(h["step"], h["value"])
    moves = sum(1 for h in opt.history if h["kept"] and h["value"] != firsts[h["step"]])
    return Final(prompt=str(layer.prompt), info={
        "steps": step, "minibatch": m, "candidates": c, "moves": moves,
        "sample_candidates": [h["value"] for h in tried[:3]]})


@method("search")
def search(ctx: Ctx) -> Final:
    return _search(ctx, mutation_proposer(ctx.task.labels), "search")


_LOCAL_LLM: dict[str, Any] = {}


def smollm2_proposer(ctx: Ctx):
    """SmolLM2 through ``LocalBackend`` rewrites the instruction (sampled, ``n=k``). Search's
    own LLM path asks for JSON-schema output, which LocalBackend refuses, so the model is
    wrapped as a mutation callable; candidates keep the field line."""
    from langtorch.backends import LocalBackend

    if "llm" not in _LOCAL_LLM:
        _LOCAL_LLM["llm"] = lt.nn.LLM(LocalBackend(), temperature=0.9, top_p=0.95, max_tokens=48)
    llm = _LOCAL_LLM["llm"]
    stats = {"calls": 0, "completion_tokens": 0, "proposed": 0, "usable": 0}

    def propose(value: str, k: int, rng: random.Random) -> list[str]:
        sentences, field = _parts(value)
        instr = " ".join(sentences)
        ask = ("Rewrite this instruction for a sentiment classifier in a different way. Keep it "
               "short (one or two sentences) and keep the answer words "
               f"{' and '.join(ctx.task.labels)}. Reply with the new instruction only.\n\n"
               f"Instruction: {instr}")
        with lt.no_grad():
            out = llm(lt.TextTensor([ask], template=False), n=k, seed=rng.randrange(2**31))
        stats["calls"] += 1
        stats["completion_tokens"] += int(np.sum(out.metadata["completion_tokens"]))
        cands = []
        for text in np.asarray(out.tolist()).reshape(-1).tolist():
            stats["proposed"] += 1
            line = text.strip().split("\n")[0].strip().strip('"').removeprefix("Instruction:").strip()
            if 8 <= len(line) <= 300 and "{" not in line and "}" not in line:
                cands.append(line + "\n" + field)
                stats["usable"] += 1
        return cands

    propose.stats = stats
    return propose


@method("search_llm")
def search_llm(ctx: Ctx) -> Final:
    proposer = smollm2_proposer(ctx)
    t = time.perf_counter()
    final = _search(ctx, proposer, "search")
    final.info.update(proposer.stats, seconds_incl_generation=round(time.perf_counter() - t, 1))
    return final


class FewShotProgram(lt.TModule):
    """The chat as text: [system] {demos} [user: instruction + review] [assistant: ...].

    Demonstrations are earlier chat turns (user: the instruction with a training review,
    assistant: its label), which SmolLM2 follows far better than demos pasted into one user
    turn (those make it answer "The review is ..." and wreck first-token scoring). With no
    demos the rendered text is exactly the zero-shot chat prompt, so the two start equal."""

    def __init__(self, task: Task, clf: LocalClassifier):
        super().__init__()
        model = clf.model
        user = task.initial.replace("{}", "@@X@@")
        turn = model.apply_chat_template([{"role": "user", "content": "@@U@@"}])
        head, _, tail = turn.partition("<|im_start|>user")
        template = head + "{demos}" + ("<|im_start|>user" + tail).replace("@@U@@", user)
        self.prompt = lt.TextParameter(template.replace("@@X@@", "{x}"), requires_grad=False)
        self.demos = lt.TextParameter("")
        demo = model.apply_chat_template(
            [{"role": "user", "content": "@@U@@"}, {"role": "assistant", "content": "@@A@@"}],
            add_generation_prompt=False)
        demo = "<|im_start|>user" + demo.partition("<|im_start|>user")[2]
        self.demo_template = (demo.replace("@@U@@", task.initial.replace("{}", "{input}"))
                              .replace("@@A@@", "{output}"))
        # Same scorer, reading the rendered chat as is.
        self.clf = LocalClassifier(clf.labels, model=model, chat_template=False,
                                   label_words=clf.label_words, batch_size=clf.batch_size)

    def forward(self, x: Any) -> lt.TextTensor:
        x = x if isinstance(x, lt.TextTensor) else lt.TextTensor(x, template=False)
        return self.clf(lt.fill(self.prompt, {"demos": self.demos, "x": x}))


@method("fewshot")
def fewshot(ctx: Ctx) -> Final:
    program = FewShotProgram(ctx.task, ctx.clf)
    m, c, k = ctx.args.minibatch, ctx.args.candidates, ctx.args.demos
    # A run becomes a demo when it is right: exact match, or (binary labels) p(target) > 0.5.
    threshold = 1.0 if ctx.args.score == "exact" else math.log(0.5) + 1e-6
    opt = lt.optim.FewShot([("demos", program.demos)], metric_of(ctx), k=k, module=program,
                           demo_template=program.demo_template, separator="",
                           n_candidates=c, threshold=threshold, seed=ctx.seed)
    step, used = 0, lambda: program.clf.forward_passes
    while used() + m + (c + 1) * m <= ctx.budget:
        x, y = ctx.minibatch("fewshot-boot", m, step=step)
        vx, vy = ctx.minibatch("fewshot-val", m, split="val", step=step)
        opt.step(x, y, vx, vy)
        step += 1
    n_demos = str(program.demos).count("<|im_start|>assistant")
    return Final(module=program, passes=used(),
                 info={"steps": step, "pool": len(opt.pool), "demos_kept": n_demos})


@method("soft_prompt")
def soft_prompt(ctx: Ctx) -> Final:
    from langtorch.tuning import PromptTuner

    batch = 8
    steps = max(1, ctx.budget // batch)
    per_epoch = math.ceil(len(ctx.task.train[0]) / batch)
    tuner = PromptTuner(n_tokens=20, labels=ctx.task.labels, template=ctx.task.initial,
                        chat=True, init="text", init_text=SOFT_INIT_TEXT, learning_rate=1e-2,
                        seed=ctx.seed, progress=False)
    tuner.fit(*ctx.task.train, epochs=math.ceil(steps / per_epoch), batch_size=batch,
              max_steps=steps, restore_best=False)
    t = time.perf_counter()
    acc = tuner.evaluate(*ctx.task.test, prompt="soft")["accuracy"]
    return Final(test_accuracy=acc, passes=len(tuner.step_losses) * batch,
                 info={"steps": len(tuner.step_losses), "flops_note": "fwd+bwd per example",
                       "test_eval_s": round(time.perf_counter() - t, 1)})


# ---------------------------------------------------------------------------------- TokenSearch
# HOOK — TokenSearch (white-box GCG token search) belongs to another helper:
# langtorch/functional/token_search.py and lt.optim.TokenSearch. This method only drives the
# optimizer: the slot is the instruction, the field line stays fixed, each step is a fresh
# stratified train minibatch, and steps run while the optimizer's own forward-pass count
# (TokenSearch.estimate, an upper bound) fits the budget. Tune its settings here (or with the
# --ts-* flags); the harness needs only a Final with the prompt text and the pass count.
def token_search_hook(ctx: Ctx, fluency_weight: float) -> Final:
    sentences, field = _parts(ctx.task.initial)
    slot = lt.TextParameter(" ".join(sentences))
    template = "{slot}\n" + field.replace("{}", "{input}")
    opt = lt.optim.TokenSearch([slot], ctx.clf.model, template=template, labels=ctx.task.labels,
                               top_k=ctx.args.ts_top_k, num_candidates=ctx.args.ts_candidates,
                               steps_per_call=ctx.args.ts_iters, fluency_weight=fluency_weight,
                               seed=ctx.seed, max_forward_passes=ctx.budget)
    n, step = ctx.args.ts_examples, 0
    while True:
        x, y = ctx.minibatch("token-search", n, step=step)
        if opt.forward_passes + opt.estimate(x)["forward_passes"] > ctx.budget:
            break
        opt.step(x, y)
        step += 1
    moves = sum(h.get("moves", 0) for h in opt.history)
    return Final(prompt=str(slot) + "\n" + field, passes=int(opt.forward_passes),
                 info={"steps": step, "moves": moves,
                       "retokenizes": all(h.get("retokenizes", True) for h in opt.history)})


@method("token_search")
def token_search(ctx: Ctx) -> Final:
    return token_search_hook(ctx, fluency_weight=0.0)


@method("token_search_fluent")
def token_search_fluent(ctx: Ctx) -> Final:
    return token_search_hook(ctx, fluency_weight=ctx.args.fluency)


# ---------------------------------------------------------------------------------- harness
def run_one(name: str, ctx: Ctx) -> dict:
    ctx.clf.forward_passes = 0
    t0 = time.perf_counter()
    try:
        final = METHODS[name](ctx)
    except Exception as e:  # noqa: BLE001 - one broken method must not sink the benchmark
        log(f"  {name}: ERROR {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    passes = final.passes if final.passes is not None else ctx.clf.forward_passes
    opt_s = time.perf_counter() - t0
    if final.test_accuracy is not None:
        acc = final.test_accuracy
    else:
        module = final.module if final.module is not None else lt.TLayer(final.prompt, ctx.clf)
        acc = accuracy(module, *ctx.task.test)
    row = {"accuracy": acc, "passes": int(passes), "over_budget": passes > ctx.budget,
           "optimize_s": round(opt_s, 1), "seconds": round(time.perf_counter() - t0, 1),
           "prompt": final.prompt, **final.info}
    log(f"  {name}: acc={acc:.3f} passes={passes} ({row['seconds']} s)"
        + (f" prompt={final.prompt!r}" if final.prompt else ""))
    return row


def summarize(rows: list[dict], threshold: float | None) -> dict:
    ok = [r for r in rows if "error" not in r]
    accs = [r["accuracy"] for r in ok]
    out = {"mean": round(statistics.fmean(accs), 4) if accs else None,
           "std": round(statistics.stdev(accs), 4) if len(accs) > 1 else 0.0,
           "accs": [round(a, 4) for a in accs], "passes": [r["passes"] for r in ok],
           "seconds": [r["seconds"] for r in ok], "seeds_ok": len(ok)}
    if len(ok) < len(rows):
        out["errors"] = [r["error"] for r in rows if "error" in r][:2]
    if threshold is not None:
        out["key_recovered"] = sum(a >= threshold for a in accs)
    for key in ("prompt", "steps", "moves", "usable", "proposed", "demos_kept", "sample_candidates"):
        if ok and key in ok[0]:
            out[key] = [r.get(key) for r in ok]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny quick run (1 seed, budget 96)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=768,
                    help="forward passes per method per seed (768 = soft prompt: 3 epochs)")
    ap.add_argument("--tasks", default="sentiment,key")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--minibatch", type=int, default=16)
    ap.add_argument("--candidates", type=int, default=7, help="Search/FewShot candidates per step")
    ap.add_argument("--demos", type=int, default=4)
    ap.add_argument("--score", choices=("logprob", "exact"), default="logprob",
                    help="selection score of the search methods (same forward passes)")
    ap.add_argument("--ts-examples", type=int, default=8, help="TokenSearch minibatch")
    ap.add_argument("--ts-candidates", type=int, default=16)
    ap.add_argument("--ts-iters", type=int, default=1, help="GCG iterations per step")
    ap.add_argument("--ts-top-k", type=int, default=64)
    ap.add_argument("--fluency", type=float, default=0.1)
    ap.add_argument("--test-limit", type=int, default=None, help="use the first N test sentences")
    ap.add_argument("--recover-threshold", type=float, default=0.75)
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.budget, args.minibatch, args.candidates = 1, 96, 8, 3
        args.ts_examples, args.ts_candidates, args.ts_iters = 8, 4, 2
        args.test_limit = args.test_limit or 40
    names = [m for m in args.methods.split(",") if m]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {list(METHODS)}")
    seeds = list(range(args.seeds))
    from langtorch.models import default_llm

    model = default_llm()
    table: dict[str, dict[str, dict]] = {}
    for task_name in args.tasks.split(","):
        t_task = time.perf_counter()
        per: dict[str, list[dict]] = {m: [] for m in names}
        ceilings = []
        for seed in seeds:
            task = make_task(task_name, seed, args.test_limit)
            clf = LocalClassifier(task.labels, model=model)
            ctx = Ctx(task, seed, args.budget, clf, args)
            log(f"[{task_name} seed {seed}] labels={task.labels}")
            for m in names:
                if task_name in METHODS[m].tasks:
                    per[m].append(run_one(m, ctx))
            if task.key_prompt is not None and "key_prompt" in per and per["key_prompt"]:
                ceilings.append(per["key_prompt"][-1].get("accuracy"))
        threshold = args.recover_threshold if task_name == "key" else None
        summary = {m: summarize(rows, threshold) for m, rows in per.items() if rows}
        line = {"bench": "text_optim", "task": task_name, "budget": args.budget,
                "budget_unit": "model forward passes (examples scored)", "seeds": seeds,
                "smoke": args.smoke, "test_size": len(make_task(task_name, 0, args.test_limit).test[0]),
                "methods": summary, "wall_s": round(time.perf_counter() - t_task, 1),
                "load_avg": [round(v, 2) for v in os.getloadavg()], "cpus": os.cpu_count(),
                "settings": {"score": args.score, "minibatch": args.minibatch, "candidates": args.candidates,
                             "demos": args.demos, "ts_examples": args.ts_examples,
                             "ts_candidates": args.ts_candidates, "ts_iters": args.ts_iters,
                             "ts_top_k": args.ts_top_k, "fluency": args.fluency}}
        if ceilings:
            line["ceiling_key_prompt"] = round(statistics.fmean(ceilings), 4)
            line["recover_threshold"] = threshold
        print(json.dumps(line), flush=True)
        table[task_name] = summary
    tasks = list(table)
    print("\n| method | " + " | ".join(f"{t} (test acc, mean ± std)" for t in tasks) + " |")
    print("|---|" + "---|" * len(tasks))
    for m in names:
        cells = []
        for t in tasks:
            s = table[t].get(m)
            if s is None or s["mean"] is None:
                cells.append("—" if s is None else "error")
                continue
            extra = f", key {s['key_recovered']}/{s['seeds_ok']}" if "key_recovered" in s else ""
            cells.append(f"{s['mean']:.3f} ± {s['std']:.3f} ({max(s['passes'])} passes{extra})")
        print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
