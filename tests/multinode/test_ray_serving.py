"""`serve --cluster ray` on a local Ray cluster of two emulated nodes, 4 CPU workers (2 per
node): the openai client is served with the local engine's tokens, a burst scales up with
weights crossing from one node to the other (the event names both), a worker actor killed
with `ray.kill` is detected (its request fails clearly, the rest keep serving, the rank comes
back into its bundle), and shutdown leaves no actor and no worker process."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from blitzscale.cluster.ray_spawner import RaySpawner, RayWorker
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import BlitzScaleError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.requests import Stage
from blitzscale.serve.server import ServingCluster
from tests.serve.conftest import FAST_PLANNER, running, start_http, stop_http
from tests.serve.test_http import PROMPTS

PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@dataclass
class Served:
    service: ServingCluster
    lt: LoopThread
    url: str
    server: Any
    stopped: bool = False

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            stop_http(self.server, self.lt)
            self.lt.run(self.service.stop())
            self.lt.close()


@pytest.fixture(scope="module")
def served(ray_cluster: Any) -> Iterator[Served]:
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 4, "backend": "ray", "ray_address": ray_cluster.address},
        router={"mode": "pd"},
        planner=FAST_PLANNER,
    )
    lt = LoopThread()
    service = ServingCluster(cfg)
    try:
        lt.run(service.start())
    except BaseException:
        lt.run(service.stop())
        lt.close()
        raise
    url, server = start_http(service, lt)
    s = Served(service, lt, url, server)
    yield s
    s.stop()


def _cluster(s: Served) -> Any:
    assert s.service.cluster is not None
    return s.service.cluster


async def _one(
    service: ServingCluster, rid: str, ids: list[int], params: SamplingParams = PARAMS
) -> list[int]:
    out: list[int] = []
    assert service.router is not None
    async for o in service.router.generate(rid, ids, params):
        out += o.new_token_ids
    return out


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def test_workers_are_ray_actors_two_per_node(served: Served) -> None:
    import ray

    cluster = _cluster(served)
    assert isinstance(cluster.spawner, RaySpawner)
    assert all(isinstance(p, RayWorker) for p in cluster.procs)
    nodes = cluster.nodes()
    assert len(nodes) == 4 and len(set(nodes)) == 2, nodes
    ray_nodes = {n["NodeID"][:8] for n in ray.nodes() if n["Alive"]}
    assert set(nodes) == ray_nodes  # the topology is Ray's
    assert sorted(nodes.count(n) for n in set(nodes)) == [2, 2]
    assert served.service.scaler is not None
    hosts = served.service.scaler.snapshot().host_of_rank
    assert len(set(hosts)) == 2 and [hosts[a] == hosts[b] for a in range(4) for b in range(4)] == [
        nodes[a] == nodes[b] for a in range(4) for b in range(4)
    ]
    pids = {p.pid for p in cluster.procs}
    assert len(pids) == 4 and os.getpid() not in pids


def test_openai_client_gets_the_local_engines_tokens(served: Served, smollm2_engine_texts: list[str]) -> None:
    c = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=180)
    texts = [
        c.completions.create(model="smollm2-135m", prompt=p, max_tokens=16, temperature=0).choices[0].text
        for p in PROMPTS
    ]
    assert texts == smollm2_engine_texts
    streamed = c.completions.create(
        model="smollm2-135m", prompt=PROMPTS[0], max_tokens=16, temperature=0, stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == texts[0]


def test_tokens_equal_the_local_backends(served: Served) -> None:
    """The same requests on the local backend (worker processes on this machine) and on
    Ray's actors give the same token ids."""
    service = served.service
    assert service.router is not None
    prompts = [*PROMPTS, "Tell me a long story about a dragon who learns to program. " * 8]
    ids = [service.router.encode(p) for p in prompts]
    on_ray = [served.lt.run(_one(service, f"cmp{k}", x)) for k, x in enumerate(ids)]
    local_cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 1}, router={"mode": "colocated"}, policy={"name": "fixed"}
    )
    assert local_cfg.cluster.backend == "local"
    with running(local_cfg) as (local, lt):
        on_local = [lt.run(_one(local, f"cmp{k}", x)) for k, x in enumerate(ids)]
    assert all(len(t) == PARAMS.max_tokens for t in on_ray)
    assert on_ray == on_local


