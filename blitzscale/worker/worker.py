"""The worker process: links to the other workers, then executes controller commands in order.

Commands arrive over ZeroMQ as msgspec messages (blitzscale.messages); tensors move only
over torch.distributed. Every command gets exactly one ReplyMsg, errors included.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec
import torch
import zmq

from blitzscale.checkpoint import load_config, load_tokenizer, resolve_model
from blitzscale.checkpoint.native import dtype_name, parse_dtype
from blitzscale.core.heap import freeze_heap
from blitzscale.engine import LLMEngine
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import (
    ActivateMsg,
    ActivateResult,
    ChecksumMsg,
    ChecksumResult,
    DeactivateMsg,
    HelloMsg,
    HostCacheMsg,
    HostCopyResult,
    InstanceLinkMsg,
    LinkMsg,
    LinkResult,
    LoadMsg,
    LoadResult,
    Message,
    NoResult,
    PrefixExportMsg,
    PrefixRecvMsg,
    PrefixSendMsg,
    ProfileMsg,
    ReleaseMsg,
    ReleaseResult,
    ReplyMsg,
    ReplyResult,
    SetRoleMsg,
    ShutdownMsg,
    StandbyMsg,
    TransferMsg,
    TransferRankResult,
    decode,
    worker_frames,
)
from blitzscale.model.config import ModelConfig
from blitzscale.model.weights import ModelWeights, layout_of
from blitzscale.transfer.checksum import buffer_checksum
from blitzscale.transfer.executor import break_neighbours, run_transfer
from blitzscale.worker import costprobe
from blitzscale.worker.cost_report import cost_report
from blitzscale.worker.disk_source import disk_shape, load_local
from blitzscale.worker.host_copies import HostCopies
from blitzscale.worker.memory import DeviceRoom, Holding, NoRoomError
from blitzscale.worker.serving import ServingLoop
from blitzscale.worker.standby import Standby, StandbySpec, free_device_memory
from blitzscale.worker.tp_follower import TPFollower, TPInbox
from blitzscale.worker.warmup import warm_up_compute
from blitzscale.worker.world import PLANES, InstanceGroup, Links, SlotLinks

log = logging.getLogger("blitzscale.worker")
# How long an idle worker's loop waits for a message (ms). Every message wakes it at once;
# the wait only bounds what advances without one: a transfer thread's end (2 ms while a
# transfer is in flight) and the stats (every STATS_INTERVAL_S). At 2 ms an idle worker
# woke 500 times a second and took 4-5% of a core doing nothing; at 10 ms, about 2%; at
# 25 ms, with unchanged stats sent once a second, about 1% (a 3-worker cluster at rest:
# 9.6% of a core before, with the router's share).
IDLE_POLL_MS = 25
BUSY_TRANSFER_POLL_MS = 2


@dataclass(frozen=True)
class WorkerConfig:
    rank: int
    world_size: int
    device: str  # "cpu" or "cuda:N"
    dist_addr: str
    dist_port: int
    control_addr: str  # tcp://host:port of the controller's ROUTER socket
    data_addr: str = ""  # tcp://host:port of the router's data socket ("" = not serving)
    dtype: str = "float32"
    init_timeout_s: float = 120.0
    tokenizer_source: str = ""  # load this model's tokenizer in the background at start
    token: bytes = b""  # the cluster's secret: every frame this worker sends carries it
    incarnation: int = 0  # > 0: a replacement of a worker that died
    peers: tuple[tuple[int, int], ...] = ()  # a replacement's live peers: (rank, incarnation)
    standby: StandbySpec | None = None  # build a standby engine of this model at start
    tp: int = 1  # ranks per instance: [k*tp, (k+1)*tp) share an instance group (worker/world.py)
    memory_bytes: int = 0  # what it may hold on its device, below the device's own (0: no cap)


class Worker:
    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.rank = cfg.rank
        self.models: dict[str, ModelWeights] = {}
        self.loading: dict[str, ModelWeights] = {}  # weights a transfer is filling now
        # What each serving slot serves (slot k's instance is rank + k * world_size to the
        # router: several models resident here, each with its own engine and loop)
        self.serving_models: dict[int, str] = {}
        self._tokenizers: dict[str, Future[Any]] = {}
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        if cfg.tokenizer_source:  # a live activation must not spend seconds on it
            self._tokenizer(cfg.tokenizer_source)
        # The main thread's: transfers under way (counted when one starts, down in _settle),
        # and whether one of them fills `loading` here. Any number may only send (a chain's
        # last target forwards to a load that joined it while it still receives).
        self._transfers = 0
        self._receiving = False
        # Transfers that ended: (model, error or "", whether this rank received), put by the
        # transfer thread before it replies; only the main thread changes `models` /
        # `loading` (in `_settle`).
        self._ended: queue.SimpleQueue[tuple[str, str, bool]] = queue.SimpleQueue()
        self.loops: dict[int, ServingLoop] = {}  # by slot; slot 0 always exists
        self._retired: tuple[str, LLMEngine] | None = None  # the last deactivated engine
        self._init_device()
        self.host_copies = HostCopies(self.device)
        self._init_world()
        self._init_standby()
        self._init_control()
        self._init_serving()
        self._init_follower()

    def _init_standby(self) -> None:
        """Before the hello: the cluster counts this worker ready once its standby exists."""
        c = self.cfg
        source = c.standby.source if c.standby is not None else ""
        self.room = DeviceRoom(
            self.device, c.memory_bytes, self._holdings, self._spare_bytes, self._give_up_spares
        )
        self.standby = Standby(
            c.standby, self.device, parse_dtype(c.dtype), lambda: self._tokenizer(source).result(), self.room
        )
        self.standby.arm()

    def _init_device(self) -> None:
        self.device = torch.device(self.cfg.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            warm_up_compute(self.device, parse_dtype(self.cfg.dtype))

    def _init_world(self) -> None:
        c = self.cfg
        self.links = Links(
            c.rank, c.incarnation, c.dist_addr, c.dist_port, self.device, c.init_timeout_s, c.tp
        )
        if c.incarnation == 0:
            self.warmup_s = self.links.connect_world(c.world_size)
        else:  # each live peer builds its side when the controller sends it a LinkMsg
            self.warmup_s = self.links.connect_peers(dict(c.peers))

    def _init_control(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"w{self.rank}".encode())
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.connect(self.cfg.control_addr)
        hello = HelloMsg(
            rank=self.rank,
            pid=os.getpid(),
            device=str(self.device),
            warmup_s=self.warmup_s,
            incarnation=self.cfg.incarnation,
        )
        self._send_control(hello)

    def _init_serving(self) -> None:
        self.data: zmq.Socket | None = None
        if self.cfg.data_addr:
            self.data = self.ctx.socket(zmq.DEALER)
            self.data.setsockopt(zmq.IDENTITY, f"w{self.rank}".encode())
            self.data.setsockopt(zmq.LINGER, 1000)
            self.data.connect(self.cfg.data_addr)
            self.data.send_multipart(
                worker_frames(
                    self.cfg.token, HelloMsg(rank=self.rank, pid=os.getpid(), device=str(self.device))
                )
            )
        self.serving = self._loop(0)

    def _loop(self, slot: int) -> ServingLoop:
        """Slot `slot`'s serving loop, made on first use (the router learns of it from its
        hello, sent before the activation that made it is answered)."""
        loop = self.loops.get(slot)
        if loop is None:
            if slot and self.links.instance is not None:
                raise BlitzScaleError(f"rank {self.rank}: a tensor-parallel rank serves one model at a time")
            vrank = self.rank + slot * self.cfg.world_size
            links = SlotLinks(self.links, self.cfg.world_size)  # (a peer may be another slot)
            loop = self.loops[slot] = ServingLoop(vrank, links, self._send_data, self._reply)  # type: ignore[arg-type]
            if slot and self.data is not None:
                self._send_data(HelloMsg(rank=vrank, pid=os.getpid(), device=str(self.device)))
        return loop

    def _serving_slot(self, model: str) -> int | None:
        """The slot whose engine serves `model` here, if any."""
        return next((k for k, m in self.serving_models.items() if m == model), None)

    def _model_loop(self, model: str) -> ServingLoop:
        """The loop serving `model` (slot 0's when none does: it answers that it has none)."""
        slot = self._serving_slot(model)
        return self.loops[slot if slot is not None else 0]

    def _exporter(self, export_id: int) -> ServingLoop:
        """The loop holding prefix export `export_id` (slot 0's when none: it refuses)."""
        return next((lp for lp in self.loops.values() if lp.prefixes.holds(export_id)), self.serving)

    def _init_follower(self) -> None:
        """Shard k > 0 of an instance group follows its leader's commands (worker/tp.py)."""
        self.follower: TPFollower | None = None
        self.inbox: TPInbox | None = None
        self._follows: InstanceGroup | None = None  # the group `inbox` reads
        self._follow(self.links.instance)

    def _follow(self, group: InstanceGroup | None) -> None:
        """(Re)start following on `group` (the links' current instance group)."""
        if self.inbox is not None:
            self.inbox.close()
        self._follows = group
        self.follower = self.inbox = None
        if group is not None and group.rank > 0:
            self.follower = TPFollower(self.links, group, self._stand_in_shard)
            self.inbox = TPInbox(self.ctx, group)

    def _handle_tp(self) -> None:
        assert self.inbox is not None and self.follower is not None
        cmd = self.inbox.take()
        if cmd is None:  # a member died: the group is rebuilt once all are back
            log.warning("rank %d: its instance group broke (%s)", self.rank, self.inbox.lost)
            self.follower.stop()
            self.inbox.close()
            self.follower = self.inbox = None
            return
        self.follower.handle(cmd, self._weights_of)

    def _engine_of(self, model: str) -> LLMEngine | None:
        """The engine serving `model` here, if it is one rank's (hot prefixes move between
        such engines only: a tensor-parallel instance's KV is spread over its shards)."""
        slot = self._serving_slot(model)
        s = self.loops[slot] if slot is not None else None
        return s.engine if s is not None and s.tp is None else None

    def _stand_in_shard(self, source: str, tp_size: int, tp_rank: int) -> ModelWeights:
        """Shard `tp_rank` of the model at `source` as the cost probe's stand-in weights."""
        config = load_config(resolve_model(source))
        return costprobe.stand_in_weights(config, parse_dtype(self.cfg.dtype), self.device, tp_size, tp_rank)

    def _weights_of(self, model: str) -> ModelWeights | None:
        """This rank's copy of `model`: held, or still arriving (a live target's)."""
        return self.models.get(model) or self.loading.get(model)

    def _send_data(self, msg: Message) -> None:
        if self.data is not None:
            self.data.send_multipart(worker_frames(self.cfg.token, msg))

    def _send_control(self, msg: Message) -> None:
        self.sock.send_multipart(worker_frames(self.cfg.token, msg))

    def serve_forever(self) -> None:
        freeze_heap()  # (the worker's modules, standby engine and links: long-lived)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        if self.data is not None:
            poller.register(self.data, zmq.POLLIN)
        busy = False
        parent = os.getppid()
        inbox: zmq.Socket | None = None
        while True:
            if os.getppid() != parent:  # the controller is gone: never linger as an orphan
                return
            if self.links.instance is not self._follows:  # rebuilt (InstanceLinkMsg)
                self._follow(self.links.instance)
            current = self.inbox.socket if self.inbox is not None else None
            if current is not inbox:
                if inbox is not None:
                    poller.unregister(inbox)
                if current is not None:
                    poller.register(current, zmq.POLLIN)
                inbox = current
            wait = BUSY_TRANSFER_POLL_MS if self._transfers or self.follower is not None else IDLE_POLL_MS
            events = dict(poller.poll(0 if busy else wait))
            self._settle()
            self.host_copies.settle()
            if self.follower is not None:  # a live setup waiting for its receive buffer
                self.follower.poll(self._weights_of)
            if inbox is not None and inbox in events:  # a leader's command: before control ones
                while self.inbox is not None and self.inbox.socket.poll(0):
                    self._handle_tp()
            if self.sock in events:
                msg = self._decode(self.sock.recv())
                if msg is None:
                    continue
                if isinstance(msg, ShutdownMsg):
                    self._reply(msg.op_id, True, NoResult())
                    return
                self._handle_control(msg)
            if self.data is not None and self.data in events:
                while self.data.poll(0):
                    slot, payload = self.data.recv_multipart()
                    data_msg = self._decode(payload)
                    if data_msg is not None:
                        self._loop(int.from_bytes(slot, "little")).handle(data_msg)
            busy = False
            for loop in list(self.loops.values()):  # one step each: resident models take turns
                busy = loop.tick() or busy

    def _decode(self, data: bytes) -> Message | None:
        try:
            return decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            log.warning("rank %d dropped an undecodable message: %s", self.rank, e)
            return None

    def _handle_control(self, msg: Message) -> None:
        op_id = getattr(msg, "op_id", -1)
        try:
            if isinstance(msg, TransferMsg):
                self._start_transfer(msg)  # replies from its thread, on a socket of its own
                return
            if isinstance(msg, LinkMsg):
                self._start_link(msg)  # likewise: the new peer may still be starting
                return
            if isinstance(msg, InstanceLinkMsg):
                self._start_instance_link(msg)
                return
            if isinstance(msg, PrefixSendMsg):  # answered when sent, by the serving loop
                self._exporter(msg.export_id).prefixes.send(msg)
                return
            if isinstance(msg, HostCacheMsg) and msg.keep:
                self._start_host_copy(msg)  # replies from its thread once the copy is made
                return
            self._reply(op_id, True, self.handle(msg))
        except NoRoomError as e:  # refused before anything was allocated (worker/memory.py)
            self._reply(op_id, False, NoResult(), f"rank {self.rank}: {e}", no_room=True)
        except torch.OutOfMemoryError as e:  # (a load's buffer: what it allocated is gone)
            free_device_memory(self.device)
            self._reply(op_id, False, NoResult(), f"no room on the device: {e}", no_room=True)
        except (BlitzScaleError, RuntimeError, ValueError, OSError) as e:
            self._reply(op_id, False, NoResult(), f"{type(e).__name__}: {e}")

    def _reply(
        self, op_id: int, ok: bool, result: ReplyResult, error: str = "", no_room: bool = False
    ) -> None:
        reply = ReplyMsg(op_id=op_id, rank=self.rank, ok=ok, error=error, result=result, no_room=no_room)
        self._send_control(reply)

    def _start_transfer(self, msg: TransferMsg) -> None:
        """Weights move on their own thread so a source keeps serving while it sends, and a
        live target serves from the layers that have landed (the receive buffer exists
        before this returns, so an ActivateMsg right behind this one finds it)."""
        receives = self._receives(msg)
        if receives and self._receiving:
            raise BlitzScaleError(f"rank {self.rank} is already receiving a transfer")
        if msg.host_source:  # (a host copy still being made is waited for)
            self.host_copies.finish(msg.model)
        if receives:
            self._prepare_receive(msg)
        # What it sends from or fills, chosen here: `_settle` moves `loading` to `models`
        # on this thread, and a chain's tail may be asked to forward while it receives.
        arriving = self.loading.get(msg.model)  # (filled now: what is sent from it waits)
        weights = arriving or self.models.get(msg.model)
        host = self.host_copies.held(msg.model)  # (one being made was waited for above)
        if weights is None and host is None:  # (a chain's tail whose own load failed)
            break_neighbours(self.rank, self.links, msg)  # they would wait out the timeout
            raise ValueError(f"rank {self.rank} holds no copy of {msg.model}")
        self._transfers += 1
        self._receiving = self._receiving or receives

        def run() -> None:
            result: ReplyResult
            try:
                result, ok, err = self._transfer(msg, weights, host, arriving is not None), True, ""
            except Exception as e:  # any failure is the transfer's, answered, never a dead thread
                result, ok, err = NoResult(), False, f"{type(e).__name__}: {e}"
            # Before the reply leaves: the controller may send the next command (activate,
            # the next transfer) the moment it has it, and the main thread settles first.
            self._ended.put((msg.model, err, receives))
            reply = ReplyMsg(op_id=msg.op_id, rank=self.rank, ok=ok, error=err, result=result)
            self._reply_from_thread(reply)

        threading.Thread(target=run, name="transfer", daemon=True).start()  # (several may run)

    def _settle(self) -> None:
        """On the main thread: a transfer that ended moves its weights from `loading` to
        `models` (or drops them, and a live target serving them stops)."""
        while True:
            try:
                model, err, received = self._ended.get_nowait()
            except queue.Empty:
                return
            self._transfers -= 1
            if not received:
                continue  # this rank only sent (what it still receives, if any, stays loading)
            self._receiving = False
            weights = self.loading.pop(model, None)
            if weights is None:
                continue
            if not err:
                self.models[model] = weights
                continue
            slot = self._serving_slot(model)
            if slot is not None:
                self.loops[slot].live.failed = f"loading the weights failed: {err}"
            elif self.follower is not None and self.follower.model_name == model:
                self.follower.weights_lost(model)  # (its leader fails the live target)
            else:
                self.standby.lost(weights)

    def _start_link(self, msg: LinkMsg) -> None:
        """Build the link to a respawned peer (or one plane of it, to a live peer) on a
        thread of its own: building waits for the peer to reach its side, and this worker
        keeps serving meanwhile."""
        planes = (msg.plane,) if msg.plane else PLANES
        if not msg.plane:
            self.links.drop(msg.peer)  # the old link led to a dead process

        def run() -> None:
            t = time.perf_counter()
            try:
                self.links.connect(msg.peer, msg.incarnation, msg.generation, planes)
                ok, err = True, ""
            except Exception as e:  # answered, never a dead thread
                ok, err = False, f"{type(e).__name__}: {e}"
            result = LinkResult(seconds=time.perf_counter() - t)
            reply = ReplyMsg(op_id=msg.op_id, rank=self.rank, ok=ok, error=err, result=result)
            self._reply_from_thread(reply)

        threading.Thread(target=run, name=f"link-{msg.peer}", daemon=True).start()

    def _start_instance_link(self, msg: InstanceLinkMsg) -> None:
        """Rebuild this rank's instance group among its members' current incarnations (one
        was respawned), on a thread: every member builds it at once."""

        def run() -> None:
            result: ReplyResult
            try:
                result, ok, err = LinkResult(seconds=self.links.connect_instance(msg.incarnations)), True, ""
            except Exception as e:  # answered, never a dead thread
                result, ok, err = NoResult(), False, f"{type(e).__name__}: {e}"
            reply = ReplyMsg(op_id=msg.op_id, rank=self.rank, ok=ok, error=err, result=result)
            self._reply_from_thread(reply)

        threading.Thread(target=run, name="instance-link", daemon=True).start()

    def _start_host_copy(self, msg: HostCacheMsg) -> None:
        weights = self.models.get(msg.model)
        if weights is None:
            raise ValueError(f"rank {self.rank} holds no device copy of {msg.model} to cache")

        def done(result: HostCopyResult | None, err: str) -> None:
            ok = result is not None
            reply = ReplyMsg(op_id=msg.op_id, rank=self.rank, ok=ok, error=err, result=result or NoResult())
            self._reply_from_thread(reply)

        try:
            self.host_copies.start(msg.model, weights, done)
        except ValueError as e:
            raise ValueError(f"rank {self.rank}: {e}") from None

    def _reply_from_thread(self, reply: ReplyMsg) -> None:
        """Answer on a socket of this thread's own (sockets are not thread-safe): through the
        main loop's outbox the reply would wait for the engine's current step, which on a
        busy CPU source took seconds and made a finished transfer look seconds longer."""
        sock = self.ctx.socket(zmq.DEALER)  # no identity: a reused one could be refused
        sock.setsockopt(zmq.LINGER, 5000)
        try:
            sock.connect(self.cfg.control_addr)
            sock.send_multipart(worker_frames(self.cfg.token, reply))
        finally:
            sock.close()  # lingers until the reply is out

    def _receives(self, msg: TransferMsg) -> bool:
        return any(self.rank in c[1:] for c in msg.chains) or (
            msg.head_is_target and any(c[0] == self.rank for c in msg.chains)
        )

    def _prepare_receive(self, msg: TransferMsg) -> None:
        if msg.model in self.models or msg.model in self.loading:
            raise ValueError(f"rank {self.rank} already holds {msg.model}")
        cfg, dtype = load_config(resolve_model(msg.source)), parse_dtype(msg.dtype)
        fresh = self._weights_room(msg.model, cfg, dtype, msg.tp_size, msg.tp_rank)
        if fresh is None:
            fresh = ModelWeights.empty(cfg, dtype, self.device, msg.tp_size, msg.tp_rank)
            fresh.readiness.reset()
        self.loading[msg.model] = fresh

    # --- commands ----------------------------------------------------------------------

    def handle(self, msg: Message) -> ReplyResult:
        if isinstance(msg, LoadMsg):
            return self._load(msg)
        if isinstance(msg, HostCacheMsg):  # (keep=True is started in _handle_control)
            self.host_copies.drop(msg.model)
            return NoResult()
        if isinstance(msg, ReleaseMsg):
            return self._release(msg)
        if isinstance(msg, ChecksumMsg):
            return self._checksum(msg)
        if isinstance(msg, ProfileMsg):
            dtype = parse_dtype(self.cfg.dtype)
            cap, group = self.cfg.memory_bytes, self.links.instance
            return cost_report(msg, self.device, dtype, self.standby, self.rank, cap, group)
        if isinstance(msg, ActivateMsg):
            return self._activate(msg)
        if isinstance(msg, DeactivateMsg):
            loop = self._loop(msg.slot)
            engine = loop.engine
            loop.deactivate()
            model = self.serving_models.pop(msg.slot, "")
            if engine is not None:  # its weights' release may make it the standby again
                self._retired = (model, engine)
            return NoResult()
        if isinstance(msg, SetRoleMsg):
            self._loop(msg.slot).role = msg.role
            return NoResult()
        if isinstance(msg, StandbyMsg):
            self.standby.respec(msg.engine)
            return NoResult()
        if isinstance(msg, PrefixExportMsg):
            return self._model_loop(msg.model).prefixes.export(self._engine_of(msg.model), msg)
        if isinstance(msg, PrefixRecvMsg):
            return self._model_loop(msg.model).prefixes.recv(self._engine_of(msg.model), msg)
        raise ValueError(f"worker cannot handle {type(msg).__name__}")

    def _load(self, msg: LoadMsg) -> LoadResult:
        if msg.model in self.models:
            raise ValueError(f"rank {self.rank} already holds {msg.model}")
        t = time.perf_counter()
        dtype = parse_dtype(self.cfg.dtype)
        shape = disk_shape(msg.source, msg.tp_rank, dtype)
        if shape is not None:
            into = self._weights_room(msg.model, shape, dtype, msg.tp_size, msg.tp_rank)
        else:  # converted as it loads: into a buffer of its own
            into = None
            src = resolve_model(msg.source)
            if src.kind != "gguf":  # (a GGUF's size is known once it is parsed, seconds)
                need = layout_of(load_config(src), dtype, msg.tp_size, msg.tp_rank).nbytes
                self.room.make(need, f"the weights of {msg.model}")
            self._give_up_spares()
        try:
            weights, stats = load_local(
                msg.source,
                dtype,
                self.device,
                msg.tp_size,
                msg.tp_rank,
                msg.parallel_readers,
                msg.direct_io,
                msg.max_bytes_per_s,
                into,
            )
        except BaseException:
            if into is not None:
                self.standby.lost(into)  # (half-read: the standby is built again)
            raise
        _sync(self.device)
        self.models[msg.model] = weights
        return msgspec.structs.replace(stats, seconds=time.perf_counter() - t, bytes=weights.layout.nbytes)

    def _transfer(
        self, msg: TransferMsg, weights: ModelWeights | None, host: ModelWeights | None, arriving: bool
    ) -> TransferRankResult:
        """`arriving`: `weights` are still being filled (this rank receives them, here or in
        the transfer a chain joined): their readiness says what may be sent. A full copy
        sends every piece at once."""
        received_at = time.time()
        layout_src = weights or host
        assert layout_src is not None
        stats = run_transfer(
            self.rank,
            self.links,
            msg,
            layout_src.layout,
            self.device,
            weights.buffer if weights is not None else None,
            weights.readiness if weights is not None and arriving else None,
            host.buffer if host is not None else None,
        )
        # No device-wide synchronize here: every piece's completion was observed on its own
        # event, and a synchronize would also wait for the engine's work, which on a busy
        # source never pauses (a 44 ms transfer was reported done after 4.4 s).
        return stats.as_result(received_at)

    def _activate(self, msg: ActivateMsg) -> ActivateResult:
        weights = self.models.get(msg.model)
        if weights is None and msg.live:  # a live target: serve what has landed so far
            weights = self.loading.get(msg.model)
            if weights is None:
                raise ValueError(f"rank {self.rank} is not loading {msg.model}")
        elif weights is None or not weights.readiness.all_ready:
            raise ValueError(f"rank {self.rank} does not hold all of {msg.model}")
        if self._serving_slot(msg.model) is not None:  # (before the standby is handed out)
            raise ValueError(f"rank {self.rank} already serves {msg.model}")
        t = time.perf_counter()
        tokenizer = self._tokenizer(msg.source)
        standby = self.standby.take_engine(weights, msg.engine, msg.model, tokenizer.result)
        room = None
        if standby is None and self.cfg.tp == 1:  # an engine to build: its KV cache must fit
            what = f"the KV cache of {msg.model}'s engine"
            room = self.room.for_engine(
                weights.config, weights.dtype, weights.layout.nbytes, msg.engine, what
            )
        result = self._loop(msg.slot).activate(weights, tokenizer.result(), msg, standby, room)
        self.serving_models[msg.slot] = msg.model
        # the engine's objects live as long as it serves; no full collection here (it
        # would delay the first request), so this activation's garbage, if any, stays
        freeze_heap(collect=False)
        took = time.perf_counter() - t
        return msgspec.structs.replace(result, standby=standby is not None, engine_s=took)

    def _tokenizer(self, source: str) -> Future[Any]:
        if source not in self._tokenizers:
            self._tokenizers[source] = self._loader.submit(lambda: load_tokenizer(resolve_model(source)))
        return self._tokenizers[source]

    def _release(self, msg: ReleaseMsg) -> ReleaseResult:
        if self._serving_slot(msg.model) is not None:
            raise ValueError(f"rank {self.rank} is serving {msg.model}; deactivate it first")
        if self.follower is not None and self.follower.model_name == msg.model:
            self.follower.stop()  # its leader was deactivated (its stop may still be on the way)
        freed, kept = 0, False
        self.host_copies.finish(msg.model)  # (a copy being made reads the weights)
        weights = self.models.pop(msg.model, None)
        if weights is not None:
            freed = weights.layout.nbytes
            retired = self._retired[1] if self._retired and self._retired[0] == msg.model else None
            kept = self.standby.recycle(msg.model, weights, retired)
            self._retired = None
            del weights, retired
        if msg.host_copy:
            self.host_copies.drop(msg.model)
        if not kept:  # (after a disk load dropped it, or a failed live load lost it)
            free_device_memory(self.device)  # (a full collection: ~0.1 s on a GPU worker)
            self.standby.arm()
        return ReleaseResult(freed_bytes=freed, device_bytes_in_use=self.device_bytes_in_use(), standby=kept)

    def _checksum(self, msg: ChecksumMsg) -> ChecksumResult:
        weights = self.host_copies.finish(msg.model) if msg.host_copy else self.models.get(msg.model)
        if weights is None:
            raise ValueError(
                f"rank {self.rank} holds no {'host' if msg.host_copy else 'device'} copy of {msg.model}"
            )
        return ChecksumResult(
            checksum=buffer_checksum(weights.buffer),
            dtype=dtype_name(weights.dtype),
            bytes=weights.layout.nbytes,
        )

    # --- device memory (worker/memory.py) ------------------------------------------------

    def _holdings(self) -> list[Holding]:
        """What holds this worker's device now (worker/memory.py)."""
        held = [Holding(f"weights of {m}", w.layout.nbytes) for m, w in self.models.items()]
        held += [Holding(f"weights of {m} (arriving)", w.layout.nbytes) for m, w in self.loading.items()]
        for slot, loop in self.loops.items():
            if loop.engine is not None:
                model = self.serving_models.get(slot, "?")
                held.append(Holding(f"KV cache of {model} (slot {slot})", loop.engine.kv_cache_bytes))
        if self._retired is not None:
            held.append(Holding(f"KV cache of {self._retired[0]} (drained)", self._retired[1].kv_cache_bytes))
        return held + self.standby.holdings()

    def _spare_bytes(self) -> int:
        """What the worker may give up for room: the standby, and a drained engine kept only
        to become it."""
        retired = self._retired[1].kv_cache_bytes if self._retired is not None else 0
        return self.standby.spare_bytes + retired

    def _give_up_spares(self) -> None:
        """Free the standby and a drained engine (something of another shape needs the room)."""
        self.standby.drop()
        if self._retired is not None:
            self._retired = None
            free_device_memory(self.device)

    def _weights_room(
        self, model: str, cfg: ModelConfig, dtype: torch.dtype, tp_size: int, tp_rank: int
    ) -> ModelWeights | None:
        """The standby's empty buffer when `model` has its shape; else None, once room for
        its weights is made (NoRoomError when there is none)."""
        into = self.standby.take_weights(cfg, dtype, tp_size)
        if into is None:
            self.room.make(layout_of(cfg, dtype, tp_size, tp_rank).nbytes, f"the weights of {model}")
            self.standby.drop()  # (another shape: it would never be used)
        return into

    def device_bytes_in_use(self) -> int:
        """What the device allocator holds (CUDA), or the bytes of the models held (CPU)."""
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return sum(w.buffer.untyped_storage().nbytes() for w in self.models.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def process_main(cfg: WorkerConfig) -> None:
    """A local worker process's entry point (from `cluster/forked.py`): the worker's
    life, then the process ends at once. Python's own exit would run torch's static
    destructors, which deregister every operator kernel one by one: seconds of CPU per
    worker (7 s for four workers to exit on a busy 2-core machine), for nothing, as the
    worker has answered everything and closed its links. (A Ray actor runs `worker_main`
    and returns: Ray ends the actor's process.)"""
    worker_main(cfg)
    _leave()


def _leave() -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def worker_main(cfg: WorkerConfig) -> None:
    """The worker's life, in a process of its own or a Ray actor's."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:  # (preloaded by the forkserver, before this was set)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(
            hf_logging.log_levels.get(os.environ["TRANSFORMERS_VERBOSITY"], logging.ERROR)
        )
    # Ctrl-C reaches the whole process group; the controller decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cfg.device.startswith("cuda"):
        # Load every kernel when the CUDA context is made. With lazy loading (CUDA's default)
        # the first launch of a kernel loads its module, which waits for the device to go
        # idle, and it never does while NCCL receives of a transfer spin waiting for data:
        # a live target's first forward pass would stall until its weights had all arrived.
        os.environ["CUDA_MODULE_LOADING"] = "EAGER"
    torch.set_num_threads(costprobe.WORKER_THREADS)
    worker = Worker(cfg)
    try:
        worker.serve_forever()
    finally:
        worker.links.close()
    if worker.inbox is not None:
        # Its reader thread waits in the instance group's broadcast, and tearing the group
        # down under it aborts the process: leave at once (everything is answered).
        _leave()
