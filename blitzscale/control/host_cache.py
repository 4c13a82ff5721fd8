"""ServerlessLLM's per-host checkpoint cache (design §6), as an immutable value.

Each host keeps the checkpoint in DRAM for `ttl_s` after it last used it: after loading it
(a miss reads SSD into host memory, which then stays cached) and while any of its GPUs serve
it. The state is a value so the live router and the simulator replay it identically.
"""

from __future__ import annotations

from dataclasses import dataclass

from blitzscale.control.snapshot import ClusterSnapshot


def host_of(snapshot: ClusterSnapshot, rank: int) -> int:
    """The host a rank lives on; ranks the snapshot does not map are on host 0."""
    return snapshot.host_of_rank[rank] if rank < len(snapshot.host_of_rank) else 0


@dataclass(frozen=True)
class HostCacheState:
    ttl_s: float = 30.0
    last_used: tuple[tuple[int, float], ...] = ()  # (host, when it last used the model), by host

    def lookup(self, host: int, now: float) -> bool:
        """A hit: the host used the model less than `ttl_s` ago."""
        return any(h == host and now - t < self.ttl_s for h, t in self.last_used)

    def insert(self, host: int, now: float) -> HostCacheState:
        """The host uses the model now; expired entries are dropped on the way."""
        kept = {h: t for h, t in self.last_used if now - t < self.ttl_s and h != host}
        kept[host] = now
        return HostCacheState(self.ttl_s, tuple(sorted(kept.items())))

    def cached_hosts(self, now: float) -> tuple[int, ...]:
        return tuple(h for h, t in self.last_used if now - t < self.ttl_s)
