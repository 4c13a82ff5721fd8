"""The router's budgets are seconds of its model's measured work (control/costmodel.py),
with token counts as explicit overrides: the per-instance prefill budget, the requests one
instance takes, and which new request is refused because it could not start in time. The
router runs over the simulated cluster, in process; the cost models are made up."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.slotted import slotted
from blitzscale.control.costmodel import CostReport, Profile, ProfileError
from blitzscale.control.planner import FALLBACK_PREFILL_RATE
from blitzscale.engine.request import SamplingParams
from blitzscale.errors import OverloadedError
from blitzscale.serve.models import ServedModel
from blitzscale.serve.router import FALLBACK_BUDGET_TOKENS, FALLBACK_MAX_REQUESTS, Router, RouterConfig
from blitzscale.sim.cluster import SimCluster
from blitzscale.sim.links import Topology


def profile(tokens_per_s: float, name: str = "m", device: str = "NVIDIA H200") -> Profile:
    """A model that prefills `tokens_per_s` (1000-token steps) and decodes in 10 ms."""
    return Profile(
        name=name,
        device=device,
        weight_bytes=10_000,
        kv_bytes_per_token=10,
        device_memory_bytes=10_000_000,
        num_layers=4,
        prefill_tokens=(100, 1000),
        prefill_ms=(100_000 / tokens_per_s, 1_000_000 / tokens_per_s),
        decode_batch=(1, 64),
        decode_context=(128,),
        decode_ms=((10.0,), (12.0,)),
    )


def _router(
    cfg: RouterConfig,
    cost: Profile | None,
    workers: int = 2,
    max_num_seqs: int = 32,
    per_rank: int = 1,
    prefix_block_size: int = 0,
) -> Router:
    topo = Topology(
        nodes=1, gpus_per_node=workers, nvlink_bytes_per_s=1e11, nic_bytes_per_s=1e10,
        pcie_bytes_per_s=1e10, ssd_bytes_per_s=1e9,
    )  # fmt: skip
    cluster = SimCluster(topo, cost or profile(1000.0), ClusterConfig(num_workers=workers), slots=per_rank)
    router = Router(cfg, slotted(cluster, per_rank), cluster.data, None, "m", 1000, 8192)
    router.add_model(
        ServedModel(
            "m", None, 1000, 8192, cost=cost, max_num_seqs=max_num_seqs, prefix_block_size=prefix_block_size
        )
    )
    return router


def test_budgets_come_from_the_cost_model_unless_given_in_tokens() -> None:
    r = _router(RouterConfig(prefill_budget_s=0.5), profile(40_000.0))
    assert r.budget_tokens("m") == 20_000  # half a second of 40k tokens/s
    assert r.max_requests("m") == 32  # the engine's batch
    r = _router(
        RouterConfig(prefill_budget_s=0.5, prefill_budget_tokens=512, max_requests_per_instance=3), None
    )
    assert (r.budget_tokens("m"), r.max_requests("m")) == (512, 3)
    r = _router(RouterConfig(), None, max_num_seqs=0)  # nothing known: the documented fallbacks
    assert (r.budget_tokens("m"), r.max_requests("m")) == (FALLBACK_BUDGET_TOKENS, FALLBACK_MAX_REQUESTS)
    health = r.costs()["m"]
    assert health["cost_model"] is None and health["prefill_budget_tokens"] == FALLBACK_BUDGET_TOKENS


def test_a_request_that_could_not_start_in_time_is_refused_and_one_that_could_is_not() -> None:
    """1000 tokens/s and two ranks that could serve: 4000 prompt tokens start within 2 s,
    6000 do not (3 s > max_queue_wait_s = 2.5)."""

    async def main() -> tuple[float, float, str]:
        r = _router(RouterConfig(mode="colocated", max_queue_wait_s=2.5), profile(1000.0))
        ok = r.expected_start_s("m", 4000)
        late = r.expected_start_s("m", 6000)
        params = SamplingParams(max_tokens=1)
        with pytest.raises(OverloadedError) as refused:
            async for _ in r.generate("late", [1] * 6000, params):
                pass
        assert r.num_refused["queue_full"] == 1 and "late" not in r.reqs
        assert refused.value.retry_after_s == 2.0  # (0.5 s of backlog too many: the floor)

        async def accepted() -> None:  # 2 s of prompt work, queued (nothing serves here)
            async for _ in r.generate("ahead", [1] * 4000, params):
                pass

        ahead = asyncio.create_task(accepted())
        while "ahead" not in r.reqs:
            await asyncio.sleep(0)
        with pytest.raises(OverloadedError) as much_later:  # 5 s: it could start in time in 2.5
            async for _ in r.generate("later", [1] * 6000, params):
                pass
        assert much_later.value.retry_after_s == pytest.approx(2.5, rel=0.01)
        ahead.cancel()
        return ok, late, str(refused.value)

    ok, late, why = asyncio.run(main())
    assert ok == pytest.approx(2.0, rel=0.01) and late == pytest.approx(3.0, rel=0.01)
    assert "could start in about 3.0 s" in why and "max_queue_wait_s=2.5" in why


def test_free_slots_of_one_gpu_count_as_one_gpu_in_the_start_estimate() -> None:
    """Three models resident per GPU (six slot ranks on two GPUs): the free capacity for a
    model is still two GPUs, not six ranks."""
    r = _router(RouterConfig(mode="colocated"), profile(1000.0), per_rank=3)
    assert r.cluster.world_size == 6
    assert r.expected_start_s("m", 4000) == pytest.approx(2.0, rel=0.01)


def test_bad_budgets_are_refused_by_name() -> None:
    for kw, name in (
        ({"prefill_budget_s": 0.0}, "prefill_budget_s"),
        ({"prefill_budget_s": -1.0}, "prefill_budget_s"),
        ({"prefill_budget_tokens": -5}, "prefill_budget_tokens"),
        ({"max_requests_per_instance": -1}, "max_requests_per_instance"),
        ({"max_queue_wait_s": -1.0}, "max_queue_wait_s"),
    ):
        with pytest.raises(ValueError, match=name):
            RouterConfig(**kw)


def test_a_profile_of_another_model_or_device_is_refused_naming_both() -> None:
    p = profile(1000.0)
    report = CostReport("NVIDIA H200", p.weight_bytes, p.kv_bytes_per_token, p.num_layers)
    report.check(p, "here")  # the same model on the same kind of GPU: fine
    other = CostReport("NVIDIA H200", 2 * p.weight_bytes, p.kv_bytes_per_token, p.num_layers)
    with pytest.raises(ProfileError, match=r"another model .*\(10000, 10, 4\).*\(20000, 10, 4\)"):
        other.check(p, "here")
    cpu = dataclasses.replace(report, device_name="cpu (1 threads)")
    with pytest.raises(
        ProfileError, match=r"measured on 'NVIDIA H200'; the workers run on 'cpu \(1 threads\)'"
    ):
        cpu.check(p, "here")


def test_the_planner_takes_the_measured_rate_unless_given() -> None:
    from blitzscale.control.config import PlannerConfig
    from blitzscale.control.models import ModelView, bounds
    from blitzscale.control.snapshot import ClusterSnapshot

    snap = ClusterSnapshot(
        now=0.0, instances=(), queued_prompt_tokens=0, live_target_tokens=0, migrating_tokens=0,
        free_ranks=(), gpu_holders=(), host_holder=None, pd_mode=False,
    )  # fmt: skip
    view = ModelView(snapshot=snap, prefill_rate=45_000.0)
    assert bounds(PlannerConfig(), view, False).tokens_prefilled_per_sec == 45_000.0
    assert bounds(PlannerConfig(tokens_prefilled_per_sec=5.0), view, False).tokens_prefilled_per_sec == 5.0
    unknown = ModelView(snapshot=snap)
    assert bounds(PlannerConfig(), unknown, False).tokens_prefilled_per_sec == FALLBACK_PREFILL_RATE


def test_a_profile_scaled_to_another_size_takes_proportionally_longer() -> None:
    p = profile(1000.0)
    q = p.scaled("big", 2 * p.weight_bytes, 20, 8)
    assert q.prefill_s(1000) == pytest.approx(2 * p.prefill_s(1000))
    assert q.decode_s(1, 128) == pytest.approx(2 * p.decode_s(1, 128))
    assert (q.weight_bytes, q.kv_bytes_per_token, q.num_layers, q.name) == (20_000, 20, 8, "big")
    assert p.prefill_tokens_in(0.5) == 500
