"""Weight and tokenizer loaders: numpy-only readers that turn files into parameter pytrees.

Every function here is handed a path; finding default paths and caching loaded models is the job
of ``langtorch.models``. ``safetensors``, ``gguf``, ``tokenizers`` and ``jinja2`` are imported
lazily so that ``import langtorch.functional`` stays light.

Example:
    >>> from langtorch.functional import loaders
    >>> "load_llama_gguf" in loaders.__all__
    True
"""

from langtorch.functional.loaders._atomic import atomic_write, fsync_dir
from langtorch.functional.loaders._bert import bert_params_from_safetensors, wordpiece_tokenizer
from langtorch.functional.loaders._gguf import (
    GGUFModel,
    dequantize_gguf,
    llama_config_from_gguf,
    load_llama_gguf,
    read_gguf_metadata,
)
from langtorch.functional.loaders._tokenizer import (
    ChatTemplate,
    bpe_tokenizer_from_gguf_metadata,
)

__all__ = [
    "atomic_write",
    "fsync_dir",
    "ChatTemplate",
    "GGUFModel",
    "bert_params_from_safetensors",
    "bpe_tokenizer_from_gguf_metadata",
    "dequantize_gguf",
    "llama_config_from_gguf",
    "load_llama_gguf",
    "read_gguf_metadata",
    "wordpiece_tokenizer",
]
