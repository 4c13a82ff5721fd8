"""What the cluster's operations return (cluster/base.py), beyond a worker's own reply.

A load, host copy, activation, release or checksum returns its worker's typed reply
(`blitzscale.messages`: `LoadResult`, `HostCopyResult`, `ActivateResult`, `ReleaseResult`);
a transfer returns a `TransferResult` per receiving rank, hot prefixes shipped a
`PrefixShipResult`, a respawn a `RespawnResult`, and `status()` a `ClusterStatus`. Plain data, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from blitzscale.cluster.pool import CopiesView


@dataclass(frozen=True)
class TransferResult:
    """One receiving rank of a transfer, in seconds counted from the moment it and every
    rank upstream of it had its buffers ready (a slow allocation elsewhere is not charged to
    the link): to completion (`seconds`), to its first usable layer (`first_layer_s`);
    `alloc_s` is its own preparation, `ready_order` its segments in the order they landed.
    `senders_done_s`: when the chain heads saw their last send complete, `replied_s`: when
    the controller had every reply (both from the earliest start among the ranks).
    `sources`: the ranks its chains started from (for a load that joined a chain in
    flight, that chain's last target)."""

    seconds: float
    first_layer_s: float
    bytes: int
    alloc_s: float = 0.0
    ready_order: tuple[int, ...] = ()
    senders_done_s: float = 0.0
    replied_s: float = 0.0
    sources: tuple[int, ...] = ()

    @property
    def GBps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


def transfer_bytes(report: dict[int, TransferResult]) -> int:
    """Bytes a transfer moved, over every receiver."""
    return sum(r.bytes for r in report.values())


@dataclass(frozen=True)
class PrefixShipResult:
    """Hot prefix blocks shipped from a serving source to a new instance: how many, their
    bytes, and the seconds from asking the source to the last byte sent (0 blocks: the
    source had no reused prefix cached); `hashes`: theirs, parents first."""

    blocks: int
    bytes: int
    seconds: float
    hashes: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class RespawnResult:
    rank: int
    incarnation: int  # 0 at cluster start, +1 each respawn
    seconds: float


@dataclass(frozen=True)
class ClusterStatus:
    """Which ranks live, where, and where every model's copies are."""

    alive: tuple[int, ...]
    dead: tuple[int, ...]
    nodes: tuple[str, ...] = ()  # by rank
    incarnations: tuple[int, ...] = ()  # by rank
    restarts: dict[int, int] = field(default_factory=dict)  # successful respawns, by rank
    pool: dict[str, CopiesView] = field(default_factory=dict)
