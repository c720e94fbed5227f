"""langtorch — LLM applications the PyTorch way.

* :class:`TextTensor` — n-d arrays of texts with numpy broadcasting and safe templates
  (``prompt + inputs`` fills placeholders), keyed records, metadata and embeddings.
* :class:`TModule`, :class:`TLayer`, :class:`TChain` — ``torch.nn.Module``s over TextTensors.
* :func:`text` — a TextTensor of data (never a template); :func:`where` — batch branching.
* :class:`Index` (and ``lt.nn.Retrieve``) — retrieval; :mod:`langtorch.metrics` — evaluation.
* :class:`PromptTuner` — soft/hard prompt tuning in JAX with PEFT interchange.
* :mod:`langtorch.functional` — the pure (numpy/JAX) core; :mod:`langtorch.interop` — torch <-> JAX.

Example:
    >>> import langtorch as lt
    >>> prompts = lt.TextTensor([["Define {}"], ["Give an example of {}"]])   # [2, 1]
    >>> (prompts + lt.TextTensor(["recursion", "entropy", "irony"])).shape   # [2, 3]
    (2, 3)
"""

from langtorch import errors
from langtorch import functional as functional
from langtorch.autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from langtorch.core import __version__ as __version__
from langtorch.functional.textops import cat, concat, fill, join, split, stack, where
from langtorch.tensor import TextParameter, TextTensor, text
from langtorch.tracing import Trace, trace

# torch-dependent names load on first use, so `import langtorch.functional` (which imports this
# package first) never pulls in torch: the functional core stays importable without it.
_LAZY = {
    "TModule": "langtorch.nn.modules",
    "TLayer": "langtorch.nn.modules",
    "TChain": "langtorch.nn.modules",
    "TFunction": "langtorch.nn.modules",
    "nn": "langtorch.nn",
    "interop": "langtorch.interop",
    "PromptTuner": "langtorch.tuning",
    "datasets": "langtorch.datasets",
    "distributed": "langtorch.distributed",
    "optim": "langtorch.optim",
    "func": "langtorch.func",
    "tracing": "langtorch.tracing",
    "autograd": "langtorch.autograd",
    "inspect_history": "langtorch.tracing",
    "Inspect": "langtorch.nn.debug",
    "Index": "langtorch.index",
    "metrics": "langtorch.metrics",
    "evaluate": "langtorch.evaluation",
    "pareto": "langtorch.evaluation",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        value = module if module.__name__ == f"langtorch.{name}" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'langtorch' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "Index",
    "Inspect",
    "PromptTuner",
    "TChain",
    "TFunction",
    "datasets",
    "distributed",
    "interop",
    "nn",
    "TLayer",
    "TModule",
    "TextParameter",
    "TextTensor",
    "Trace",
    "autograd",
    "cat",
    "concat",
    "enable_grad",
    "errors",
    "evaluate",
    "fill",
    "func",
    "functional",
    "inspect_history",
    "is_grad_enabled",
    "join",
    "metrics",
    "no_grad",
    "optim",
    "pareto",
    "set_grad_enabled",
    "split",
    "stack",
    "text",
    "trace",
    "tracing",
    "where",
]
