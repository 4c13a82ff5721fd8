"""A whole node lost while serving (`ray.cluster_utils.Cluster.remove_node`: its raylet and
every process on it go): its ranks are found dead, each request ends with the right tokens
(rerun on the other node if it had streamed nothing) or an error naming a lost rank, the
cluster view drops them, no placement group is left for Ray to reschedule (its GCS spins on
one it cannot place), the other node serves on, and shutdown leaves nothing behind, the
lost ranks' pending respawns included.

Four colocated instances, one per worker, and no scaling (`fixed`), so two instances are on
each node when the second one goes."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import BlitzScaleError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster
from tests.multinode.test_ray_serving import _exists, _one, _until
from tests.serve.conftest import running

PARAMS = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def service(ray_cluster: Any) -> Iterator[tuple[ServingCluster, LoopThread]]:
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 4, "backend": "ray", "ray_address": ray_cluster.address},
        router={"mode": "colocated"},
        policy={"name": "fixed", "fixed_prefill": 4},
    )
    with running(cfg) as pair:
        yield pair


def test_a_lost_node_is_detected_and_the_other_node_keeps_serving(
    service: tuple[ServingCluster, LoopThread], ray_cluster: Any
) -> None:
    import ray
    from ray.util.placement_group import placement_group_table

    svc, lt = service
    router, cluster = svc.router, svc.cluster
    assert router is not None and cluster is not None
    (lost,) = ray_cluster.worker_nodes
    nodes = cluster.nodes()
    lost_ranks = [r for r, n in enumerate(nodes) if n == lost.node_id[:8]]
    assert len(lost_ranks) == 2, (nodes, lost.node_id)
    kept = [r for r in range(4) if r not in lost_ranks]
    assert sorted(i.rank for i in router.instances.values() if i.accepts == "colocated") == [0, 1, 2, 3]
    lost_pids = [cluster.procs[r].pid for r in lost_ranks]
    actors = [p.actor for p in cluster.procs]
    ids = router.encode("Once upon a time, in a land far away, a dragon")
    ref = lt.run(_one(svc, "ref", ids, PARAMS))

    def lost_busy() -> bool:
        return any(router.instances[r].num_assigned for r in lost_ranks)

    async def scenario() -> list[Any]:
        tasks = [asyncio.create_task(_one(svc, f"n{i}", ids, PARAMS)) for i in range(12)]
        await _until(lost_busy, "requests on the second node", 120)
        await asyncio.to_thread(ray_cluster.remove_node, lost)
        await _until(lambda: set(lost_ranks) <= cluster.dead, "the lost node's ranks to be found dead")
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    results = lt.run(scenario(), timeout=900)
    failed = [r for r in results if isinstance(r, BaseException)]
    for r in failed:  # had streamed on a lost rank: the error names it
        assert isinstance(r, BlitzScaleError) and "died" in str(r), r
        assert any(str(x) in str(r) for x in lost_ranks), r
    assert all(r == ref for r in results if not isinstance(r, BaseException)), "wrong tokens"
    assert router.respawner.deaths >= 2
    # The cluster view drops them; the head node serves on.
    assert set(lost_ranks) <= cluster.dead and not set(lost_ranks) & set(cluster.alive_ranks())
    # No placement group of ours waits for the lost node's bundles: Ray's GCS would retry
    # placing them in a busy loop, a core taken from the node that serves on.
    groups = placement_group_table()
    assert all(g["state"] == "REMOVED" for g in groups.values()), groups
    assert not set(lost_ranks) & set(cluster.pool.gpu_holders(svc.cfg.model.name))
    for k in range(3):
        assert lt.run(asyncio.wait_for(_one(svc, f"after{k}", ids, PARAMS), 300)) == ref
    assert set(kept) <= set(cluster.alive_ranks())

    # Shutdown: every actor (the lost ranks' pending replacements too) and process ends.
    kept_pids = [cluster.procs[r].pid for r in kept]
    actors += [cluster.procs[r].actor for r in lost_ranks]
    lt.run(svc.stop())
    svc.cluster = svc.control = None  # (the fixture's stop then has nothing left)
    for a in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(a.where.remote(), timeout=60)
    deadline = time.monotonic() + 60
    alive = kept_pids + lost_pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _exists(p)]
        time.sleep(0.2)
    assert not alive, f"worker processes still running: {alive}"
    assert os.getpid() not in kept_pids + lost_pids
