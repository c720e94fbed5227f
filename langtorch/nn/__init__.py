"""langtorch.nn — text modules: ``torch.nn.Module``s whose forward maps TextTensors to TextTensors.

Example:
    >>> import langtorch as lt
    >>> isinstance(lt.nn.TChain(), __import__("torch").nn.Sequential)
    True
"""

from langtorch.nn.llm import LLM, Embed, chat  # noqa: F401  (LLM runtime modules)
from langtorch.nn.modules import TChain, TFunction, TLayer, TModule

__all__ = ["TChain", "TFunction", "TLayer", "TModule"]
