"""A local Ray cluster of two emulated nodes (2 CPUs each, small object stores); its nodes
are separate raylets on this machine, so actors on them are separate processes placed by
Ray exactly as on two machines.

Every test here is in the `ray` xdist unit: one xdist worker runs them in turn, so two Ray
instances never start on this machine at once. The modules share one cluster (a Ray start
is seconds of CPU on a busy 2-core machine): started by the first module that asks for it,
given back its second node if a module before removed it (test_ray_node_loss), and shut
down once the last test here is done."""

from __future__ import annotations

from typing import Any

import pytest

NODES = 2
CPUS_PER_NODE = 2
OBJECT_STORE = 100 * 2**20
_shared: dict[str, Any] = {}


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    import ray
    from ray.cluster_utils import Cluster

    if "cluster" not in _shared:
        _shared["cluster"] = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": CPUS_PER_NODE,
                "object_store_memory": OBJECT_STORE,
                "include_dashboard": False,
                # Ray runs its workers at niceness 15, below everything else on the
                # machine: on a real node that is the raylet and little else, here it
                # is the other test worker's processes, and on a busy 2-core machine
                # our workers got 8% of a core each (a node-loss test took 6 minutes).
                "_system_config": {"worker_niceness": 0},
            },
        )
        ray.init(address=_shared["cluster"].address, include_dashboard=False)
    cluster = _shared["cluster"]
    while len(cluster.worker_nodes) < NODES - 1:
        cluster.add_node(num_cpus=CPUS_PER_NODE, object_store_memory=OBJECT_STORE)
    cluster.wait_for_nodes()
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == NODES and all(n["Resources"].get("CPU") == CPUS_PER_NODE for n in alive), alive
    return cluster


@pytest.fixture
def no_shared_ray() -> None:
    """For a test that starts a Ray instance of its own: none of ours runs beside it."""
    stop_shared_ray()


def stop_shared_ray() -> None:
    cluster = _shared.pop("cluster", None)
    if cluster is not None:
        import ray

        try:
            ray.shutdown()
        finally:
            cluster.shutdown()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    result = yield  # (the module's own fixtures, which may use the cluster, end first)
    if _shared and (nextitem is None or not nextitem.nodeid.startswith("tests/multinode/")):
        stop_shared_ray()
    return result
