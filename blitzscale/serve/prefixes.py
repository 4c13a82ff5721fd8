"""Which prompt prefixes each instance probably holds in its prefix cache, for routing.

The router records, per instance, the full-block prefix hashes of every prompt it sends
there (the same chained hashes the engine keys its cache with, `kvcache/prefix.py`), least
recently used first out once an instance's entries pass its KV cache's size in blocks. It
is a guess, as SGLang's cache-aware router and Dynamo's approximate KV router make one: the
engine evicts on its own, under memory pressure, and a guess that is wrong costs a prefill,
never a wrong answer. Everything known of an instance goes when its engine is new (its
weights loaded again: `epoch`) or its cache is reset.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from blitzscale.kvcache.prefix import extend_hashes

FALLBACK_CAPACITY_BLOCKS = 4096  # an instance's cache size before its first stats report


class InstancePrefixes:
    """One instance's cached prefix blocks, as far as the router knows."""

    def __init__(self, epoch: Hashable) -> None:
        self.epoch = epoch
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: list[bytes]) -> int:
        """How many of the leading blocks are here."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def record(self, hashes: list[bytes], capacity: int) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > max(capacity, 0):
            self._blocks.popitem(last=False)


class PrefixIndex:
    """Per (model, instance): the prefix blocks it was sent. One owner (the router)."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, int], InstancePrefixes] = {}

    @staticmethod
    def hashes(prompt: list[int], block_size: int) -> list[bytes]:
        """The prompt's full blocks but its last token's (a fully cached prompt still
        computes its last token, as the engine does)."""
        return extend_hashes([], prompt, (len(prompt) - 1) // block_size, block_size)

    def _entry(self, model: str, rank: int, epoch: Hashable) -> InstancePrefixes | None:
        e = self._by.get((model, rank))
        if e is not None and e.epoch != epoch:
            del self._by[model, rank]  # a new engine: its cache started empty
            return None
        return e

    def cached_blocks(self, model: str, rank: int, epoch: Hashable, hashes: list[bytes]) -> int:
        e = self._entry(model, rank, epoch)
        return e.match(hashes) if e is not None else 0

    def record(self, model: str, rank: int, epoch: Hashable, hashes: list[bytes], capacity: int) -> None:
        if not hashes:
            return
        e = self._entry(model, rank, epoch)
        if e is None:
            e = self._by[model, rank] = InstancePrefixes(epoch)
        e.record(hashes, capacity)

    def forget(self, rank: int | None = None) -> None:
        """What an instance holds (None: every instance), after its cache was reset."""
        for key in [k for k in self._by if rank is None or k[1] == rank]:
            del self._by[key]

    def num_blocks(self, model: str, rank: int) -> int:
        e = self._by.get((model, rank))
        return len(e) if e is not None else 0
