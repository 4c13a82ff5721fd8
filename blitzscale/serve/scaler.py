"""The scale loop: snapshot -> planner -> policy actions -> cluster operations.

The decisions are the pure functions of `blitzscale.control`; this module only executes
them against the live cluster and keeps instance states truthful. An action whose ranks
are still busy with an earlier action is skipped this round (the planner will ask again).
An instance is `tp` consecutive ranks, known by its first (`ControlState.owner`): loads and
releases go to all its ranks, activation and roles to its first, which leads the others.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from blitzscale import clock
from blitzscale.cluster.base import Cluster
from blitzscale.control.backoff import LoadBackoff
from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.host_cache import HostCacheState
from blitzscale.control.planner import desired_counts
from blitzscale.control.policies import (
    DrainAction,
    LoadAction,
    MutateAction,
    ReleaseAction,
    ReviveAction,
    ScaleAction,
    next_host_cache,
    scale_actions,
)
from blitzscale.control.snapshot import ClusterSnapshot, InstanceState
from blitzscale.engine.config import EngineConfig
from blitzscale.messages import ActivateMsg, Role
from blitzscale.serve.instances import Instance
from blitzscale.serve.loads import Loads
from blitzscale.serve.metrics import ClusterMetrics
from blitzscale.serve.router import Router
from blitzscale.serve.state import ControlState

log = logging.getLogger("blitzscale.scaler")
ROLE_STATE = {
    "prefill": InstanceState.PREFILL,
    "decode": InstanceState.DECODE,
    "colocated": InstanceState.COLOCATED,
}
DRAINING = {InstanceState.SHUTTING_PREFILL, InstanceState.SHUTTING_DECODE}


class Scaler:
    def __init__(
        self,
        router: Router,
        planner: PlannerConfig,
        policy: PolicyConfig,
        model: str,
        source: str,
        disk_source: str,
        engine: EngineConfig,
        metrics: ClusterMetrics,
    ) -> None:
        self.router = router
        self.state: ControlState = router.state
        self.cluster: Cluster = router.cluster
        self.planner = planner
        self.policy = policy
        self.model = model
        self.source = source  # spec every worker can resolve (tokenizer, config)
        self.disk_source = disk_source  # our-format folder for disk loads
        self.engine = engine
        self.metrics = metrics
        self.host_cache = HostCacheState(ttl_s=policy.sllm_ttl_s)
        self.backoff = LoadBackoff(base_s=planner.load_retry_s, max_failures=planner.max_load_failures)
        router.on_rank_back.append(self.backoff.fresh)  # a respawned worker starts with a clean slate
        self.busy: set[int] = set()  # instances with an action in flight
        self.events: list[dict[str, Any]] = []  # scale events, for the demo and tests
        self._tasks: set[asyncio.Task[None]] = set()
        self.loads = Loads(self)  # how weights get onto new instances

    @property
    def pd_mode(self) -> bool:
        return self.router.cfg.mode == "pd"

    # --- bring-up -----------------------------------------------------------------------

    @property
    def tp(self) -> int:
        return self.state.tp

    async def bootstrap(self, num_prefill: int, num_decode: int, keep_host_copy: bool) -> None:
        """First instances: instance 0 from disk, the rest over the network from it."""
        first = tuple(range(self.tp))
        self.state.move(0, InstanceState.LOADING, "(disk)")
        seconds, nbytes = await self.loads.from_disk(first)
        self.record("up", "disk", list(first), seconds, nbytes, [])
        if keep_host_copy:  # the cluster's one host copy, for scaling from zero
            await self.cluster.cache_on_host(self.model, 0)
        roles = (
            ["prefill"] * num_prefill + ["decode"] * num_decode
            if self.pd_mode
            else ["colocated"] * num_prefill
        )
        await self.activate_many([0], roles[0])
        others = [k * self.tp for k in range(1, len(roles))]
        for rank in others:
            self.state.move(rank, InstanceState.LOADING, "(network)")
        if others:
            targets = tuple(r for i in others for r in range(i, i + self.tp))
            await self.loads.network(first, targets, multicast=True)
            for rank, role in zip(others, roles[1:], strict=True):
                await self.activate_many([rank], role)

    def activate_msg(self, role: Role, live: bool = False) -> ActivateMsg:
        return ActivateMsg(
            op_id=self.cluster.next_op(),
            model=self.model,
            source=self.source,
            role=role,
            engine=self.engine,
            live=live,
        )

    async def activate_many(self, ranks: list[int], role: Role) -> None:
        """Start engines on freshly loaded instances, all at once."""
        results = await self.cluster.activate({rank: self.activate_msg(role) for rank in ranks})
        for res in results.values():
            self.metrics.activated(res)
        for rank in ranks:
            if role == "decode":  # decode instances are made from prefill ones (design §4)
                self.state.move(rank, InstanceState.PREFILL, "(activated)")
                self.state.move(rank, InstanceState.MUTATING_TO_DECODE, "(bootstrap)")
            self.state.move(rank, ROLE_STATE[role], "(activated)")
        self.router.wake()

    # --- the loop -----------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        r = self.router
        now = clock.now()
        instances = self.state.views()
        used = {rank for i in instances for rank in i.ranks}
        return ClusterSnapshot(
            now=now,
            instances=instances,
            queued_prompt_tokens=sum(len(q.prompt) for q in r.queue)
            + sum(i.outstanding_tokens for i in r.instances.values() if i.rank not in r.live.pairs),
            live_target_tokens=sum(
                i.outstanding_tokens for i in r.instances.values() if i.rank in r.live.pairs
            ),
            migrating_tokens=r.migrations.waiting_tokens,
            free_ranks=tuple(
                x for x in r.cluster.alive_ranks() if x not in used and self.backoff.may_load(x, now)
            ),
            gpu_holders=tuple(self.cluster.pool.gpu_holders(self.model)),
            host_holder=self.cluster.pool.host_holder(self.model),
            tp=self.tp,
            pd_mode=self.pd_mode,
            host_of_rank=self._hosts(),
        )

    def _hosts(self) -> tuple[int, ...]:
        """Rank -> host id, from the cluster's nodes (numbered in order of first rank)."""
        ids: dict[str, int] = {}
        return tuple(ids.setdefault(n, len(ids)) for n in self.cluster.nodes())

    async def stop(self) -> None:
        """Cancel actions in flight (the cluster is about to go away under them)."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.planner.interval_s)
            try:
                await self.step()
            except Exception:  # a failed round must not stop scaling for good
                log.exception("scale round failed")

    async def step(self) -> list[ScaleAction]:
        self._advance_transitions()
        snap = self.snapshot()
        desired = desired_counts(snap, self.planner)
        actions = scale_actions(snap, desired, self.policy, self.planner, self.host_cache)
        self.host_cache = next_host_cache(self.host_cache, snap, actions)
        for a in actions:
            self._launch(a)
        return actions

    def _advance_transitions(self) -> None:
        """States that change on their own: drained instances go warm, mutations complete."""
        for inst in self.state:
            if inst.id in self.busy:
                continue
            if inst.state in DRAINING and inst.is_idle:
                self.state.move(inst.id, InstanceState.SHUTTING_NULL, "(drained)")
            elif inst.state is InstanceState.MUTATING_TO_DECODE and inst.outstanding_tokens == 0:
                self._spawn(inst.id, self._finish_mutation(inst))

    def _launch(self, a: ScaleAction) -> None:
        if isinstance(a, LoadAction):
            targets = tuple(t for t in a.target_ranks if t not in self.busy and self.state.is_free(t))
            if targets != a.target_ranks:
                return
            live = a.live and a.path == "network"
            state = InstanceState.NEW_PREFILL if live else InstanceState.LOADING
            ids = self.instance_ids(targets)
            for t in ids:
                self.state.move(t, state, f"({a.path})")
            self._spawn(ids, self.loads.run_live(a) if live else self.loads.run(a))
            return
        inst = self.state.get(a.instance_id)
        if inst is None or inst.id in self.busy:
            return
        if isinstance(a, ReviveAction):
            self.state.move(inst.id, ROLE_STATE[a.role], "(revived)")
            self.router.wake()
        elif isinstance(a, DrainAction):
            # colocated instances hold running requests, so they drain like decode ones
            prefill = inst.accepts == "prefill"
            state = InstanceState.SHUTTING_PREFILL if prefill else InstanceState.SHUTTING_DECODE
            self.state.move(inst.id, state, "(draining)")
        elif isinstance(a, MutateAction):
            self.state.move(inst.id, InstanceState.MUTATING_TO_DECODE, "(mutating)")
        elif isinstance(a, ReleaseAction):
            self._spawn(inst.id, self._release(inst))

    def instance_ids(self, ranks: tuple[int, ...] | list[int]) -> tuple[int, ...]:
        """The instances these ranks belong to, in order."""
        return tuple(dict.fromkeys(self.state.owner(r) for r in ranks))

    def _spawn(self, ids: int | tuple[int, ...], coro: Any) -> None:
        keys = (ids,) if isinstance(ids, int) else ids
        self.busy.update(keys)
        task = asyncio.create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self.busy.difference_update(keys)
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("scale action failed: %s", t.exception())

        task.add_done_callback(done)

    # --- actions ------------------------------------------------------------------------

    async def _finish_mutation(self, inst: Instance) -> None:
        await self.cluster.set_role(inst.rank, "decode")
        self.state.move(inst.id, InstanceState.DECODE, "(mutated)")
        self.router.wake()

    async def _release(self, inst: Instance) -> None:
        if inst.state is not InstanceState.SHUTTING_NULL or not inst.is_idle:
            return
        await self.cluster.deactivate(inst.rank)
        res = await asyncio.gather(*(self.cluster.release(self.model, r) for r in inst.ranks))
        self.state.move(inst.id, InstanceState.INACTIVE, "(released)")
        freed = sum(int(x.get("freed_bytes", 0)) for x in res)
        kept = all(x.get("standby") for x in res)
        self.record("down", "release", list(inst.ranks), 0.0, freed, [], standby=kept)

    def record(
        self,
        direction: str,
        path: str,
        ranks: list[int],
        seconds: float,
        nbytes: int,
        sources: list[int],
        report: dict[int, dict[str, Any]] | None = None,
        standby: bool | None = None,
    ) -> None:
        """`seconds` is the whole operation as the scaler saw it; a transfer's `report` adds,
        per target, the link's own time and when its first layer was usable; a release
        says whether the worker kept the buffer and engine as its standby."""
        self.metrics.scale_events.labels(direction=direction, path=path).inc()
        if direction == "up":
            self.metrics.transfer_bytes.labels(path=path).inc(nbytes)
            for rank in self.instance_ids(ranks):  # what loading it again would cost (no-thrash)
                self.state.loaded(rank, seconds)
        event = {
            "time": clock.now(),
            "direction": direction,
            "path": path,
            "ranks": ranks,
            "sources": sources,
            "seconds": round(seconds, 4),
            "bytes": nbytes,
            "nodes": self.nodes_of(ranks),  # where the ranks and the sources live
            "source_nodes": self.nodes_of(sources),
        }
        if report:
            event["link_s"] = round(max(v["seconds"] for v in report.values()), 4)
            event["first_layer_s"] = round(min(v["first_layer_s"] for v in report.values()), 4)
            event["senders_done_s"] = round(max(v.get("senders_done_s", 0.0) for v in report.values()), 4)
            event["replied_s"] = round(max(v.get("replied_s", 0.0) for v in report.values()), 4)
        if standby is not None:
            event["standby"] = standby
        self.events.append(event)
        log.info(
            "scale %s via %s: ranks %s (nodes %s) from %s (nodes %s) in %.3f s (%d bytes)",
            direction,
            path,
            ranks,
            ",".join(event["nodes"]),
            sources,
            ",".join(event["source_nodes"]) or "-",
            seconds,
            nbytes,
        )

    def nodes_of(self, ranks: list[int]) -> list[str]:
        """The nodes `ranks` live on, each once, in rank order."""
        nodes = self.cluster.nodes()
        return list(dict.fromkeys(nodes[r] if r < len(nodes) else "?" for r in ranks))
