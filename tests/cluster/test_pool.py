"""The parameter pool's invariants: one host copy per model, copies only after success."""

from __future__ import annotations

import pytest

from blitzscale.cluster.pool import CopiesView, ParameterPool, PoolError


def test_one_host_copy_per_model_in_the_whole_cluster() -> None:
    pool = ParameterPool()
    pool.add_host_copy("m", 0)
    with pytest.raises(PoolError, match="already has its one host copy"):
        pool.add_host_copy("m", 1)
    assert pool.host_holder("m") == 0
    pool.add_host_copy("other", 1)  # one per model, not one per cluster
    assert pool.drop_host_copy("m") == 0
    pool.add_host_copy("m", 2)
    assert pool.host_holder("m") == 2


def test_loads_enter_the_pool_only_when_committed() -> None:
    pool = ParameterPool()
    pool.begin_load("m", [1, 2])
    assert pool.gpu_holders("m") == [] and pool.models_on(1) == ["m"]
    with pytest.raises(PoolError, match="already hold or are loading"):
        pool.begin_load("m", [2])
    pool.commit_load("m", [1])
    pool.abort_load("m", [2])
    assert pool.gpu_holders("m") == [1] and pool.models_on(2) == []
    pool.release("m", 1)
    assert pool.gpu_holders("m") == []
    with pytest.raises(PoolError, match="does not hold"):
        pool.release("m", 1)


def test_a_dead_rank_holds_nothing() -> None:
    pool = ParameterPool()
    pool.begin_load("m", [0, 1])
    pool.commit_load("m", [0, 1])
    pool.add_host_copy("m", 1)
    pool.forget_rank(1)
    assert pool.snapshot() == {"m": CopiesView(gpu=(0,), loading=(), host=None)}
