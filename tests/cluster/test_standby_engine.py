"""A worker's standby engine built again for another engine configuration (serve does this
once a derived `models_per_rank` gives each engine a share of the device): the next
activation that asks for that engine takes the rebuilt standby, and so does a respawned
worker's."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from blitzscale.checkpoint.convert import convert
from blitzscale.cluster.commands import Activation
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster
from blitzscale.core.config import EngineConfig
from blitzscale.messages import ActivateResult
from blitzscale.worker.standby import StandbySpec
from tests.cluster.conftest import SRC, M

FIRST = EngineConfig(block_size=16, num_kv_blocks=16, max_model_len=256)
SHARED = replace(FIRST, num_kv_blocks=8)  # (as an equal share of the device shrinks a KV cache)


def _serve(c: LocalCluster, folder: str, engine: EngineConfig) -> ActivateResult:
    b = c.blocking
    b.load(M, 0, folder)  # (from disk: into the standby's buffer)
    res = b.activate({0: Activation(model=M, source=folder, role="colocated", engine=engine)})[0]
    b.deactivate(0)
    b.release(M, 0)
    return res


def test_a_standby_built_again_serves_the_next_activation_and_a_respawned_worker_builds_it_so(
    tmp_path: Path,
) -> None:
    folder = str(convert(SRC, tmp_path / "tiny"))
    with LocalCluster(ClusterConfig(num_workers=1, standby="on"), standby=StandbySpec(M, folder, FIRST)) as c:
        c.blocking.set_standby_engine(SHARED)
        assert c.standby is not None and c.standby.engine == SHARED
        res = _serve(c, folder, SHARED)
        assert res.standby and res.num_kv_blocks == 8

        c.kill(0)
        c.procs[0].join(timeout=30)
        deadline = time.monotonic() + 60
        while c.find_dead() != [0] and 0 not in c.dead:
            assert time.monotonic() < deadline, "the killed worker was not found dead"
            time.sleep(0.1)
        c.blocking.respawn(0)
        res = _serve(c, folder, SHARED)
        assert res.standby and res.num_kv_blocks == 8
