"""Hot prefixes travel with the weights, on real CPU workers (SmolLM2): a new instance
scaled up over the network from one that serves the model receives its most reused cached
prefix blocks over their KV link, and its very first request computes only what follows
them, with the same tokens. Both scale-up paths: live (ZigZag, the blocks follow once the
weights are in) then ordinary (the blocks arrive before the instance takes requests);
each new instance then serves alone (the others drained), so its hits are the shipped
blocks' and nobody else's. The scaler is driven by hand (`fixed` policy: its loop never
scales)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from blitzscale.control.policies import DrainAction, LoadAction
from blitzscale.control.snapshot import InstanceState
from blitzscale.core.sampling import SamplingParams
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.server import ServingCluster
from tests.multinode.test_ray_serving import _one, _until
from tests.serve.conftest import running

PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SYSTEM = (
    "You are a careful assistant for a team of platform engineers. Answer briefly, name the "
    "command or setting that matters, and say when you are not sure."
)


@pytest.fixture(scope="module")
def service() -> Iterator[tuple[ServingCluster, LoopThread]]:
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 3},
        router={"mode": "colocated"},
        policy={"name": "fixed", "fixed_prefill": 1, "fixed_decode": 0},
    )
    with running(cfg) as pair:
        yield pair


def _hits(svc: ServingCluster, rank: int) -> int:
    assert svc.router is not None
    stats = svc.router.instances[rank].stats
    return stats.prefix_hits if stats is not None else 0


def _shipped(svc: ServingCluster) -> float:
    assert svc.metrics is not None
    return svc.metrics.hot_prefix_blocks.labels(model=svc.cfg.model.name)._value.get()


def test_a_new_instance_gets_the_sources_hot_prefixes_and_its_first_request_hits_them(
    service: tuple[ServingCluster, LoopThread],
) -> None:
    svc, lt = service
    router, scaler = svc.router, svc.scaler
    assert router is not None and scaler is not None
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is a KV cache?"}]
    ids = router.encode_chat(msgs)
    block = 16
    assert len(ids) >= 3 * block
    ref = lt.run(_one(svc, "first", ids, PARAMS))  # rank 0 computes it all
    assert lt.run(_one(svc, "again", ids, PARAMS)) == ref  # and then takes its blocks from the cache
    lt.run(_until(lambda: _hits(svc, 0) > 0, "rank 0's prefix hits in its stats", 60))

    def serving(rank: int) -> bool:
        inst = router.instances.get(rank)
        return inst is not None and inst.state is InstanceState.COLOCATED

    async def scale(action: LoadAction, drain: int) -> None:
        scaler._launch(action)
        await _until(
            lambda: serving(action.target_ranks[0]) and serving(drain), "the new instance to serve", 240
        )
        await _until(lambda: not scaler.busy, "the scale-up to end", 60)
        scaler._launch(DrainAction(drain))  # (fixed policy: it stays draining, taking nothing new)

    for source, target, live in ((0, 1, True), (1, 2, False)):  # the second ships what the first got
        before = _shipped(svc)
        lt.run(
            scale(
                LoadAction((target,), "network", (source,), live=live, partner=source if live else None),
                source,
            )
        )
        assert _shipped(svc) > before, f"no hot prefix blocks reached rank {target} (live={live})"
        assert _hits(svc, target) == 0
        assert lt.run(_one(svc, f"on{target}", ids, PARAMS)) == ref  # its first request
        lt.run(_until(lambda t=target: _hits(svc, t) > 0, f"rank {target}'s first request to hit", 60))
        assert _hits(svc, target) >= 3 * block  # (at least the system prompt's first full blocks)
