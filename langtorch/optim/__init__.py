"""langtorch.optim — optimizers for text parameters, with torch.optim's shape.

Every optimizer has ``step(closure=None)`` (see :class:`TextOptimizer` for the contract); the
ones that score candidates on examples take them in their constructor (``inputs=``,
``targets=``, ``batch_size=``).

* :class:`TGD` — textual gradient descent: rewrites parameters from ``param.grad`` (written by
  ``loss.backward()``), in structured output, with revert-on-worse under ``step(closure)``.
* :class:`Search` — propose candidates (LLM or mutation), score the candidates x batch grid in
  one ``functional_call``, keep the best (APE/OPRO).
* :class:`FewShot` — bootstrap demonstrations from runs that pass the metric (DSPy's
  BootstrapFewShot idea) into a demos parameter.
* :class:`TokenSearch` — white-box, gradient-guided token search (GCG/AutoPrompt) over a
  ``{slot}`` of a prompt on the local JAX model; the result is plain text for any backend.
* :class:`Budget` — calls / tokens / cost limits; every optimizer has one (``opt.budget``).
* ``set_backward_engine`` / ``get_backward_engine`` — deprecated aliases of
  :func:`langtorch.autograd.set_feedback_engine` / ``get_feedback_engine`` (the critic of
  ``loss.backward()`` is a *feedback engine*).

Example:
    >>> import langtorch as lt
    >>> m = lt.TLayer("{}?")
    >>> opt = lt.optim.Search(m.named_text_parameters(), lambda v, k, rng: ["{}"], 1,
    ...                       module=m, metric="exact_match", inputs=["a"], targets=["a"])
    >>> opt.step()
    1.0
"""

from langtorch.autograd import get_backward_engine, set_backward_engine
from langtorch.optim._base import TextOptimizer
from langtorch.optim._gepa import GEPA
from langtorch.optim._search import FewShot, Search, evaluate_candidates
from langtorch.optim._tgd import TGD
from langtorch.optim._token_search import TokenSearch
from langtorch.runtime import Budget

__all__ = [
    "Budget",
    "FewShot",
    "GEPA",
    "Search",
    "TGD",
    "TokenSearch",
    "TextOptimizer",
    "evaluate_candidates",
    "get_backward_engine",
    "set_backward_engine",
]
