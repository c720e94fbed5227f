"""bf16 decode steps compute a row bit for bit alike at every row count (the default decode
dtype where the CPU has bf16 dot units).

A request's logprobs (not only its greedy tokens, which hide small differences) are compared
alone and among 1, 7 and 15 other requests, on a SmolLM2-shaped layer (hidden 576, 9 query
heads over 3 KV heads of 64, FFN 1,536; two layers and a small vocabulary keep it fast) with
random bf16 weights. Two things make the rows independent of their batch on XLA:CPU, and the
test fails without either: the decode program is compiled with
:func:`~langtorch.functional.engine.decode_compiler_options` (from ~8 rows XLA:CPU hands the
RMS norm's reduce and the rotary math to YNNPACK fusions that round differently from its own
loops below), and a lone row decodes as two (``SlotBatch.min_rows``: the one-row program
rounds differently from every other row count). Checked by putting each back: with the
options off the target's logprobs differ among 7 and 15 others; with ``min_rows = 1`` they
differ between alone and among others; with ``MIN_DECODE_STEPS = 1`` chunks of 1 and 2 steps
differ from longer ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from langtorch.functional.engine import Sequence, SlotBatch
from langtorch.functional.models import llama

CFG = llama.LlamaConfig(vocab_size=512, hidden_size=576, num_layers=2, num_heads=9,
                        num_kv_heads=3, head_dim=64, intermediate_size=1536, max_positions=256)
N = 24  # tokens per request

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu",
                                reason="XLA:CPU's fusion choices; GPUs round per their kernels")


@pytest.fixture(scope="module")
def params():
    p = llama.random_params(jax.random.key(11), CFG)
    return jax.tree.map(lambda a: a.astype(jnp.bfloat16), p)


def _prompt(seed, length=None):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40)) if length is None else length
    return rng.integers(1, CFG.vocab_size, n).tolist()


def _logprobs(params, others, *, at=0, chunk=4):
    """The target's (token, logprob) pairs when it decodes among ``others`` requests."""
    b = SlotBatch(params, config=CFG, max_slots=16, chunk=chunk, eos_ids=(),
                  prefix_cache_tokens=0)
    prompts = [_prompt(100 + i) for i in range(others)]
    # A 100-token target: its attention sums over 100-124 slots, where this model's one-row
    # program rounds differently from two rows at several steps (with a 20-60 token prompt
    # it happened not to).
    prompts.insert(at, _prompt(7, 100))
    seqs = [Sequence(p, max_tokens=N, top_logprobs=0) for p in prompts]
    b.admit(seqs)
    while b.live:
        b.step()
    return [(int(e[0]), float(e[1])) for e in seqs[at].logprobs]


def test_a_bf16_row_decodes_bit_for_bit_alike_alone_and_among_others(params):
    alone = _logprobs(params, 0)
    assert len(alone) == N
    for others, at in ((1, 1), (7, 0), (15, 9)):
        assert _logprobs(params, others, at=at) == alone, f"among {others} others"


def test_short_chunks_decode_like_long_ones(params):
    # Chunks of 1 or 2 steps run the MIN_DECODE_STEPS-step program with a smaller limit:
    # loops of one or two steps compiled to programs that rounded differently.
    want = _logprobs(params, 0, chunk=8)
    for chunk in (1, 2):
        assert _logprobs(params, 0, chunk=chunk) == want, f"chunk={chunk}"
