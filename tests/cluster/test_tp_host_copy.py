"""The one host copy of a tensor-parallel model: each shard of the caching instance keeps its
own shard in its host's memory, the pool names the instance, and a scale from zero streams
shard k of the host copy to shard k of each new instance (its own ranks included)."""

from __future__ import annotations

import pytest

from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster
from blitzscale.cluster.pool import PoolError
from blitzscale.errors import BlitzScaleError
from tests.cluster.conftest import SRC, M


def test_a_tp2_host_copy_is_one_copy_of_shards_and_loads_shard_k_to_shard_k() -> None:
    with LocalCluster(ClusterConfig(num_workers=4, transfer_timeout_s=30), tp=2) as c:
        b = c.blocking
        b.load_instance(M, [0, 1], SRC)
        refs = [b.checksum(M, r) for r in (0, 1)]
        assert refs[0] != refs[1]  # two different shards
        with pytest.raises(BlitzScaleError, match="rank 1 leads no instance"):
            b.cache_on_host(M, 1)
        res = b.cache_on_host(M, 0)
        assert c.pool.host_holder(M) == 0
        assert res.bytes > 0
        with pytest.raises(PoolError, match="one host copy"):
            b.cache_on_host(M, 0)
        for r in (0, 1):  # scale to zero: only the host copy is left
            b.release(M, r)
        assert c.pool.gpu_holders(M) == [] and c.pool.host_holder(M) == 0
        assert [b.checksum(M, r, host_copy=True) for r in (0, 1)] == refs

        # Both instances come back from it at once: (0, 1) from its own host memory.
        b.transfer(M, SRC, [0, 1], [0, 1, 2, 3], from_host=True)
        assert [b.checksum(M, r) for r in (0, 1, 2, 3)] == refs * 2
        with pytest.raises(BlitzScaleError, match="not whole instances"):
            b.transfer(M, SRC, [0], [2, 3], from_host=True)

        b.release_host_copy(M)  # every shard lets its part go
        assert c.pool.host_holder(M) is None
        for r in (0, 1):
            with pytest.raises(BlitzScaleError, match="holds no host copy"):
                b.checksum(M, r, host_copy=True)
