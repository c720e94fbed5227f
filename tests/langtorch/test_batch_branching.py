"""The seed's conditional QA pipeline (section 4) on a batch: the search branch runs only for the
low-confidence entries (counted at the loopback server), and the merged output keeps exact
entry-level lineage from both branches, so loss.backward() routes feedback per branch."""

import re

import numpy as np
import pytest

import langtorch as lt
from langtorch import TModule
from langtorch.autograd import parameter_sources
from langtorch.backends import OpenAIBackend

N = 20
LOW = {i for i in range(N) if i % 4 == 1}  # the questions the model is unsure about


def question(i):
    return f"Q{i:02d}: what happened in year {1900 + i}?"


class QAModule(TModule):
    def __init__(self, llm):
        super().__init__()
        self.llm = llm
        self.prompt = lt.TextParameter("请直接回答以下问题：\n\n问题：{question}\n\n答案：")

    def forward(self, question):
        answer = self.llm(self.prompt + question)
        answer.metadata["module"] = "qa"
        return answer


class SelfEvalModule(TModule):
    def __init__(self, llm):
        super().__init__()
        self.llm = llm

    def forward(self, answer):
        scores = self.llm(lt.TextTensor("仅输出一个0到1之间的小数。\n答案：{answer}\n评分：") + answer)

        def parse(s):
            try:
                return float(s.strip())
            except ValueError:
                return 0.5

        answer.metadata["confidence"] = np.array([parse(s) for s in scores.tolist()])
        return answer


class SearchAugmentModule(TModule):
    def __init__(self, llm, index):
        super().__init__()
        self.llm = llm
        self.index = index
        self.prompt = lt.TextParameter("基于以下搜索信息，请重新回答这个问题：\n\n问题：{question}\n\n搜索信息：\n{results}\n\n增强后的答案：")

    def forward(self, question):
        results = question.map(lambda q: self.index.get(q[:3], "（无结果）"))
        answer = self.llm(self.prompt * lt.TextTensor({"question": question, "results": results}))
        answer.metadata["module"] = "augmented_qa"
        answer.metadata["source"] = "web"
        return answer


class BatchConditionalQA(TModule):
    def __init__(self, qa, evaluator, searcher, threshold=0.7):
        super().__init__()
        self.qa, self.evaluator, self.searcher, self.threshold = qa, evaluator, searcher, threshold

    def forward(self, question):
        answer = self.evaluator(self.qa(question))
        confidence = answer.metadata["confidence"]
        low = confidence < self.threshold  # a bool array over the batch
        if not low.any():
            return answer
        augmented = self.searcher(question[low])  # the search branch, only where needed
        augmented.metadata["original_confidence"] = confidence[low]
        return answer.masked_scatter(low, augmented)


def responder(prompts_seen):
    def answer(body):
        prompt = body["messages"][-1]["content"]
        if "How should the prompt change" in prompt:  # text-gradient requests (backward)
            return "Feedback on " + " ".join(sorted(set(re.findall(r"Q\d\d", prompt))))
        if "pieces of feedback" in prompt:  # merging: keep which questions each piece was about
            return "Merged: " + " ".join(sorted(set(re.findall(r"Q\d\d", prompt))))
        i = int(re.search(r"Q(\d\d)", prompt).group(1))
        if prompt.startswith("请直接回答"):
            return f"initial answer Q{i:02d}"
        if prompt.startswith("仅输出"):
            return "0.30" if i in LOW else "0.95"
        if prompt.startswith("基于以下搜索信息"):
            prompts_seen.append(i)
            return f"augmented answer Q{i:02d}"
        return "unexpected request"

    return answer


def _pipeline(srv):
    backend = OpenAIBackend("loopback-model", base_url=srv.url, api_key="sk-loopback", max_retries=0)
    llm = lt.nn.LLM(backend, temperature=0)
    index = {f"Q{i:02d}": f"search result for {i}" for i in range(N)}
    pipe = BatchConditionalQA(QAModule(llm), SelfEvalModule(llm), SearchAugmentModule(llm, index))
    return pipe, backend


def test_batch_of_20_calls_the_search_branch_only_for_low_confidence_entries(srv):
    searched = []
    srv.responder = responder(searched)
    pipe, _ = _pipeline(srv)
    out = pipe(lt.TextTensor([question(i) for i in range(N)]))
    # 20 answers + 20 self-evaluations + one augmented request per low-confidence entry.
    assert srv.chat_requests == 2 * N + len(LOW)
    assert sorted(searched) == sorted(LOW)
    assert out.shape == (N,)
    expected = [f"augmented answer Q{i:02d}" if i in LOW else f"initial answer Q{i:02d}" for i in range(N)]
    assert out.tolist() == expected
    assert out.metadata["module"].tolist() == ["augmented_qa" if i in LOW else "qa" for i in range(N)]
    assert out.metadata["source"].tolist() == ["web" if i in LOW else None for i in range(N)]
    orig = out.metadata["original_confidence"]
    assert all((orig[i] == 0.3) if i in LOW else np.isnan(orig[i]) for i in range(N))
    conf = out.metadata["confidence"]  # the initial answers' scores, where they were kept
    assert all(np.isnan(conf[i]) if i in LOW else conf[i] == 0.95 for i in range(N))
    assert out.metadata["model"].tolist() == ["loopback-model"] * N
    assert not out.is_template  # model output stays data


