"""A dead worker is replaced: the cluster respawns it as its next incarnation, rebuilds
every survivor's link to it (the links between survivors stay as they were), and the new
process takes and gives weights like any other rank."""

from __future__ import annotations

import pytest

from blitzscale.cluster.local import Blocking
from blitzscale.errors import BlitzScaleError
from tests.cluster.conftest import SRC, M, tiny_cluster

cluster = tiny_cluster(3)


def _kill(c: Blocking, rank: int) -> None:
    c.procs[rank].kill()
    c.procs[rank].join(timeout=30)
    assert c.find_dead() == [rank]


def test_a_respawned_worker_takes_and_gives_weights_over_rebuilt_links(cluster: Blocking) -> None:
    cluster.load(M, 0, SRC)
    ref = cluster.checksum(M, 0)
    cluster.transfer(M, SRC, [0], [1, 2])
    _kill(cluster, 1)
    assert cluster.pool.gpu_holders(M) == [0, 2]
    assert 1 not in cluster.alive_ranks()
    with pytest.raises(BlitzScaleError, match="dead"):
        cluster.checksum(M, 1)

    res = cluster.respawn(1)
    assert res.rank == 1 and res.incarnation == 1 and cluster.restarts[1] == 1
    assert cluster.alive_ranks() == [0, 1, 2] and cluster.hellos[1].incarnation == 1
    assert cluster.pool.gpu_holders(M) == [0, 2]  # the new process holds nothing
    cluster.transfer(M, SRC, [2], [1])  # the rebuilt link 2-1
    assert cluster.checksum(M, 1) == ref
    cluster.release(M, 0)
    cluster.transfer(M, SRC, [1], [0])  # and 1-0, from the new process
    assert cluster.checksum(M, 0) == ref
    cluster.release(M, 2)
    cluster.transfer(M, SRC, [0], [2])  # the survivors' own link, untouched
    assert cluster.checksum(M, 2) == ref

    _kill(cluster, 1)  # a second death: the next incarnation
    assert cluster.respawn(1).incarnation == 2
    cluster.transfer(M, SRC, [0, 2], [1])  # striped from both survivors
    assert cluster.checksum(M, 1) == ref


def test_only_a_dead_worker_is_respawned(cluster: Blocking) -> None:
    with pytest.raises(BlitzScaleError, match="not dead"):
        cluster.respawn(0)


def test_a_rank_dead_now_is_one_the_cluster_has_forgotten() -> None:
    """A worker that ends between `dead_now`'s look for new deaths and its answer is not
    named until the next call: named early, its respawn was refused ("not dead") and the
    try counted against its restarts (seen when a Ray node was lost)."""
    from blitzscale.cluster.config import ClusterConfig
    from blitzscale.cluster.local import LocalCluster

    class Dying:  # alive at the first look only
        looks = 0

        def is_alive(self) -> bool:
            self.looks += 1
            return self.looks == 1

    class Alive:
        def is_alive(self) -> bool:
            return True

    c = LocalCluster(ClusterConfig(num_workers=2), spawner=object())  # type: ignore[arg-type]
    c.procs = [Alive(), Dying()]  # type: ignore[list-item]
    assert c.dead_now() == set() and c.dead == set()
    assert c.dead_now() == {1} and c.dead == {1}
