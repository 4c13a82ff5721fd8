"""Allocation of fixed-size KV blocks, and the prefix cache over them. Pure bookkeeping:
no tensors, no device.

A used block has one or more holders (requests); `free` drops one. A full block whose
tokens are known can be registered under its prefix hash (kvcache/prefix.py): another
request whose prompt starts with the same tokens then shares it (`share`) instead of
computing it again. A registered block nobody holds stays cached: it is allocated again
only when no empty block is left, least recently freed first, and then forgets its hash.

Each registered block also knows its parent's hash and how often a request took it from
the cache (`hits`): `hot_prefixes` names the most reused chains, which a new instance of
the model can receive along with its weights (`import_prefix` registers them there).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from blitzscale.kvcache.prefix import ROOT


@dataclass(frozen=True)
class HotBlock:
    """A cached block worth shipping: its prefix hash, its parent's (ROOT for a first
    block), how many requests took it from the cache, and where it is in this pool."""

    hash: bytes
    parent: bytes
    hits: int
    block: int


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._empty: deque[int] = deque(range(num_blocks))  # free, holding nothing reusable
        self._cached: OrderedDict[int, None] = OrderedDict()  # free, registered; oldest first
        self._refs: dict[int, int] = {}  # used block -> its holders
        self._hash_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._parent: dict[int, bytes] = {}  # registered block -> its parent's hash
        self._hits: dict[int, int] = {}  # registered block -> requests that took it cached
        self.evictions = 0  # cached blocks handed out again (their prefix forgotten)

    @property
    def num_free_blocks(self) -> int:
        return len(self._empty) + len(self._cached)

    @property
    def num_empty_blocks(self) -> int:
        """Free blocks that hold no cached prefix."""
        return len(self._empty)

    @property
    def num_used_blocks(self) -> int:
        return len(self._refs)

    @property
    def num_cached_blocks(self) -> int:
        """Registered blocks, held or not."""
        return len(self._hash_of)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"asked for {num_blocks} KV blocks, {self.num_free_blocks} free")
        ids = []
        for _ in range(num_blocks):
            if self._empty:
                b = self._empty.popleft()
            else:  # the least recently freed cached block gives up its prefix
                b, _ = self._cached.popitem(last=False)
                self._forget(b)
                self.evictions += 1
            self._refs[b] = 1
            ids.append(b)
        return ids

    def free(self, block_ids: list[int]) -> None:
        """One holder lets go of each block; a block nobody holds is free again (cached, if
        registered)."""
        for b in block_ids:
            n = self._refs.get(b, 0)
            if n <= 0:
                raise RuntimeError(f"KV block {b} freed twice or never allocated")
            if n > 1:
                self._refs[b] = n - 1
                continue
            del self._refs[b]
            if b in self._hash_of:
                self._cached[b] = None
            else:
                self._empty.append(b)

    # --- the prefix cache ------------------------------------------------------------------

    def cached_prefix(self, hashes: list[bytes]) -> list[int]:
        """The blocks holding the longest run of `hashes` from the first (pure lookup)."""
        out = []
        for h in hashes:
            b = self._block_of.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def num_idle(self, block_ids: list[int]) -> int:
        """How many of these registered blocks nobody holds (sharing them takes them off
        the free count)."""
        return sum(1 for b in block_ids if b in self._cached)

    def share(self, block_ids: list[int]) -> None:
        """One more holder for each of these registered blocks (from `cached_prefix`)."""
        for b in block_ids:
            if b not in self._hash_of:
                raise RuntimeError(f"KV block {b} is not in the prefix cache")
            if b in self._cached:
                del self._cached[b]
                self._refs[b] = 1
            else:
                self._refs[b] += 1
            self._hits[b] += 1

    def register(self, block: int, h: bytes, parent: bytes = ROOT, hits: int = 0) -> bool:
        """A used, full block now known to hold the prefix `h` (its parent's hash:
        `parent`). A prefix already cached in another block, or a block already
        registered, is left as it is (False)."""
        if block not in self._refs:
            raise RuntimeError(f"KV block {block} is free: only a held block can be registered")
        if h in self._block_of or block in self._hash_of:
            return False
        self._hash_of[block] = h
        self._block_of[h] = block
        self._parent[block] = parent
        self._hits[block] = hits
        return True

    def _forget(self, block: int) -> None:
        del self._block_of[self._hash_of.pop(block)]
        del self._parent[block], self._hits[block]

    def hot_prefixes(self, max_blocks: int) -> list[HotBlock]:
        """Up to `max_blocks` cached blocks that requests took from the cache, most taken
        first, each with every block before it in its sequence (a block is found only
        through its whole chain): parents before children. Blocks never reused are not
        hot, and a chain whose first blocks were evicted is unreachable, so neither is it."""
        if max_blocks <= 0:
            return []
        depth: dict[int, int] = {}  # of the picked blocks: 0 for a sequence's first

        def unpicked_chain(b: int) -> list[int] | None:
            """b and its ancestors not picked yet, first block first; None if broken."""
            out = [b]
            while (p := self._parent[out[-1]]) != ROOT:
                a = self._block_of.get(p)
                if a is None:
                    return None
                if a in depth:
                    break
                out.append(a)
            return out[::-1]

        hot = sorted((b for b, n in self._hits.items() if n > 0), key=lambda b: -self._hits[b])
        for b in hot:
            new = None if b in depth else unpicked_chain(b)
            if new is None or len(depth) + len(new) > max_blocks:
                continue  # picked, unreachable, or too long (a shorter chain may still fit)
            parent = self._block_of.get(self._parent[new[0]])
            first = depth[parent] + 1 if parent is not None else 0
            for i, x in enumerate(new):
                depth[x] = first + i
        order = sorted(depth, key=lambda b: depth[b])
        return [HotBlock(self._hash_of[b], self._parent[b], self._hits[b], b) for b in order]

    def is_registered(self, block: int) -> bool:
        return block in self._hash_of

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (blocks in use keep their contents and holders);
        returns how many were forgotten."""
        n = len(self._hash_of)
        self._empty.extend(self._cached)
        self._cached.clear()
        self._hash_of.clear()
        self._block_of.clear()
        self._parent.clear()
        self._hits.clear()
        return n

    def refs(self, block: int) -> int:
        """Holders of a block (0: free)."""
        return self._refs.get(block, 0)

    @property
    def used_ids(self) -> frozenset[int]:
        return frozenset(self._refs)

    def check(self) -> list[str]:
        """What is wrong with the pool's own books (empty: nothing)."""
        problems = []
        empty, cached, used = set(self._empty), set(self._cached), set(self._refs)
        if len(empty) != len(self._empty):
            problems.append("a block is on the free list twice")
        if (empty & cached) or ((empty | cached) & used):
            problems.append(f"blocks both free and used: {sorted((empty | cached) & used)[:8]}")
        if len(empty) + len(cached) + len(used) != self.num_blocks:
            problems.append(f"free {len(empty) + len(cached)} + used {len(used)} != {self.num_blocks} blocks")
        if any(n < 1 for n in self._refs.values()):
            problems.append("a used block has no holder")
        if cached - set(self._hash_of) or empty & set(self._hash_of):
            problems.append("a free block is cached without a prefix, or empty with one")
        if len(self._block_of) != len(self._hash_of) or any(
            self._hash_of.get(b) != h for h, b in self._block_of.items()
        ):
            problems.append("the prefix cache's two maps disagree")
        if set(self._parent) != set(self._hash_of) or set(self._hits) != set(self._hash_of):
            problems.append("a registered block lacks its parent or its hits, or a free one has them")
        return problems
