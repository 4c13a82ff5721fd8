"""A live target whose weight source died (`Router.abandon_live`, for the targets
`ControlState.starved` names when the router finds ranks dead): its remaining layers will
never come, so the prompts waiting for them are taken back and run again now, not when its
transfer gives up. The router runs over the simulated cluster in process (whose workers do
not die: here its death report is set by hand), with a data plane that keeps what it is
told to send."""

from __future__ import annotations

from blitzscale.cluster.config import ClusterConfig
from blitzscale.control.snapshot import InstanceState
from blitzscale.core.sampling import SamplingParams
from blitzscale.messages import AbortMsg
from blitzscale.serve.requests import RouterRequest, Stage
from blitzscale.serve.router import Router, RouterConfig
from blitzscale.sim.cluster import SimCluster
from blitzscale.sim.links import Topology
from tests.serve.test_budgets import profile
from tests.serve.test_live_relays import _Recorded


def _router(weight_sources: tuple[int, ...] = (0,)) -> tuple[Router, _Recorded]:
    """Rank 0 serves; rank 1 is its live target, its first layers landed, its weights
    coming from `weight_sources`."""
    topo = Topology(
        nodes=1, gpus_per_node=3, nvlink_bytes_per_s=1e11, nic_bytes_per_s=1e10,
        pcie_bytes_per_s=1e10, ssd_bytes_per_s=1e9,
    )  # fmt: skip
    cluster = SimCluster(topo, profile(1000.0), ClusterConfig(num_workers=3, max_restarts=0))
    data = _Recorded()
    router = Router(RouterConfig(mode="colocated"), cluster, data, None, "m", 1000, 8192)  # type: ignore[arg-type]
    router.state.move(0, InstanceState.LOADING)
    router.state.move(0, InstanceState.COLOCATED)
    router.state.move(1, InstanceState.NEW_PREFILL)
    router.live.begin((1,), 0, weight_sources)
    router.state.set_live_ready(1)
    router.connected |= {0, 1}
    return router, data


def _on(router: Router, rid: str, rank: int, prefilled: bool = False) -> RouterRequest:
    """A request dispatched to `rank`, as the router's dispatch does it."""
    r = RouterRequest(id=rid, prompt=[1, 2, 3], params=SamplingParams(), model="m")
    router.reqs[r.id] = r
    r.move(Stage.PREFILL)
    r.prefill_rank = rank
    router.state.assign(rank, len(r.prompt))
    if prefilled:
        r.prefilled = True
        router.state.take_tokens(rank, len(r.prompt))
    return r


def test_a_target_whose_weight_source_died_gives_its_waiting_prompts_back_at_once() -> None:
    router, data = _router()
    waiting = [_on(router, f"w{i}", 1) for i in range(2)]
    answered = _on(router, "a", 1, prefilled=True)  # its output came: not waiting for layers
    elsewhere = _on(router, "s", 0)
    assert router.abandon_live(1, "its weight source (rank [0]) died") == 2
    assert data.sent == [(1, AbortMsg(request_id="w0")), (1, AbortMsg(request_id="w1"))]
    for r in waiting:  # queued again at the front, under a new wire id, no death counted
        assert r.stage is Stage.QUEUED and r.prefill_rank is None
        assert r.wire_id == f"{r.id}#1" and not r.died_on
        assert r in list(router.queue)
    assert elsewhere.stage is Stage.PREFILL and elsewhere.prefill_rank == 0
    assert answered.stage is Stage.PREFILL and answered.wire_id == "a"
    target = router.instances[1]
    assert target.state is InstanceState.INACTIVE
    assert 1 not in router.live.pairs and router.live.abandoned_total == 1
    # the transfer's own failure, when it comes, finds nothing more to do
    assert router.abandon_live(1, "again") == 0 and router.live.abandoned_total == 1


def test_a_target_that_holds_every_layer_is_left_alone() -> None:
    router, data = _router()
    router.state.move(1, InstanceState.REFRACTORY_PREFILL, "(fully loaded)")
    r = _on(router, "w", 1)
    assert router.abandon_live(1, "its weight source (rank [0]) died") == 0
    assert not data.sent and r.stage is Stage.PREFILL
    assert router.instances[1].state is InstanceState.REFRACTORY_PREFILL


def _dies(router: Router, rank: int) -> None:
    router.cluster.dead_now = lambda: {rank}  # type: ignore[method-assign]
    router._fail_dead_instances()


def test_the_death_of_the_weight_source_gives_the_target_up_and_reruns_every_prompt() -> None:
    router, _ = _router()
    on_source, on_target = _on(router, "s", 0), _on(router, "t", 1)
    _dies(router, 0)
    assert on_source.died_on == {0} and on_target.died_on == set()  # both run again
    assert on_source.stage is on_target.stage is Stage.QUEUED
    assert router.instances[1].state is InstanceState.INACTIVE
    assert router.live.abandoned_total == 1 and not router.live.pairs


def test_the_death_of_a_relay_partner_that_sends_no_weights_leaves_the_target_serving() -> None:
    """pd: the partner is the prefill instance, the weights come from the decode one."""
    router, _ = _router(weight_sources=(2,))
    on_target = _on(router, "t", 1)
    _dies(router, 0)
    assert on_target.stage is Stage.PREFILL and on_target.prefill_rank == 1
    assert router.instances[1].state is InstanceState.NEW_PREFILL
    assert router.live.abandoned_total == 0 and router.live.pairs == {1: None}  # on its own


def test_health_warns_of_a_worker_out_of_the_pool_for_good_and_stays_ok() -> None:
    """A worker that died more often than it may be restarted (here: once, with
    max_restarts 0) stays out of the pool: /health still says "ok" while others serve, and
    warns of it by rank."""
    import asyncio

    router, _ = _router()
    assert router.health()["warnings"] == []

    async def dies() -> None:
        router.respawner.died(2)

    asyncio.run(dies())
    health = router.health()
    assert health["status"] == "ok" and health["problems"] == []
    assert health["warnings"] == ["worker 2 is out of the pool for good: it died after 0 restarts"]
