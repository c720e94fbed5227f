"""langtorch — LLM applications the PyTorch way.

* :class:`TextTensor` — n-d arrays of texts with numpy broadcasting and safe templates
  (``prompt + inputs`` fills placeholders), keyed records, metadata and embeddings.
* :class:`TModule`, :class:`TLayer`, :class:`TChain` — ``torch.nn.Module``s over TextTensors.
* :mod:`langtorch.functional` — the pure (numpy/JAX) core; :mod:`langtorch.interop` — torch <-> JAX.

Example:
    >>> import langtorch as lt
    >>> prompts = lt.TextTensor([["Define {}"], ["Give an example of {}"]])   # [2, 1]
    >>> (prompts + lt.TextTensor(["recursion", "entropy", "irony"])).shape   # [2, 3]
    (2, 3)
"""

from langtorch import errors
from langtorch import functional as functional
from langtorch.functional.textops import cat, concat, fill, join, split, stack
from langtorch.nn.modules import TChain, TFunction, TLayer, TModule
from langtorch.tensor import TextParameter, TextTensor

__version__ = "0.1.0"

__all__ = [
    "TChain",
    "TFunction",
    "TLayer",
    "TModule",
    "TextParameter",
    "TextTensor",
    "cat",
    "concat",
    "errors",
    "fill",
    "functional",
    "join",
    "split",
    "stack",
]
