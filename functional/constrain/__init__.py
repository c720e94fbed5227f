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

Why llguidance (measured with ``tests/benchmarks/bench_grammar_masks.py --gguf <gemma-3.gguf>``:
a JSON schema with nested objects, an array of enums, numbers and a pattern; 200-step random
walks over the allowed tokens; mask = compute + unpack to bool; a shared 2-core CPU, so wall
times are noisy, medians are the figure to read):

===================  ===========================  ===========================  =====================
tokenizer            llguidance                   xgrammar                     outlines-core
===================  ===========================  ===========================  =====================
SmolLM2, 49k         setup 0.11 s, compile 1 ms,  setup 1.1 s, compile 10 ms,  compile 0.32 s,
(GGUF gpt2 BPE)      mask p50 11 µs (p99 0.3 ms)  mask p50 7 µs (p99 23 µs)    mask p50 1.3 ms,
                                                                               advance 0.33 ms
Gemma-3, 262k        setup 0.9 s, compile 1 ms,   setup 0.1 s, compile 67 ms,  compile 3.0 s,
(GGUF SentencePiece) mask p50 51 µs (p99 2 ms)    mask p50 23 µs (p99 0.1 ms)  mask p99 9 ms,
                                                                               advance 0.64 ms
===================  ===========================  ===========================  =====================

* outlines-core builds a regex automaton over the whole vocabulary per schema (0.3-3 s for each
  new schema: a request bringing its own schema would stall the batch) and its advance costs a
  third to two thirds of a millisecond per token; out.
* xgrammar has the fastest masks, but ``import xgrammar`` imports torch (it requires torch,
  triton and transformers): ``langtorch.functional`` never imports torch (the dependency rule),
  and a torch+triton install for a JAX engine is out of proportion.
* llguidance has no Python dependencies, compiles a schema lazily in ~1 ms (so every request may
  bring its own schema), computes a mask in tens of µs even on a 262k vocabulary (well below
  one decode step), fills a whole batch's masks in parallel with the GIL released
  (``LLExecutor``), supports rollback and the JSON-schema / regex / Lark surface with precise
  errors, and is what vLLM, SGLang and llama.cpp ship.

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
