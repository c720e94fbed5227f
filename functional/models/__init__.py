"""Pure-function models over parameter pytrees: a BERT encoder and one generic decoder
(:mod:`~langtorch.functional.models.decoder`: Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3), of
which :mod:`~langtorch.functional.models.llama` is the default-configured view.

Example:
    >>> from langtorch.functional.models import bert, decoder, llama
    >>> bert.MINILM_L6.hidden_size, llama.SMOLLM2_135M.hidden_size
    (384, 576)
"""

from langtorch.functional.models import bert, decoder, llama, quant

__all__ = ["bert", "decoder", "llama", "quant"]
