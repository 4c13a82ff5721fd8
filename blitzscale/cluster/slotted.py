"""Several models resident on each worker: a cluster whose ranks are serving slots.

With `[cluster] models_per_rank = S` a worker holds up to S models at once, each with its
own engine and serving loop (worker/worker.py), each an instance of its own to the control
plane. `SlottedCluster` gives the control plane S * W ranks over a cluster of W workers:
rank v is worker `v % W`'s slot `v // W`. The router, the scaler and the policies are
unchanged: a free rank is a free slot, and a model's instances on one worker share that
worker's device, links and host memory (`nodes()` says so). Weights, transfers, host
copies and releases are the worker's (by model); activation, role and deactivation name
the slot. A worker holds a model at most once, so the slots of one model are on different
workers (`free_slots`); each slot's engine takes an equal share of the device's memory
(`EngineConfig.models_per_device`), so one slot's load never starves another's KV cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from blitzscale.cluster.base import Cluster
from blitzscale.cluster.commands import Activation, CostQuery, LiveStart
from blitzscale.cluster.pool import CopiesView
from blitzscale.cluster.results import PrefixShipResult, RespawnResult, TransferResult
from blitzscale.control.costmodel import CostReport
from blitzscale.core.roles import Role
from blitzscale.messages import ActivateResult, HostCopyResult, LoadResult, ReleaseResult


class SlotPool:
    """The parameter pool in slot ranks: a worker's device copy of a model is at the slot
    it was loaded into (its host copy, a worker's, at slot 0's rank = the worker's)."""

    def __init__(self, cluster: SlottedCluster) -> None:
        self._c = cluster

    @property
    def _inner(self) -> Any:
        return self._c.inner.pool

    def gpu_holders(self, model: str) -> list[int]:
        return sorted(self._c.rank_of(model, w) for w in self._inner.gpu_holders(model))

    def host_holder(self, model: str) -> int | None:
        return self._inner.host_holder(model)

    def host_ranks(self) -> set[int]:
        return self._inner.host_ranks()

    def models_on(self, rank: int) -> list[str]:
        w, slot = self._c.split(rank)
        return [m for m in self._inner.models_on(w) if self._c.slot_of(m, w) == slot]

    def snapshot(self) -> dict[str, CopiesView]:
        return self._inner.snapshot()


class _Restarts(Counter[int]):
    """Respawns by slot rank: a slot's are its worker's."""

    def __init__(self, inner: Counter[int], world: int) -> None:
        super().__init__()
        self._inner, self._world = inner, world

    def __getitem__(self, rank: int) -> int:
        return self._inner[rank % self._world]

    def values(self) -> Any:
        return self._inner.values()

    def __iter__(self) -> Iterator[int]:
        return iter(self._inner)


class SlottedCluster:
    def __init__(self, inner: Any, per_rank: int) -> None:
        if per_rank < 1:
            raise ValueError(f"models_per_rank must be >= 1, got {per_rank}")
        self.inner = inner
        self.per_rank = per_rank
        self.cfg = inner.cfg
        self.pool = SlotPool(self)
        self._slots: dict[tuple[str, int], int] = {}  # (model, worker) -> the slot it is in
        self._pending: Counter[tuple[str, int]] = Counter()  # operations placing it, not ended
        self._respawns: dict[int, asyncio.Task[RespawnResult]] = {}

    def __getattr__(self, name: str) -> Any:  # lifecycle, tokens, calls: the inner cluster's
        return getattr(self.inner, name)

    # --- ranks ----------------------------------------------------------------------------

    @property
    def workers(self) -> int:
        return self.inner.world_size

    @property
    def world_size(self) -> int:
        return self.workers * self.per_rank

    @property
    def restarts(self) -> Counter[int]:
        return _Restarts(self.inner.restarts, self.workers)

    def split(self, rank: int) -> tuple[int, int]:
        """Slot rank -> (worker, slot)."""
        slot, worker = divmod(rank, self.workers)
        if slot >= self.per_rank:
            raise ValueError(f"rank {rank} is beyond the {self.world_size} slots")
        return worker, slot

    def slot_of(self, model: str, worker: int) -> int:
        return self._slots.get((model, worker), 0)

    def rank_of(self, model: str, worker: int) -> int:
        return worker + self.slot_of(model, worker) * self.workers

    def workers_with(self, model: str) -> set[int]:
        """Workers that hold `model`, load it, or are about to."""
        placed = {w for m, w in self._slots if m == model}
        return self.inner.pool.ranks_of(model) | placed

    def _place(self, model: str, ranks: list[int]) -> list[int]:
        """The workers of `ranks`, each now placing `model` in its slot (until `_done`)."""
        workers = []
        for r in ranks:
            w, slot = self.split(r)
            held = self._slots.get((model, w))
            if held is not None and held != slot:
                raise ValueError(f"worker {w} already holds {model} in slot {held}")
            workers.append(w)
        for r, w in zip(ranks, workers, strict=True):
            self._slots[(model, w)] = self.split(r)[1]
            self._pending[(model, w)] += 1
        return workers

    def _done(self, model: str, workers: list[int]) -> None:
        """Operations on `workers` ended: forget the slots of copies of `model` the pool no
        longer has (failed or released), unless another operation is placing them."""
        for w in workers:
            self._pending[(model, w)] -= 1
            if self._pending[(model, w)] <= 0:
                del self._pending[(model, w)]
        pool = self.inner.pool
        for m, w in list(self._slots):
            if m == model and not self._pending[(m, w)] and model not in pool.models_on(w):
                del self._slots[(m, w)]

    def _ranks(self, model: str, results: dict[int, Any]) -> dict[int, Any]:
        return {self.rank_of(model, w): v for w, v in results.items()}

    # --- status ---------------------------------------------------------------------------

    def alive_ranks(self) -> list[int]:
        alive = self.inner.alive_ranks()
        return sorted(w + k * self.workers for k in range(self.per_rank) for w in alive)

    def nodes(self) -> tuple[str, ...]:
        return tuple(self.inner.nodes()) * self.per_rank

    def dead_now(self) -> set[int]:
        dead = self.inner.dead_now()
        for m, w in list(self._slots):
            if w in dead and not self._pending[(m, w)]:
                del self._slots[(m, w)]
        return {w + k * self.workers for k in range(self.per_rank) for w in dead}

    def status(self) -> Any:
        return self.inner.status()

    # --- loads ----------------------------------------------------------------------------

    async def load(
        self, model: str, rank: int, source: str, *, max_bytes_per_s: float = 0.0, cold: bool = False
    ) -> LoadResult:
        (w,) = self._place(model, [rank])
        try:
            return await self.inner.load(model, w, source, max_bytes_per_s=max_bytes_per_s, cold=cold)
        finally:
            self._done(model, [w])

    async def transfer(
        self,
        model: str,
        source: str,
        sources: list[int],
        targets: list[int],
        *,
        from_host: bool = False,
        live: dict[int, Activation] | None = None,
        on_live: Callable[[LiveStart], None] | None = None,
        **kw: Any,
    ) -> dict[int, TransferResult]:
        src = [self.split(r)[0] for r in sources]
        tgt = self._place(model, targets)
        inner_live = None
        if live is not None:
            inner_live = {}
            for r, a in live.items():
                w, slot = self.split(r)
                inner_live[w] = dataclasses.replace(a, slot=slot)
        relay = None
        if on_live is not None:
            cb = on_live

            def relay(start: LiveStart) -> None:
                cb(dataclasses.replace(start, rank=self.rank_of(model, start.rank)))

        try:
            out = await self.inner.transfer(
                model, source, src, tgt, from_host=from_host, live=inner_live, on_live=relay, **kw
            )
        finally:
            self._done(model, tgt)
        return {  # (where each came from, in slot ranks too)
            r: dataclasses.replace(v, sources=tuple(self.rank_of(model, w) for w in v.sources))
            for r, v in self._ranks(model, out).items()
        }

    async def cache_on_host(self, model: str, rank: int) -> HostCopyResult:
        return await self.inner.cache_on_host(model, self.split(rank)[0])

    async def release_host_copy(self, model: str) -> None:
        await self.inner.release_host_copy(model)

    # --- serving ----------------------------------------------------------------------------

    async def activate(self, ranks: dict[int, Activation]) -> dict[int, ActivateResult]:
        by_slot: dict[int, dict[int, Activation]] = {}
        for r, a in ranks.items():
            w, slot = self.split(r)
            by_slot.setdefault(slot, {})[w] = dataclasses.replace(a, slot=slot)
        done = await asyncio.gather(*(self.inner.activate(acts) for acts in by_slot.values()))
        out: dict[int, ActivateResult] = {}
        for slot, results in zip(by_slot, done, strict=True):
            out.update({w + slot * self.workers: res for w, res in results.items()})
        return out

    async def set_role(self, rank: int, role: Role) -> None:
        w, slot = self.split(rank)
        await self.inner.set_role(w, role, slot=slot)

    async def ship_prefixes(self, model: str, src: int, dst: int, max_blocks: int) -> PrefixShipResult:
        s, d = self.split(src)[0], self.split(dst)[0]
        return await self.inner.ship_prefixes(model, s, d, max_blocks)

    async def deactivate(self, rank: int) -> None:
        w, slot = self.split(rank)
        await self.inner.deactivate(w, slot=slot)

    # --- the rest -------------------------------------------------------------------------

    async def release(self, model: str, rank: int, host_copy: bool = False) -> ReleaseResult:
        (w,) = self._place(model, [rank])  # (its own slot: it is there)
        try:
            return await self.inner.release(model, w, host_copy)
        finally:
            self._done(model, [w])

    async def checksum(self, model: str, rank: int, host_copy: bool = False) -> str:
        return await self.inner.checksum(model, self.split(rank)[0], host_copy)

    async def cost_report(self, rank: int, query: CostQuery) -> CostReport:
        return await self.inner.cost_report(self.split(rank)[0], query)

    async def respawn(self, rank: int) -> RespawnResult:
        """Once per worker: every slot of a dead worker asks, the first brings it back."""
        w, _ = self.split(rank)
        task = self._respawns.get(w)
        if task is None or task.done():
            task = self._respawns[w] = asyncio.get_running_loop().create_task(self.inner.respawn(w))
        return await asyncio.shield(task)

    def kill(self, rank: int) -> None:
        self.inner.kill(self.split(rank)[0])


def slotted(cluster: Cluster, per_rank: int) -> Cluster:
    """`cluster` itself with one model per worker, else its slots."""
    return cluster if per_rank == 1 else SlottedCluster(cluster, per_rank)  # type: ignore[return-value]


def slot_workers(cluster: Cluster) -> int:
    """The GPUs whose slots `cluster`'s ranks are (0: one model a worker, a rank is a GPU)."""
    return cluster.workers if isinstance(cluster, SlottedCluster) else 0


def free_slots(
    cluster: Cluster, model: str, ranks: list[int], instances: Iterable[int] = ()
) -> tuple[int, ...]:
    """The free ranks `model` may be loaded into: all of them on a cluster of one model a
    worker; with slots, the first free slot of each worker that holds no copy of `model`
    and has no instance of it (`instances`: their ranks, a load just launched included):
    two slots of one worker never take the same model."""
    if not isinstance(cluster, SlottedCluster):
        return tuple(ranks)
    busy = {cluster.split(r)[0] for r in instances} | cluster.workers_with(model)
    out: dict[int, int] = {}
    for r in sorted(ranks):
        w, _ = cluster.split(r)
        if w not in out and w not in busy:
            out[w] = r
    return tuple(sorted(out.values()))
