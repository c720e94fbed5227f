"""GEPA side by side with DSPy: ``lt.optim.GEPA`` vs ``dspy.GEPA`` vs
``dspy.BootstrapFewShotWithRandomSearch`` vs the initial prompt, at the same metric-call budget.

``dspy`` and ``gepa`` are benchmark-only packages (not dependencies of langtorch): without them the
DSPy methods are reported as skipped and ours runs against the initial prompt.

Tasks
  (a) ``synthetic`` (deterministic; measures search efficiency, not model quality). ``K``
      categories, each with an arbitrary label word drawn per seed. The scripted *model* (an
      OpenAI-compatible server on 127.0.0.1, which both libraries call over HTTP) answers an item
      right only when its prompt states that item's category rule ("If the category is c3, answer
      blue."), else "unknown". The metric's feedback on a wrong answer names the rule; the
      scripted *reflection engine* of each library can only add rules that appear in the text it
      is shown (our backward engine passes the feedback it is shown on). Reported: test accuracy,
      metric calls, and the metric calls spent when the best validation score first reached 1.0.
  (b) ``sentiment`` (real): ``langtorch.datasets.load_sentiment`` on a model behind any
      OpenAI-compatible URL (``langtorch serve`` for the local model: ``--base-url``), the same
      model as the reflection engine. Reported: test accuracy, metric calls, tokens, wall time.

Output: one JSON line per task (per-method mean/std over seeds), then a markdown table.

    python tests/benchmarks/bench_gepa.py --task synthetic --seeds 3 --budget 400
    python tests/benchmarks/bench_gepa.py --task synthetic --smoke          # 1 seed, tiny budget
    langtorch serve & python tests/benchmarks/bench_gepa.py --task sentiment --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import langtorch as lt
from langtorch.backends import OpenAIBackend
from langtorch.testing import OpenAIServer

KEY = "sk-bench-0000000000"
WORDS = ["blue", "red", "north", "south", "alpha", "beta", "cat", "dog", "left", "right", "apple", "stone",
         "green", "gold", "moon", "river", "salt", "pepper", "oak", "pine", "iron", "glass", "wolf", "hare"]
INSTRUCTION = "Answer with the label of the item."
RULE = "If the category is {c}, answer {a}."
WRONG = re.compile(r"for category (c\d+) the answer is (\w+)")


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ task (a)
def synthetic_task(seed: int, k: int) -> dict[str, Any]:
    rng = random.Random(seed)
    labels = rng.sample(WORDS, k)

    def split(n_per: int, tag: str) -> list[tuple[str, str]]:
        rows = [(f"category c{i}: {tag} item {j}", labels[i]) for i in range(k) for j in range(n_per)]
        rng.shuffle(rows)
        return rows

    return {"labels": labels, "train": split(2, "train"), "val": split(1, "val"), "test": split(2, "test")}


def feedback_metric(pred: str, target: str, cat: str) -> tuple[float, str]:
    if pred.strip() == target:
        return 1.0, "Correct."
    return 0.0, f"Wrong: for category {cat} the answer is {target}."


def category(text: str) -> str:
    found = re.findall(r"category (c\d+)", text)
    return found[-1] if found else "c?"


def learned(text: str, current: str) -> str:
    """The scripted reflection: the current text plus every rule named in the feedback shown."""
    new = current
    for cat, word in sorted(set(WRONG.findall(text))):
        r = RULE.format(c=cat, a=word)
        if r not in new:
            new += "\n" + r
    return new


def scripted_responder(counts: dict[str, int]) -> Callable[[dict], str]:
    def answer(body: dict) -> str:
        msgs = body["messages"]
        user = msgs[-1]["content"] if isinstance(msgs[-1]["content"], str) else str(msgs[-1]["content"])
        everything = "\n".join(str(m.get("content")) for m in msgs)
        if "Components you may rewrite" in user:  # langtorch GEPA's reflection (JSON schema)
            counts["reflect"] += 1
            comp = re.findall(r"### component: (.+)", user)[0]
            value = user.split(f"### component: {comp}\nCurrent value:\n<<<\n", 1)[1].split("\n>>>", 1)[0]
            return json.dumps({"reasoning": "add the rules named in the feedback",
                               "proposals": [{"rewrites": [{"component": comp, "new_value": learned(user, value)}]}]})
        if "[[ ## current_instruction ## ]]" in user:  # dspy.GEPA's reflection (its ProposeInstruction)
            counts["reflect"] += 1
            current = user.split("[[ ## current_instruction ## ]]\n", 1)[1].split("\n\n[[ ## ", 1)[0]
            if "[[ ## new_instruction ## ]]" in everything:  # ChatAdapter
                return f"[[ ## new_instruction ## ]]\n{learned(user, current)}\n\n[[ ## completed ## ]]"
            return json.dumps({"new_instruction": learned(user, current)})  # JSONAdapter
        if "I provided an assistant with the following instructions" in everything:  # gepa's default template
            counts["reflect"] += 1
            current = everything.split("```", 2)[1].strip("\n")
            return "```\n" + learned(everything, current) + "\n```"
        if "How should the prompt change" in user or "pieces of feedback on it" in user:  # backward
            counts["feedback"] += 1
            return "\n".join(sorted(set(f"Wrong: for category {c} the answer is {w}." for c, w in WRONG.findall(user)))) \
                or "No change needed."
        counts["model"] += 1
        cat = category(user)
        word = next((w for c, w in re.findall(r"If the category is (c\d+), answer (\w+)\.", everything) if c == cat), None)
        reply = word or "unknown"
        if "[[ ## " in everything:  # DSPy's chat adapter format
            return f"[[ ## answer ## ]]\n{reply}\n\n[[ ## completed ## ]]"
        return reply
    return answer


# ------------------------------------------------------------------------------ methods
def run_initial(task: dict, ctx: dict) -> dict[str, Any]:
    layer = lt.TLayer(INSTRUCTION + "\n{}", lt.nn.LLM(ctx["backend"](), temperature=0))
    return {"test": _ours_test(layer, task, ctx), "metric_calls": 0, "to_optimum": None, "tokens": 0}


def _pairs(rows: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    return [x for x, _ in rows], [y for _, y in rows]


def _ours_metric(ctx: dict) -> Callable[[str, str], Any]:
    if ctx["task"] == "synthetic":
        labels = ctx["labels"]
        return lambda pred, target: feedback_metric(pred, target, f"c{labels.index(target)}")
    return lambda pred, target: (1.0, "Correct.") if pred.strip().lower().startswith(target) else (
        0.0, f"Wrong: the answer should be {target!r}, the output was {pred.strip()[:80]!r}.")


def _ours_test(layer: Any, task: dict, ctx: dict) -> float:
    x, y = _pairs(task["test"])
    return lt.evaluate(layer, x, y, _ours_metric(ctx), reduce="mean")


def run_ours(task: dict, ctx: dict) -> dict[str, Any]:
    layer = lt.TLayer(INSTRUCTION + "\n{}", lt.nn.LLM(ctx["backend"](), temperature=0))
    opt = lt.optim.GEPA(layer.named_text_parameters(), module=layer, metric=_ours_metric(ctx),
                        reflection_engine=ctx["backend"](), trainset=_pairs(task["train"]),
                        valset=_pairs(task["val"]), minibatch=3, max_metric_calls=ctx["budget"],
                        seed=ctx["seed"], perfect_score=1.0)
    need = opt.estimate()["metric_calls"]
    opt.fit()
    if opt.step_count == 0:
        log(f"ours: the budget ({ctx['budget']}) is below one step ({need} metric calls: the valset twice plus "
            "two minibatches); raise --budget or lower --val-size")
    means = opt.scores.mean(axis=1)
    first = next((lin["metric_calls"] for lin, m in zip(opt.lineage, means) if m >= 1.0), None)
    return {"test": _ours_test(layer, task, ctx), "metric_calls": opt.metric_calls, "to_optimum": first,
            "tokens": opt.budget.tokens, "candidates": len(opt.pool)}


def _dspy_setup(task: dict, ctx: dict) -> tuple[Any, Any, list, list, list, Callable]:
    import dspy

    lm = dspy.LM(f"openai/{ctx['model']}", api_base=ctx["base_url"], api_key=KEY, temperature=0.0,
                 cache=False, max_tokens=1000)
    dspy.configure(lm=lm)

    class Label(dspy.Signature):
        __doc__ = INSTRUCTION
        item: str = dspy.InputField()
        answer: str = dspy.OutputField()

    program = dspy.Predict(Label)

    def ex(rows: list[tuple[str, str]]) -> list:
        return [dspy.Example(item=x, answer=y).with_inputs("item") for x, y in rows]

    metric_fn = _ours_metric(ctx)

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        score, fb = metric_fn(str(getattr(pred, "answer", "")), gold.answer)
        return dspy.Prediction(score=score, feedback=fb) if pred_name is not None else score

    return lm, program, ex(task["train"]), ex(task["val"]), ex(task["test"]), metric


def _dspy_test(program: Any, test: list, metric: Callable) -> float:
    return statistics.mean(float(metric(e, program(item=e.item))) for e in test)


def _tokens(lm: Any) -> int:
    total = 0
    for h in lm.history:
        usage = h.get("usage") or {}
        total += int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
    return total


def run_dspy_gepa(task: dict, ctx: dict) -> dict[str, Any]:
    import dspy

    lm, program, train, val, test, metric = _dspy_setup(task, ctx)
    reflection = dspy.LM(f"openai/{ctx['model']}", api_base=ctx["base_url"], api_key=KEY, temperature=0.0,
                         cache=False, max_tokens=2000)

    def gepa_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        score, fb = _ours_metric(ctx)(str(getattr(pred, "answer", "")), gold.answer)
        return dspy.Prediction(score=score, feedback=fb)

    opt = dspy.GEPA(metric=gepa_metric, max_metric_calls=ctx["budget"], reflection_lm=reflection,
                    reflection_minibatch_size=3, track_stats=True, seed=ctx["seed"], num_threads=8)
    best = opt.compile(program, trainset=train, valset=val)
    res = best.detailed_results
    # gepa records a candidate's discovery budget *before* its own validation; ours (lineage
    # "metric_calls") after it. Add the validation so both count the calls until the optimum is known.
    first = next((c + len(val) for c, s in zip(res.discovery_eval_counts, res.val_aggregate_scores) if s >= 1.0),
                 None)
    return {"test": _dspy_test(best, test, metric), "metric_calls": res.total_metric_calls, "to_optimum": first,
            "tokens": _tokens(lm) + _tokens(reflection), "candidates": len(res.candidates)}


def run_dspy_bootstrap(task: dict, ctx: dict) -> dict[str, Any]:
    import dspy

    lm, program, train, val, test, metric = _dspy_setup(task, ctx)
    calls = {"n": 0}

    def counted(gold, pred, trace=None):
        calls["n"] += 1
        return metric(gold, pred, trace)

    # Each candidate program bootstraps on the trainset and is scored on the valset; three baseline
    # programs come on top. Size the number of candidates to the budget (reported calls are counted).
    n_cands = max(1, ctx["budget"] // (len(train) + len(val)) - 3)
    opt = dspy.BootstrapFewShotWithRandomSearch(metric=counted, max_bootstrapped_demos=4, max_labeled_demos=4,
                                                num_candidate_programs=n_cands, num_threads=8)
    best = opt.compile(program, trainset=train, valset=val)
    return {"test": _dspy_test(best, test, metric), "metric_calls": calls["n"], "to_optimum": None,
            "tokens": _tokens(lm)}


METHODS = {"initial": run_initial, "ours": run_ours, "dspy_gepa": run_dspy_gepa,
           "dspy_bootstrap": run_dspy_bootstrap}


# ------------------------------------------------------------------------------ driver
def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stat(key: str) -> Any:
        vals = [r[key] for r in rows if r.get(key) is not None]
        if not vals:
            return None
        return {"mean": statistics.mean(vals), "std": statistics.pstdev(vals) if len(vals) > 1 else 0.0}

    return {"test": stat("test"), "metric_calls": stat("metric_calls"), "to_optimum": stat("to_optimum"),
            "reached_optimum": sum(r.get("to_optimum") is not None for r in rows), "tokens": stat("tokens"),
            "seconds": stat("seconds"), "runs": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["synthetic", "sentiment"], default="synthetic")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=400, help="metric calls per method")
    ap.add_argument("--categories", type=int, default=12, help="(a) number of categories")
    ap.add_argument("--methods", default="initial,ours,dspy_gepa,dspy_bootstrap")
    ap.add_argument("--base-url", default=None, help="(b) the OpenAI-compatible URL (e.g. langtorch serve)")
    ap.add_argument("--model", default="model")
    ap.add_argument("--val-size", type=int, default=None, help="use only the first N validation examples")
    ap.add_argument("--smoke", action="store_true", help="1 seed, 6 categories, budget 80")
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.categories, args.budget = 1, 6, 80
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown methods {unknown}; choose from {sorted(METHODS)}")
    try:
        import dspy  # noqa: F401
        import gepa  # noqa: F401

        have_dspy = True
    except ImportError:
        have_dspy = False
        log("dspy/gepa are not installed in this environment (pip install dspy gepa): the DSPy methods are "
            "skipped; ours runs against the initial prompt.")
    if args.task == "sentiment" and not args.base_url:
        ap.error("--task sentiment needs --base-url (e.g. start `langtorch serve` and pass its /v1 URL)")

    results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    skipped: list[str] = []
    server = None
    counts = {"model": 0, "feedback": 0, "reflect": 0}
    if args.task == "synthetic":
        server = OpenAIServer(scripted_responder(counts)).__enter__()
        base_url = server.url
    else:
        base_url = args.base_url
    try:
        for seed in range(args.seeds):
            if args.task == "synthetic":
                task = synthetic_task(seed, args.categories)
            else:
                from langtorch.datasets import load_sentiment

                task = {}
                for name in ("train", "val", "test"):
                    xs, ys = load_sentiment(name)
                    task[name] = list(zip(xs.tolist(), ys.tolist()))
                task["labels"] = sorted({y for _, y in task["train"]})
            if args.val_size:
                task["val"] = task["val"][: args.val_size]
            ctx = {"task": args.task, "seed": seed, "budget": args.budget, "base_url": base_url, "model": args.model,
                   "labels": task["labels"],
                   "backend": lambda: OpenAIBackend(args.model, base_url=base_url, api_key=KEY, max_concurrency=16)}
            for m in methods:
                if m.startswith("dspy") and not have_dspy:
                    if m not in skipped:
                        skipped.append(m)
                    continue
                for key in counts:
                    counts[key] = 0
                t0 = time.perf_counter()
                row = METHODS[m](task, ctx)
                row["seconds"] = time.perf_counter() - t0
                row["seed"] = seed
                if args.task == "synthetic":
                    row["requests"] = dict(counts)
                results[m].append(row)
                log(f"seed {seed} {m}: {json.dumps({k: v for k, v in row.items() if k != 'requests'})}")
    finally:
        if server is not None:
            server.__exit__(None, None, None)

    summary = {m: summarize(rows) for m, rows in results.items() if rows}
    print(json.dumps({"bench": "gepa", "task": args.task, "seeds": args.seeds, "budget": args.budget,
                      "categories": args.categories if args.task == "synthetic" else None,
                      "skipped": skipped, "methods": summary}))
    print("\n| method | test acc | metric calls | calls to val 100% (runs reaching it) | tokens | seconds |")
    print("|---|---|---|---|---|---|")
    fmt = lambda s, p=3: "—" if s is None else f"{s['mean']:.{p}f} ± {s['std']:.{p}f}"  # noqa: E731
    for m, s in summary.items():
        print(f"| {m} | {fmt(s['test'])} | {fmt(s['metric_calls'], 0)} | {fmt(s['to_optimum'], 0)} "
              f"({s['reached_optimum']}/{len(s['runs'])}) | {fmt(s['tokens'], 0)} | {fmt(s['seconds'], 1)} |")
    for m in skipped:
        print(f"| {m} | skipped: dspy/gepa not installed | | | | |")


if __name__ == "__main__":
    main()
