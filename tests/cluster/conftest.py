"""A small CPU cluster with random tiny weights, for tests of the cluster itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import Blocking, LocalCluster

M = "tiny"
SRC = "random:tiny-llama3"


def tiny_cluster(num_workers: int) -> Callable[[], Iterator[Blocking]]:
    """A module-scoped fixture: `num_workers` CPU workers, driven by blocking calls."""

    @pytest.fixture(scope="module")
    def cluster() -> Iterator[Blocking]:
        with LocalCluster(ClusterConfig(num_workers=num_workers, transfer_timeout_s=20)).blocking as c:
            yield c

    return cluster
