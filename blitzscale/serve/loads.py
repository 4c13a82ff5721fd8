"""How the scaler brings weights onto new instances: over the network (chain multicast,
or live: serving while they arrive), from the one host copy, or from disk; then the
engines are started, and after a network load the hottest cached prefixes follow.
Composed into `Scaler`, which chooses the actions (control/policies.py); `LoadsOwner`
names what the loads use of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from blitzscale import clock
from blitzscale.cluster.base import Cluster
from blitzscale.cluster.calls import ClusterOpError
from blitzscale.cluster.commands import Activation, LiveStart
from blitzscale.cluster.results import TransferResult, transfer_bytes
from blitzscale.control.backoff import LoadBackoff
from blitzscale.control.config import PolicyConfig
from blitzscale.control.policies import LoadAction
from blitzscale.control.snapshot import InstanceState
from blitzscale.core.roles import Role
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import ActivateResult
from blitzscale.serve.events import Direction
from blitzscale.serve.metrics import ClusterMetrics
from blitzscale.serve.models import ScaledModel
from blitzscale.serve.router import Router
from blitzscale.serve.state import ControlState

log = logging.getLogger("blitzscale.scaler")


class LoadsOwner(Protocol):
    """What the loads use of the scaler that composes them."""

    router: Router
    cluster: Cluster
    state: ControlState
    backoff: LoadBackoff
    metrics: ClusterMetrics
    policy: PolicyConfig
    model: str  # the default model's name

    @property
    def models(self) -> Mapping[str, ScaledModel]: ...

    @property
    def pd_mode(self) -> bool: ...

    @property
    def tp(self) -> int: ...

    def instance_ids(self, ranks: tuple[int, ...] | list[int]) -> tuple[int, ...]:
        """The instances these ranks belong to, in order."""
        ...

    def activation(self, role: Role, model: str | None = None) -> Activation: ...

    async def activate_many(
        self, ranks: list[int], role: Role, model: str | None = None, prefix_source: int | None = None
    ) -> None: ...

    def record(
        self,
        direction: Direction,
        path: str,
        ranks: list[int],
        seconds: float,
        nbytes: int,
        sources: list[int],
        report: dict[int, TransferResult] | None = None,
        standby: bool | None = None,
        model: str | None = None,
    ) -> None:
        """A scale event (metrics, the demo's events, the instances' load times)."""
        ...


class Loads:
    """The scaler's load actions; composed into it (`Scaler.loads`)."""

    def __init__(self, scaler: LoadsOwner) -> None:
        self.scaler = scaler
        self.router: Router = scaler.router
        self.cluster: Cluster = scaler.cluster
        self.backoff: LoadBackoff = scaler.backoff

    def _name(self, model: str | None) -> str:
        return model or self.scaler.model

    async def run(self, a: LoadAction) -> None:
        role = "prefill" if self.scaler.pd_mode else "colocated"
        model = self._name(a.model)
        from_host = a.path == "host" and self.cluster.pool.host_holder(model) is not None
        ids = self.scaler.instance_ids(a.target_ranks)
        if a.path != "network" and not from_host:
            # Disk loads are independent: each target reads on its own and serves as soon
            # as its own load ends, whatever the others do.
            done = await asyncio.gather(  # (the page cache is dropped once, by the first)
                *(self._load_disk(self._ranks(t), role, model, cold=i == 0) for i, t in enumerate(ids)),
                return_exceptions=True,
            )
            for t, err in zip(ids, done, strict=True):  # every target ran to its end
                if isinstance(err, BaseException):
                    log.error("starting rank %d after its disk load failed: %s", t, err)
            return
        try:
            if a.path == "network":
                await self.network(a.sources, a.target_ranks, a.multicast, model)
            else:
                await self._load_host(a.target_ranks, model)
        except BlitzScaleError as e:
            self._load_failed(a.target_ranks, e, model)
            await self._drop_partial(a.target_ranks, model)
            return
        self._load_succeeded(a.target_ranks)
        source = a.sources[0] if a.path == "network" and a.sources else None  # (its hot prefixes)
        await self.scaler.activate_many(list(ids), role, model=model, prefix_source=source)

    async def _drop_partial(self, targets: tuple[int, ...], model: str) -> None:
        """Shards of a tp > 1 instance that loaded while another did not are released: the
        instance is INACTIVE, and its ranks must hold nothing for the next load."""
        holders = set(self.cluster.pool.gpu_holders(model))
        for i in self.scaler.instance_ids(targets):
            ranks = self._ranks(i)
            if len(ranks) > 1 and not holders.issuperset(ranks):
                for r in holders.intersection(ranks):
                    try:
                        await self.cluster.release(model, r)
                    except BlitzScaleError as e:
                        log.error("releasing the shard on rank %d failed: %s", r, e)

    def _ranks(self, instance_id: int) -> tuple[int, ...]:
        return tuple(range(instance_id, instance_id + self.scaler.tp))

    def _load_failed(self, targets: tuple[int, ...], e: BlitzScaleError, model: str) -> None:
        """Targets that did not get the model go back to INACTIVE and wait (backing off)
        before a load may pick them again; repeated failures take a rank out of service.
        An instance with any shard missing did not get it."""
        no_room = isinstance(e, ClusterOpError) and e.no_room
        if no_room:
            log.warning("load onto %s waits for device memory: %s", list(targets), e)
        else:
            log.error("load onto %s failed: %s", list(targets), e)
        now = clock.now()
        holders = set(self.cluster.pool.gpu_holders(model))
        for i in self.scaler.instance_ids(targets):
            if holders.issuperset(self._ranks(i)):
                continue
            self.scaler.state.move(i, InstanceState.INACTIVE, "(no room)" if no_room else "(load failed)")
            if not no_room:
                self.scaler.metrics.load_failures.inc()
        for t in targets:
            if t in holders:
                continue
            if no_room:
                self.backoff.no_room(t, now)  # (tried again soon; the rank is fine)
            elif self.backoff.failed(t, now):
                log.error(
                    "rank %d is out of service after %d failed loads in a row (last: %s); "
                    "its worker is restarted",
                    t,
                    self.backoff.max_failures,
                    e,
                )
                self.router.respawner.restart(t)  # a fresh process, fresh links

    def _load_succeeded(self, targets: tuple[int, ...]) -> None:
        for t in targets:
            self.backoff.succeeded(t)

    async def run_live(self, a: LoadAction) -> None:
        """ZigZag (design §2.3): targets start serving as soon as their first layers land,
        and `a.partner` (now OLD_PREFILL) relays their tasks when it is idle."""
        role = "prefill" if self.scaler.pd_mode else "colocated"
        model = self._name(a.model)
        partner = self.scaler.state.get(a.partner)
        if partner is not None and partner.model != model:
            partner = None
        if partner is not None and partner.state in (InstanceState.PREFILL, InstanceState.COLOCATED):
            why = f"(relays for {list(a.target_ranks)})"
            self.scaler.state.move(partner.id, InstanceState.OLD_PREFILL, why)
        else:
            partner = None
        ids = self.scaler.instance_ids(a.target_ranks)  # (tp > 1: leaders; their shards follow)
        self.router.live.begin(ids, partner.rank if partner is not None else None, a.sources)
        activated: dict[int, ActivateResult] = {}

        def on_live(start: LiveStart) -> None:  # on this loop, as each reply arrives
            if start.result is not None:
                activated[start.rank] = start.result
                self.scaler.metrics.activated(start.result)
            else:
                log.warning("live activation of rank %d failed: %s", start.rank, start.error)
            self.router.wake()

        live = dict.fromkeys(ids, self.scaler.activation(role, model))
        t0 = clock.now()
        try:
            report = await self.cluster.transfer(
                model,
                self.scaler.models[model].source,
                list(a.sources),
                list(a.target_ranks),
                live=live,
                on_live=on_live,
                may_join=self.scaler.policy.joins_chains,
            )
        except BlitzScaleError as e:
            self._load_failed(a.target_ranks, e, model)
            await self._drop_partial(a.target_ranks, model)
            for t in ids:
                self.router.live.end(t)
            return
        self._load_succeeded(a.target_ranks)
        nbytes = transfer_bytes(report)
        self.scaler.record(
            "up",
            "network",
            list(a.target_ranks),
            clock.now() - t0,
            nbytes,
            list(a.sources),
            report,
            model=model,
        )
        if a.sources:  # serving already: the hot prefixes reach them as the weights did
            await self.ship_prefixes(a.sources[0], activated, model)
        missed = [t for t in ids if t not in activated]
        if missed:  # loaded, but never started live: start them the ordinary way
            for t in missed:
                self.router.live.end(t)
            await self.scaler.activate_many(
                missed, role, model=model, prefix_source=a.sources[0] if a.sources else None
            )

    def prefix_source(self, model: str, fallback: int, exclude: Mapping[int, object]) -> int:
        """Where a new instance's hot prefixes come from: the instance of `model` that
        computes prompts (prefill, colocated, or a live target's partner) whose cache was
        hit the most, not one of the new ones; else `fallback` (the weights' source). In pd
        mode the weights come from decode instances, whose caches are only ever imported
        into, never looked up: the hot ones are the prefill instances'."""
        computing = (InstanceState.PREFILL, InstanceState.COLOCATED, InstanceState.OLD_PREFILL)
        best = [
            (i.stats.prefix_hits if i.stats is not None else 0, -i.rank, i.rank)
            for i in self.router.instances.values()
            if i.model == model and i.state in computing and i.rank not in exclude
        ]
        return max(best)[2] if best else fallback

    async def ship_prefixes(self, source: int, targets: Mapping[int, ActivateResult], model: str) -> None:
        """The most reused cached prefixes of `model` (from `prefix_source`; `source`, the
        weights' source, when no other instance computes prompts) into each new instance
        (one after another: the source packs a copy for each), up to `hot_prefix_share` of
        its KV blocks. Instances of one rank only; a failure leaves the target empty, serving."""
        share = self.scaler.policy.hot_prefix_share
        if share <= 0 or self.scaler.tp > 1:
            return
        source = self.prefix_source(model, source, targets)
        if source in targets:
            return
        for rank, res in targets.items():
            try:
                shipped = await self.cluster.ship_prefixes(
                    model, source, rank, int(share * res.num_kv_blocks)
                )
            except BlitzScaleError as e:
                log.warning("hot prefixes of %s from rank %d to rank %d: %s", model, source, rank, e)
                continue
            if shipped.blocks:
                self.scaler.metrics.prefixes_shipped(model, shipped.blocks, shipped.bytes)
                self.router.prefixes_shipped(model, rank, list(shipped.hashes))
                log.info(
                    "%d hot prefix blocks of %s from rank %d to rank %d (%.1f MB, %.3f s)",
                    shipped.blocks, model, source, rank, shipped.bytes / 1e6, shipped.seconds,
                )  # fmt: skip

    async def network(
        self, sources: tuple[int, ...], targets: tuple[int, ...], multicast: bool, model: str | None = None
    ) -> None:
        """Sources and targets are whole instances' ranks (shard k to shard k)."""
        name = self._name(model)
        source = self.scaler.models[name].source
        ids = self.scaler.instance_ids(targets)
        groups = [targets] if multicast else [self._ranks(i) for i in ids]
        for group in groups:
            t0 = clock.now()
            report = await self.cluster.transfer(
                name, source, list(sources), list(group), may_join=self.scaler.policy.joins_chains
            )
            nbytes = transfer_bytes(report)
            self.scaler.record(
                "up", "network", list(group), clock.now() - t0, nbytes, list(sources), report, model=name
            )

    async def _load_host(self, targets: tuple[int, ...], model: str) -> None:
        holder = self.cluster.pool.host_holder(model)
        assert holder is not None
        shards = list(self._ranks(holder))  # (tp > 1: each shard's host memory holds its own)
        source = self.scaler.models[model].source
        t0 = clock.now()
        report = await self.cluster.transfer(model, source, shards, list(targets), from_host=True)
        nbytes = transfer_bytes(report)
        self.scaler.record("up", "host", list(targets), clock.now() - t0, nbytes, shards, report, model=model)

    async def from_disk(
        self, ranks: tuple[int, ...], cold: bool = False, model: str | None = None
    ) -> tuple[float, int]:
        """Load one instance from disk, every shard at once: (seconds, bytes). Raises if
        any shard failed (the shards that loaded stay in the pool)."""
        name = self._name(model)
        folder = self.scaler.models[name].disk_source
        cap = self.cluster.cfg.disk_bytes_per_s
        t0 = clock.now()
        done = await asyncio.gather(
            *(
                self.cluster.load(name, r, folder, max_bytes_per_s=cap, cold=cold and k == 0)
                for k, r in enumerate(ranks)
            ),
            return_exceptions=True,
        )
        loaded = []
        for res in done:
            if isinstance(res, BaseException):
                raise res
            loaded.append(res)
        return clock.now() - t0, sum(r.bytes for r in loaded)

    async def _load_disk(self, target: tuple[int, ...], role: Role, model: str, cold: bool) -> None:
        """`cold`: from the disk itself, as a scale-up from an SSD would."""
        try:
            seconds, nbytes = await self.from_disk(target, cold, model)
        except BlitzScaleError as e:
            self._load_failed(target, e, model)
            await self._drop_partial(target, model)
            return
        self.scaler.record("up", "disk", list(target), seconds, nbytes, [], model=model)
        self._load_succeeded(target)
        await self.scaler.activate_many([target[0]], role, model=model)
        self.scaler.copy_to_host_soon(model, target[0])
