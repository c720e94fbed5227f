"""langtorch.datasets — small datasets that ship inside the package (no download, no network).

* :func:`load_sentiment` — 416 hand-written sentences, binary sentiment, fixed splits.

Example:
    >>> from langtorch.datasets import load_sentiment
    >>> texts, labels = load_sentiment("train")
    >>> len(texts) == len(labels) == 250
    True
"""

from langtorch.datasets._sentiment import SENTIMENT_LABELS, load_sentiment

__all__ = ["SENTIMENT_LABELS", "load_sentiment"]
