"""A worker dying under load: its requests fail at once with a clear error, the pool
forgets its copies, a request accepted afterwards is still served (from disk), and the dead
worker is respawned and used again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import BlitzScaleError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def test_dead_instance_fails_its_requests_and_the_cluster_recovers() -> None:
    cfg = ServeConfig().with_overrides(cluster={"num_workers": 2}, router={"mode": "colocated"})
    lt = LoopThread()
    service = ServingCluster(cfg)
    try:
        lt.run(service.start())
        router = service.router
        assert router is not None and service.cluster is not None
        ids = router.encode("Once upon a time")

        async def one(rid: str, n: int) -> list[int]:
            out: list[int] = []
            params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            async for o in router.generate(rid, ids, params):
                out += o.new_token_ids
            return out

        async def scenario() -> tuple[float, list[int]]:
            long = asyncio.create_task(one("long", 1500))
            await asyncio.sleep(1.5)
            service.cluster.procs[0].kill()
            t0 = time.monotonic()
            with pytest.raises(BlitzScaleError, match="died"):
                await long
            failed_after = time.monotonic() - t0
            after = await asyncio.wait_for(one("after", 8), 60)
            assert service.cluster.pool.gpu_holders(cfg.model.name) == [1]
            # The dead worker comes back (a new process, links rebuilt) holding nothing...
            await _until(lambda: router.respawner.restarts == 1 and 0 in router.connected, "respawn")
            assert 0 not in router.dead_ranks and 0 in service.cluster.alive_ranks()
            # ...and is the only rank left to serve once the other one dies too.
            service.cluster.procs[1].kill()
            again = await asyncio.wait_for(one("again", 8), 120)
            return failed_after, after + again

        failed_after, tokens = lt.run(scenario())
        assert failed_after < 5
        assert len(tokens) == 16 and tokens[:8] == tokens[8:]  # greedy: the same answer
        assert 0 in service.cluster.pool.gpu_holders(cfg.model.name)
        assert router.respawner.deaths == 2
        assert not router.reqs
    finally:
        lt.run(service.stop())
        lt.close()
