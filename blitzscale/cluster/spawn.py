"""How a worker process is started, checked alive, killed and stopped, and where it lives.

`LocalCluster` does everything else (control socket, mailbox, store, pool, respawn); a
spawner only runs `worker_main(WorkerConfig)` somewhere. `ProcessSpawner` starts local
processes (the default; `process_main` runs it and ends the process at once);
`cluster/ray_spawner.py` starts Ray actors on a Ray cluster's nodes; `cluster/spawners.py`
picks one.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Protocol

from blitzscale.errors import BlitzScaleError
from blitzscale.worker.worker import WorkerConfig, process_main

LOCAL_NODE = "local"


class WorkerHandle(Protocol):
    """One running worker, as the controller sees it (a subset of `mp.Process`)."""

    @property
    def pid(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


class Spawner(Protocol):
    def connect(self, host: str) -> str:
        """Get ready to start workers; returns the address the controller binds and gives
        the workers (`host`, or one the workers' nodes can reach). Called again: the same."""
        ...

    def slots(self, num_workers: int, device: str, tp: int) -> int:
        """How many workers to start (GPUs visible, whole instances); reserves them."""
        ...

    def spawn(self, cfg: WorkerConfig, name: str) -> WorkerHandle: ...

    def node_of(self, rank: int) -> str:
        """The node rank `rank`'s worker runs on (ranks of one node share NVLink and host
        memory)."""
        ...

    def close(self) -> None:
        """After every worker was stopped: give back what `slots` reserved."""
        ...


def whole_instances(n: int, tp: int, what: str) -> int:
    n -= n % tp
    if n < 1:
        raise BlitzScaleError(f"tp={tp} needs {tp} GPUs, {what}")
    return n


class ProcessSpawner:
    """Worker processes on this machine. `ranks_per_host` > 0 emulates hosts of that many
    ranks each (for the per-host policies); 0: every rank is on one host."""

    def __init__(self, ranks_per_host: int = 0) -> None:
        self.ranks_per_host = ranks_per_host

    def connect(self, host: str) -> str:
        return host

    def slots(self, num_workers: int, device: str, tp: int) -> int:
        if device != "cuda":
            return num_workers
        import torch

        visible = torch.cuda.device_count()
        if visible < 1:
            raise BlitzScaleError("device cuda: no GPU is visible")
        return whole_instances(min(num_workers, visible), tp, f"{visible} visible")

    def spawn(self, cfg: WorkerConfig, name: str) -> mp.Process:
        p = mp.get_context("spawn").Process(target=process_main, args=(cfg,), name=name, daemon=True)
        p.start()
        return p

    def node_of(self, rank: int) -> str:
        per = self.ranks_per_host
        return f"host{rank // per}" if per else LOCAL_NODE

    def close(self) -> None:
        pass
