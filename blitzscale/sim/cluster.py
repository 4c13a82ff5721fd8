"""The simulated cluster: the control plane's cluster interface (cluster/base.py) over
simulated GPUs, links and disks, and the data plane to their simulated engines.

Every operation takes the time the links say on the virtual clock, holds its ranks like
the real cluster's do (operations on one rank in order, on different ranks side by side)
and writes the same parameter pool. Workers never die here.

With several models resident per worker (`slots`: `models_per_rank`, resolved) the control
plane sees the workers' slots (cluster/slotted.py) and this cluster the workers: an engine
is keyed by its slot's rank (worker + slot * world_size), its links are its worker's, and
the engines resident on one worker share its device: a step takes as many times its
profile's time as engines on the device are computing (`HostCores` with one core: the
worker's steps take turns).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack

from blitzscale import clock
from blitzscale.cluster.commands import Activation, CostQuery, LiveStart
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.flights import Flight, Flights
from blitzscale.cluster.pool import ParameterPool
from blitzscale.cluster.results import ClusterStatus, PrefixShipResult, RespawnResult, TransferResult
from blitzscale.control.costmodel import CostReport, Profile
from blitzscale.core.roles import Role
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import (
    ActivateResult,
    HelloMsg,
    HostCopyResult,
    KVSentMsg,
    LoadResult,
    Message,
    ReleaseResult,
)
from blitzscale.sim.cores import HostCores
from blitzscale.sim.engine import EngineShape, Recorder, SimEngine
from blitzscale.sim.links import Links, Topology


class SimDataPlane:
    """The router's data plane to simulated engines: typed messages in process."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()

    async def send(self, rank: int, msg: Message) -> None:
        self.send_nowait(rank, msg)

    def send_nowait(self, rank: int, msg: Message) -> None:
        self.cluster.deliver(rank, msg)

    async def recv(self) -> Message:
        return await self.inbox.get()


