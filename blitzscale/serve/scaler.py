"""The scale loop: snapshot -> planner -> policy actions -> cluster operations.

The decisions are the pure functions of `blitzscale.control`; this module only executes
them against the live cluster and keeps instance states truthful. An action whose ranks
are still busy with an earlier action is skipped this round (the planner will ask again).
An instance is `tp` consecutive ranks, known by its first (`ControlState.owner`): loads and
releases go to all its ranks, activation and roles to its first, which leads the others.
Several models share the ranks: each round every model's view goes to
`control/models.py`, whose actions name their model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from blitzscale import clock
from blitzscale.cluster.base import Cluster
from blitzscale.cluster.commands import Activation
from blitzscale.cluster.results import TransferResult
from blitzscale.cluster.slotted import free_slots, slot_workers
from blitzscale.control.backoff import LoadBackoff
from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.costmodel import Profile
from blitzscale.control.host_cache import HostCacheState, host_copy_room
from blitzscale.control.models import ModelView, pool_actions
from blitzscale.control.policies import (
    DrainAction,
    LoadAction,
    MutateAction,
    ReleaseAction,
    ReviveAction,
    ScaleAction,
    next_host_cache,
)
from blitzscale.control.snapshot import ClusterSnapshot, InstanceState
from blitzscale.core.config import EngineConfig
from blitzscale.core.roles import Role
from blitzscale.serve.events import Direction, ScaleEvent
from blitzscale.serve.instances import Instance
from blitzscale.serve.loads import Loads
from blitzscale.serve.metrics import ClusterMetrics
from blitzscale.serve.models import ScaledModel
from blitzscale.serve.router import Router
from blitzscale.serve.state import ControlState

log = logging.getLogger("blitzscale.scaler")
ROLE_STATE = {
    "prefill": InstanceState.PREFILL,
    "decode": InstanceState.DECODE,
    "colocated": InstanceState.COLOCATED,
}
DRAINING = {InstanceState.SHUTTING_PREFILL, InstanceState.SHUTTING_DECODE}


@dataclass(frozen=True)
class _PoolFacts:
    """What every model's snapshot of one round shares."""

    now: float
    free: list[int]  # alive ranks with no instance that may load now
    hosts: tuple[int, ...]  # rank -> host id


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
        pace: Profile | None = None,
    ) -> None:
        """`pace`: the paced workers' reference device ([engine] pace, resolved), told to
        every instance it activates."""
        self.router = router
        self.state: ControlState = router.state
        self.cluster: Cluster = router.cluster
        self.planner = planner
        self.policy = policy
        self.model = model
        self.source = source  # spec every worker can resolve (tokenizer, config)
        self.disk_source = disk_source  # our-format folder for disk loads
        self.engine = engine
        self.pace = pace  # (worker/pacing.py)
        self.metrics = metrics
        self.models: dict[str, ScaledModel] = {model: ScaledModel(model, source, disk_source)}
        self.model_bytes: dict[str, int] = {}  # one instance's weights, by model (from loads)
        self.started_at = clock.now()
        cap = self.cluster.cfg.host_memory_bytes
        self.host_cache = HostCacheState(ttl_s=policy.sllm_ttl_s, capacity_bytes=cap)  # sllm's
        self.backoff = LoadBackoff(base_s=planner.load_retry_s, max_failures=planner.max_load_failures)
        router.on_rank_back.append(self.backoff.fresh)  # a respawned worker starts with a clean slate
        self.busy: set[int] = set()  # instances with an action in flight
        self.events: list[ScaleEvent] = []  # for the demo, the simulator and tests
        self._tasks: set[asyncio.Task[None]] = set()
        self._host_copy_lock = asyncio.Lock()  # one host copy decided at a time
        # set when a round should not wait for the interval: an action ended (a rank may be
        # free), or an idle instance was told to drain (it is drained at once)
        self._kicked = asyncio.Event()
        router.on_unserved.append(lambda _model: self._kicked.set())  # (its load starts now)
        self.loads = Loads(self)  # how weights get onto new instances

    @property
    def pd_mode(self) -> bool:
        return self.router.cfg.mode == "pd"

    def add_model(self, spec: ScaledModel) -> None:
        """Another model on the same ranks (the router serves it too); the model given to
        the constructor keeps its name, but takes `spec`'s bounds if named here."""
        if spec.name in self.models and spec.name != self.model:
            raise ValueError(f"model {spec.name!r} is scaled already")
        self.models[spec.name] = spec

    def _model(self, name: str | None) -> ScaledModel:
        return self.models[name or self.model]

    # --- bring-up -----------------------------------------------------------------------

    @property
    def tp(self) -> int:
        return self.state.tp

    async def bootstrap(
        self,
        num_prefill: int,
        num_decode: int,
        keep_host_copy: bool,
        model: str | None = None,
        first: int = 0,
    ) -> None:
        """A model's first instances from instance `first` on: it from disk, the rest over
        the network from it."""
        name = self._model(model).name
        head = tuple(range(first, first + self.tp))
        self.state.move(first, InstanceState.LOADING, "(disk)", model=name)
        seconds, nbytes = await self.loads.from_disk(head, model=name)
        self.record("up", "disk", list(head), seconds, nbytes, [], model=name)
        roles = (
            ["prefill"] * num_prefill + ["decode"] * num_decode
            if self.pd_mode
            else ["colocated"] * num_prefill
        )
        await self.activate_many([first], roles[0], model=name)
        others = [first + k * self.tp for k in range(1, len(roles))]
        for rank in others:
            self.state.move(rank, InstanceState.LOADING, "(network)", model=name)

        async def the_others() -> None:
            if others:
                targets = tuple(r for i in others for r in range(i, i + self.tp))
                await self.loads.network(head, targets, multicast=True, model=name)
                for rank, role in zip(others, roles[1:], strict=True):
                    await self.activate_many([rank], role, model=name)

        # the cluster's one host copy, for scaling from zero: made while the first instance
        # serves and the others load (the head's worker copies on a thread of its own)
        copy = self.keep_host_copy(name, first) if keep_host_copy else asyncio.sleep(0)
        await asyncio.gather(the_others(), copy)

    def copy_to_host_soon(self, model: str, rank: int) -> None:
        """After a model came from disk: its one host copy, made in the background now
        (seconds for an 8B model on a GPU host) rather than when its last instance is
        released, where a request for another model would wait for it."""
        if self.policy.name != "fixed" and self.cluster.pool.host_holder(model) is None:
            self._spawn((), self._copy_to_host(model, rank))

    async def _copy_to_host(self, model: str, rank: int) -> None:
        try:
            await self.keep_host_copy(model, rank)
        except Exception as e:  # its release makes one then, or it comes back from disk
            log.error("keeping a host copy of %s failed: %s", model, e)

    async def keep_host_copy(self, model: str, rank: int) -> bool:
        """Make `rank`'s device copy the model's one host copy, if it has none and it fits
        its host's `[cluster] host_memory_bytes` (host copies of models that GPUs hold
        make room, least recently requested first). False: none was made (or one is
        being made)."""
        async with self._host_copy_lock:
            return await self._keep_host_copy(model, rank)

    async def _keep_host_copy(self, model: str, rank: int) -> bool:
        pool = self.cluster.pool
        if pool.host_holder(model) is not None:
            return False
        where = self._host_of
        copies = {
            m: (where(r), self.model_bytes.get(m, 0))
            for m in self.models
            if (r := pool.host_holder(m)) is not None
        }
        last = self.router.last_request_at
        evictable = sorted(
            (m for m in copies if pool.gpu_holders(m)), key=lambda m: (last.get(m, self.started_at), m)
        )
        cap = self.cluster.cfg.host_memory_bytes
        drop = host_copy_room(copies, where(rank), self.model_bytes.get(model, 0), cap, evictable)
        if drop is None:
            log.warning(
                "no host copy of %s: host %d has no room in host_memory_bytes=%d", model, where(rank), cap
            )
            return False
        for m in drop:
            await self.cluster.release_host_copy(m)
            log.info("dropped the host copy of %s to make room for %s", m, model)
            self.count_held(m)
        await self.cluster.cache_on_host(model, rank)
        self.count_held(model)
        return True

    def count_held(self, model: str) -> None:
        """`model`'s weight bytes on GPUs and hosts, for /metrics."""
        pool, one = self.cluster.pool, self.model_bytes.get(model, 0)
        gpu = one * len(set(pool.gpu_holders(model))) // self.tp
        self.metrics.held(model, gpu, one if pool.host_holder(model) is not None else 0)

    def activation(self, role: Role, model: str | None = None) -> Activation:
        """What an instance of `model` (None: the default) is started with in `role`."""
        spec = self._model(model)
        return Activation(model=spec.name, source=spec.source, role=role, engine=self.engine, pace=self.pace)

    async def activate_many(
        self, ranks: list[int], role: Role, model: str | None = None, prefix_source: int | None = None
    ) -> None:
        """Start engines on freshly loaded instances, all at once; with `prefix_source` (the
        instance their weights came from), its hot prefixes reach them before they serve."""
        results = await self.cluster.activate(dict.fromkeys(ranks, self.activation(role, model)))
        for res in results.values():
            self.metrics.activated(res)
        if prefix_source is not None:
            await self.loads.ship_prefixes(prefix_source, results, self._model(model).name)
        for rank in ranks:
            if role == "decode":  # decode instances are made from prefill ones (design §4)
                self.state.move(rank, InstanceState.PREFILL, "(activated)")
                self.state.move(rank, InstanceState.MUTATING_TO_DECODE, "(bootstrap)")
            self.state.move(rank, ROLE_STATE[role], "(activated)")
        self.router.wake()

    # --- the loop -----------------------------------------------------------------------

    def _pool_facts(self) -> _PoolFacts:
        now = clock.now()
        used = {rank for i in self.state.views() for rank in i.ranks}
        free = [x for x in self.cluster.alive_ranks() if x not in used and self.backoff.may_load(x, now)]
        return _PoolFacts(now, free, self._hosts())

    def snapshot(self, model: str | None = None, pool: _PoolFacts | None = None) -> ClusterSnapshot:
        """`model`'s picture (None: the default model's); free ranks are the pool's (`pool`:
        taken once for every model of a round)."""
        r = self.router
        name = self._model(model).name
        pool = pool or self._pool_facts()
        now = pool.now
        instances = self.state.views(name)
        mine = [i for i in r.instances.values() if i.model == name]
        return ClusterSnapshot(
            now=now,
            instances=instances,
            queued_prompt_tokens=sum(len(q.prompt) for q in r.queue if q.model == name)
            + sum(i.outstanding_tokens for i in mine if i.rank not in r.live.pairs),
            live_target_tokens=sum(i.outstanding_tokens for i in mine if i.rank in r.live.pairs),
            migrating_tokens=sum(len(q.prompt) for q in r.migrations.pending if q.model == name),
            free_ranks=free_slots(r.cluster, name, pool.free, [rank for i in instances for rank in i.ranks]),
            gpu_holders=tuple(self.cluster.pool.gpu_holders(name)),
            host_holder=self.cluster.pool.host_holder(name),
            tp=self.tp,
            pd_mode=self.pd_mode,
            host_of_rank=pool.hosts,
            model=name,
            model_bytes=self.model_bytes.get(name, 0),
            slot_workers=slot_workers(r.cluster),
        )

    def model_view(self, name: str, pool: _PoolFacts | None = None) -> ModelView:
        spec = self.models[name]
        return ModelView(
            snapshot=self.snapshot(name, pool),
            requests=self.router.requests_of(name),
            waiting_since=self.router.oldest_queued_at(name),
            last_request_at=self.router.last_request_at.get(name),
            started_at=self.started_at,
            min_instances=spec.min_instances,
            max_instances=spec.max_instances,
            keep_alive_s=spec.keep_alive_s,
            ttft_slo_s=spec.ttft_slo_s,
            prefill_rate=cost.prefill_rate() if (cost := self.router.cost(name)) is not None else 0.0,
        )

    def _host_of(self, rank: int) -> int:
        hosts = self._hosts()
        return hosts[rank] if rank < len(hosts) else 0

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
        self.started_at = clock.now()  # keep-alives count from here (bootstrap is done)
        while True:
            # a round every interval, or on a kick (asyncio.timeout, not wait_for: Python
            # 3.11's wait_for can swallow a cancel landing as it times out, and stop() hangs)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.planner.interval_s):
                    await self._kicked.wait()
            self._kicked.clear()
            try:
                await self.step()
            except Exception:  # a failed round must not stop scaling for good
                log.exception("scale round failed")

    async def step(self) -> list[ScaleAction]:
        self._advance_transitions()
        pool = self._pool_facts()
        views = [self.model_view(m, pool) for m in self.models]
        actions = pool_actions(views, self.policy, self.planner, self.host_cache)
        for v in views:
            mine = [a for a in actions if a.model == v.name]
            self.host_cache = next_host_cache(self.host_cache, v.snapshot, mine)
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
                self.state.move(t, state, f"({a.path})", model=a.model or self.model)
            self._spawn(ids, self.loads.run_live(a) if live else self.loads.run(a))
            return
        inst = self.state.get(a.instance_id)
        if inst is None or inst.id in self.busy or (a.model and inst.model != a.model):
            return
        if isinstance(a, ReviveAction):
            self.state.move(inst.id, ROLE_STATE[a.role], "(revived)")
            self.router.wake()
        elif isinstance(a, DrainAction):
            # colocated instances hold running requests, so they drain like decode ones
            prefill = inst.accepts == "prefill"
            state = InstanceState.SHUTTING_PREFILL if prefill else InstanceState.SHUTTING_DECODE
            self.state.move(inst.id, state, "(draining)")
            if inst.is_idle:  # (the next round finds it drained and may release it)
                self._kicked.set()
        elif isinstance(a, MutateAction):
            self.state.move(inst.id, InstanceState.MUTATING_TO_DECODE, "(mutating)")
        elif isinstance(a, ReleaseAction) and inst.state is InstanceState.SHUTTING_NULL and inst.is_idle:
            # (one that cannot go now is not spawned: its end would kick a round that plans
            # it again, at once, forever; its idleness comes with a stats report)
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
            self._kicked.set()  # (a rank freed or an instance up: a waiting model need not wait)
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
        model = inst.model
        t0 = clock.now()
        await self.cluster.deactivate(inst.rank)
        last = set(self.cluster.pool.gpu_holders(model)) <= set(inst.ranks)
        if last and self.policy.name != "fixed":
            # its last GPU copy: the model's one host copy keeps it off the disk next time
            try:
                await self.keep_host_copy(model, inst.rank)
            except Exception as e:  # it comes back from disk then
                log.error("keeping a host copy of %s failed: %s", model, e)
        res = await asyncio.gather(*(self.cluster.release(model, r) for r in inst.ranks))
        self.state.move(inst.id, InstanceState.INACTIVE, "(released)")
        freed = sum(x.freed_bytes for x in res)
        kept = all(x.standby for x in res)
        seconds = clock.now() - t0
        if last:
            self.metrics.swapped(model, "out", seconds)
        self.record("down", "release", list(inst.ranks), seconds, freed, [], standby=kept, model=model)

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
        """`seconds` is the whole operation as the scaler saw it; a transfer's `report` adds,
        per target, the link's own time and when its first layer was usable; a release
        says whether the worker kept the buffer and engine as its standby."""
        name = model or self.model
        if direction == "down":
            self.metrics.scale_events.labels(direction=direction, path=path, model=name).inc()
        else:
            self.metrics.scaled_up(name, path, nbytes, seconds)
            ids = self.instance_ids(ranks)
            for rank in ids:  # what loading it again would cost (no-thrash)
                self.state.loaded(rank, seconds)
            if nbytes and ids:
                self.model_bytes[name] = nbytes // len(ids)
            if path != "network" and set(self.cluster.pool.gpu_holders(name)) <= set(ranks):
                self.metrics.swapped(name, "in", seconds)  # (from zero: its host copy or disk)
        self.count_held(name)
        per = list((report or {}).values())
        # where the weights came from: a load that joined a chain in flight took them from
        # that chain's last target, not from the sources it was asked to use
        sources = sorted({s for v in per for s in v.sources}) or sources
        event = ScaleEvent(
            model=name,
            time=clock.now(),
            direction=direction,
            path=path,
            ranks=tuple(ranks),
            sources=tuple(sources),
            seconds=round(seconds, 4),
            bytes=nbytes,
            nodes=tuple(self.nodes_of(ranks)),  # where the ranks and the sources live
            source_nodes=tuple(self.nodes_of(sources)),
            link_s=round(max(v.seconds for v in per), 4) if per else None,
            first_layer_s=round(min(v.first_layer_s for v in per), 4) if per else None,
            senders_done_s=round(max(v.senders_done_s for v in per), 4) if per else None,
            replied_s=round(max(v.replied_s for v in per), 4) if per else None,
            standby=standby,
        )
        self.events.append(event)
        log.info(
            "scale %s %s via %s: ranks %s (nodes %s) from %s (nodes %s) in %.3f s (%d bytes)",
            name,
            direction,
            path,
            ranks,
            ",".join(event.nodes),
            sources,
            ",".join(event.source_nodes) or "-",
            seconds,
            nbytes,
        )

    def nodes_of(self, ranks: list[int]) -> list[str]:
        """The nodes `ranks` live on, each once, in rank order."""
        nodes = self.cluster.nodes()
        return list(dict.fromkeys(nodes[r] if r < len(nodes) else "?" for r in ranks))
