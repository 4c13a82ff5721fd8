"""The spawner `[cluster] backend` names: local processes, or Ray actors (Ray is imported
only for "ray")."""

from __future__ import annotations

from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.spawn import ProcessSpawner, Spawner


def make_spawner(cfg: ClusterConfig) -> Spawner:
    """The spawner of `[cluster] backend` (Ray is imported only for "ray")."""
    if cfg.backend == "ray":
        from blitzscale.cluster.ray_spawner import RaySpawner

        return RaySpawner(cfg.ray_address, cfg.startup_timeout_s)
    return ProcessSpawner(cfg.ranks_per_host)
