"""A tensor-parallel instance whose leader fails part-way through a step (CPU, gloo, two
processes): its serving loop must end the worker at once (`WorkerBrokenError`) rather than
fail the step's requests and go on. The other shard is then inside that step's all-reduce,
and the next step's collectives would pair with it: a hang, or sums of the wrong tensors
(the cluster stops and respawns the whole group when one member dies:
tests/cluster/test_tp_respawn.py)."""

from __future__ import annotations

import queue
import time
from datetime import timedelta

import torch.distributed as dist

from blitzscale.cluster.spawn import worker_context
from tests.worker.tp_procs import failing_leader_main

LIMIT_S = 600  # generous: a loaded 2-core machine


def test_a_failed_tensor_parallel_step_ends_the_leaders_worker() -> None:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120)
    )
    ctx = worker_context()
    out = ctx.Queue()
    procs = [
        ctx.Process(target=failing_leader_main, args=(r, store.port, "random:tiny-llama3", out), daemon=True)
        for r in range(2)
    ]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + LIMIT_S
        while True:
            try:
                result = out.get(timeout=1.0)
                break
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a shard exited with {dead}"
                assert time.monotonic() < deadline, "no result in time"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=60)
    assert len(result["tokens"]) == 3  # the group served before the fault
    assert result["raised"] == "WorkerBrokenError", result
    assert "tensor-parallel" in result["message"] and "injected" in result["message"], result["message"]
