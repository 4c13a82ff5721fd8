"""A worker dying under load: its requests fail at once with a clear error, the pool
forgets its copies, and a request accepted afterwards is still served (from disk)."""

from __future__ import annotations

import asyncio
import time

import pytest

from blitzscale.engine.request import SamplingParams
from blitzscale.errors import BlitzScaleError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster


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
            return failed_after, after

        failed_after, after = lt.run(scenario())
        assert failed_after < 5
        assert len(after) == 8
        assert service.cluster.pool.gpu_holders(cfg.model.name) == [1]
        assert not router.reqs
    finally:
        lt.run(service.stop())
        lt.close()
