"""Grammar-constrained decoding: OpenAI request fields -> per-request token masks.

Structured outputs (``response_format`` JSON object / JSON schema), vLLM-style ``guided_regex``
and ``guided_choice``, and tool calls are compiled by **llguidance** into matchers that say,
before each decode step, which token ids may come next. The engine masks the other logits to
``-inf``, samples, and advances the matcher with the sampled id.

Pieces, lowest first:

* :class:`TokenVocabulary` — a tokenizer as the grammar engine needs it (bytes per id, EOS and
  special ids), from GGUF metadata or a ``tokenizers.Tokenizer``: every architecture the
  loaders support reduces to it.
* :func:`constraint_from_request` / :func:`tool_call_constraint` — request fields ->
  :class:`Constraint` (tokenizer-independent; bad input -> ``BadRequestError`` naming the
  schema path or the request field).
* :class:`GrammarCompiler` — one per tokenizer: compiles and caches grammars
  (LRU by constraint), makes a :class:`TokenMatcher` per sequence, fills many packed masks
  in parallel.

Why llguidance (measured with ``tests/benchmarks/bench_grammar_masks.py``: a JSON schema with
nested objects, arrays, enums, numbers and a pattern; 200-step random walks over allowed tokens;
a shared 2-core CPU, so wall times are noisy):

================  ===============  ==================  ==================================
tokenizer         llguidance        xgrammar            outlines-core
================  ===============  ==================  ==================================
SmolLM2 (49k,     setup 0.43 s,     setup 3.6-4.5 s,    setup 0.08-0.35 s, compile 0.7-1 s,
byte-level BPE)   mask p50 7.5 µs   mask p50 8.2 µs     mask p50 1.4 ms, advance 1-1.5 ms
Gemma-3 (262k,    mask p50 ~1 ms    mask p50 22 µs      compile 8.9 s, advance 2.4 ms
SentencePiece)
================  ===============  ==================  ==================================

* outlines-core compiles a regex DFA over the whole vocabulary per schema (seconds for a 262k
  vocabulary, per new schema: every distinct request schema would stall the engine) and its
  advance/mask calls cost milliseconds; out.
* xgrammar is the fastest per mask on the large vocabulary, but ``import xgrammar`` imports
  torch (and requires torch, triton and transformers): ``langtorch.functional`` never imports
  torch (the dependency rule), and a 1 GB dependency for a CPU/TPU JAX engine is out of
  proportion.
* llguidance has no Python dependencies, builds a tokenizer in well under a second for a 49k
  vocabulary, compiles a schema lazily in ~1 ms (so every request may bring its own schema),
  computes a mask in µs on SmolLM2, fills a whole batch's masks in parallel (LLExecutor,
  GIL released), supports rollback and the full JSON-schema / regex / Lark surface with clear
  errors, and is what vLLM, SGLang and llama.cpp use. Its masks on the 262k vocabulary are
  slower (~1 ms median) but still below one decode step of such a model on CPU.

Example:
    >>> from langtorch.functional.constrain import (GrammarCompiler, TokenVocabulary,
    ...                                             constraint_from_request)
    >>> vocab = TokenVocabulary([b"", b"pos", b"neg", b"itive", b"ative"], eos_ids=[0])
    >>> m = GrammarCompiler(vocab).matcher(
    ...     constraint_from_request(guided_choice=["positive", "negative"]))
    >>> m.allowed_mask().nonzero()[0].tolist()
    [1, 2]
    >>> m.advance(2), m.allowed_mask().nonzero()[0].tolist()
    (True, [4])
"""

from langtorch.functional.constrain._matcher import (
    GrammarCompiler,
    TokenMatcher,
    bitmask_words,
    unpack_bitmask,
)
from langtorch.functional.constrain._request import (
    Constraint,
    constraint_from_request,
    tool_call_constraint,
)
from langtorch.functional.constrain._vocab import TokenVocabulary

__all__ = [
    "Constraint",
    "GrammarCompiler",
    "TokenMatcher",
    "TokenVocabulary",
    "bitmask_words",
    "constraint_from_request",
    "tool_call_constraint",
    "unpack_bitmask",
]
