"""``Inspect``: a pass-through module that shows what flows through a pipeline (the seed's
"debugging module")."""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np

from langtorch.nn.modules import TModule
from langtorch.tensor import TextTensor

__all__ = ["Inspect"]

log = logging.getLogger("langtorch.inspect")


class Inspect(TModule):
    """Pass the input through unchanged, printing (or logging) its entries and metadata.

    Insert it anywhere in a :class:`~langtorch.TChain` or call it inside ``forward``. The
    output *is* the input (same object: provenance, metadata and embedding untouched).

    Args:
        label: a name printed with each view (default: the module's call path).
        max_entries: at most this many entries are shown (then a count of the rest).
        max_chars: texts longer than this are elided.
        metadata: show the metadata columns.
        log: ``False`` prints to ``file``; ``True`` logs to the ``langtorch.inspect`` logger at
            INFO; a ``logging.Logger`` logs there.
        file: where to print (default ``sys.stdout``).

    Attributes:
        last: the last input seen (a TextTensor), for inspection after the run.

    Example:
        >>> import langtorch as lt
        >>> chain = lt.TChain(lt.TLayer("Q: {}"), lt.Inspect("after prompt"))
        >>> out = chain(lt.TextTensor(["why?", "how?"]))
        [after prompt] TextTensor shape (2,)
          (0,) 'Q: why?'
          (1,) 'Q: how?'
        >>> out.tolist()
        ['Q: why?', 'Q: how?']
    """

    def __init__(self, label: str | None = None, *, max_entries: int = 10, max_chars: int = 200,
                 metadata: bool = True, log: bool | logging.Logger = False, file: Any = None):
        super().__init__()
        if label is not None and not isinstance(label, str):
            raise TypeError(f"Inspect label must be a str, got {type(label).__name__}")
        for name, v in (("max_entries", max_entries), ("max_chars", max_chars)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Inspect {name} must be a positive int, got {v!r}")
        self.label = label
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.show_metadata = bool(metadata)
        self.log = log
        self.file = file
        self.last: TextTensor | None = None

    def describe(self, x: Any) -> str:
        """The text that :meth:`forward` shows for ``x``."""
        from langtorch.core import context as _context

        label = self.label or _context.path_string() or "Inspect"
        if not isinstance(x, TextTensor):
            return f"[{label}] {type(x).__name__}: {x!r:.{self.max_chars}}"
        lines = [f"[{label}] TextTensor shape {x.shape}" + (f" fields {list(x.fields)}" if x.fields else "")]
        flat = x.texts.reshape(-1).tolist() if x.ndim else [str(x)]
        cols = {k: x.metadata.column(k).reshape(-1) for k in x.metadata} if self.show_metadata else {}
        for i, text in enumerate(flat[: self.max_entries]):
            index = tuple(int(j) for j in np.unravel_index(i, x.shape)) if x.ndim else ()
            shown = text if len(text) <= self.max_chars else text[: self.max_chars - 1] + f"… [{len(text)} chars]"
            line = f"  {index} {shown!r}"
            if cols:
                meta = ", ".join(f"{k}={_short(v[i], self.max_chars)}" for k, v in cols.items())
                line += f"  {{{meta}}}"
            lines.append(line)
        if len(flat) > self.max_entries:
            lines.append(f"  … {len(flat) - self.max_entries} more entries")
        if x.embedding is not None:
            lines.append(f"  embedding {tuple(x.embedding.shape)}")
        return "\n".join(lines)

    def forward(self, x: Any) -> Any:
        """Show ``x`` and return it unchanged."""
        self.last = x
        text = self.describe(x)
        if self.log is False:
            print(text, file=self.file if self.file is not None else sys.stdout)
        else:
            logger = self.log if isinstance(self.log, logging.Logger) else log
            logger.info("%s", text)
        return x

    def extra_repr(self) -> str:
        return repr(self.label) if self.label else ""


def _short(value: Any, limit: int) -> str:
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
