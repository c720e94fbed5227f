"""``Demos``: demonstrations chosen per input by nearest-neighbour search (local MiniLM)."""

from __future__ import annotations

from typing import Any

import numpy as np

from langtorch.nn.modules import TModule
from langtorch.tensor import TextParameter, TextTensor

__all__ = ["Demos"]


class Demos(TModule):
    """Pick, for every input entry, the ``k`` most similar demonstrations from a pool.

    The pool is a TextParameter of keyed records with fields ``input`` and ``output`` (shape
    ``[M]``; saved in ``state_dict()`` as plain lists of str). ``forward(x)`` embeds the inputs
    and the pool's inputs (the local all-MiniLM-L6-v2 by default), takes the top-``k`` by cosine
    similarity with :func:`langtorch.functional.topk`, and returns a TextTensor of ``x``'s shape:
    each entry is its demonstrations, most similar first, each written with ``template`` and
    joined with ``separator``. The result is data (braces in demonstrations are never parsed),
    ready to fill a program's ``{demos}`` field. ``lt.optim.FewShot(..., select="knn")`` fills
    the pool with bootstrapped demonstrations.

    Args:
        k: demonstrations per entry.
        template: how one demonstration is written (fields ``{input}``, ``{output}``).
        separator: between demonstrations.
        embedder: ``list[str] -> [N, d]`` array (or an object with ``embed_texts``); default the
            local MiniLM.
        pool: initial ``(input, output)`` pairs.

    Example:
        >>> import numpy as np, langtorch as lt
        >>> bag = lambda texts: np.array([[t.count("a"), t.count("b") + 0.1] for t in texts], np.float32)
        >>> demos = lt.nn.Demos(1, embedder=bag, pool=[("aaa", "A"), ("bbb", "B")])
        >>> demos(lt.TextTensor(["aa", "b"])).tolist()
        ['Input: aaa\\nOutput: A', 'Input: bbb\\nOutput: B']
    """

    def __init__(self, k: int = 4, *, template: str = "Input: {input}\nOutput: {output}",
                 separator: str = "\n\n", embedder: Any = None, pool: Any = ()):
        super().__init__()
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"Demos k must be a positive int, got {k!r}")
        from langtorch.functional.template import parse_template

        names = set(parse_template(template).names)
        if not names or not names <= {"input", "output"}:
            raise ValueError(f"Demos template must use {{input}} and/or {{output}} only, got {template!r}")
        self.k = k
        self.template = template
        self.separator = separator
        self._embedder = embedder
        self._cache: tuple[Any, np.ndarray] | None = None
        self.pool = TextParameter({"input": [], "output": []})
        self.set_pool(pool)

    def set_pool(self, pairs: Any) -> None:
        """Replace the pool with ``(input, output)`` pairs (a list of 2-tuples of str).

        Example:
            >>> import langtorch as lt
            >>> d = lt.nn.Demos(1); d.set_pool([("q", "a")]); d.pool.shape
            (1,)
        """
        pairs = [tuple(p) for p in pairs]
        for i, p in enumerate(pairs):
            if len(p) != 2 or not all(isinstance(s, str) for s in p):
                raise TypeError(f"Demos pool items must be (input, output) pairs of str; item {i} is {p!r}")
        inputs = np.array([p[0] for p in pairs], dtype=object).astype(str) if pairs else np.array([], dtype=str)
        outputs = np.array([p[1] for p in pairs], dtype=object).astype(str) if pairs else np.array([], dtype=str)
        self.pool.data = {"input": inputs, "output": outputs} if pairs else {"input": [], "output": []}
        self._cache = None

    def pairs(self) -> list[tuple[str, str]]:
        """The pool as ``(input, output)`` pairs."""
        if self.pool.size == 0 or not self.pool.fields:
            return []
        return list(zip(self.pool["input"].tolist(), self.pool["output"].tolist()))

    def _embed(self, texts: list[str]) -> np.ndarray:
        model = self._embedder
        if model is None:
            from langtorch.models import default_embedder

            model = default_embedder()
        fn = getattr(model, "embed_texts", model)
        vecs = np.asarray(fn(texts), dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape[0] != len(texts):
            raise ValueError(f"Demos: the embedder must return an array of shape [{len(texts)}, d] for "
                             f"{len(texts)} texts; it returned shape {vecs.shape}")
        return vecs

    def forward(self, x: Any) -> TextTensor:
        x = x if isinstance(x, TextTensor) else TextTensor(x, template=False)
        pairs = self.pairs()
        flat = x.texts.reshape(-1).tolist() if x.ndim else [str(x)]
        if not pairs or not flat:
            chosen = [""] * len(flat)
        else:
            key = tuple(pairs)
            if self._cache is None or self._cache[0] != key:
                self._cache = (key, self._embed([p[0] for p in pairs]))
            from langtorch.functional.embedding import topk
            from langtorch.functional.textops import fill

            k = min(self.k, len(pairs))
            queries = self._embed(flat)
            if queries.shape[1] != self._cache[1].shape[1]:
                raise ValueError(f"Demos: the embedder gave {queries.shape[1]}-d vectors for the inputs "
                                 f"and {self._cache[1].shape[1]}-d ones for the pool")
            _, idx = topk(queries, self._cache[1], k)
            idx = np.asarray(idx).reshape(len(flat), k)
            tpl = TextTensor(self.template)
            written = [str(fill(tpl, {"input": TextTensor(a, template=False), "output": TextTensor(b, template=False)},
                                strict=False)) for a, b in pairs]
            chosen = [self.separator.join(written[int(j)] for j in row) for row in idx]
        out = np.array(chosen, dtype=object).astype(str).reshape(x.shape) if x.ndim else chosen[0]
        return TextTensor(out, template=False)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # The pool's size is data (how many demonstrations were bootstrapped), not architecture:
        # take the saved one as it is.
        value = state_dict.get(prefix + "pool")
        if isinstance(value, dict) and set(value) == {"input", "output"}:
            if len(value["input"]) != len(value["output"]):
                error_msgs.append(f'While copying the Demos pool "{prefix}pool": {len(value["input"])} '
                                  f'inputs but {len(value["output"])} outputs')
                return
            try:
                self.set_pool(list(zip(value["input"], value["output"])))
            except TypeError as e:
                error_msgs.append(f'While copying the Demos pool "{prefix}pool": {e}')
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return f"k={self.k}, pool={self.pool.size if self.pool.fields else 0}"
