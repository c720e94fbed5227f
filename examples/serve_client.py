"""Call a served local model with the official `openai` client (chat, streaming, embeddings).

Against a running server:
    langtorch serve                                   # in another shell
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/serve_client.py

Without OPENAI_BASE_URL the script starts the same server in a background thread first.
"""

import contextlib
import os

import numpy as np
from openai import OpenAI


@contextlib.contextmanager
def server_url():
    if os.environ.get("OPENAI_BASE_URL"):
        yield os.environ["OPENAI_BASE_URL"]
        return
    from langtorch.backends import LocalBackend
    from langtorch.serve import Server, create_app

    backend = LocalBackend()
    with Server(create_app(backend, embedding_backend=backend)) as server:
        print(f"started a server at {server.url}")
        yield server.url


with server_url() as url:
    client = OpenAI(base_url=url, api_key=os.environ.get("LANGTORCH_API_KEY", "unused"))
    print("models:", [m.id for m in client.models.list().data])

    question = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                           max_tokens=16)
    print("answer:", reply.choices[0].message.content)
    print("usage:", reply.usage.prompt_tokens, "prompt +", reply.usage.completion_tokens,
          "completion tokens")

    print("streamed: ", end="")
    for chunk in client.chat.completions.create(model="smollm2", messages=question,
                                                temperature=0, max_tokens=16, stream=True):
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    print()

    vectors = client.embeddings.create(model="minilm", input=["a cat", "a kitten", "a stock market"])
    e = np.array([d.embedding for d in vectors.data])
    print(f"cosine(cat, kitten) = {e[0] @ e[1]:.2f}, cosine(cat, stock market) = {e[0] @ e[2]:.2f}")
