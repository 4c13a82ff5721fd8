"""The serving cluster scales itself: a burst adds instances whose weights come from a
running instance over the network, an idle cluster scales back down, tokens never change."""

from __future__ import annotations

import asyncio
import time

from blitzscale.control.snapshot import InstanceState
from blitzscale.core.sampling import SamplingParams
from blitzscale.serve.background import LoopThread
from blitzscale.serve.server import ServingCluster

PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


async def _one(service: ServingCluster, rid: str, ids: list[int]) -> list[int]:
    out: list[int] = []
    assert service.router is not None
    async for o in service.router.generate(rid, ids, PARAMS):
        out += o.new_token_ids
    return out


def _serving(service: ServingCluster) -> int:
    assert service.router is not None
    return sum(1 for i in service.router.instances.values() if i.accepts is not None)


def test_burst_scales_up_over_the_network_and_idle_scales_down(
    pd_service: tuple[ServingCluster, LoopThread],
) -> None:
    service, lt = pd_service
    assert service.router is not None and service.scaler is not None
    ids = service.router.encode("Tell me a long story about a dragon who learns to program. " * 8)
    before = _serving(service)
    disk_loads = sum(1 for e in service.scaler.events if e.path == "disk")
    ref = lt.run(_one(service, "ref", ids))

    async def burst() -> tuple[list[list[int]], int]:
        tasks = [asyncio.create_task(_one(service, f"b{i}", ids)) for i in range(24)]
        peak = 0
        while not all(t.done() for t in tasks):
            peak = max(peak, _serving(service))
            await asyncio.sleep(0.05)
        return [t.result() for t in tasks], peak

    outs, peak = lt.run(burst())
    assert all(o == ref for o in outs), "tokens changed while the cluster scaled"
    ups = [e for e in service.scaler.events if e.direction == "up"]
    network = [e for e in ups if e.path == "network" and e.ranks != (1,)]
    assert peak > before, f"no scale-up: {before} -> {peak}"
    assert network and all(e.sources for e in network), ups
    assert sum(1 for e in ups if e.path == "disk") == disk_loads  # nothing new read from disk
    text = _metrics(service)
    assert 'blitzscale_transfer_bytes_total{model="smollm2-135m",path="network"}' in text

    # Idle: back down to one instance per role, while a trickle of requests keeps arriving.
    # An instance is released only once idle for reload_cost_factor times its load's own
    # duration, which on a busy machine is many seconds: the limit is generous.
    def released() -> bool:
        states = {i.state for i in service.router.instances.values()}
        return _serving(service) == before and InstanceState.INACTIVE in states

    deadline = time.monotonic() + 180
    n = 0
    while not released() and time.monotonic() < deadline:
        assert lt.run(_one(service, f"t{n}", ids[:20])), "a request failed during scale-down"
        n += 1
        time.sleep(0.2)
    assert _serving(service) == before
    assert released()
    assert any(e.direction == "down" for e in service.scaler.events)


def _metrics(service: ServingCluster) -> str:
    from prometheus_client import generate_latest

    return generate_latest(service.registry).decode()
