"""A bounded store of prompt key/value blocks, found by a chained hash of their tokens.

Prefix caching as vLLM and llama.cpp do it: a prompt is cut into fixed-size blocks of ``block``
tokens; block ``i``'s key is a hash of its tokens *chained* with block ``i - 1``'s key, so a key
names the whole prefix up to the end of its block, never a block's tokens alone. Two prompts
that share their first ``k`` whole blocks (a system prompt, a few-shot block, the template of a
candidate grid) share those ``k`` keys, and the second one reuses the first one's keys/values
instead of computing them.

The store holds at most ``capacity`` tokens (``capacity // block`` blocks) and evicts the least
recently used block first. A lookup touches a prefix's blocks from its last to its first, and
storing a block touches its parents after it, so a parent block is always more recently used
than its children and is evicted after them (an evicted parent would make its children
unreachable). The values are opaque to the store (the
engine keeps device arrays there); it only counts them.

Counters (:meth:`PrefixCache.stats`): ``hits`` (blocks reused), ``misses`` (blocks looked up,
not found and then computed), ``evicted`` (blocks dropped to make room), ``hit_tokens``
(``hits * block``), ``blocks`` / ``tokens`` held now and the ``capacity_tokens``.

Example:
    >>> from langtorch.functional.prefix_cache import PrefixCache, block_hashes
    >>> store = PrefixCache(capacity=8, block=4)
    >>> keys = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    >>> len(keys)  # two whole blocks; the ninth token is in no block
    2
    >>> store.put(keys[0], "kv of 1..4"); store.put(keys[1], "kv of 5..8")
    >>> store.match(block_hashes([1, 2, 3, 4, 5, 6, 7, 0], 4))  # the first block only
    ['kv of 1..4']
    >>> store.stats()["hits"], store.stats()["tokens"]
    (1, 8)
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PrefixCache", "block_hashes"]

_ROOT = b"langtorch-prefix-v1"


def block_hashes(ids: Sequence[int], block: int, *, salt: bytes = b"") -> list[bytes]:
    """The chained keys of the whole ``block``-token blocks of ``ids`` (a trailing partial block
    has none): ``key[i] = blake2b(key[i - 1] + tokens of block i)``, ``key[-1]`` = the salt.

    Example:
        >>> from langtorch.functional.prefix_cache import block_hashes
        >>> a, b = block_hashes([1, 2, 3, 4], 2), block_hashes([9, 9, 3, 4], 2)
        >>> len(a), a[0] != b[0], a[1] != b[1]  # same second block, different prefix
        (2, True, True)
    """
    if int(block) < 1:
        raise ValueError(f"block_hashes: expected a block size >= 1, got {block!r}.")
    arr = np.asarray(list(ids), np.int64)
    prev = hashlib.blake2b(_ROOT + bytes(salt), digest_size=16).digest()
    out = []
    for i in range(len(arr) // block):
        prev = hashlib.blake2b(prev + arr[i * block:(i + 1) * block].tobytes(),
                               digest_size=16).digest()
        out.append(prev)
    return out


class PrefixCache:
    """An LRU store of prefix blocks keyed by :func:`block_hashes` (see the module docstring).

    Args:
        capacity: most tokens held (``0`` turns the store off: nothing is kept, nothing found).
        block: tokens per block.

    Example:
        >>> from langtorch.functional.prefix_cache import PrefixCache
        >>> s = PrefixCache(capacity=4, block=2)
        >>> for k in (b"a", b"b", b"c"):
        ...     s.put(k, k.decode())
        >>> s.get(b"a"), s.get(b"c"), s.stats()["evicted"]
        (None, 'c', 1)
    """

    def __init__(self, capacity: int, block: int):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or capacity < 0:
            raise ValueError(f"PrefixCache: expected capacity as an integer number of tokens "
                             f">= 0, got {capacity!r}.")
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
            raise ValueError(f"PrefixCache: expected block as an integer >= 1, got {block!r}.")
        self.capacity = int(capacity)
        self.block = int(block)
        self.max_blocks = self.capacity // self.block
        self._blocks: collections.OrderedDict[bytes, Any] = collections.OrderedDict()
        self.hits = self.misses = self.evicted = 0

    @property
    def enabled(self) -> bool:
        """Whether the store can hold at least one block."""
        return self.max_blocks > 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def get(self, key: bytes) -> Any:
        """The block stored under ``key`` (now the most recently used), or ``None``; not
        counted (:meth:`match` and :meth:`count_hit` count)."""
        value = self._blocks.get(key)
        if value is not None:
            self._blocks.move_to_end(key)
        return value

    def count_hit(self, n: int = 1) -> None:
        """Count ``n`` blocks reused."""
        self.hits += int(n)

    def count_miss(self, n: int = 1) -> None:
        """Count ``n`` blocks looked up in vain (and computed)."""
        self.misses += int(n)

    def match(self, keys: Sequence[bytes]) -> list[Any]:
        """The stored blocks of the longest prefix of ``keys`` held here (counted as hits),
        touched last-to-first so that parents stay more recent than their children."""
        found = []
        for k in keys:
            v = self._blocks.get(k)
            if v is None:
                break
            found.append((k, v))
        for k, _ in reversed(found):
            self._blocks.move_to_end(k)
        self.count_hit(len(found))
        return [v for _, v in found]

    def put(self, key: bytes, value: Any, parents: Sequence[bytes] = ()) -> None:
        """Keep ``value`` under ``key`` (a no-op when the store is off), then touch its
        ``parents`` (the keys of the blocks before it, first to last) so that they stay more
        recent than it; evict the least recently used blocks beyond the capacity.

        Example:
            >>> from langtorch.functional.prefix_cache import PrefixCache
            >>> s = PrefixCache(capacity=2, block=1)
            >>> s.put(b"0", 0); s.put(b"1", 1, parents=[b"0"]); s.put(b"2", 2, parents=[b"0", b"1"])
            >>> s.get(b"0"), s.get(b"1"), s.get(b"2")  # the deepest block went first
            (0, 1, None)
        """
        if not self.enabled:
            return
        if key in self._blocks:
            self._blocks.move_to_end(key)
        else:
            self._blocks[key] = value
        for p in reversed(list(parents)):
            if p in self._blocks:
                self._blocks.move_to_end(p)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
            self.evicted += 1

    def clear(self) -> None:
        """Drop every block (the counters stay)."""
        self._blocks.clear()

    def stats(self) -> dict[str, int]:
        """``hits``, ``misses``, ``evicted``, ``hit_tokens``, ``blocks``, ``tokens``,
        ``capacity_tokens`` and ``block_tokens`` (see the module docstring)."""
        return {"hits": self.hits, "misses": self.misses, "evicted": self.evicted,
                "hit_tokens": self.hits * self.block, "blocks": len(self._blocks),
                "tokens": len(self._blocks) * self.block, "capacity_tokens": self.capacity,
                "block_tokens": self.block}
