"""The other shards of a tensor-parallel instance (worker/tp.py has the leader's side).

`TPInbox` reads the instance's control group on a thread of its own (gloo, no deadline)
and hands each command's bytes to the worker's main loop; `TPFollower` runs each command on
its shard's weights and KV cache, in order, meeting the leader's all-reduces.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import msgspec
import torch
import zmq

from blitzscale.checkpoint.native import parse_dtype
from blitzscale.kvcache.cache import KVCache
from blitzscale.messages import (
    TPCommand,
    TPForwardMsg,
    TPKVCommitMsg,
    TPKVDropMsg,
    TPKVRecvMsg,
    TPKVSendMsg,
    TPReadyMsg,
    TPSetupMsg,
    TPStopMsg,
    decode_tp,
)
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.llama import LlamaModel
from blitzscale.model.tp import TensorParallel
from blitzscale.worker.p2p import MIGRATION_TIMEOUT_S, wait_one
from blitzscale.worker.standby import free_device_memory
from blitzscale.worker.tp import (
    META_FIELDS,
    all_agree,
    broadcast_opts,
    least_of,
)
from blitzscale.worker.world import InstanceGroup, Links

if TYPE_CHECKING:
    from blitzscale.model.weights import ModelWeights

    WeightsOf = Callable[[str], ModelWeights | None]
    # (config source, tp size, tp rank) -> a shard of stand-in weights (the cost probe's)
    StandInOf = Callable[[str, int, int], ModelWeights]

log = logging.getLogger("blitzscale.worker")
LIVE_SETUP_WAIT_S = 60.0  # a live shard's own transfer must have begun by then


class TPInbox:
    """A follower's reader of its instance's control group: a thread that takes each command
    off the group and passes its bytes to the main loop's poller (`socket`)."""

    def __init__(self, ctx: zmq.Context, instance: InstanceGroup) -> None:
        self.instance = instance
        addr = f"inproc://tp-{id(self)}"
        self.socket = ctx.socket(zmq.PAIR)
        self.socket.bind(addr)
        self._out = ctx.socket(zmq.PAIR)
        self._out.connect(addr)
        self.lost: str = ""  # why the reader stopped (the group broke: a member died)
        self._thread = threading.Thread(target=self._run, name="tp-inbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        g = self.instance.control
        try:
            while True:
                header = torch.zeros(1, dtype=torch.long)
                g.broadcast([header], broadcast_opts()).wait()
                payload = torch.empty(int(header.item()), dtype=torch.uint8)
                g.broadcast([payload], broadcast_opts()).wait()
                self._out.send(payload.numpy().tobytes())
        except Exception as e:  # the group broke (a member died, or it was rebuilt)
            self.lost = f"{type(e).__name__}: {e}".splitlines()[0]
            self._out.send(b"")  # wakes the main loop, which sees `lost`

    def take(self) -> TPCommand | None:
        """The next command (None: the reader has stopped)."""
        data = self.socket.recv()
        if not data:
            return None
        try:
            return decode_tp(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise RuntimeError(f"undecodable command from the instance leader: {e}") from e

    def close(self) -> None:
        self._out.close(linger=0)
        self.socket.close(linger=0)


class TPFollower:
    """Shard k > 0 of an instance: runs what its leader says on its own weights and KV."""

    def __init__(self, links: Links, instance: InstanceGroup, stand_in_of: StandInOf | None = None) -> None:
        self.links = links
        self.instance = instance
        self.stand_in_of = stand_in_of
        self.model_name = ""
        self._stand_in = False  # the model served is the cost probe's stand-in
        self.model: LlamaModel | None = None
        self.kv: KVCache | None = None
        self._recvs: dict[str, tuple[Future[None], torch.Tensor]] = {}
        self._dropped: set[str] = set()
        self._sends: list[tuple[Future[None], torch.Tensor]] = []
        self._orphans: list[torch.Tensor] = []  # buffers a failed receive may still land in
        self._waiters = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tp-kv-wait")
        self._pending: tuple[TPSetupMsg, float] | None = None  # a live setup awaiting its weights
        self._lost = False  # the weights being served stopped arriving

    @property
    def active(self) -> bool:
        return self.model is not None

    def handle(self, cmd: TPCommand, weights_of: WeightsOf) -> None:
        """Run one command; `weights_of(model)`: this rank's copy of a model (held, or for
        a live setup still arriving), or None."""
        if isinstance(cmd, TPSetupMsg):
            self._setup(cmd, weights_of)
        elif isinstance(cmd, TPReadyMsg):
            least_of(self.instance, self._ready_prefix())
        elif isinstance(cmd, TPStopMsg):
            self.stop()
        elif isinstance(cmd, TPForwardMsg):
            self._forward(cmd)
        elif isinstance(cmd, TPKVSendMsg):
            self._send(cmd)
        elif isinstance(cmd, TPKVRecvMsg):
            self._recv(cmd)
        elif isinstance(cmd, TPKVCommitMsg):
            self._commit(cmd)
        elif isinstance(cmd, TPKVDropMsg):
            self._drop(cmd.request_id)
        self._reap()

    def _setup(self, cmd: TPSetupMsg, weights_of: WeightsOf) -> None:
        """Build the shard's model and KV cache; every shard then says whether it could.
        A live setup may reach this shard before its own transfer does (they come by
        different paths): it waits (`poll`), the worker serving meanwhile, and the leader
        in the answer's all-reduce."""
        self.stop()
        if cmd.stand_in_source:
            self._build(cmd, self._stand_in_weights(cmd))
            self._stand_in = self.model is not None
            return
        weights = weights_of(cmd.model)
        if weights is None and cmd.live:
            self._pending = (cmd, time.monotonic() + LIVE_SETUP_WAIT_S)
            return
        self._build(cmd, weights)

    def _stand_in_weights(self, cmd: TPSetupMsg) -> ModelWeights | None:
        """This shard of `cmd`'s model as stand-in weights (None, logged: it cannot)."""
        try:
            if self.stand_in_of is None:
                raise RuntimeError("this follower builds no stand-in weights")
            return self.stand_in_of(cmd.stand_in_source, self.instance.size, self.instance.rank)
        except Exception as e:  # (the leader hears it in the setup's answer)
            log.error("rank %d: no stand-in shard of %s: %s", self.links.rank, cmd.model, e)
            return None

    def poll(self, weights_of: WeightsOf) -> None:
        """A pending live setup goes ahead once this rank's receive buffer exists (or fails
        after LIVE_SETUP_WAIT_S)."""
        self._reap()
        if self._pending is None:
            return
        cmd, deadline = self._pending
        weights = weights_of(cmd.model)
        if weights is not None or time.monotonic() > deadline:
            self._pending = None
            self._build(cmd, weights)

    def weights_lost(self, model: str) -> None:
        """This shard's transfer of `model` failed: a live leader learns it at its next
        question (the answer -1)."""
        if model == self.model_name:
            self._lost = True

    def _ready_prefix(self) -> int:
        if self.model is None or self._lost:
            return -1
        return self.model.weights.readiness.num_ready_prefix

    def _build(self, cmd: TPSetupMsg, weights: ModelWeights | None) -> None:
        rank = self.instance.rank
        ok = (
            weights is not None
            and (cmd.live or weights.readiness.all_ready)
            and weights.layout.tp_rank == rank
        )
        if weights is not None and ok:
            lay = weights.layout
            tp = TensorParallel(self.instance.compute, rank, self.instance.size)
            self.model = LlamaModel(weights, max_positions=cmd.max_model_len, tp_group=tp)
            self.kv = KVCache(
                weights.config, cmd.num_blocks, cmd.block_size, weights.dtype, weights.device, lay.tp_size
            )
            self.model_name = cmd.model
        else:
            log.error(
                "rank %d cannot serve shard %d of %s: it does not hold it", self.links.rank, rank, cmd.model
            )
        all_agree(self.instance, ok)

    def stop(self) -> None:
        device = self.model.weights.device if self.model is not None and self._stand_in else None
        self.model = self.kv = None
        self.model_name = ""
        self._lost = False
        self._pending = None
        self._stand_in = False
        if device is not None:  # the probe's weights and KV cache were this shard's alone
            free_device_memory(device)

    @torch.inference_mode()
    def _forward(self, cmd: TPForwardMsg) -> None:
        model, kv = self._serving()
        device = model.weights.device
        flat = torch.frombuffer(bytearray(cmd.meta), dtype=torch.long).to(device)
        views = dict(zip(META_FIELDS, flat.split(cmd.meta_sizes), strict=True))
        views["block_tables"] = views["block_tables"].view(cmd.num_seqs, -1)
        meta = AttentionMetadata(
            **views,  # type: ignore[arg-type]
            query_lens=tuple(cmd.query_lens),
            context_lens=tuple(cmd.context_lens),
            block_size=cmd.block_size,
        )
        if cmd.token_ids:
            ids = torch.frombuffer(bytearray(cmd.token_ids), dtype=torch.long).to(device)
            hidden = model.embed(ids)
        else:
            raw = torch.frombuffer(bytearray(cmd.hidden), dtype=torch.uint8)
            hidden = raw.view(parse_dtype(cmd.dtype)).view(-1, model.config.hidden_size).to(device)
        model.run_layers(hidden, meta, kv, cmd.start, cmd.end)

    def _serving(self) -> tuple[LlamaModel, KVCache]:
        if self.model is None or self.kv is None:
            raise RuntimeError(f"shard {self.instance.rank} got a step before its setup")
        return self.model, self.kv

    def _peer(self, leader: int) -> int:
        """This shard's counterpart in the instance led by `leader` (instances are aligned)."""
        return leader + self.instance.rank

    def _send(self, cmd: TPKVSendMsg) -> None:
        _, kv = self._serving()
        layers = (0, cmd.num_layers) if cmd.num_layers else None
        buf = kv.gather_blocks(cmd.block_ids, layers)  # a copy: the blocks may be reused at once
        work = self.links.isend(buf, self._peer(cmd.dst_rank), "kv")
        self._sends.append((self._waiters.submit(wait_one, work, buf.device), buf))

    def _recv(self, cmd: TPKVRecvMsg) -> None:
        _, kv = self._serving()
        shape = kv.packed_shape(cmd.num_blocks, cmd.num_layers or None)
        buf = torch.empty(shape, dtype=kv.data.dtype, device=kv.data.device)
        work = self.links.irecv(buf, self._peer(cmd.src_rank), "kv")
        self._recvs[cmd.request_id] = (self._waiters.submit(wait_one, work, buf.device), buf)

    def _commit(self, cmd: TPKVCommitMsg) -> None:
        """The leader's part landed; ours must too (bounded), then every shard says so."""
        ok = False
        entry = self._recvs.pop(cmd.request_id, None)
        if entry is not None:
            done, buf = entry
            try:
                done.result(timeout=MIGRATION_TIMEOUT_S + 5)
                _, kv = self._serving()
                layers = (0, cmd.num_layers) if cmd.num_layers else None
                kv.scatter_blocks(cmd.block_ids[: buf.shape[2]], buf, layers)
                ok = True
            except Exception as e:  # this shard's KV did not arrive: the request fails
                log.error("shard %d: KV of %r did not arrive: %s", self.instance.rank, cmd.request_id, e)
                self._orphans.append(buf)
        all_agree(self.instance, ok)

    def _drop(self, request_id: str) -> None:
        if request_id in self._recvs:
            self._dropped.add(request_id)

    def _reap(self) -> None:
        """Forget finished sends and dropped receives (their buffers may go)."""
        self._sends = [(f, b) for f, b in self._sends if not f.done()]
        for rid in list(self._dropped):
            done, buf = self._recvs[rid]
            if done.done():
                if done.exception() is not None:
                    self._orphans.append(buf)
                del self._recvs[rid]
                self._dropped.discard(rid)

    @property
    def busy(self) -> bool:
        return bool(self._sends or self._dropped)
