"""A worker dying under load: its streamed requests fail at once with a clear error, one
whose client reads only the whole answer runs again and gives the right tokens, the pool
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

        async def one(rid: str, n: int, out: list[int] | None = None) -> list[int]:
            out = [] if out is None else out
            params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            async for o in router.generate(rid, ids, params):
                out += o.new_token_ids
            return out

        async def whole(rid: str, n: int) -> tuple[list[int], int]:
            """A request whose client reads only the answer: its outputs, as the HTTP edge
            folds them (`restarted` forgets the earlier ones)."""
            params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            restarts, last = 0, None
            async for o in router.generate(rid, ids, params, stream=False):
                restarts += o.restarted
                last = o
            assert last is not None and last.finished
            return last.token_ids, restarts

        def decoding_on_0(rid: str) -> bool:
            r = router.reqs.get(rid)
            return r is not None and r.prefill_rank == 0 and len(r.output_ids) > 0

        async def scenario() -> tuple[float, list[int]]:
            streamed: list[int] = []
            long = asyncio.create_task(one("long", 1500, streamed))
            quiet = asyncio.create_task(whole("quiet", 300))
            await _until(lambda: decoding_on_0("long") and decoding_on_0("quiet"), "both decoding on rank 0")
            service.cluster.procs[0].kill()
            t0 = time.monotonic()
            with pytest.raises(BlitzScaleError, match="died"):
                await long
            failed_after = time.monotonic() - t0
            quiet_tokens, restarts = await asyncio.wait_for(quiet, 300)
            assert restarts == 1 and len(quiet_tokens) == 300
            k = min(len(streamed), 300)  # greedy, the same prompt: the same tokens
            assert k > 0 and quiet_tokens[:k] == streamed[:k]
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
        assert failed_after < 20  # at once, not after a link's 30 s timeout (generous: a busy machine)
        assert len(tokens) == 16 and tokens[:8] == tokens[8:]  # greedy: the same answer
        assert 0 in service.cluster.pool.gpu_holders(cfg.model.name)
        assert router.respawner.deaths == 2
        assert not router.reqs
    finally:
        lt.run(service.stop())
        lt.close()


def test_fixed_provisioning_loads_again_the_instance_it_lost() -> None:
    """Policy `fixed` never scales, but holds its count: its one instance's worker dies,
    and an instance on the other rank (from disk: no GPU holds the model now) serves the
    request that ran there again and the next ones. It once served nothing more: requests
    waited their minute in the queue and were refused, beside an idle worker."""
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 2}, router={"mode": "colocated"}, policy={"name": "fixed"}
    )
    lt = LoopThread()
    service = ServingCluster(cfg)
    try:
        lt.run(service.start())
        router = service.router
        assert router is not None and service.cluster is not None and service.scaler is not None
        ids = router.encode("Once upon a time")

        async def whole(rid: str, n: int) -> list[int]:
            params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
            last = None
            async for o in router.generate(rid, ids, params, stream=False):
                last = o
            assert last is not None and last.finished
            return last.token_ids

        async def scenario() -> tuple[list[int], list[int], list[int]]:
            before = await whole("before", 8)
            quiet = asyncio.create_task(whole("quiet", 400))  # (long enough to be killed mid-answer)
            await _until(
                lambda: "quiet" in router.reqs and len(router.reqs["quiet"].output_ids) > 0, "decoding"
            )
            service.cluster.procs[0].kill()
            rerun = await asyncio.wait_for(quiet, 300)
            after = await asyncio.wait_for(whole("after", 8), 120)
            return before, rerun, after

        before, rerun, after = lt.run(scenario())
        assert after == before and rerun[:8] == before  # greedy: the same answer, served again
        ups = [e for e in service.scaler.events if e.direction == "up"]
        assert [(e.path, e.ranks) for e in ups] == [("disk", (0,)), ("disk", (1,))], ups
        assert service.cluster.pool.gpu_holders(cfg.model.name) == [1]
    finally:
        lt.run(service.stop())
        lt.close()
