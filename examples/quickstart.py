"""langtorch quickstart: TextTensors, templates, a prompt grid, modules, and persistence.

Run: python examples/quickstart.py
"""

import contextlib
import os
import tempfile

import torch

import langtorch as lt
import langtorch.functional as F
from langtorch.backends import LocalBackend, OpenAIBackend
from langtorch.testing import OpenAIServer

# 1. Templates: `prompt + inputs` fills placeholders (safely: no attribute access, no re-parsing).
prompt = lt.TextTensor("Translate into French: {input}")
print(prompt + lt.TextTensor("Hello, world!"))

# Without placeholders, + concatenates.
print(lt.TextTensor("Model, please answer: ") + lt.TextTensor("why is the sky blue?"))

# 2. Batches broadcast like numpy: a [P, 1] grid of templates times [N] inputs gives [P, N] prompts.
templates = lt.TextTensor([["Define {}."], ["Give an everyday example of {}."]])  # [2, 1]
topics = lt.TextTensor(["entropy", "recursion", "irony"])  # [3]
grid = templates + topics
print("prompt grid", grid.shape)
print(grid)

# Keyed records fill named placeholders; `*` is the strict fill.
poems = lt.TextTensor("Write a {form} about {theme}.") * lt.TextTensor(
    {"theme": ["spring", "the sea"], "form": "haiku"}
)
print(poems.tolist())

# 3. Metadata flows with the entries through indexing and reshaping.
grid.metadata["topic"] = topics.tolist()  # broadcast to [2, 3]
print("metadata of grid[1, 2]:", grid[1, 2].metadata)
print("joined row 0:", grid[0].join(" | "))


# 4. An LLM step: each entry of the [2, 3] prompt grid is one request, sent concurrently.
# With OPENAI_API_KEY set (optionally OPENAI_BASE_URL, LANGTORCH_MODEL) it uses that server;
# otherwise a loopback OpenAI-compatible server on 127.0.0.1 answers with echoes.
with contextlib.ExitStack() as stack:
    if os.environ.get("OPENAI_API_KEY"):
        backend = OpenAIBackend(os.environ.get("LANGTORCH_MODEL", "gpt-4o-mini"))
    else:
        server = stack.enter_context(OpenAIServer())
        backend = OpenAIBackend("loopback", base_url=server.url, api_key="sk-loopback")
    llm = lt.nn.LLM(backend, system="Answer in one short sentence.", temperature=0)
    answers = llm(grid)
    print("answers", answers.shape, "|", answers[1, 2])
    print("tokens used:", backend.usage.prompt_tokens, "in,", backend.usage.completion_tokens, "out")


# 5. Local models, offline, in JAX: retrieval with MiniLM embeddings, chat with SmolLM2.
notes = lt.TextTensor([
    "The Eiffel Tower is in Paris.",
    "Photosynthesis turns light into chemical energy.",
    "The Great Wall of China is thousands of kilometres long.",
    "Mitochondria are the powerhouse of the cell.",
]).embed()  # .embedding has shape [4, 384]
questions = lt.TextTensor(["Where is the Eiffel Tower?", "How do plants use sunlight?"]).embed()
scores, idx = F.topk(questions.embedding, notes.embedding, k=1)
context = notes[idx[:, 0]]  # index with the top-k result
for q, c, s in zip(questions.tolist(), context.tolist(), scores[:, 0]):
    print(f"retrieved for {q!r}: {c!r} (cosine {s:.2f})")

local_llm = lt.nn.LLM(LocalBackend(), temperature=0, max_tokens=24)
rag = lt.TextTensor("Answer from the context.\nContext: {context}\nQuestion: {question}")
answers = local_llm(rag * lt.TextTensor({"context": context, "question": questions}))
print("local answers:", answers.tolist())
print("local usage:", answers.metadata["completion_tokens"].tolist(), "completion tokens")


# 6. Modules are torch.nn.Modules: compose them, with Python control flow inside forward.
class Tidy(lt.TModule):
    def forward(self, x):
        return x.map(str.strip)


class Route(lt.TModule):
    """Short questions go one way, long ones another."""

    def __init__(self):
        super().__init__()
        self.short = lt.TLayer("Answer in one word: {}")
        self.long = lt.TLayer("Answer step by step: {}")

    def forward(self, x):
        return self.short(x) if len(str(x)) < 20 else self.long(x)


pipeline = lt.TChain(Tidy(), Route())
print(pipeline(lt.TextTensor("  Capital of France?  ")))
print(pipeline(lt.TextTensor("  Why do leaves change colour in autumn?  ")))

# 7. state_dict holds the text parameters as plain strings: torch.save, then weights_only load.
pipeline[1].short.prompt.data = "Reply with a single word: {}"
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "pipeline.pth")
    torch.save(pipeline.state_dict(), path)
    restored = lt.TChain(Tidy(), Route())
    restored.load_state_dict(torch.load(path, weights_only=True))
print("restored prompt:", restored[1].short.prompt)
print(restored(lt.TextTensor("Capital of Italy?")))


# 8. RAG with lt.Index and the lt.nn.Retrieve module: top-k passages per question, then a prompt.
facts = [
    "The Eiffel Tower is in Paris and was finished in 1889.",
    "Honey bees make honey from flower nectar.",
    "The Nile flows north into the Mediterranean Sea.",
    "Mount Everest is the highest mountain above sea level.",
    "Octopuses have three hearts.",
]
index = lt.Index(facts, metadata={"source": [f"fact-{i}" for i in range(len(facts))]})  # local MiniLM
with tempfile.TemporaryDirectory() as tmp:
    index.save(tmp)  # embeddings.safetensors + index.json; no pickle
    index = lt.Index.load(tmp)
retrieve = lt.nn.Retrieve(index, k=2)
asked = lt.TextTensor(["Where is the Eiffel Tower?", "What do bees make?"])
passages = retrieve(asked)  # [2, 2]: metadata "score", "index", "source"
print("RAG passages", passages.shape, "| best for", repr(asked[0].item()) + ":", repr(passages[0, 0].item()),
      f"({passages.metadata['source'][0, 0]}, cosine {passages.metadata['score'][0, 0]:.2f})")
rag_answers = local_llm(rag * lt.TextTensor({"context": passages.join("\n"), "question": asked}))
print("RAG answers:", rag_answers.tolist())


# 9. Tools: a function with type hints and a docstring is a tool; the LLM runs the tool-call loop
# (the model asks for calls, they run, their results go back, until it answers).
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text whose words to count.
    """
    return len(text.split())


with contextlib.ExitStack() as stack:
    if os.environ.get("OPENAI_API_KEY"):
        backend = OpenAIBackend(os.environ.get("LANGTORCH_MODEL", "gpt-4o-mini"))
    else:  # the loopback server calls the first tool with example arguments, then echoes
        server = stack.enter_context(OpenAIServer())
        backend = OpenAIBackend("loopback", base_url=server.url, api_key="sk-loopback")
    agent = lt.nn.LLM(backend, tools=[word_count], temperature=0)
    answer = agent(lt.TextTensor("How many words are in 'the quick brown fox'?"))
    print("tool calls:", [(c["name"], c["arguments"], c["result"]) for c in answer.metadata["tool_calls"]])
    print("tool answer:", answer.item())
