"""The LangTorch article's conditional QA pipeline (section 4), with real LLM calls.

answer -> self-evaluation -> threshold -> (low confidence) search-augmented answer.

The modules are the article's, nearly verbatim; where it wrote `call_llm_api(prompt)` they call a
`langtorch.nn.LLM`. It runs offline against `langtorch.testing.OpenAIServer` (a real HTTP server on
127.0.0.1, spoken to by the official openai client) with a scripted responder. To use a real
OpenAI-compatible server instead, set OPENAI_BASE_URL / OPENAI_API_KEY and LANGTORCH_MODEL.

Run: python examples/conditional_qa.py
"""

import io
import os

import torch

import langtorch as lt
from langtorch import TModule
from langtorch.backends import OpenAIBackend
from langtorch.testing import OpenAIServer


# --------------------------------------------------------------------------- the article's modules
class QAModule(TModule):
    """简单的问答模块。"""

    def __init__(self, llm):
        super().__init__()
        self.llm = llm

    def forward(self, question: lt.TextTensor) -> lt.TextTensor:
        prompt = lt.TextTensor("请直接回答以下问题：\n\n问题：{question}\n\n答案：") + question
        answer_text = self.llm(prompt)
        answer_text.metadata["module"] = "qa"
        return answer_text


class SelfEvalModule(TModule):
    """让LLM评估自己答案的置信度（0-1分）。"""

    def __init__(self, llm):
        super().__init__()
        self.llm = llm

    def forward(self, qa_pair: lt.TextTensor) -> lt.TextTensor:
        answer = qa_pair
        eval_prompt = lt.TextTensor(
            "请你以专家的身份，评估以下答案的确定性。如果答案基于广泛认可的事实，打高分；如果涉及推测或知识盲区，打低分。\n"
            "仅输出一个0到1之间的小数，不要任何其他文字。\n答案：{answer}\n评分："
        ) + answer
        score_text = self.llm(eval_prompt)
        try:
            score = float(str(score_text).strip())
        except ValueError:
            score = 0.5
        # 将分数作为元数据附加到原答案上，并返回原答案
        answer.metadata["confidence"] = score
        return answer


class WebSearchModule(TModule):
    """接收搜索查询，返回搜索结果摘要。(Offline: a small local index instead of a search API.)"""

    def __init__(self, index):
        super().__init__()
        self.index = index

    def forward(self, query: lt.TextTensor) -> lt.TextTensor:
        results = [v for k, v in self.index.items() if k in str(query)][:3]
        output = lt.TextTensor("\n\n".join(results) or "（无结果）", template=False)
        output.metadata["source"] = "web_search"
        return output


class SearchAugmentModule(TModule):
    """当置信度低时，进行搜索并生成新答案。"""

    def __init__(self, search_tool, llm):
        super().__init__()
        self.search = search_tool
        self.llm = llm

    def forward(self, question: lt.TextTensor) -> lt.TextTensor:
        # 1. 搜索
        search_results = self.search(question)
        # 2. 基于搜索结果生成答案
        augmented_prompt = lt.TextTensor(
            "基于以下搜索信息，请重新回答这个问题：\n\n问题：{question}\n\n搜索信息：\n{results}\n\n增强后的答案："
        ) * lt.TextTensor({"question": str(question), "results": str(search_results)})
        augmented_answer = self.llm(augmented_prompt)
        augmented_answer.metadata["module"] = "augmented_qa"
        augmented_answer.metadata["source"] = "web"
        return augmented_answer


