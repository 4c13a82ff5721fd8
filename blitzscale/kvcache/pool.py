"""Allocation of fixed-size KV blocks. Pure bookkeeping: no tensors, no device."""

from __future__ import annotations

from collections import deque


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"need num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self._used)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"asked for {num_blocks} KV blocks, {len(self._free)} free")
        ids = [self._free.popleft() for _ in range(num_blocks)]
        self._used.update(ids)
        return ids

    def free(self, block_ids: list[int]) -> None:
        ids = set(block_ids)
        if len(ids) == len(block_ids) and ids <= self._used:  # (the usual case, at set speed)
            self._used -= ids
            self._free.extend(block_ids)
            return
        for b in block_ids:
            if b not in self._used:
                raise RuntimeError(f"KV block {b} freed twice or never allocated")
            self._used.remove(b)
            self._free.append(b)

    @property
    def used_ids(self) -> frozenset[int]:
        return frozenset(self._used)

    def check(self) -> list[str]:
        """What is wrong with the pool's own books (empty: nothing)."""
        problems = []
        free = set(self._free)
        if len(free) != len(self._free):
            problems.append("a block is on the free list twice")
        if free & self._used:
            problems.append(f"blocks both free and used: {sorted(free & self._used)[:8]}")
        if len(free) + len(self._used) != self.num_blocks:
            problems.append(f"free {len(free)} + used {len(self._used)} != {self.num_blocks} blocks")
        return problems
