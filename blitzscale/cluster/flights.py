"""GPU-to-GPU loads in flight, and which of them a new load may join.

A load whose source is still sending an earlier load of the same model would otherwise
wait for it (the source's line, cluster/lines.py). Instead it joins that chain: the chain's
last target forwards each layer to the new targets as soon as it has landed there
(transfer/executor.py waits on its readiness), so the new load neither waits for the
source nor takes its link. Pure bookkeeping, owned by a cluster (local or simulated);
both decide a join the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class Flight:
    """One GPU-to-GPU load under way. `senders`: the ranks it sends from; `origins`: the
    sources it stems from (for a load that joined another, that one's origins);
    `tails[k]`: the rank of shard k that receives last, whose outbound link it leaves free."""

    model: str
    senders: frozenset[int]
    origins: frozenset[int]
    tails: tuple[int, ...]

    @staticmethod
    def of(model: str, sources: list[int], tails: list[int]) -> Flight:
        return Flight(model, frozenset(sources), frozenset(sources), tuple(tails))

    def joined_by(self, tails: list[int]) -> Flight:
        """The flight of a load that joins this one: it sends from this one's tails and
        stems from its origins; its own targets are the chain's new tails (a third load
        from the same busy source extends the chain again)."""
        return Flight(self.model, frozenset(self.tails), self.origins, tuple(tails))


class Flights:
    def __init__(self) -> None:
        self._now: list[Flight] = []

    @contextlib.contextmanager
    def flying(self, flight: Flight | None) -> Iterator[None]:
        """`flight` may be joined while the block runs (None: a load nothing may join,
        such as one from the host copy)."""
        if flight is None:
            yield
            return
        self._now.append(flight)
        try:
            yield
        finally:
            self._now.remove(flight)

    def joinable(self, model: str, sources: list[int], shards: int) -> Flight | None:
        """While one of `sources` is sending `model`, the latest load of it in flight that
        stems from them (with one tail per shard): a load from those sources joins it
        rather than waiting. None once the sources are free again."""
        wanted = set(sources)
        now = [f for f in self._now if f.model == model]
        if not any(f.senders & wanted for f in now):
            return None
        return next((f for f in reversed(now) if f.origins & wanted and len(f.tails) == shards), None)
