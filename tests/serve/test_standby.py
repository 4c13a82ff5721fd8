"""Standby engines (worker/standby.py), switched on for CPU workers: the first load from
disk and a scale-up over the network serve with the engine its worker built at start, a
release hands the buffer and the drained engine back as the standby, and the next scale-up
uses it again; tokens never change. (On GPUs the same path skips the decode-graph capture;
`tests/gpu` runs it there.)"""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest

from blitzscale.control.snapshot import InstanceState
from blitzscale.serve.background import LoopThread
from blitzscale.serve.server import ServingCluster
from tests.serve.conftest import FAST_PLANNER, make_service
from tests.serve.test_scaling import _one

standby_service = pytest.fixture(scope="module")(
    make_service(
        cluster={"num_workers": 2, "standby": "on"},
        router={"mode": "colocated", "prefill_budget_tokens": 400},
        planner={**FAST_PLANNER, "tokens_prefilled_per_sec": 300.0, "max_prefill": 2},
    )
)


async def _many(service: ServingCluster, rids: list[str], ids: list[int]) -> list[list[int]]:
    return await asyncio.gather(*(_one(service, rid, ids) for rid in rids))


def _activations(service: ServingCluster, engine: str) -> float:
    text = generate_latest(service.registry).decode()
    key = f'blitzscale_activations_total{{engine="{engine}"}}'
    line = next(x for x in text.splitlines() if x.startswith(key))
    return float(line.split()[-1])


def _burst_until_scaled(
    service: ServingCluster, lt: LoopThread, ids: list[int], ref: list[int], tag: str
) -> None:
    assert service.router is not None and service.scaler is not None
    ups = sum(1 for e in service.scaler.events if e.direction == "up" and e.path == "network")
    deadline = time.monotonic() + 180
    n = 0
    while time.monotonic() < deadline:
        outs = lt.run(_many(service, [f"{tag}{n}-{i}" for i in range(12)], ids))
        assert all(o == ref for o in outs), "tokens changed while the cluster scaled"
        n += 1
        if sum(1 for e in service.scaler.events if e.direction == "up" and e.path == "network") > ups:
            return
    raise AssertionError("no scale-up over the network")


def _wait_released(service: ServingCluster, lt: LoopThread, ids: list[int]) -> dict:
    assert service.router is not None and service.scaler is not None
    downs = len([e for e in service.scaler.events if e.direction == "down"])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        events = [e for e in service.scaler.events if e.direction == "down"]
        if len(events) > downs:
            return events[-1]
        lt.run(_one(service, "trickle", ids[:8]))
        time.sleep(0.3)
    raise AssertionError("the scaled-up instance was never released")


def test_scale_up_uses_the_standby_and_a_release_rearms_it(
    standby_service: tuple[ServingCluster, LoopThread],
) -> None:
    service, lt = standby_service
    assert service.router is not None
    ids = service.router.encode("Write a long poem about the sea and the stars. " * 6)
    ref = lt.run(_one(service, "ref", ids))
    # the first instance came from disk, into that worker's standby buffer
    assert _activations(service, "built") == 0 and _activations(service, "standby") == 1

    _burst_until_scaled(service, lt, ids, ref, "a")
    assert _activations(service, "standby") == 2
    down = _wait_released(service, lt, ids)
    assert down.standby is True, down  # buffer and engine kept as the standby
    assert any(i.state is InstanceState.INACTIVE for i in service.router.instances.values())

    _burst_until_scaled(service, lt, ids, ref, "b")
    assert _activations(service, "standby") == 3  # the recycled engine served again
    assert _activations(service, "built") == 0
