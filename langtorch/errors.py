"""Every error langtorch raises on purpose, rooted at :class:`LangTorchError`.

Defined in ``langtorch.functional.errors`` (the lowest layer) and re-exported here.

Example:
    >>> from langtorch.errors import LangTorchError, TemplateError
    >>> issubclass(TemplateError, LangTorchError)
    True
"""

from langtorch.functional.errors import *  # noqa: F403
from langtorch.functional.errors import __all__ as __all__  # noqa: F401
