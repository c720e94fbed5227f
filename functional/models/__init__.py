"""Pure-function models over parameter pytrees: a BERT encoder and a Llama decoder.

Example:
    >>> from langtorch.functional.models import bert, llama
    >>> bert.MINILM_L6.hidden_size, llama.SMOLLM2_135M.hidden_size
    (384, 576)
"""

from langtorch.functional.models import bert, llama

__all__ = ["bert", "llama"]
