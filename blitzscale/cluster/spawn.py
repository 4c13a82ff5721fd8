"""How a worker process is started, checked alive, killed and stopped, and where it lives.

`LocalCluster` does everything else (control socket, mailbox, store, pool, respawn); a
spawner only runs `worker_main(WorkerConfig)` somewhere. `ProcessSpawner` starts local
processes (the default; `process_main` runs it and ends the process at once);
`cluster/ray_spawner.py` starts Ray actors on a Ray cluster's nodes; `cluster/spawners.py`
picks one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from typing import Protocol

from blitzscale.cluster.forked import forked_main
from blitzscale.errors import BlitzScaleError
from blitzscale.worker.worker import WorkerConfig

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
        args = (dict(os.environ), pickle.dumps(cfg))
        p = worker_context().Process(target=forked_main, args=args, name=name, daemon=True)
        p.start()
        return p

    def node_of(self, rank: int) -> str:
        per = self.ranks_per_host
        return f"host{rank // per}" if per else LOCAL_NODE

    def close(self) -> None:
        pass


# Workers are forked from a server process that has imported torch once (multiprocessing's
# forkserver), not started as fresh interpreters: each fresh one imported torch again, 2.5 s
# of a core on an idle machine, more on a busy one, per worker and per respawn. The server
# is this process's child, started with its first worker, and imports torch and
# transformers' tokenizer classes (every worker loads a tokenizer: another 1.2-1.8 s
# each): CUDA is never initialised there, and our modules (some read settings from the
# environment when imported) are imported in each worker once its environment is set
# (`forked_main`, which also applies `TRANSFORMERS_VERBOSITY` again: transformers read it
# when the server imported it).
FORKSERVER_PRELOAD = [
    "torch",
    "transformers.models.auto.tokenization_auto",
    "transformers.tokenization_utils_fast",
]
_ctx: mp.context.ForkServerContext | None = None


def worker_context() -> mp.context.ForkServerContext:
    """multiprocessing's forkserver context, its server preloading torch (the first call
    sets that; the server starts with the first process started)."""
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return _ctx
