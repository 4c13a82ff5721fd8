"""Typed configuration of a worker cluster (addresses and ports come from here)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from blitzscale.model.config import DTYPE_NAMES

BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class ClusterConfig:
    num_workers: int = 2
    device: str = "cpu"  # "cpu": N CPU workers; "cuda": one worker per visible GPU
    dtype: str = ""  # "" = float32 on CPU, bfloat16 on GPU
    host: str = "127.0.0.1"
    dist_port: int = 0  # torch.distributed rendezvous; 0 = pick a free port
    control_port: int = 0  # ZeroMQ commands; 0 = pick a free port
    startup_timeout_s: float = 180.0
    op_timeout_s: float = 120.0  # a command's reply must come within this
    transfer_timeout_s: float = 30.0  # a transfer piece must land within this
    piece_bytes: int = 0  # 0: one piece per segment stripe
    ranks_per_host: int = 0  # topology for per-host policies (sllm); 0: all ranks on one host
    disk_bytes_per_s: float = 0.0  # cap scale-up disk reads (0: none), to reproduce a slower disk
    transfer_bytes_per_s: float = 0.0  # cap GPU-to-GPU weight transfers (0: none): slow links
    max_restarts: int = 5  # a dead worker is respawned up to this many times (0: never)
    # Each worker builds a standby engine of the served model at start (KV cache, decode
    # graphs) so a new instance serves as soon as its weights land (worker/standby.py):
    # "auto" on GPUs, "on" anywhere, "off".
    standby: str = "auto"
    # Host memory (bytes) each host gives to model copies (0: no bound): blitz keeps at most
    # one host copy per model in the cluster, sllm caches per host (TTL, LRU beyond it).
    host_memory_bytes: int = 0
    # Device memory (bytes) each worker may hold: weights, KV caches, the standby (0: the
    # device's own; a CPU worker: no bound). A load or an engine that would not fit is
    # refused before it allocates and tried again once there is room (worker/memory.py).
    worker_memory_bytes: int = 0
    # How workers are started: "local" processes on this machine, or "ray": one Ray actor
    # per GPU (or CPU slot) across a Ray cluster's nodes (pip install 'blitzscale[ray]').
    backend: str = "local"
    ray_address: str = ""  # backend "ray": the cluster to join ("auto", host:port); "" starts one
    # Models resident on each worker at once, each with its own engine; each engine's KV
    # cache takes an equal share of the device (cluster/slotted.py). 1: one model a worker,
    # another swapped in from its host copy when it must. 0: as many as fit a GPU, each with
    # its weights and one request of its whole context (control/residency.py; 1 on a CPU).
    models_per_rank: int = 0

    def __post_init__(self) -> None:
        if self.host_memory_bytes < 0:
            raise ValueError(f"host_memory_bytes must be >= 0 (0: no bound), got {self.host_memory_bytes}")
        if self.worker_memory_bytes < 0:
            raise ValueError(
                f"worker_memory_bytes must be >= 0 (0: the device's own), got {self.worker_memory_bytes}"
            )
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.dtype and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)} (or ''), got {self.dtype!r}")
        for name in ("startup_timeout_s", "op_timeout_s", "transfer_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value}")
        for name in ("piece_bytes", "ranks_per_host"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: the default), got {getattr(self, name)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.standby not in ("auto", "on", "off"):
            raise ValueError(f"standby must be 'auto', 'on' or 'off', got {self.standby!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.ray_address and self.backend != "ray":
            raise ValueError(
                f"ray_address {self.ray_address!r} (--ray-address) needs backend 'ray' (--cluster ray), "
                f"not {self.backend!r}"
            )
        if self.backend == "ray" and self.ranks_per_host:
            raise ValueError(
                f"ranks_per_host {self.ranks_per_host} emulates hosts of the local backend; "
                "the ray backend takes each rank's node from Ray (leave it 0)"
            )
        if self.models_per_rank < 0:
            raise ValueError(f"models_per_rank must be >= 0 (0: as many as fit), got {self.models_per_rank}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0 (0: never respawn), got {self.max_restarts}")
        for name in ("disk_bytes_per_s", "transfer_bytes_per_s"):
            if not getattr(self, name) >= 0:  # (NaN too)
                raise ValueError(f"{name} must be >= 0 (0: no cap), got {getattr(self, name)}")

    @property
    def uses_standby(self) -> bool:
        return self.standby == "on" or (self.standby == "auto" and self.device == "cuda")

    @property
    def resolved_dtype(self) -> str:
        return self.dtype or ("float32" if self.device == "cpu" else "bfloat16")
