"""The seed article's examples, run as written there (only the network calls are replaced by
deterministic local modules; the LLM versions run against the loopback server elsewhere)."""

import io

import torch

import langtorch as lt
from langtorch import TChain, TModule


def test_section_2_1_prompt_plus_input():
    prompt = lt.TextTensor("请翻译以下句子：{input}")
    user_input = lt.TextTensor("Hello, world!")
    formatted_prompt = prompt + user_input
    assert str(formatted_prompt) == "请翻译以下句子：Hello, world!"
    assert "TextTensor(" in repr(formatted_prompt)


def test_section_3_1_basic_and_batched(capsys):
    t1 = lt.TextTensor("模型，请问：")
    t2 = lt.TextTensor("天空为什么是蓝色的？")
    combined = t1 + t2
    print(f"基础加法: {combined}")
    batch_prompts = lt.TextTensor(["写一首关于{theme}的诗"] * 3)
    themes = lt.TextTensor(["春天", "夏天", "秋天"])
    batched = batch_prompts + themes
    print(f"批处理加法:\n{batched}")
    out = capsys.readouterr().out
    assert "基础加法: 模型，请问：天空为什么是蓝色的？" in out
    assert batched.tolist() == ["写一首关于春天的诗", "写一首关于夏天的诗", "写一首关于秋天的诗"]
    sentiment_scores = torch.tensor([0.8, -0.2, 0.5])
    batched.metadata["sentiment"] = sentiment_scores.numpy()
    assert batched[0].metadata["sentiment"] == torch.tensor(0.8).item()


# ---- Section 4.2, verbatim except the simulated LLM / search calls ----------------------------


class QAModule(TModule):
    """简单的问答模块。"""

    def forward(self, question: lt.TextTensor) -> lt.TextTensor:
        prompt = lt.TextTensor(f"请直接回答以下问题：\n\n问题：{question}\n\n答案：")
        assert "问题：" in str(prompt)
        answer_text = lt.TextTensor("这是根据模型知识生成的答案。")  # 模拟
        answer_text.metadata["module"] = "qa"
        return answer_text


class SelfEvalModule(TModule):
    """让LLM评估自己答案的置信度（0-1分）。"""

    def __init__(self, score="0.65"):
        super().__init__()
        self.score = score

    def forward(self, qa_pair: lt.TextTensor) -> lt.TextTensor:
        answer = qa_pair
        score_text = lt.TextTensor(self.score)  # 模拟返回一个分数字符串
        try:
            score = float(str(score_text).strip())
        except ValueError:
            score = 0.5
        answer.metadata["confidence"] = score
        return answer


class FakeSearch(TModule):
    def forward(self, query: lt.TextTensor) -> lt.TextTensor:
        output = lt.TextTensor(f"results for {query}")
        output.metadata["source"] = "web_search"
        return output


class SearchAugmentModule(TModule):
    """当置信度低时，进行搜索并生成新答案。"""

    def __init__(self, search_tool):
        super().__init__()
        self.search = search_tool

    def forward(self, question: lt.TextTensor) -> lt.TextTensor:
        search_results = self.search(question)
        augmented_prompt = lt.TextTensor(
            f"基于以下搜索信息，请重新回答这个问题：\n\n问题：{question}\n\n搜索信息：\n{search_results}\n\n增强后的答案："
        )
        assert "results for" in str(augmented_prompt)
        augmented_answer = lt.TextTensor("这是基于网络搜索信息生成的增强答案。")
        augmented_answer.metadata["module"] = "augmented_qa"
        augmented_answer.metadata["source"] = "web"
        return augmented_answer


class ConditionalQAPipeline(TModule):
    """带有自评估和条件搜索的问答管道。"""

    def __init__(self, qa_module, eval_module, search_module, threshold=0.7):
        super().__init__()
        self.qa = qa_module
        self.evaluator = eval_module
        self.searcher = search_module
        self.threshold = threshold

    def forward(self, question: lt.TextTensor) -> lt.TextTensor:
        initial_answer = self.qa(question)
        evaluated_answer = self.evaluator(initial_answer)
        confidence = evaluated_answer.metadata.get("confidence", 0.0)
        if confidence >= self.threshold:
            print(f"置信度高 ({confidence:.2f})， 返回初始答案。")
            evaluated_answer.metadata["final"] = True
            return evaluated_answer
        else:
            print(f"置信度低 ({confidence:.2f})， 触发搜索增强。")
            augmented_answer = self.searcher(question)
            augmented_answer.metadata["final"] = True
            augmented_answer.metadata["original_confidence"] = confidence
            return augmented_answer


def test_section_4_conditional_pipeline(capsys):
    qa = QAModule()
    augmenter = SearchAugmentModule(FakeSearch())
    low = ConditionalQAPipeline(qa, SelfEvalModule("0.65"), augmenter, threshold=0.7)
    result_low = low(lt.TextTensor("2025年诺贝尔文学奖得主会是谁？"))
    assert str(result_low) == "这是基于网络搜索信息生成的增强答案。"
    assert result_low.metadata["original_confidence"] == 0.65 and result_low.metadata["final"]
    high = ConditionalQAPipeline(qa, SelfEvalModule("0.9"), augmenter, threshold=0.7)
    result_high = high(lt.TextTensor("水的化学式是什么？"))
    print(f"答案元数据：{result_high.metadata}")
    assert result_high.metadata["module"] == "qa" and result_high.metadata["confidence"] == 0.9
    out = capsys.readouterr().out
    assert "置信度低 (0.65)" in out and "置信度高 (0.90)" in out
    assert "'confidence': 0.9" in out

    # 5.1: batch processing by looping over a TextTensor
    questions = lt.TextTensor(["什么是机器学习？", "解释一下神经网络。", "Python的GIL是什么？"])
    batch_results = [low(q) for q in questions]
    assert len(batch_results) == 3


def test_section_3_2_tchain_of_three_and_5_2_persistence(tmp_path):
    class Clean(TModule):
        def forward(self, x):
            return x.map(str.strip)

    class FakeLLM(lt.TLayer):
        def __init__(self):
            super().__init__("Answer briefly: {}")

    class Post(TModule):
        def forward(self, x):
            out = x.map(lambda s: s + " [checked]")
            out.metadata["source"] = "post"
            return out

    module1, module2, module3 = Clean(), FakeLLM(), Post()
    my_chain = TChain(module1, module2, module3)
    input_tensor = lt.TextTensor("  原始用户查询  ")
    output_tensor = my_chain(input_tensor)
    assert str(output_tensor) == "Answer briefly: 原始用户查询 [checked]"

    pipeline = ConditionalQAPipeline(QAModule(), SelfEvalModule(), my_chain, threshold=0.7)
    my_chain[1].prompt.data = "Answer in detail: {}"
    path = tmp_path / "conditional_qa_pipeline.pth"
    torch.save(pipeline.state_dict(), path)
    fresh_chain = TChain(Clean(), FakeLLM(), Post())
    loaded_pipeline = ConditionalQAPipeline(QAModule(), SelfEvalModule(), fresh_chain, threshold=0.7)
    loaded_pipeline.load_state_dict(torch.load(path))  # the default is weights_only=True
    loaded_pipeline.eval()
    assert str(fresh_chain[1].prompt) == "Answer in detail: {}"
    buf = io.BytesIO()
    torch.save(pipeline.state_dict(), buf)
    buf.seek(0)
    assert torch.load(buf, weights_only=True)["searcher.1.prompt"] == "Answer in detail: {}"
