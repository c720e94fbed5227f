"""Prompt tuning on the bundled sentiment set: baselines, a soft prompt, a hard prompt, MiniLM.

Everything runs offline on CPU with the pip-installed SmolLM2-135M-Instruct and all-MiniLM-L6-v2.
It prints a markdown table of test-split accuracies (the one in docs/prompt_tuning.md), writes the
loss curve PNG and a JSON of all numbers, and shows the tuned prompt in a TChain and the hard
prompt as a template.

    python examples/prompt_tuning.py                 # full run (~15-25 min on 2 cores)
    python examples/prompt_tuning.py --quick         # 1 epoch, fewer evaluations (~6 min)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import langtorch as lt
from langtorch.datasets import load_sentiment
from langtorch.tuning import PromptTuner

LABELS = ["negative", "positive"]
TEMPLATE = "Review: {}\nSentiment:"
CHAT_TEMPLATE = ("Is the sentiment of this review positive or negative? Answer with one word.\n"
                 "Review: {}")
INIT_TEXT = "Classify the sentiment of the review as positive or negative."


def logistic_probe(train_x, train_y, val_x, val_y, test_x, test_y):
    """L2-regularised logistic regression on frozen embeddings; C picked on the val split."""
    def fit(x, y, lam, steps=3000, lr=0.5):
        w, b = np.zeros(x.shape[1]), 0.0
        for _ in range(steps):
            p = 1 / (1 + np.exp(-(x @ w + b)))
            g = p - y
            w -= lr * (x.T @ g / len(y) + lam * w)
            b -= lr * g.mean()
        return w, b

    best = None
    for lam in (1e-4, 1e-3, 1e-2, 1e-1):
        w, b = fit(train_x, train_y, lam)
        acc = float((((val_x @ w + b) > 0) == val_y).mean())
        if best is None or acc > best[0]:
            best = (acc, w, b, lam)
    _, w, b, lam = best
    return float((((test_x @ w + b) > 0) == test_y).mean()), lam


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 epoch per run, for a smoke test")
    ap.add_argument("--out", default="docs", help="where the PNG and the JSON go")
    ap.add_argument("--progress", action="store_true", help="show progress bars")
    ap.add_argument("--parts", default="zero,soft,pez,minilm",
                    help="comma-separated subset of: zero, soft, pez, minilm")
    args = ap.parse_args()
    epochs = 1 if args.quick else args.epochs
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, val, test = (load_sentiment(s) for s in ("train", "val", "test"))
    results: dict[str, dict] = {}
    parts = set(args.parts.split(","))

    def record(name, metrics, seconds, **extra):
        results[name] = {**metrics, "seconds": round(seconds, 1), **extra}
        print(f"{name:58s} acc={metrics['accuracy']:.3f}  ({seconds:.0f} s)", flush=True)

    # --- SmolLM2 zero-shot: plain completion template and the chat template.
    if "zero" in parts:
        zero_shot(test, record)
    soft = pez = None
    if "soft" in parts:
        soft = soft_prompt(train, val, test, epochs, out, args, record)
    if "pez" in parts:
        pez = pez_prompt(train, val, test, epochs, args, record)
    if "minilm" in parts:
        minilm(train, val, test, args, record)
    if soft is not None and pez is not None:
        show(soft, pez, out)
    (out / "prompt_tuning_results.json").write_text(json.dumps(
        {"epochs": epochs, "test_size": len(test[0]), "results": results}, indent=1))
    print("\n| setup | test accuracy |\n|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['accuracy']:.3f} |")


def zero_shot(test, record):
    t = time.perf_counter()
    plain = PromptTuner(n_tokens=0, labels=LABELS, template=TEMPLATE, progress=False)
    record("SmolLM2 zero-shot, plain template", plain.evaluate(*test, prompt="none"),
           time.perf_counter() - t)
    t = time.perf_counter()
    chat = PromptTuner(n_tokens=0, labels=LABELS, template=CHAT_TEMPLATE, chat=True,
                       progress=False)
    record("SmolLM2 zero-shot, chat template", chat.evaluate(*test, prompt="none"),
           time.perf_counter() - t)


def soft_prompt(train, val, test, epochs, out, args, record):
    """Soft prompt, P = 20, initialised from an instruction."""
    t = time.perf_counter()
    soft = PromptTuner(n_tokens=20, labels=LABELS, template=TEMPLATE, init="text",
                       init_text=INIT_TEXT, learning_rate=1e-2, progress=args.progress)
    soft.fit(*train, val=val, epochs=epochs, batch_size=8, eval_every=8)
    fit_s = time.perf_counter() - t
    record("SmolLM2 soft prompt (P=20)", soft.evaluate(*test), fit_s,
           history=soft.history)
    soft.plot(out / "prompt_tuning_loss.png")
    t = time.perf_counter()
    record("SmolLM2 nearest-token projection of that soft prompt",
           soft.evaluate(*test, prompt="hard"), time.perf_counter() - t,
           hard_prompt=soft.hard_prompt())
    return soft


def pez_prompt(train, val, test, epochs, args, record):
    """PEZ: train through the projection, then use the hard prompt as plain text."""
    t = time.perf_counter()
    pez = PromptTuner(n_tokens=20, labels=LABELS, template=TEMPLATE, init="text",
                      init_text=INIT_TEXT + " ", learning_rate=0.1, weight_decay=0.1, pez=True,
                      progress=args.progress)
    pez.fit(*train, val=val, epochs=epochs, batch_size=8, eval_every=16)
    fit_s = time.perf_counter() - t
    record("SmolLM2 PEZ prompt (P=20), projected embeddings", pez.evaluate(*test), fit_s,
           history=pez.history)
    t = time.perf_counter()
    record("SmolLM2 PEZ hard prompt (P=20), as text", pez.evaluate(*test, prompt="hard"),
           time.perf_counter() - t, hard_prompt=pez.hard_prompt())

    return pez


def minilm(train, val, test, args, record):
    """MiniLM: soft prompt on the frozen encoder vs a logistic-regression probe."""
    t = time.perf_counter()
    mz = PromptTuner("minilm", n_tokens=0, labels=LABELS, progress=False)
    record("MiniLM zero-shot (cosine to label names)", mz.evaluate(*test, prompt="none"),
           time.perf_counter() - t)
    t = time.perf_counter()
    ms = PromptTuner("minilm", n_tokens=20, labels=LABELS, learning_rate=0.3,
                     progress=args.progress)
    ms.fit(*train, val=val, epochs=10 if not args.quick else 1, batch_size=16)
    record("MiniLM soft prompt (P=20)", ms.evaluate(*test), time.perf_counter() - t)
    t = time.perf_counter()
    from langtorch.models import default_embedder

    emb = default_embedder()
    xs = [emb.embed_texts(s[0].tolist()) for s in (train, val, test)]
    ys = [np.array([lab == "positive" for lab in s[1].tolist()]) for s in (train, val, test)]
    acc, lam = logistic_probe(xs[0], ys[0], xs[1], ys[1], xs[2], ys[2])
    record("MiniLM logistic-regression probe (frozen embeddings)", {"accuracy": acc},
           time.perf_counter() - t, l2=lam)


def show(soft, pez, out):
    """The tuned prompt as a module in a chain, and the hard prompt as a template."""
    chain = lt.TChain(lt.TFunction(lambda x: x.map(str.strip)), soft.as_module())
    print("TChain:", chain(lt.TextTensor(["  The soup was cold and the waiter rude.  "])).tolist())
    print("hard-prompt template:", repr(pez.hard_template().item()))
    soft.save_adapter(out / "sentiment_adapter")  # loads with peft.PeftModel.from_pretrained


if __name__ == "__main__":
    main()
