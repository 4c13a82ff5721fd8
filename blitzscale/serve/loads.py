"""How the scaler brings weights onto new instances: over the network (chain multicast,
or live: serving while they arrive), from the one host copy, or from disk; then the
engines are started. Composed into `Scaler`, which chooses the actions (control/policies.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from blitzscale import clock
from blitzscale.cluster.base import Cluster
from blitzscale.control.backoff import LoadBackoff
from blitzscale.control.policies import LoadAction
from blitzscale.control.snapshot import InstanceState
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import ReplyMsg, Role
from blitzscale.serve.router import Router

if TYPE_CHECKING:
    from blitzscale.serve.scaler import Scaler

log = logging.getLogger("blitzscale.scaler")


class Loads:
    """The scaler's load actions; composed into it (`Scaler.loads`)."""

    def __init__(self, scaler: Scaler) -> None:
        self.scaler = scaler
        self.router: Router = scaler.router
        self.cluster: Cluster = scaler.cluster
        self.model = scaler.model
        self.source = scaler.source
        self.disk_source = scaler.disk_source
        self.backoff: LoadBackoff = scaler.backoff

    async def run(self, a: LoadAction) -> None:
        role = "prefill" if self.scaler.pd_mode else "colocated"
        from_host = a.path == "host" and self.cluster.pool.host_holder(self.model) is not None
        if a.path != "network" and not from_host:
            # Disk loads are independent: each target reads on its own and serves as soon
            # as its own load ends, whatever the others do.
            done = await asyncio.gather(  # (the page cache is dropped once, by the first)
                *(self._load_disk(t, role, cold=i == 0) for i, t in enumerate(a.target_ranks)),
                return_exceptions=True,
            )
            for t, err in zip(a.target_ranks, done, strict=True):  # every target ran to its end
                if isinstance(err, BaseException):
                    log.error("starting rank %d after its disk load failed: %s", t, err)
            return
        try:
            if a.path == "network":
                await self.network(a.sources, a.target_ranks, a.multicast)
            else:
                await self._load_host(a.target_ranks)
        except BlitzScaleError as e:
            self._load_failed(a.target_ranks, e)
            return
        self._load_succeeded(a.target_ranks)
        await self.scaler.activate_many(list(a.target_ranks), role)

    def _load_failed(self, targets: tuple[int, ...], e: BlitzScaleError) -> None:
        """Targets that did not get the model go back to INACTIVE and wait (backing off)
        before a load may pick them again; repeated failures take a rank out of service."""
        log.error("load onto %s failed: %s", list(targets), e)
        now = clock.now()
        for t in targets:
            if t in self.cluster.pool.gpu_holders(self.model):
                continue
            self.scaler.state.move(t, InstanceState.INACTIVE, "(load failed)")
            self.scaler.metrics.load_failures.inc()
            if self.backoff.failed(t, now):
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
        partner = self.scaler.state.get(a.partner)
        if partner is not None and partner.state in (InstanceState.PREFILL, InstanceState.COLOCATED):
            why = f"(relays for {list(a.target_ranks)})"
            self.scaler.state.move(partner.id, InstanceState.OLD_PREFILL, why)
        else:
            partner = None
        self.router.live.begin(a.target_ranks, partner.rank if partner is not None else None)
        activated: set[int] = set()

        def on_live(reply: ReplyMsg) -> None:  # on this loop, as each reply arrives
            if reply.ok:
                activated.add(reply.rank)
                self.scaler.metrics.activated(reply.result)
            else:
                log.warning("live activation of rank %d failed: %s", reply.rank, reply.error)
            self.router.wake()

        live = {t: self.scaler.activate_msg(role, live=True) for t in a.target_ranks}
        t0 = clock.now()
        try:
            report = await self.cluster.transfer(
                self.model,
                self.source,
                list(a.sources),
                list(a.target_ranks),
                live=live,
                on_live=on_live,
            )
        except BlitzScaleError as e:
            self._load_failed(a.target_ranks, e)
            for t in a.target_ranks:
                self.router.live.end(t)
            return
        self._load_succeeded(a.target_ranks)
        nbytes = sum(v["bytes"] for v in report.values())
        self.scaler.record(
            "up", "network", list(a.target_ranks), clock.now() - t0, nbytes, list(a.sources), report
        )
        missed = [t for t in a.target_ranks if t not in activated]
        if missed:  # loaded, but never started live: start them the ordinary way
            for t in missed:
                self.router.live.end(t)
            await self.scaler.activate_many(missed, role)

    async def network(self, sources: tuple[int, ...], targets: tuple[int, ...], multicast: bool) -> None:
        groups = [targets] if multicast else [(t,) for t in targets]
        for group in groups:
            t0 = clock.now()
            report = await self.cluster.transfer(self.model, self.source, list(sources), list(group))
            nbytes = sum(v["bytes"] for v in report.values())
            self.scaler.record("up", "network", list(group), clock.now() - t0, nbytes, list(sources), report)

    async def _load_host(self, targets: tuple[int, ...]) -> None:
        holder = self.cluster.pool.host_holder(self.model)
        t0 = clock.now()
        report = await self.cluster.transfer(self.model, self.source, [holder], list(targets), from_host=True)
        nbytes = sum(v["bytes"] for v in report.values())
        self.scaler.record("up", "host", list(targets), clock.now() - t0, nbytes, [holder], report)

    async def _load_disk(self, target: int, role: Role, cold: bool) -> None:
        t0 = clock.now()
        try:
            res = await self.cluster.load(
                self.model,
                target,
                self.disk_source,
                max_bytes_per_s=self.cluster.cfg.disk_bytes_per_s,
                cold=cold,  # from the disk itself, as a scale-up from an SSD would
            )
        except BlitzScaleError as e:
            self._load_failed((target,), e)
            return
        self.scaler.record("up", "disk", [target], clock.now() - t0, int(res.get("bytes", 0)), [])
        self._load_succeeded((target,))
        await self.scaler.activate_many([target], role)