def test_burst_scales_up_with_weights_crossing_nodes(served: Served) -> None:
    service, lt = served.service, served.lt
    assert service.router is not None and service.scaler is not None
    ids = service.router.encode("Tell me a long story about a dragon who learns to program. " * 8)
    ref = lt.run(_one(service, "ref", ids))
    nodes = _cluster(served).nodes()

    async def burst() -> list[list[int]]:
        tasks = [asyncio.create_task(_one(service, f"b{i}", ids)) for i in range(24)]
        return list(await asyncio.gather(*tasks))

    outs = lt.run(burst())
    assert all(o == ref for o in outs), "tokens changed while the cluster scaled across nodes"
    crossing = [
        e
        for e in service.scaler.events
        if e.direction == "up"
        and e.path == "network"
        and any(nodes[t] != nodes[s] for t in e.ranks for s in e.sources)
    ]
    assert crossing, service.scaler.events
    e = crossing[0]
    assert set(e.source_nodes) == {nodes[s] for s in e.sources}
    assert set(e.nodes) == {nodes[t] for t in e.ranks}
    assert len(set(e.nodes) | set(e.source_nodes)) == 2  # both nodes named
    assert e.bytes > 0


def test_a_killed_worker_actor_is_detected_and_the_rest_keep_serving(served: Served) -> None:
    import ray

    service, lt = served.service, served.lt
    router, cluster = service.router, _cluster(served)
    assert router is not None
    ids = router.encode("Once upon a time")
    ref = lt.run(_one(service, "ref2", ids))

    async def scenario() -> tuple[int, list[Any]]:
        params = SamplingParams(max_tokens=1500, ignore_eos=True, temperature=0)
        long = asyncio.create_task(_one(service, "long", ids, params))

        def decoding() -> bool:
            r = router.reqs.get("long")
            return r is not None and r.stage is Stage.DECODE and bool(r.output_ids)

        await _until(decoding, "the long request to decode", 180)
        victim = router.reqs["long"].decode_rank
        assert victim is not None
        deaths = router.respawner.deaths
        others = [asyncio.create_task(_one(service, f"o{i}", ids)) for i in range(4)]
        ray.kill(cluster.procs[victim].actor, no_restart=True)
        with pytest.raises(BlitzScaleError, match=f"{victim}"):
            await long
        await _until(lambda: router.respawner.deaths > deaths, "the death to be seen")
        results = await asyncio.gather(*others, return_exceptions=True)
        return victim, results

    victim, results = lt.run(scenario(), timeout=900)
    for r in results:  # each either got the right answer or a clear error naming the rank
        if isinstance(r, BaseException):
            assert isinstance(r, BlitzScaleError) and str(victim) in str(r), r
        else:
            assert r == ref
    assert victim not in cluster.pool.gpu_holders(service.cfg.model.name) or cluster.restarts[victim]
    assert lt.run(asyncio.wait_for(_one(service, "after", ids), 300)) == ref  # the rest serve
    # The rank comes back: a new actor in its bundle, on its node.
    lt.run(_until(lambda: cluster.restarts[victim] == 1 and victim in router.connected, "respawn", 300))
    assert victim in cluster.alive_ranks() and cluster.nodes()[victim] != "?"


def test_shutdown_leaves_no_actor_and_no_process(served: Served) -> None:
    import ray

    cluster = _cluster(served)
    actors = [p.actor for p in cluster.procs]
    pids = [p.pid for p in cluster.procs]
    served.stop()
    for a in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(a.where.remote(), timeout=60)
    deadline = time.monotonic() + 60
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _exists(p)]
        time.sleep(0.2)
    assert not alive, f"worker processes still running: {alive}"
    assert ray.is_initialized()  # the test's own Ray cluster: joined, so not shut down by serve


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
