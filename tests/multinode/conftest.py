"""A local Ray cluster of two emulated nodes (2 CPUs each, small object stores), shared by
the module; its nodes are separate raylets on this machine, so actors on them are
separate processes placed by Ray exactly as on two machines.

Every test here is in the `ray` xdist group: one xdist worker runs them in turn, so two Ray
instances never start on this machine at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

NODES = 2
CPUS_PER_NODE = 2
OBJECT_STORE = 100 * 2**20


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": CPUS_PER_NODE,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
        },
    )
    for _ in range(NODES - 1):
        cluster.add_node(num_cpus=CPUS_PER_NODE, object_store_memory=OBJECT_STORE)
    try:
        ray.init(address=cluster.address, include_dashboard=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
