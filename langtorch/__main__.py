"""``python -m langtorch``: the same command line as the ``langtorch`` console script.

Example:
    >>> from langtorch.__main__ import main
    >>> callable(main)
    True
"""

from __future__ import annotations

import sys

from langtorch.serve import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
