"""Two live scale-ups from one source, in the serving cluster on CPU workers (SmolLM2): the
second is launched while the first's capped transfer is still under way, so it joins that
chain (cluster/flights.py) and its weights come from the first target, itself serving
while they arrive. Tokens do not change, both new instances end as ordinary ones, and
their weights equal the source's. The scaler is driven by hand; its planner may not scale."""

from __future__ import annotations

import asyncio

from blitzscale.control.policies import LoadAction
from blitzscale.control.snapshot import InstanceState
from blitzscale.core.sampling import SamplingParams
from blitzscale.serve.config import ServeConfig
from tests.multinode.test_ray_serving import _one, _until
from tests.serve.conftest import running

PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
RATE = 60e6  # bytes/s: SmolLM2 in fp32 (538 MB) arrives in about 9 s


def test_a_second_live_load_joins_the_first_and_both_serve() -> None:
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 3, "transfer_bytes_per_s": RATE},
        router={"mode": "colocated", "prefill_budget_tokens": 400},
        policy={"name": "blitz"},
        planner={"max_prefill": 1, "scale_down_idle_s": 600.0},  # it neither adds nor drains
    )
    with running(cfg) as (svc, lt):
        router, scaler, cluster = svc.router, svc.scaler, svc.cluster
        assert router is not None and scaler is not None and cluster is not None
        model = svc.cfg.model.name
        ids = router.encode("Describe the number 91 and why it matters to a careful reader. " * 6)
        ref = lt.run(_one(svc, "ref", ids, PARAMS))

        async def scenario() -> list[list[int]]:
            scaler._launch(LoadAction((1,), "network", (0,), multicast=True, live=True, partner=0))
            # (under way once the pool counts rank 1 as loading; it takes ~9 s from there)
            await _until(lambda: 1 in cluster.pool.ranks_of(model), "the first load to start", 120)
            assert cluster.pool.gpu_holders(model) == [0], "the first load ended before the second began"
            scaler._launch(LoadAction((2,), "network", (0,), multicast=True, live=True))
            outs = await asyncio.gather(*(_one(svc, f"b{i}", ids, PARAMS) for i in range(12)))
            await _until(lambda: not scaler.busy, "both loads to end", 240)
            return outs

        outs = lt.run(scenario(), timeout=300)
        assert all(o == ref for o in outs), "tokens changed while a joined load served"
        ups = {e.ranks: e for e in scaler.events if e.direction == "up" and e.path == "network"}
        assert ups[(1,)].sources == (0,) and ups[(2,)].sources == (1,), ups
        lt.run(_until(lambda: not router.live.pairs, "the live pairs to end", 60))
        for r in (1, 2):
            assert router.instances[r].state is InstanceState.COLOCATED
        sums = [lt.run(cluster.checksum(model, r)) for r in (0, 1, 2)]
        assert sums[1] == sums[0] and sums[2] == sums[0]
