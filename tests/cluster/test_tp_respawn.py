"""A tensor-parallel instance whose shard dies comes back whole: the cluster stops the rest
of its group, respawns every member, and the group's process groups are built again among
the new incarnations, so the instance can be loaded and lead its shards once more."""

from __future__ import annotations

import time

from blitzscale.cluster.commands import Activation
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster
from blitzscale.core.config import EngineConfig
from blitzscale.messages import ActivateResult
from tests.cluster.conftest import SRC, M

ENGINE = EngineConfig(block_size=16, num_kv_blocks=16, max_model_len=256)


def _activate(c: LocalCluster) -> ActivateResult:
    return c.blocking.activate({0: Activation(model=M, source=SRC, role="colocated", engine=ENGINE)})[0]


def test_a_dead_shard_brings_its_group_back_whole_with_a_rebuilt_instance_group() -> None:
    with LocalCluster(ClusterConfig(num_workers=2, transfer_timeout_s=20), tp=2) as c:
        b = c.blocking
        for r in (0, 1):
            b.load(M, r, SRC)
        assert _activate(c).num_kv_blocks == 16  # the follower built its cache (all_ok)
        b.deactivate(0)

        c.kill(1)
        c.procs[1].join(timeout=30)
        deadline = time.monotonic() + 60
        assert c.find_dead() == [1]  # found dead: its mate 0 is stopped with it
        while c.procs[0].is_alive():
            assert time.monotonic() < deadline, "the rest of the group was not stopped"
            time.sleep(0.1)
        assert c.find_dead() == [0]
        assert sorted(c.dead) == [0, 1] and c.pool.gpu_holders(M) == []

        assert b.respawn(1).incarnation == 1
        b.respawn(0)  # the last member back: the group is rebuilt among incarnations 1 and 1
        assert c.alive_ranks() == [0, 1] and c.incarnations == [1, 1]
        for r in (0, 1):
            b.load(M, r, SRC)
        assert _activate(c).num_kv_blocks == 16  # leads its shard over the rebuilt group
        b.deactivate(0)
