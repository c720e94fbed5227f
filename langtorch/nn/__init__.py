"""langtorch.nn — text modules: ``torch.nn.Module``s whose forward maps TextTensors to TextTensors.

* :class:`TModule`, :class:`TLayer`, :class:`TChain`, :class:`TFunction` — the building blocks.
* :class:`LLM` — one chat-completions request per entry, on any backend; :class:`Embed` — the
  embeddings endpoint or the local MiniLM; :func:`chat` — TextTensors of conversations.
* :class:`LocalClassifier` — label-word scoring on the local SmolLM2 (offline, no generation): a
  module whose outputs are labels, for comparing prompt candidates with the text optimizers.
* :class:`Retrieve` — the ``k`` best passages of an :class:`~langtorch.Index` per query (RAG).
* :class:`Tool` — a Python function (or module) as a tool an ``LLM(..., tools=[...])`` calls in
  its tool-call loop, and as a module itself; :class:`ToolError`.
* :class:`Inspect` — a pass-through debugging module that prints what flows through.
* :class:`TextLoss` (an LLM judge) and :class:`MetricLoss` (a Python metric) — losses whose
  ``backward()`` sends textual feedback to the TextParameters (see :mod:`langtorch.optim`).

Example:
    >>> import langtorch as lt
    >>> isinstance(lt.nn.TChain(), __import__("torch").nn.Sequential)
    True
"""

from langtorch.nn.classify import LocalClassifier
from langtorch.nn.debug import Inspect
from langtorch.nn.demos import Demos
from langtorch.nn.llm import LLM, Embed, chat
from langtorch.nn.losses import MetricLoss, TextLoss
from langtorch.nn.modules import TChain, TFunction, TLayer, TModule
from langtorch.nn.retrieve import Retrieve
from langtorch.nn.tools import Tool, ToolError

__all__ = ["LLM", "Demos", "Embed", "Inspect", "LocalClassifier", "MetricLoss", "Retrieve", "TChain", "TFunction",
           "TLayer", "TModule", "TextLoss", "Tool", "ToolError", "chat"]
