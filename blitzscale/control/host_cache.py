"""Host memory for model copies, as immutable values (design §6).

ServerlessLLM's per-host checkpoint cache (`HostCacheState`): each host keeps a model's
checkpoint in DRAM for `ttl_s` after it last used it (after loading it: a miss reads SSD
into host memory, which then stays cached; and while any of its GPUs serve it), and within
`capacity_bytes` per host: beyond it the least recently used models are evicted. The state
is a value so the live router and the simulator replay it identically.

blitz keeps at most one host copy per model in the whole cluster (the ParameterPool's
invariant); `host_copy_room` says which copies make room for a new one under the budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from blitzscale.control.snapshot import ClusterSnapshot


def host_of(snapshot: ClusterSnapshot, rank: int) -> int:
    """The host a rank lives on; ranks the snapshot does not map are on host 0."""
    return snapshot.host_of_rank[rank] if rank < len(snapshot.host_of_rank) else 0


@dataclass(frozen=True)
class CacheEntry:
    host: int
    model: str
    last_used: float
    nbytes: int = 0


@dataclass(frozen=True)
class HostCacheState:
    ttl_s: float = 30.0
    entries: tuple[CacheEntry, ...] = ()  # by (host, model)
    capacity_bytes: int = 0  # per host (0: no bound)

    def lookup(self, host: int, now: float, model: str = "") -> bool:
        """A hit: the host used the model less than `ttl_s` ago (and kept it)."""
        return any(
            e.host == host and e.model == model and now - e.last_used < self.ttl_s for e in self.entries
        )

    def insert(self, host: int, now: float, model: str = "", nbytes: int = 0) -> HostCacheState:
        """The host uses the model now. Expired entries are dropped on the way, then the
        host's least recently used others while it holds more than `capacity_bytes`."""
        kept = [
            e
            for e in self.entries
            if now - e.last_used < self.ttl_s and not (e.host == host and e.model == model)
        ]
        new = CacheEntry(host, model, now, nbytes)
        if self.capacity_bytes:
            mine = sorted((e for e in kept if e.host == host), key=lambda e: (e.last_used, e.model))
            used = nbytes + sum(e.nbytes for e in mine)
            for old in mine:
                if used <= self.capacity_bytes:
                    break
                kept.remove(old)
                used -= old.nbytes
        entries = sorted([*kept, new], key=lambda e: (e.host, e.model))
        return HostCacheState(self.ttl_s, tuple(entries), self.capacity_bytes)

    def cached_hosts(self, now: float, model: str = "") -> tuple[int, ...]:
        return tuple(e.host for e in self.entries if e.model == model and now - e.last_used < self.ttl_s)

    def host_bytes(self, host: int, now: float) -> int:
        """Bytes the host's cache holds now."""
        return sum(e.nbytes for e in self.entries if e.host == host and now - e.last_used < self.ttl_s)

    @property
    def last_used(self) -> tuple[tuple[int, float], ...]:
        """(host, when) of the unnamed model's entries (the one-model view)."""
        return tuple((e.host, e.last_used) for e in self.entries if e.model == "")


def host_copy_room(
    copies: Mapping[str, tuple[int, int]],
    host: int,
    nbytes: int,
    capacity_bytes: int,
    evictable: list[str],
) -> list[str] | None:
    """blitz: the host copies (of `copies`: model -> (host, bytes)) to drop so a new copy
    of `nbytes` fits `host`'s `capacity_bytes`, taken in the order of `evictable` (models
    that can come back another way); None if it cannot fit."""
    if not capacity_bytes:
        return []
    used = sum(b for h, b in copies.values() if h == host)
    drop: list[str] = []
    for m in evictable:
        if used + nbytes <= capacity_bytes:
            break
        h, b = copies.get(m, (-1, 0))
        if h == host:
            drop.append(m)
            used -= b
    return drop if used + nbytes <= capacity_bytes else None
