"""Weight and tokenizer loaders: numpy-only readers that turn files into parameter pytrees.

Every function here is handed a path; finding default paths and caching loaded models is the job
of ``langtorch.models``. ``safetensors``, ``gguf``, ``tokenizers`` and ``jinja2`` are imported
lazily so that ``import langtorch.functional`` stays light.

* Hugging Face decoder directories: :func:`load_hf_decoder` (memory-mapped safetensors, sharded
  or not), :func:`load_hf_tokenizer`; GGUF files of every supported architecture:
  :func:`load_gguf_decoder`, :func:`tokenizer_from_gguf`.
* Families: :func:`decoder_config_from_hf`, :func:`decoder_config_from_gguf`
  (:data:`SUPPORTED_ARCHITECTURES`).

Example:
    >>> from langtorch.functional import loaders
    >>> "load_llama_gguf" in loaders.__all__ and "load_hf_decoder" in loaders.__all__
    True
"""

from langtorch.functional.loaders._atomic import atomic_write, fsync_dir
from langtorch.functional.loaders._bert import bert_params_from_safetensors, wordpiece_tokenizer
from langtorch.functional.loaders._families import (
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_GGUF_ARCHITECTURES,
    decoder_config_from_gguf,
    decoder_config_from_hf,
)
from langtorch.functional.loaders._gguf import (
    DECODER_LOADER_VERSION,
    GGUFModel,
    dequantize_gguf,
    llama_config_from_gguf,
    load_gguf_decoder,
    load_llama_gguf,
    read_gguf_metadata,
)
from langtorch.functional.loaders._hf import (
    TO_SAFETENSORS,
    SafetensorsFiles,
    load_hf_decoder,
    read_hf_config,
)
from langtorch.functional.loaders._hf_tokenizer import (
    Tokenizer,
    load_hf_tokenizer,
    tokenizer_from_gguf,
)
from langtorch.functional.loaders._tokenizer import (
    ChatTemplate,
    bpe_tokenizer_from_gguf_metadata,
    spm_tokenizer_from_gguf_metadata,
)

__all__ = [
    "DECODER_LOADER_VERSION",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_GGUF_ARCHITECTURES",
    "TO_SAFETENSORS",
    "atomic_write",
    "fsync_dir",
    "ChatTemplate",
    "GGUFModel",
    "SafetensorsFiles",
    "Tokenizer",
    "bert_params_from_safetensors",
    "bpe_tokenizer_from_gguf_metadata",
    "decoder_config_from_gguf",
    "decoder_config_from_hf",
    "dequantize_gguf",
    "llama_config_from_gguf",
    "load_gguf_decoder",
    "load_hf_decoder",
    "load_hf_tokenizer",
    "load_llama_gguf",
    "read_gguf_metadata",
    "read_hf_config",
    "spm_tokenizer_from_gguf_metadata",
    "tokenizer_from_gguf",
    "wordpiece_tokenizer",
]
