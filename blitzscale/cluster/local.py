"""A cluster of worker processes, driven over ZeroMQ: on this machine (the default) or,
with another spawner (`cluster/spawn.py`), as Ray actors across a Ray cluster's nodes.

The controller owns the parameter pool and is the only writer of it: a copy enters the
pool only when the worker that holds it has said its load completed.

With tensor-parallel instances (`tp` > 1) ranks [k*tp, (k+1)*tp) form instance k and rank r
holds shard r % tp: a load or transfer to a rank moves that shard (shard k to shard k), and
the workers build each group's process groups at start. When a member of a group dies, the
others are stopped too and the whole group comes back as fresh processes; its process
groups are built again once every member is up (no group is made at scale time).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import zmq

from blitzscale.checkpoint.native import rank_file
from blitzscale.cluster.blocking import Blocking
from blitzscale.cluster.calls import Calls, ClusterOpError, result_of
from blitzscale.cluster.commands import Activation, CostQuery, LiveStart
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.flights import Flight, Flights
from blitzscale.cluster.lines import RankLines
from blitzscale.cluster.mailbox import Mailbox
from blitzscale.cluster.pool import ParameterPool
from blitzscale.cluster.results import ClusterStatus, PrefixShipResult, RespawnResult, TransferResult
from blitzscale.cluster.shards import ShardPlan, neighbour_pairs, transfer_report
from blitzscale.cluster.spawn import Spawner, WorkerHandle
from blitzscale.cluster.spawners import make_spawner
from blitzscale.control.costmodel import CostReport
from blitzscale.core.config import EngineConfig
from blitzscale.core.roles import Role
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import (
    ActivateResult,
    ChecksumMsg,
    ChecksumResult,
    DeactivateMsg,
    HelloMsg,
    HostCacheMsg,
    HostCopyResult,
    InstanceLinkMsg,
    LinkMsg,
    LoadMsg,
    LoadResult,
    Message,
    NoResult,
    PrefixExportMsg,
    PrefixExportResult,
    PrefixMoveResult,
    PrefixRecvMsg,
    PrefixSendMsg,
    ProfileResult,
    ReleaseMsg,
    ReleaseResult,
    ReplyMsg,
    Result,
    SetRoleMsg,
    ShutdownMsg,
    StandbyMsg,
    TransferMsg,
    TransferRankResult,
)
from blitzscale.transfer.disk import drop_page_cache
from blitzscale.worker.standby import StandbySpec
from blitzscale.worker.worker import WorkerConfig

log = logging.getLogger("blitzscale.cluster")
R = TypeVar("R", bound=Result)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(
        self,
        cfg: ClusterConfig,
        data_addr: str = "",
        tokenizer_source: str = "",
        standby: StandbySpec | None = None,
        tp: int = 1,
        spawner: Spawner | None = None,
    ) -> None:
        """`data_addr`: the router's data socket, for workers that will serve;
        `tokenizer_source`: a model whose tokenizer serving workers load while they start;
        `standby`: the model every worker (and each replacement) builds a standby engine of;
        `tp`: ranks per instance; `spawner`: how workers are started (local processes)."""
        check_tp_workers(cfg.num_workers, tp)
        self.cfg = cfg
        self.tp = tp
        self.data_addr = data_addr
        self.tokenizer_source = tokenizer_source
        self.standby = standby
        self.pool = ParameterPool()
        self.spawner: Spawner = spawner or make_spawner(cfg)
        self.host = cfg.host  # what the controller binds and the workers dial (spawner's)
        self.procs: list[WorkerHandle] = []
        self.dead: set[int] = set()
        self.hellos: dict[int, HelloMsg] = {}
        self._op_ids = itertools.count(1)
        self.token = secrets.token_bytes(16)  # every worker frame carries it (messages.py)
        self.incarnations: list[int] = []  # per rank: 0, then +1 each time it is respawned
        self.restarts: Counter[int] = Counter()  # respawns that succeeded, by rank
        self._hello_cv = threading.Condition()
        self._store: Any = None
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._mail: Mailbox | None = None
        self._calls: Calls | None = None  # commands and their replies, once started
        self._dist_port = 0
        self._control_port = 0
        self._holding = RankLines().holding  # per rank (and "respawn"): operations in call order
        self._flights = Flights()  # GPU-to-GPU loads under way, which a new one may join

    @property
    def world_size(self) -> int:
        return len(self.procs)

    @property
    def calls(self) -> Calls:
        if self._calls is None:
            raise BlitzScaleError("the cluster is not started")
        return self._calls

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> LocalCluster:
        cfg = self.cfg
        try:  # whatever fails on the way, nothing started lingers (stop() ends it all)
            self.host = self.spawner.connect(cfg.host)
            n = self.spawner.slots(cfg.num_workers, cfg.device, self.tp)
            self._ctx = zmq.Context()
            self._sock = self._ctx.socket(zmq.ROUTER)
            self._sock.setsockopt(zmq.LINGER, 0)
            if cfg.control_port:
                self._sock.bind(f"tcp://{self.host}:{cfg.control_port}")
                self._control_port = cfg.control_port
            else:
                self._control_port = self._sock.bind_to_random_port(f"tcp://{self.host}")
            self._mail = Mailbox(self._sock, self.token, self._on_hello)
            self._calls = Calls(self._mail, lambda: self.dead, self._check_alive, cfg.op_timeout_s)
            self._dist_port = self._start_store()
            self.incarnations = [0] * n
            for rank in range(n):
                self.procs.append(self._spawn(rank, n, 0, ()))
            self._wait_hellos()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, rank: int, n: int, incarnation: int, peers: tuple[tuple[int, int], ...]) -> WorkerHandle:
        cfg = self.cfg
        wcfg = WorkerConfig(
            rank=rank,
            world_size=n,
            device=f"cuda:{rank}" if cfg.device == "cuda" else "cpu",
            dist_addr=self.host,
            dist_port=self._dist_port,
            control_addr=f"tcp://{self.host}:{self._control_port}",
            data_addr=self.data_addr,
            dtype=cfg.resolved_dtype,
            init_timeout_s=cfg.startup_timeout_s,
            tokenizer_source=self.tokenizer_source,
            token=self.token,
            incarnation=incarnation,
            peers=peers,
            standby=self.standby,
            tp=self.tp,
            memory_bytes=cfg.worker_memory_bytes,
        )
        name = f"blitzscale-worker-{rank}" + (f".{incarnation}" if incarnation else "")
        return self.spawner.spawn(wcfg, name)

    def _on_hello(self, msg: HelloMsg) -> None:  # on the mailbox's thread
        if msg.rank < len(self.incarnations) and msg.incarnation == self.incarnations[msg.rank]:
            with self._hello_cv:
                self.hellos[msg.rank] = msg
                self._hello_cv.notify_all()
            log.info(
                "worker %d up on %s (pid %d, incarnation %d), links built in %.2f s",
                msg.rank,
                msg.device,
                msg.pid,
                msg.incarnation,
                msg.warmup_s,
            )

    def _start_store(self) -> int:
        """The torch.distributed rendezvous store, served from here on a socket bound to
        the configured host only (torch's own would listen on every interface)."""
        from datetime import timedelta

        import torch.distributed as dist

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.cfg.dist_port))
        listener.listen(256)
        port = listener.getsockname()[1]
        self._store = dist.TCPStore(
            self.host,
            port,
            is_master=True,
            master_listen_fd=listener.detach(),  # the store owns the socket from here
            wait_for_workers=False,
            timeout=timedelta(seconds=self.cfg.startup_timeout_s),
        )
        return port

    def _wait_hellos(self) -> None:
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while len(self.hellos) < self.world_size:
            self._check_alive(set(range(self.world_size)) - set(self.hellos), starting=True)
            if time.monotonic() > deadline:
                self.stop()
                raise BlitzScaleError(f"workers did not start within {self.cfg.startup_timeout_s} s")
            with self._hello_cv:
                self._hello_cv.wait(timeout=0.1)

    def stop(self) -> None:
        if self._mail is not None:
            for rank in self.alive_ranks():
                self._mail.send(rank, ShutdownMsg())
        for p in self.procs:
            p.join(timeout=10)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        if self._mail is not None:
            self._mail.close()
            self._mail = None
            self._calls = None
        if self._sock is not None:
            self._sock.close()
            self._ctx.term()
            self._sock = None
        self._store = None  # closes its socket
        self.spawner.close()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive_ranks(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if r not in self.dead and p.is_alive()]

    def nodes(self) -> tuple[str, ...]:
        """The node each rank's worker runs on, by rank (ranks of a node share NVLink and
        host memory); "?" for one not placed yet."""
        return tuple(self.spawner.node_of(r) for r in range(self.world_size))

    # --- messaging ----------------------------------------------------------------------

    def _send(self, rank: int, msg: Message) -> None:
        assert self._mail is not None
        self._mail.send(rank, msg)

    def forget_rank(self, rank: int) -> None:
        """`rank`'s process is gone: it takes no more commands and holds no copy. The rest
        of its instance group goes too (found dead next, and respawned like any death): a
        shard alone can neither serve nor rejoin a group whose other members live on."""
        self.dead.add(rank)
        self.pool.forget_rank(rank)
        for mate in self.group_of(rank):
            if mate != rank and mate not in self.dead and self.procs[mate].is_alive():
                log.warning("stopping worker %d: rank %d of its instance group died", mate, rank)
                self.procs[mate].kill()

    def group_of(self, rank: int) -> range:
        """The ranks of `rank`'s instance (tp-aligned)."""
        first = rank - rank % self.tp
        return range(first, first + self.tp)

    def find_dead(self) -> list[int]:
        """Ranks whose process has exited since they were last seen alive; each is forgotten
        (it takes no more commands and holds no copy) and may be respawned."""
        return self._check_alive(set(range(self.world_size)))

    def dead_now(self) -> set[int]:
        """Ranks with no live process now (a rank being respawned has one), each already
        forgotten: one whose process ends between the two looks is left to the next call
        (named here, it was not yet dead to `respawn`, and the try was lost)."""
        self.find_dead()
        return {r for r, p in enumerate(self.procs) if r in self.dead and not p.is_alive()}

    @property
    def blocking(self) -> Blocking:
        """This cluster for code that is not async (scripts, benchmarks, tests): every
        operation runs to completion on an event loop of its own."""
        return Blocking(self)

    def _check_alive(self, ranks: set[int], starting: bool = False) -> list[int]:
        died = [r for r in ranks if r not in self.dead and not self.procs[r].is_alive()]
        for r in died:
            self.forget_rank(r)
        if died and starting:
            self.stop()
            raise BlitzScaleError(f"workers {died} exited during start-up (see their output above)")
        return died

    async def respawn(self, rank: int) -> RespawnResult:
        """Replace the dead worker `rank` with a fresh process (its next incarnation) and
        rebuild every live worker's link to it; the rank is usable again (holding nothing)
        once all of them have answered. Other operations go on meanwhile."""
        if rank not in self.dead:
            raise BlitzScaleError(f"worker {rank} is not dead")
        async with self._holding(["respawn"]):  # one at a time: each links to those before it
            t = time.monotonic()
            try:
                incarnation = await self._respawn(rank, t + self.cfg.startup_timeout_s)
            except BaseException:
                if self.procs[rank].is_alive():  # half started: it must not linger
                    self.procs[rank].kill()
                    await asyncio.to_thread(self.procs[rank].join, 5)
                raise
            self.dead.discard(rank)
            self.restarts[rank] += 1
            await self._relink_group(rank)
        seconds = time.monotonic() - t
        log.warning("worker %d respawned (incarnation %d) in %.1f s", rank, incarnation, seconds)
        return RespawnResult(rank=rank, incarnation=incarnation, seconds=seconds)

    async def _respawn(self, rank: int, deadline: float) -> int:
        await asyncio.to_thread(self.procs[rank].join, 1)  # reap the old process
        peers = {s: self.incarnations[s] for s in self.alive_ranks()}
        incarnation = self.incarnations[rank] + 1
        with self._hello_cv:
            self.hellos.pop(rank, None)
            self.incarnations[rank] = incarnation
        self.procs[rank] = await asyncio.to_thread(
            self._spawn, rank, self.world_size, incarnation, tuple(sorted(peers.items()))
        )
        links = {s: LinkMsg(op_id=self.next_op(), peer=rank, incarnation=incarnation) for s in peers}
        # Each survivor builds its side while the replacement starts; the replacement says
        # hello once it has linked to every one of them.
        what = f"links to respawned rank {rank}"
        waiting = asyncio.ensure_future(self.calls.each(links, what, max(1.0, deadline - time.monotonic())))
        try:
            # (every survivor answering before the replacement is up: one of them failed)
            await self._until_hello(rank, deadline, lambda: bool(links) and waiting.done())
            replies = await waiting
        finally:
            waiting.cancel()
        if not all(m.ok for m in replies.values()):
            raise ClusterOpError(f"links to respawned rank {rank}", replies)
        await self._until_hello(rank, deadline)  # (its hello may land just after their answers)
        return incarnation

    async def _until_hello(
        self, rank: int, deadline: float, stop: Callable[[], bool] = lambda: False
    ) -> None:
        """Until the respawned `rank` has said hello (or `stop` says to look no longer)."""
        while rank not in self.hellos and not stop():
            if not self.procs[rank].is_alive():
                raise BlitzScaleError(f"respawned worker {rank} exited during start-up")
            if time.monotonic() > deadline:
                raise BlitzScaleError(f"respawned worker {rank} did not start in time")
            await asyncio.sleep(0.05)

    async def _relink_group(self, rank: int) -> None:
        """Once every member of `rank`'s instance group is back, they build its process
        groups among their new incarnations. A member still on its way back does it later."""
        members = list(self.group_of(rank))
        if self.tp == 1 or any(m in self.dead or not self.procs[m].is_alive() for m in members):
            return
        incarnations = {m: self.incarnations[m] for m in members}
        msgs = {m: InstanceLinkMsg(op_id=self.next_op(), incarnations=incarnations) for m in members}
        replies = await self.calls.each(msgs, f"instance group {members}", self.cfg.startup_timeout_s)
        if not all(m.ok for m in replies.values()):  # the next member's respawn tries again
            log.error("%s", ClusterOpError(f"instance group {members}", replies))
        else:
            log.info("instance group %s rebuilt (incarnations %s)", members, incarnations)

    def kill(self, rank: int) -> None:
        """End a worker's process now (it is then found dead and respawned like any death)."""
        if self.procs[rank].is_alive():
            self.procs[rank].kill()

    def next_op(self) -> int:
        return next(self._op_ids)

    # --- operations ---------------------------------------------------------------------

    async def load(
        self,
        model: str,
        rank: int,
        source: str,
        readers: int = 8,
        direct_io: bool = False,
        *,
        max_bytes_per_s: float = 0.0,
        cold: bool = False,
    ) -> LoadResult:
        """Load from a local source (disk, HF folder, random weights) onto one rank; with
        `cold`, from the disk itself (the file's pages are dropped from the page cache)."""
        if cold and rank_file(Path(source), 0).exists():
            await asyncio.to_thread(drop_page_cache, rank_file(Path(source), 0))
        msg = LoadMsg(
            op_id=self.next_op(),
            model=model,
            source=source,
            tp_size=self.tp,
            tp_rank=rank % self.tp,
            parallel_readers=readers,
            direct_io=direct_io,
            max_bytes_per_s=max_bytes_per_s,
        )
        async with self._holding([rank]):
            self.pool.begin_load(model, [rank])
            try:
                replies = await self.calls.each_ok({rank: msg}, f"load {model} on rank {rank}")
            except BaseException:
                self.pool.abort_load(model, [rank])
                raise
            self.pool.commit_load(model, [rank])
        return result_of(replies[rank], LoadResult)

    async def transfer(
        self,
        model: str,
        source: str,
        sources: list[int],
        targets: list[int],
        *,
        from_host: bool = False,
        max_bytes_per_s: float = 0.0,
        piece_bytes: int | None = None,
        live: dict[int, Activation] | None = None,
        on_live: Callable[[LiveStart], None] | None = None,
        may_join: bool = True,
    ) -> dict[int, TransferResult]:
        """Stream a model from `sources` (device copies, or the one host copy) to `targets`.

        Targets that complete enter the pool; the others do not, whatever happened.
        `live`: engines started on targets right behind the transfer (ActivateMsg with
        live=True), so they serve while weights arrive; `on_live` sees each start as its
        reply comes, long before the transfer ends. With tp > 1 `sources` and `targets` are whole
        instances' ranks: shard k moves from the sources' ranks k to the targets' ranks k."""
        rate = max_bytes_per_s or (0.0 if from_host else self.cfg.transfer_bytes_per_s)
        if self.tp > 1:
            insts = [[*self.group_of(r)] for r in sources if r % self.tp == 0]
            tgts = [[*self.group_of(r)] for r in targets if r % self.tp == 0]
            flat = [[r for i in insts for r in i], [r for i in tgts for r in i]]
            if sorted(flat[0]) != sorted(sources) or sorted(flat[1]) != sorted(targets):
                raise BlitzScaleError(f"tp={self.tp}: {sources} -> {targets} are not whole instances")
            return await self.transfer_instances(
                model,
                source,
                insts,
                tgts,
                from_host=from_host,
                max_bytes_per_s=rate,
                piece_bytes=piece_bytes,
                live=live,
                on_live=on_live,
                may_join=may_join,
            )
        shard = ShardPlan(sources, targets, 0)
        return await self._transfer(
            [shard], model, source, 1, from_host, rate, piece_bytes, live, on_live, may_join
        )

    async def transfer_instances(
        self,
        model: str,
        source: str,
        sources: list[list[int]],
        targets: list[list[int]],
        *,
        from_host: bool = False,
        max_bytes_per_s: float = 0.0,
        piece_bytes: int | None = None,
        live: dict[int, Activation] | None = None,
        on_live: Callable[[LiveStart], None] | None = None,
        may_join: bool = True,
    ) -> dict[int, TransferResult]:
        """Tensor-parallel instances: shard k streams from the sources' rank k to the targets'
        rank k (from the host copy's shard k with `from_host`); all shards move at once,
        each as its own chain plan. `live`: as in `transfer` (the targets' leaders, whose
        shards follow them)."""
        tp = len(sources[0])
        if any(len(i) != tp for i in sources + targets):
            raise BlitzScaleError(f"all instances must have tp={tp}: {sources} -> {targets}")
        shards = [ShardPlan([s[k] for s in sources], [t[k] for t in targets], k) for k in range(tp)]
        rate = max_bytes_per_s or (0.0 if from_host else self.cfg.transfer_bytes_per_s)
        return await self._transfer(
            shards, model, source, tp, from_host, rate, piece_bytes, live, on_live, may_join
        )

    async def _transfer(
        self,
        shards: list[ShardPlan],
        model: str,
        source: str,
        tp_size: int,
        from_host: bool,
        max_bytes_per_s: float,
        piece_bytes: int | None,
        live: dict[int, Activation] | None,
        on_live: Callable[[LiveStart], None] | None,
        may_join: bool = True,
    ) -> dict[int, TransferResult]:
        receivers = [t for s in shards for t in s.targets]
        sources = [r for s in shards for r in s.sources]
        join = self._flights.joinable(model, sources, len(shards)) if may_join and not from_host else None
        if join is not None:  # its sources are busy sending: their chain's tails forward it
            shards = [ShardPlan([join.tails[k]], s.targets, s.tp_rank) for k, s in enumerate(shards)]
            log.info("transfer %s to %s joins the chain in flight at %s", model, receivers, list(join.tails))
        msgs: dict[int, Message] = {}
        chains_of: dict[int, list[list[int]]] = {}
        every_chain: list[list[int]] = []
        last: list[int] = []  # per shard, the rank that receives last (a later load's join)
        for s in shards:
            chains = s.chains()
            every_chain += chains
            last.append(chains[0][-1])
            msg = TransferMsg(
                op_id=self.next_op(),
                model=model,
                source=source,
                dtype=self.cfg.resolved_dtype,
                chains=chains,
                num_stripes=len(chains),
                piece_bytes=self.cfg.piece_bytes if piece_bytes is None else piece_bytes,
                host_source=from_host,
                head_is_target=from_host and s.sources[0] in s.targets,
                max_bytes_per_s=max_bytes_per_s,
                timeout_s=self.cfg.transfer_timeout_s,
                tp_size=tp_size,
                tp_rank=s.tp_rank,
            )
            for r in {r for c in chains for r in c}:
                if r in msgs:
                    raise BlitzScaleError(f"rank {r} appears in two shards of one transfer")
                msgs[r] = msg
                chains_of[r] = chains
        starts = {r: a.message(self.next_op(), live=True) for r, a in (live or {}).items()}
        extra: list[tuple[int, Message]] = list(starts.items())
        live_ops = {m.op_id for m in starts.values()}

        def seen(reply: ReplyMsg) -> None:
            if reply.op_id in live_ops and on_live is not None:
                on_live(LiveStart.of_reply(reply))

        tails = list(join.tails) if join is not None else []
        own = [r for r in msgs if r not in tails]
        flight = None
        if not from_host:
            flight = join.joined_by(last) if join is not None else Flight.of(model, sources, last)
        async with self._holding(own, sharing=tails):
            self.pool.begin_load(model, receivers)
            try:
                with self._flights.flying(flight):
                    by_op = await self.calls.ops([*msgs.items(), *extra], f"transfer {model}", on_reply=seen)
            except BaseException:
                self.pool.abort_load(model, receivers)
                raise
            if not all(by_op[r, m.op_id].ok for r, m in msgs.items()):  # type: ignore[union-attr]
                await self._mend_links(every_chain)
        replies = {r: by_op[r, m.op_id] for r, m in msgs.items()}  # type: ignore[union-attr]
        done = [r for r in receivers if replies[r].ok]
        self.pool.commit_load(model, done)
        self.pool.abort_load(model, [r for r in receivers if r not in done])
        if len(done) < len(receivers) or not all(m.ok for m in replies.values()):
            what = " ".join(f"{s.sources} -> {s.targets}" for s in shards)
            raise ClusterOpError(f"transfer {model} {what}", replies)
        results = {r: result_of(m, TransferRankResult) for r, m in replies.items()}
        return transfer_report(results, receivers, chains_of, time.time())

    async def _mend_links(self, chains: list[list[int]]) -> None:
        """After a failed transfer: whichever rank failed broke its weights links to its
        neighbours in the plan (transfer/executor.py), so the failure reached the others at
        once. Rebuild every such link whose two ends are alive, on the weights plane only
        and under a new generation; a dead end's links are rebuilt when it is respawned."""
        alive = set(self.alive_ranks())
        msgs: list[tuple[int, Message]] = []
        for a, b in neighbour_pairs(chains):
            if a in alive and b in alive:
                gen = self.next_op()
                for me, peer in ((a, b), (b, a)):
                    link = LinkMsg(
                        op_id=self.next_op(),
                        peer=peer,
                        incarnation=self.incarnations[peer],
                        plane="weights",
                        generation=gen,
                    )
                    msgs.append((me, link))
        if not msgs:
            return
        what = "weights links after a failed transfer"
        replies = await self.calls.ops(msgs, what, self.cfg.startup_timeout_s)
        failed = {k: m.error for k, m in replies.items() if not m.ok}
        if failed:  # a transfer over such a link fails at once, naming it (NoLinkError)
            log.error("rebuilding weights links after a failed transfer failed: %s", failed)

    async def load_instance(self, model: str, ranks: list[int], source: str) -> None:
        """Load a tensor-parallel instance: rank k of `ranks` gets shard k."""
        tp = len(ranks)
        msgs = {
            r: LoadMsg(op_id=self.next_op(), model=model, source=source, tp_size=tp, tp_rank=k)
            for k, r in enumerate(ranks)
        }
        async with self._holding(ranks):
            self.pool.begin_load(model, ranks)
            try:
                await self.calls.each_ok(msgs, f"load {model} on ranks {ranks}")
            except BaseException:
                self.pool.abort_load(model, ranks)
                raise
            self.pool.commit_load(model, ranks)

    async def cache_on_host(self, model: str, rank: int) -> HostCopyResult:
        """Make `rank`'s device copy the cluster's one host copy of `model`. With tp > 1
        `rank` leads an instance and each of its shards keeps its own shard in its host's
        memory: together they are the one host copy (the pool names the leader)."""
        if rank % self.tp:
            raise BlitzScaleError(f"rank {rank} leads no instance (tp={self.tp})")
        ranks = list(self.group_of(rank))
        msgs: dict[int, Message] = {r: HostCacheMsg(op_id=self.next_op(), model=model) for r in ranks}
        async with self._holding(ranks):
            self.pool.add_host_copy(model, rank)  # refuses a second host copy
            try:
                replies = await self.calls.each_ok(msgs, f"host cache of {model} on ranks {ranks}")
            except BaseException:
                self.pool.drop_host_copy(model)
                if len(ranks) > 1:  # shards that made theirs let them go (best effort)
                    drop = [(r, HostCacheMsg(op_id=self.next_op(), model=model, keep=False)) for r in ranks]
                    with contextlib.suppress(BlitzScaleError):
                        await self.calls.ops(drop, f"drop host copy of {model}")
                raise
        shards = [result_of(m, HostCopyResult) for m in replies.values()]
        return HostCopyResult(
            bytes=sum(s.bytes for s in shards),
            pinned=all(s.pinned for s in shards),
            seconds=max(s.seconds for s in shards),
        )

    async def release_host_copy(self, model: str) -> None:
        rank = self.pool.host_holder(model)
        if rank is None:
            return
        ranks = list(self.group_of(rank))
        msgs: dict[int, Message] = {
            r: HostCacheMsg(op_id=self.next_op(), model=model, keep=False) for r in ranks
        }
        async with self._holding(ranks):
            if self.pool.drop_host_copy(model) is not None:
                await self.calls.each_ok(msgs, f"drop host copy of {model}")

    async def release(self, model: str, rank: int, host_copy: bool = False) -> ReleaseResult:
        """Free `rank`'s device copy (and with `host_copy` its share of the host copy: with
        tp > 1 the caller releases every shard of the instance)."""
        msg = ReleaseMsg(op_id=self.next_op(), model=model, host_copy=host_copy)
        async with self._holding([rank]):
            self.pool.release(model, rank)
            if host_copy and self.pool.host_holder(model) == self.group_of(rank).start:
                self.pool.drop_host_copy(model)
            replies = await self.calls.each_ok({rank: msg}, f"release {model} on rank {rank}")
        return result_of(replies[rank], ReleaseResult)

    async def command(self, rank: int, msg: Message, kind: type[R]) -> R:
        """Any other command to one worker, answered with a `kind`; raises ClusterOpError
        if it fails."""
        return (await self.command_many({rank: msg}, kind))[rank]

    async def command_many(self, msgs: dict[int, Message], kind: type[R]) -> dict[int, R]:
        """Commands to several workers at once (they run concurrently), each answered with
        a `kind`."""
        what = f"{type(next(iter(msgs.values()))).__name__} on ranks {sorted(msgs)}"
        async with self._holding(list(msgs)):
            replies = await self.calls.each_ok(msgs, what)
        return {r: result_of(m, kind) for r, m in replies.items()}

    async def activate(self, ranks: dict[int, Activation]) -> dict[int, ActivateResult]:
        """Start engines on ranks that hold the model."""
        msgs: dict[int, Message] = {r: a.message(self.next_op()) for r, a in ranks.items()}
        return await self.command_many(msgs, ActivateResult)

    async def set_standby_engine(self, engine: EngineConfig) -> None:
        """Every worker's standby engine (a respawned one's too) is built as `engine` from
        now on; those built otherwise are built again (no-op without a standby)."""
        if self.standby is None or self.standby.engine == engine:
            return
        self.standby = dataclasses.replace(self.standby, engine=engine)
        msgs: dict[int, Message] = {
            r: StandbyMsg(op_id=self.next_op(), engine=engine) for r in self.alive_ranks()
        }
        await self.command_many(msgs, NoResult)

    async def set_role(self, rank: int, role: Role, slot: int = 0) -> None:
        await self.command(rank, SetRoleMsg(op_id=self.next_op(), role=role, slot=slot), NoResult)

    async def ship_prefixes(self, model: str, src: int, dst: int, max_blocks: int) -> PrefixShipResult:
        """The source packs its hot blocks; the target reserves room and posts the receive
        (refusing sends nothing); then the source sends (answered once sent)."""
        t = time.monotonic()
        what = f"hot prefixes of {model} from rank {src} to rank {dst}"
        async with self._holding([src, dst]):
            ask = PrefixExportMsg(op_id=self.next_op(), model=model, max_blocks=max_blocks)
            export = result_of((await self.calls.each_ok({src: ask}, what))[src], PrefixExportResult)
            if not export.blocks:
                return PrefixShipResult(blocks=0, bytes=0, seconds=time.monotonic() - t)
            recv = PrefixRecvMsg(op_id=self.next_op(), model=model, src_rank=src, blocks=export.blocks)
            await self.calls.each_ok({dst: recv}, what)
            send = PrefixSendMsg(op_id=self.next_op(), export_id=export.export_id, dst_rank=dst)
            sent = result_of((await self.calls.each_ok({src: send}, what))[src], PrefixMoveResult)
        hashes = tuple(b.hash for b in export.blocks)
        return PrefixShipResult(
            blocks=sent.blocks, bytes=sent.bytes, seconds=time.monotonic() - t, hashes=hashes
        )

    async def deactivate(self, rank: int, slot: int = 0) -> None:
        await self.command(rank, DeactivateMsg(op_id=self.next_op(), slot=slot), NoResult)

    def status(self) -> ClusterStatus:
        return ClusterStatus(
            alive=tuple(self.alive_ranks()),
            dead=tuple(sorted(self.dead)),
            nodes=self.nodes(),
            incarnations=tuple(self.incarnations),
            restarts=dict(self.restarts),
            pool=self.pool.snapshot(),
        )

    async def checksum(self, model: str, rank: int, host_copy: bool = False) -> str:
        msg = ChecksumMsg(op_id=self.next_op(), model=model, host_copy=host_copy)
        async with self._holding([rank]):
            replies = await self.calls.each_ok({rank: msg}, f"checksum {model} on rank {rank}")
        return result_of(replies[rank], ChecksumResult).checksum

    async def cost_report(self, rank: int, query: CostQuery) -> CostReport:
        r = await self.command(rank, query.message(self.next_op()), ProfileResult)
        return CostReport(
            r.device_name,
            r.weight_bytes,
            r.kv_bytes_per_token,
            r.num_layers,
            r.profile,
            r.cached,
            r.probe_s,
            r.device_memory_bytes,
            r.context_len,
        )


def check_tp_workers(num_workers: int, tp: int) -> None:
    """Instances are `tp` consecutive ranks: the workers must come in whole instances."""
    if tp < 1:
        raise BlitzScaleError(f"tp must be at least 1, got {tp}")
    if num_workers % tp:
        raise BlitzScaleError(f"workers={num_workers} is not a multiple of tp={tp}")
