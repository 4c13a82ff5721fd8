"""The cluster itself on Ray actors (no router): 4 CPU workers over two emulated nodes take
weights across the node boundary with the same bytes, a worker whose actor is killed is
found dead and respawned as a new actor on its node, and `stop` ends every actor and gives
every CPU back. The placement group that placed the ranks is given back as soon as they are
placed (ray_spawner.py: one kept would make Ray's GCS spin once a node is lost)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import Blocking, LocalCluster
from blitzscale.cluster.ray_spawner import RaySpawner
from tests.cluster.conftest import SRC, M


@pytest.fixture(scope="module")
def cluster(ray_cluster: Any) -> Iterator[Blocking]:
    cfg = ClusterConfig(num_workers=4, transfer_timeout_s=30, backend="ray", ray_address=ray_cluster.address)
    with LocalCluster(cfg).blocking as c:
        yield c


def test_a_chain_across_nodes_gives_every_rank_the_same_bytes(cluster: Blocking) -> None:
    assert isinstance(cluster.spawner, RaySpawner)  # chosen by [cluster] backend
    nodes = cluster.nodes()
    assert len(set(nodes)) == 2 and cluster.status().nodes == nodes
    cluster.load(M, 0, SRC)
    ref = cluster.checksum(M, 0)
    other = [r for r in range(4) if nodes[r] != nodes[0]]
    same = [r for r in range(1, 4) if nodes[r] == nodes[0]]
    report = cluster.transfer(M, SRC, [0], same + other)  # inside node A, then to node B
    assert sorted(report) == sorted(same + other) and all(v.bytes > 0 for v in report.values())
    assert all(cluster.checksum(M, r) == ref for r in range(4))
    cluster.release(M, other[0])
    cluster.transfer(M, SRC, [other[1]], [other[0]])  # inside node B
    assert cluster.checksum(M, other[0]) == ref


def test_a_killed_actor_is_found_dead_and_comes_back_on_its_node(cluster: Blocking) -> None:
    import ray

    nodes = cluster.nodes()
    victim = 3
    ray.kill(cluster.procs[victim].actor, no_restart=True)
    cluster.procs[victim].join(timeout=60)
    assert cluster.find_dead() == [victim]
    assert victim not in cluster.alive_ranks() and victim not in cluster.pool.gpu_holders(M)
    res = cluster.respawn(victim)
    assert res.incarnation == 1 and cluster.alive_ranks() == [0, 1, 2, 3]
    assert cluster.nodes()[victim] == nodes[victim]  # its node
    cluster.transfer(M, SRC, [0], [victim])  # over the rebuilt link, across nodes or not
    assert cluster.checksum(M, victim) == cluster.checksum(M, 0)


def test_stop_ends_every_actor_and_gives_every_cpu_back(cluster: Blocking) -> None:
    import ray
    from ray.util.placement_group import placement_group_table

    groups = placement_group_table()
    assert groups and all(g["state"] == "REMOVED" for g in groups.values()), groups  # since start
    actors = [p.actor for p in cluster.procs]
    cluster.stop()  # (the fixture's stop after it finds nothing left)
    for a in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(a.where.remote(), timeout=60)
    deadline = time.monotonic() + 60  # (Ray's view of free resources lags a little)
    while ray.available_resources().get("CPU") != 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 4  # every CPU back