class ConditionalQAPipeline(TModule):
    """带有自评估和条件搜索的问答管道。"""

    def __init__(self, qa_module, eval_module, search_module, threshold=0.7):
        super().__init__()
        # 将子模块注册为属性，这样它们的状态可以被保存/加载
        self.qa = qa_module
        self.evaluator = eval_module
        self.searcher = search_module
        self.threshold = threshold

    def forward(self, question: lt.TextTensor) -> lt.TextTensor:
        # 步骤1: 生成初始答案
        initial_answer = self.qa(question)
        # 步骤2: 自评估
        evaluated_answer = self.evaluator(initial_answer)
        confidence = evaluated_answer.metadata.get("confidence", 0.0)
        # 步骤3: 条件决策
        if confidence >= self.threshold:
            print(f"置信度高 ({confidence:.2f})， 返回初始答案。")
            evaluated_answer.metadata["final"] = True
            return evaluated_answer
        else:
            print(f"置信度低 ({confidence:.2f})， 触发搜索增强。")
            # 步骤4: 搜索并生成增强答案
            augmented_answer = self.searcher(question)
            augmented_answer.metadata["final"] = True
            augmented_answer.metadata["original_confidence"] = confidence
            return augmented_answer


# --------------------------------------------------------------------------- the loopback "model"
def scripted_model(body):
    """What the loopback server answers: a stand-in for a real model, keyed on the prompts."""
    prompt = body["messages"][-1]["content"]
    if prompt.startswith("请直接回答"):
        return "水的化学式是 H₂O。" if "水的化学式" in prompt else "可能是一位欧洲作家，但我不确定。"
    if prompt.startswith("请你以专家的身份"):
        return "0.95" if "H₂O" in prompt else "0.30"
    if prompt.startswith("基于以下搜索信息"):
        return "根据搜索信息：诺贝尔文学奖由瑞典学院在每年十月公布，公布之前无法确定得主。"
    return "（未知请求）"


SEARCH_INDEX = {
    "诺贝尔文学奖": "诺贝尔文学奖由瑞典学院评选，通常在每年十月上旬公布。",
    "诺贝尔": "诺贝尔奖自1901年起颁发。",
}


def build_pipeline(backend):
    llm = lt.nn.LLM(backend, temperature=0)
    qa = QAModule(llm)
    evaluator = SelfEvalModule(llm)
    search_tool = WebSearchModule(SEARCH_INDEX)
    augmenter = SearchAugmentModule(search_tool, llm)
    return ConditionalQAPipeline(qa, evaluator, augmenter, threshold=0.7)


def main(backend):
    # 创建条件管道
    pipeline = build_pipeline(backend)

    # 测试问题
    test_question_high = lt.TextTensor("水的化学式是什么？")
    test_question_low = lt.TextTensor("2025年诺贝尔文学奖得主会是谁？")

    print("测试高置信度问题：")
    result_high = pipeline(test_question_high)
    print(f"最终答案：{result_high}")
    print(f"答案元数据：{result_high.metadata}")

    print("\n" + "=" * 50 + "\n")

    print("测试低置信度问题：")
    result_low = pipeline(test_question_low)
    print(f"最终答案：{result_low}")
    print(f"答案元数据：{result_low.metadata}")

    # 5.1 批量处理多个问题 (one pipeline call per question, as in the article)
    questions = lt.TextTensor(["水的化学式是什么？", "2025年诺贝尔文学奖得主会是谁？"])
    batch_results = [pipeline(q) for q in questions]
    print("\n批量结果：", [str(r) for r in batch_results])

    # 5.2 持久化: the state dict loads with weights_only=True and holds no API key
    buffer = io.BytesIO()
    torch.save(pipeline.state_dict(), buffer)
    buffer.seek(0)
    loaded_pipeline = build_pipeline(backend)
    loaded_pipeline.load_state_dict(torch.load(buffer, weights_only=True))
    loaded_pipeline.eval()

    print(f"\n用量：{backend.usage}")
    return result_high, result_low


if __name__ == "__main__":
    if os.environ.get("OPENAI_BASE_URL") and os.environ.get("LANGTORCH_MODEL"):
        main(OpenAIBackend(os.environ["LANGTORCH_MODEL"]))
    else:
        with OpenAIServer(responder=scripted_model) as server:
            main(OpenAIBackend("loopback-model", base_url=server.url, api_key="sk-loopback"))