def test_merged_output_keeps_lineage_from_both_branches_and_backward_routes_per_branch(srv):
    searched = []
    srv.responder = responder(searched)
    pipe, backend = _pipeline(srv)
    out = pipe(lt.TextTensor([question(i) for i in range(N)]))
    assert out.grad_fn is not None and out.grad_fn.op == "masked_scatter"
    qa_src = parameter_sources(out, pipe.qa.prompt)
    aug_src = parameter_sources(out, pipe.searcher.prompt)
    assert qa_src.tolist() == [-1 if i in LOW else 0 for i in range(N)]
    assert aug_src.tolist() == [0 if i in LOW else -1 for i in range(N)]

    targets = lt.TextTensor([f"T{i:02d}" for i in range(N)])
    loss = lt.nn.MetricLoss(lambda p, t: (0.0, f"wrong for {t}"))(out, targets)
    loss.backward(feedback_engine=backend)
    assert pipe.qa.prompt.grad.metadata["count"] == N - len(LOW)
    assert pipe.searcher.prompt.grad.metadata["count"] == len(LOW)
    qa_grad, aug_grad = str(pipe.qa.prompt.grad), str(pipe.searcher.prompt.grad)
    for i in range(N):
        tag = f"Q{i:02d}"
        assert (tag in aug_grad) == (i in LOW) and (tag in qa_grad) == (i not in LOW), tag


def test_where_with_both_branches_computed_matches_masked_scatter(srv):
    srv.responder = responder([])
    pipe, _ = _pipeline(srv)
    questions = lt.TextTensor([question(i) for i in range(N)])
    answer = pipe.evaluator(pipe.qa(questions))
    augmented = pipe.searcher(questions)  # every entry (more requests): the where() form
    merged = lt.where(answer.metadata["confidence"] >= 0.7, answer, augmented)
    assert merged.tolist() == pipe(questions).tolist()
    assert parameter_sources(merged, pipe.searcher.prompt).tolist() == [0 if i in LOW else -1 for i in range(N)]


def test_lineage_of_0d_and_permuted_merges_without_a_server():
    # 0-d operands: the merged hidden column is a 0-d object array (crashed the graph before).
    p, q = lt.TextParameter("a {}"), lt.TextParameter("b {}")
    for cond, src_p, src_q in [(False, -1, 0), (True, 0, -1), (np.bool_(False), -1, 0)]:
        w = lt.where(cond, p, q)
        assert w.item() == ("a {}" if cond else "b {}")
        assert int(parameter_sources(w, p)) == src_p and int(parameter_sources(w, q)) == src_q
    assert int(parameter_sources(p.masked_scatter(True, q), q)) == 0
    assert int(parameter_sources(p.index_put((), q), p)) == -1
    # values scattered in a permuted order keep their own entry numbers
    a = lt.TextParameter(["P0 {}", "P1 {}", "P2 {}"]) + lt.TextTensor(["x0", "x1", "x2"])
    qs = lt.TextParameter(["Q0 {}", "Q1 {}", "Q2 {}"])
    out = a.masked_scatter(np.array([True, False, True]), qs[np.array([2, 0])] + "v")
    assert out.tolist() == ["Q2 v", "P1 x1", "Q0 v"]
    assert parameter_sources(out, qs).tolist() == [2, -1, 0]


def test_the_articles_pipeline_as_written_explains_a_batch(srv):
    """The article's single-question pipeline (examples/conditional_qa.py, `if confidence >=
    threshold:`) runs as written on one question; given a batch, its `if` raises a langtorch
    error that names the batch forms above instead of numpy's "truth value is ambiguous"."""
    import runpy
    from pathlib import Path

    from langtorch.errors import LangTorchError, ShapeError

    example = runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "conditional_qa.py"),
                             run_name="conditional_qa")
    srv.responder = example["scripted_model"]
    backend = OpenAIBackend("loopback-model", base_url=srv.url, api_key="sk-loopback", max_retries=0)
    pipeline = example["build_pipeline"](backend)
    one = pipeline(lt.TextTensor("水的化学式是什么？"))
    assert one.metadata["final"] and one.metadata["confidence"] == 0.95
    batch = lt.TextTensor(["水的化学式是什么？", "2025年诺贝尔文学奖得主会是谁？"])
    with pytest.raises(ShapeError) as info:
        pipeline(batch)
    assert isinstance(info.value, (LangTorchError, ValueError))
    message = str(info.value)
    assert "metadata['confidence']" in message and "lt.where" in message and "masked_scatter" in message
    assert [str(pipeline(q)) for q in batch][0] == "水的化学式是 H₂O。"  # iterating works
