"""The worker process: joins the world, then executes controller commands one at a time.

Commands arrive over ZeroMQ as msgspec messages (blitzscale.messages); tensors move only
over torch.distributed. Every command gets exactly one ReplyMsg, errors included.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from blitzscale.checkpoint import load_config, resolve_model
from blitzscale.checkpoint.native import dtype_name, parse_dtype
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import (
    ChecksumMsg,
    HelloMsg,
    HostCacheMsg,
    LoadMsg,
    Message,
    ReleaseMsg,
    ReplyMsg,
    ShutdownMsg,
    TransferMsg,
    decode,
    encode,
)
from blitzscale.model.weights import ModelWeights
from blitzscale.transfer.checksum import buffer_checksum
from blitzscale.transfer.executor import run_transfer
from blitzscale.worker.disk_source import load_local
from blitzscale.worker.world import init_world, warm_up_pairs


@dataclass(frozen=True)
class WorkerConfig:
    rank: int
    world_size: int
    device: str  # "cpu" or "cuda:N"
    dist_addr: str
    dist_port: int
    control_addr: str  # tcp://host:port of the controller's ROUTER socket
    dtype: str = "float32"
    init_timeout_s: float = 120.0


class Worker:
    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.rank = cfg.rank
        self.models: dict[str, ModelWeights] = {}
        self.host_copies: dict[str, ModelWeights] = {}
        self._init_device()
        self._init_world()
        self._init_control()

    def _init_device(self) -> None:
        self.device = torch.device(self.cfg.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def _init_world(self) -> None:
        c = self.cfg
        init_world(c.rank, c.world_size, c.dist_addr, c.dist_port, self.device, c.init_timeout_s)
        t = time.perf_counter()
        self.num_warm_pairs = warm_up_pairs(c.rank, c.world_size, self.device)
        self.warmup_s = time.perf_counter() - t

    def _init_control(self) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"w{self.rank}".encode())
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.connect(self.cfg.control_addr)
        self.sock.send(encode(HelloMsg(rank=self.rank, pid=os.getpid(), device=str(self.device))))

    def serve_forever(self) -> None:
        while True:
            msg = decode(self.sock.recv())
            if isinstance(msg, ShutdownMsg):
                self._reply(msg.op_id, True, {})
                return
            try:
                result = self.handle(msg)
                self._reply(msg.op_id, True, result)
            except (BlitzScaleError, RuntimeError, ValueError, OSError) as e:
                self._reply(getattr(msg, "op_id", -1), False, {}, f"{type(e).__name__}: {e}")

    def _reply(self, op_id: int, ok: bool, result: dict[str, Any], error: str = "") -> None:
        self.sock.send(encode(ReplyMsg(op_id=op_id, rank=self.rank, ok=ok, error=error, result=result)))

    # --- commands ----------------------------------------------------------------------

    def handle(self, msg: Message) -> dict[str, Any]:
        if isinstance(msg, LoadMsg):
            return self._load(msg)
        if isinstance(msg, TransferMsg):
            return self._transfer(msg)
        if isinstance(msg, HostCacheMsg):
            return self._host_cache(msg)
        if isinstance(msg, ReleaseMsg):
            return self._release(msg)
        if isinstance(msg, ChecksumMsg):
            return self._checksum(msg)
        raise ValueError(f"worker cannot handle {type(msg).__name__}")

    def _load(self, msg: LoadMsg) -> dict[str, Any]:
        if msg.model in self.models:
            raise ValueError(f"rank {self.rank} already holds {msg.model}")
        t = time.perf_counter()
        weights, stats = load_local(
            msg.source,
            parse_dtype(self.cfg.dtype),
            self.device,
            msg.tp_size,
            msg.tp_rank,
            msg.parallel_readers,
            msg.direct_io,
        )
        _sync(self.device)
        self.models[msg.model] = weights
        return {**stats, "seconds": time.perf_counter() - t, "bytes": weights.layout.nbytes}

    def _transfer(self, msg: TransferMsg) -> dict[str, Any]:
        received_at = time.time()
        dtype = parse_dtype(msg.dtype)
        weights = self.models.get(msg.model)
        is_receiver = any(self.rank in c[1:] for c in msg.chains) or (
            msg.head_is_target and any(c[0] == self.rank for c in msg.chains)
        )
        fresh = None
        if is_receiver:
            if weights is not None:
                raise ValueError(f"rank {self.rank} already holds {msg.model}")
            cfg = load_config(resolve_model(msg.source))
            fresh = ModelWeights.empty(cfg, dtype, self.device, msg.tp_size, msg.tp_rank)
            weights = fresh
        host = self.host_copies.get(msg.model)
        layout_src = weights or host
        if layout_src is None:
            raise ValueError(f"rank {self.rank} holds no copy of {msg.model}")
        stats = run_transfer(
            self.rank,
            msg,
            layout_src.layout,
            self.device,
            weights.buffer if weights is not None else None,
            weights.readiness if weights is not None else None,
            host.buffer if host is not None else None,
        )
        _sync(self.device)
        if fresh is not None:
            self.models[msg.model] = fresh
        return {**stats.as_result(), "received_at": received_at}

    def _host_cache(self, msg: HostCacheMsg) -> dict[str, Any]:
        if not msg.keep:
            self.host_copies.pop(msg.model, None)
            return {}
        if msg.model in self.host_copies:
            raise ValueError(f"rank {self.rank} already has a host copy of {msg.model}")
        weights = self.models.get(msg.model)
        if weights is None:
            raise ValueError(f"rank {self.rank} holds no device copy of {msg.model} to cache")
        pin = self.device.type == "cuda"
        host = ModelWeights.empty(
            weights.config, weights.dtype, "cpu", weights.layout.tp_size, weights.layout.tp_rank, pin
        )
        host.buffer.copy_(weights.buffer)
        host.readiness.mark_all_ready()
        self.host_copies[msg.model] = host
        return {"bytes": host.layout.nbytes, "pinned": pin}

    def _release(self, msg: ReleaseMsg) -> dict[str, Any]:
        freed = 0
        weights = self.models.pop(msg.model, None)
        if weights is not None:
            freed = weights.layout.nbytes
            del weights
        if msg.host_copy:
            self.host_copies.pop(msg.model, None)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"freed_bytes": freed, "device_bytes_in_use": self.device_bytes_in_use()}

    def _checksum(self, msg: ChecksumMsg) -> dict[str, Any]:
        store = self.host_copies if msg.host_copy else self.models
        weights = store.get(msg.model)
        if weights is None:
            raise ValueError(
                f"rank {self.rank} holds no {'host' if msg.host_copy else 'device'} copy of {msg.model}"
            )
        return {
            "checksum": buffer_checksum(weights.buffer),
            "dtype": dtype_name(weights.dtype),
            "bytes": weights.layout.nbytes,
        }

    def device_bytes_in_use(self) -> int:
        """What the device allocator holds (CUDA), or the bytes of the models held (CPU)."""
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return sum(w.buffer.untyped_storage().nbytes() for w in self.models.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker_main(cfg: WorkerConfig) -> None:
    """Process entry point (multiprocessing spawn target)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    torch.set_num_threads(1)
    worker = Worker(cfg)
    try:
        worker.serve_forever()
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