class SimCluster:
    def __init__(
        self,
        topo: Topology,
        profile: Profile,
        cfg: ClusterConfig,
        *,
        local_host_cache: bool = False,
        piece_bytes: int = 0,
        tp: int = 1,
        slots: int = 1,
    ) -> None:
        """`profile`: one instance's (one shard's, at tp > 1: instances are `tp`
        consecutive ranks, shard k of every instance moves to shard k of another);
        `slots`: the models resident per worker (`models_per_rank`, resolved)."""
        self.topo = topo
        self.tp = tp
        self.profile = profile
        self.cfg = cfg
        self.local_host_cache = local_host_cache  # sllm / allcache: each host's own DRAM copy
        self.piece_bytes = piece_bytes or max(1, profile.weight_bytes // (profile.num_layers + 2))
        self.pool = ParameterPool()
        self.restarts: Counter[int] = Counter()
        self.links = Links(topo)
        self.data = SimDataPlane(self)
        self.recorder = Recorder()
        self.engines: dict[int, SimEngine] = {}  # by slot rank (= the worker's with one slot)
        self._engine_models: dict[int, str] = {}
        self.devices = [HostCores(1) for _ in range(topo.world_size)]  # resident engines share it
        self.cores = [HostCores(topo.cores_per_node, topo.background_threads) for _ in range(topo.nodes)]
        self._locks = [asyncio.Lock() for _ in range(topo.world_size)]
        self._ops = itertools.count(1)
        self.gpu_busy_s = 0.0  # GPU-seconds holding a model (the summary's gpu_seconds)
        self._held_since: dict[int, float] = {}
        self._held: Counter[int] = Counter()  # models each rank holds or loads
        self.messages = 0  # data-plane messages, for the simulator's own report
        # GPU-to-GPU loads under way (a new one may join: cluster/flights.py), and when
        # each one's first layers and last land on its tails (simulated clock)
        self.flights = Flights()
        self._landing: dict[Flight, tuple[float, float]] = {}
        self.joins = 0  # loads that joined a chain in flight
        self.prefix_blocks_shipped = 0  # hot prefix blocks new instances received
        for rank in range(topo.world_size * slots):  # every worker (slot) is up
            self._emit(HelloMsg(rank=rank, pid=0, device=f"sim:{rank % topo.world_size}"))

    # --- the interface: status ---------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.topo.world_size

    def alive_ranks(self) -> list[int]:
        return list(range(self.world_size))

    def nodes(self) -> tuple[str, ...]:
        return tuple(f"node{self.topo.node_of(r)}" for r in range(self.world_size))

    def dead_now(self) -> set[int]:
        return set()

    def status(self) -> ClusterStatus:
        alive = tuple(self.alive_ranks())
        return ClusterStatus(alive=alive, dead=(), nodes=self.nodes(), pool=self.pool.snapshot())

    def next_op(self) -> int:
        return next(self._ops)

    async def _hold(self, stack: AsyncExitStack, ranks: list[int]) -> None:
        for r in sorted(set(ranks)):  # one order for everyone: no deadlock
            await stack.enter_async_context(self._locks[r])

    def _gained(self, ranks: list[int]) -> None:
        now = clock.now()
        for r in ranks:
            self._held[r] += 1
            self._held_since.setdefault(r, now)

    def _lost(self, rank: int) -> None:
        """`rank` holds one model fewer; its GPU-seconds stop when it holds none."""
        self._held[rank] = max(0, self._held[rank] - 1)
        if self._held[rank]:
            return
        since = self._held_since.pop(rank, None)
        if since is not None:
            self.gpu_busy_s += clock.now() - since

    def gpu_seconds(self) -> float:
        """GPU-seconds with a model on them so far (instances counted while they hold it)."""
        now = clock.now()
        return self.gpu_busy_s + sum(now - t for t in self._held_since.values())

    # --- loads ----------------------------------------------------------------------------

    async def load(
        self, model: str, rank: int, source: str, *, max_bytes_per_s: float = 0.0, cold: bool = False
    ) -> LoadResult:
        nbytes = self.profile.weight_bytes
        async with AsyncExitStack() as stack:
            await self._hold(stack, [rank])
            self.pool.begin_load(model, [rank])
            self._gained([rank])
            links = self.links.disk_links(rank)
            rate = self.links.rate(links)
            if max_bytes_per_s:
                rate = min(rate, max_bytes_per_s)
            seconds = nbytes / rate + self.topo.latency_s
            with self.links.using(links):
                await asyncio.sleep(seconds)
            self.pool.commit_load(model, [rank])
        return LoadResult(path="disk", bytes=nbytes, seconds=seconds)

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
        may_join: bool = True,
    ) -> dict[int, TransferResult]:
        if any(t in self.pool.gpu_holders(model) for t in targets):
            raise BlitzScaleError(f"a target of {targets} already holds {model}")
        join = self.flights.joinable(model, sources, self.tp) if may_join and not from_host else None
        if join is not None:  # its sources are busy sending: their chain's tails forward it
            self.joins += 1
        async with AsyncExitStack() as stack:  # (a join runs beside the chain it joins)
            await self._hold(stack, [*targets, *([] if from_host or join is not None else sources)])
            self.pool.begin_load(model, targets)
            self._gained(targets)
            try:
                report = await self._move(model, sources, targets, from_host, live, on_live, join)
            except BaseException:
                self.pool.abort_load(model, targets)
                for t in targets:
                    self._lost(t)
                raise
            self.pool.commit_load(model, targets)
        return report

    async def _move(
        self,
        model: str,
        sources: list[int],
        targets: list[int],
        from_host: bool,
        live: dict[int, Activation] | None,
        on_live: Callable[[LiveStart], None] | None,
        join: Flight | None = None,
    ) -> dict[int, TransferResult]:
        nbytes = self.profile.weight_bytes
        flight = None
        if from_host:
            holder = sources[0] if sources else 0
            links = [lk for t in targets for lk in self.links.host_links(holder, t, self.local_host_cache)]
            own = Counter(key for key, _ in links)  # one holder's link, shared by every target
            seconds = nbytes / self.links.rate(links, own) + self.topo.latency_s
            first = self.piece_bytes / self.links.rate(links, own)
        else:  # shard k of the sources feeds shard k of the targets, all shards at once
            heads = list(join.tails) if join is not None else sources  # (a join: shard k's tail)
            groups = [(heads[k :: self.tp], targets[k :: self.tp]) for k in range(self.tp)]
            chains = [self.links.chains(s, t) for s, t in groups]
            links = [lk for c in chains for lk in self.links.chain_links(c)]
            seconds = max(self.links.multicast_seconds(s, t, nbytes, self.piece_bytes) for s, t in groups)
            hop = self.piece_bytes / self.links.rate(links) + self.topo.latency_s
            first = hop + self.piece_bytes / self.links.rate(links)
            tails = [c[0][-1] for c in chains]
            if join is None:
                flight = Flight.of(model, sources, tails)
            else:  # never before the tails have a piece, never faster than the hop from them
                first_at, last_at = self._landing.get(join, (0.0, 0.0))  # (ended: all landed)
                seconds = max(seconds, last_at - clock.now() + hop)
                first = max(first_at - clock.now(), 0.0) + first
                flight = join.joined_by(tails)
        t0 = clock.now()
        for rank, act in (live or {}).items():  # ZigZag: engines start before weights land
            self._start_engine(rank, act, loaded_at=t0 + seconds, first_layers_at=t0 + first)
            if on_live is not None:
                on_live(LiveStart(rank, self._engine_info(act)))
        if flight is not None:
            self._landing[flight] = (t0 + first, t0 + seconds)
        try:
            with self.links.using(links), self.flights.flying(flight):
                await asyncio.sleep(seconds)
        finally:
            if flight is not None:
                del self._landing[flight]
        froms = tuple(sorted(join.tails if join is not None else sources))
        done = TransferResult(
            seconds=seconds,
            first_layer_s=first,
            bytes=nbytes,
            senders_done_s=seconds,
            replied_s=seconds,
            sources=froms,
        )
        return dict.fromkeys(targets, done)

    async def cache_on_host(self, model: str, rank: int) -> HostCopyResult:
        self.pool.add_host_copy(model, rank)
        return HostCopyResult(bytes=self.profile.weight_bytes, pinned=True)  # (the host links' rates)

    async def release_host_copy(self, model: str) -> None:
        self.pool.drop_host_copy(model)

    # --- serving ------------------------------------------------------------------------

    def _shape(self, act: Activation) -> EngineShape:
        # (what is 0 is sized as a worker's engine sizes it: for a GPU, unless told already)
        e, p = act.engine.for_device("cuda"), self.profile
        kv_tokens = p.kv_tokens
        if e.models_per_device > 1:  # one equal share of the device each, less its weights
            kv_tokens = max(0, p.engine_bytes // e.models_per_device - p.weight_bytes) // p.kv_bytes_per_token
        return EngineShape(
            block_size=e.block_size,
            max_num_batched_tokens=e.max_num_batched_tokens,
            max_num_seqs=e.max_num_seqs,
            max_model_len=e.max_model_len or 1 << 30,
            kv_blocks=e.num_kv_blocks or max(1, kv_tokens // e.block_size),
            prefix_caching=e.prefix_caching,
        )

    def _engine_info(self, act: Activation) -> ActivateResult:
        """What a worker's activation reply says: its KV blocks and context limit."""
        shape = self._shape(act)
        return ActivateResult(num_kv_blocks=shape.kv_blocks, max_model_len=shape.max_model_len)

    def _start_engine(
        self, worker: int, act: Activation, loaded_at: float | None = None, first_layers_at: float = 0.0
    ) -> int:
        """Start `act`'s engine on `worker`'s slot; its rank (worker + slot * world_size)."""
        rank = worker + act.slot * self.world_size
        if rank in self.engines:
            raise BlitzScaleError(f"rank {rank} is already serving")
        e = SimEngine(
            rank=rank,
            role=act.role,
            profile=self.profile,
            shape=self._shape(act),
            emit=self._emit,
            recorder=self.recorder,
            kv_move=self._kv_move,
            relay_move=self._relay_move,
            loaded_at=loaded_at,
            cores=self.cores[self.topo.node_of(worker)],
            device=self.devices[worker],
        )
        self.engines[rank] = e
        self._engine_models[rank] = act.model
        e.start()
        if loaded_at is not None:
            e.live_events(first_layers_at)
        return rank

    async def activate(self, ranks: dict[int, Activation]) -> dict[int, ActivateResult]:
        async with AsyncExitStack() as stack:
            await self._hold(stack, list(ranks))
            for rank, act in ranks.items():
                self._start_engine(rank, act)
        return {rank: self._engine_info(act) for rank, act in ranks.items()}

    async def set_role(self, rank: int, role: Role, slot: int = 0) -> None:
        self.engines[rank + slot * self.world_size].role = role

    async def ship_prefixes(self, model: str, src: int, dst: int, max_blocks: int) -> PrefixShipResult:
        """As a worker pair ships them (worker/prefix_ship.py), the engines' own books:
        the source names its hot blocks, the target reserves empty blocks, and once their
        bytes crossed the link it registers them as cached."""
        t = clock.now()
        async with AsyncExitStack() as stack:
            await self._hold(stack, [src, dst])
            source, target = self._engine_of(model, src), self._engine_of(model, dst)
            if source is None or target is None:
                raise BlitzScaleError(f"ranks {src} and {dst} must both serve {model}")
            hot = source.handoffs.hot_prefixes(max_blocks)
            if not hot:
                return PrefixShipResult(blocks=0, bytes=0, seconds=clock.now() - t)
            ids = target.reserve_prefixes(len(hot))
            nbytes = len(hot) * source.shape.block_size * self.profile.kv_bytes_per_token
            arrived = asyncio.get_running_loop().create_future()
            self._over_link(src, dst, nbytes, lambda: arrived.set_result(None))
            await arrived
            if self.engines.get(dst) is target:  # (not stopped meanwhile)
                target.prefixes_arrived(ids, [(h.hash, h.parent, h.hits) for h in hot])
        self.prefix_blocks_shipped += len(hot)
        hashes = tuple(h.hash for h in hot)
        return PrefixShipResult(blocks=len(hot), bytes=nbytes, seconds=clock.now() - t, hashes=hashes)

    def _engine_of(self, model: str, worker: int) -> SimEngine | None:
        """The engine serving `model` on `worker` (in any of its slots)."""
        for rank, m in self._engine_models.items():
            if m == model and rank % self.world_size == worker:
                return self.engines[rank]
        return None

    async def deactivate(self, rank: int, slot: int = 0) -> None:
        rank += slot * self.world_size
        e = self.engines.get(rank)
        if e is not None and not e.is_idle:
            raise BlitzScaleError(f"rank {rank} still has requests; drain it first")
        if e is not None:
            e.stop()
            del self.engines[rank]
            self._engine_models.pop(rank, None)

    async def release(self, model: str, rank: int, host_copy: bool = False) -> ReleaseResult:
        async with AsyncExitStack() as stack:
            await self._hold(stack, [rank])
            self.pool.release(model, rank)
            if host_copy and self.pool.host_holder(model) == rank:
                self.pool.drop_host_copy(model)
            self._lost(rank)
        return ReleaseResult(freed_bytes=self.profile.weight_bytes)

    async def checksum(self, model: str, rank: int, host_copy: bool = False) -> str:
        return "simulated"

    async def cost_report(self, rank: int, query: CostQuery) -> CostReport:
        """A simulated GPU costs what its profile says."""
        p = self.profile
        return CostReport(p.device, p.weight_bytes, p.kv_bytes_per_token, p.num_layers, p, cached=True)

    async def respawn(self, rank: int) -> RespawnResult:
        raise BlitzScaleError("simulated workers do not die")

    def kill(self, rank: int) -> None:
        raise BlitzScaleError("simulated workers do not die")

    async def stop(self) -> None:
        """The end of the run: every engine stops."""
        tasks = [t for e in self.engines.values() if (t := e.stop()) is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        self.engines.clear()

    # --- the data plane -------------------------------------------------------------------

    def deliver(self, rank: int, msg: Message) -> None:
        self.messages += 1
        e = self.engines.get(rank)
        if e is not None:
            e.handle(msg)

    def _emit(self, msg: Message) -> None:
        self.messages += 1
        self.data.inbox.put_nowait(msg)

    def _kv_move(self, src: int, dst: int, rid: str, tokens: int) -> None:
        """A held request's KV from `src` to `dst` over their link, shared fairly."""

        def done() -> None:
            if src in self.engines:
                self.engines[src].kv_sent(rid)
            if dst in self.engines:
                self.engines[dst].kv_arrived(rid)
            self._emit(KVSentMsg(rank=src, request_id=rid))

        self._over_link(src, dst, tokens * self.profile.kv_bytes_per_token, done)

    def _relay_move(self, src: int, dst: int, rid: str, tokens: int, layers: int) -> None:
        """A relayed task from live target `src` to source `dst`: its hidden states and the
        KV of its first `layers` layers (nothing after no layer)."""
        p = self.profile
        nbytes = tokens * (p.kv_bytes_per_token * layers / p.num_layers + p.hidden_bytes_per_token)

        def done() -> None:
            if src in self.engines:
                self.engines[src].relay_sent(rid)
            if dst in self.engines:
                self.engines[dst].relay_arrived(rid)

        self._over_link(src, dst, nbytes if layers else 0.0, done)

    def _over_link(self, src: int, dst: int, nbytes: float, done: Callable[[], None]) -> None:
        """`nbytes` from `src` to `dst` (slot ranks) over their workers' link, shared fairly;
        then `done()`."""
        links = self.topo.path(src % self.world_size, dst % self.world_size)
        seconds = nbytes / self.links.rate(links) + self.topo.latency_s if nbytes else 0.0

        async def move() -> None:
            with self.links.using(links):
                await asyncio.sleep(seconds)
            done()

        asyncio.get_running_loop().create_task(move())
