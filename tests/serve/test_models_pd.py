"""Two models in prefill/decode mode on four CPU workers: each request is prefilled and
decoded by instances of its own model (its KV migrates only to a decode instance of that
model), and a model that went to zero comes back as a prefill and a decode instance."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from blitzscale.control.snapshot import InstanceState
from blitzscale.core.sampling import SamplingParams
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ModelEntry, ServeConfig
from blitzscale.serve.requests import Stage
from blitzscale.serve.server import ServingCluster
from tests.serve.conftest import running

LONG = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
WAIT_S = 300


@pytest.fixture(scope="module")
def pd_models() -> Iterator[tuple[ServingCluster, LoopThread]]:
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 4},
        router={"mode": "pd"},
        planner={"scale_down_idle_s": 0.3, "shutting_null_keep_s": 0.3, "reload_cost_factor": 0.0},
        policy={"name": "blitz"},
        models=[ModelEntry("a", "smollm2-135m"), ModelEntry("b", "smollm2-135m", keep_alive_s=3.0)],
    )
    with running(cfg) as pair:
        yield pair


def test_each_model_decodes_on_its_own_instances_and_b_comes_back_from_zero(
    pd_models: tuple[ServingCluster, LoopThread],
) -> None:
    service, lt = pd_models
    router = service.router
    assert router is not None and service.scaler is not None
    ids = router.encode("Write a long letter to a friend about the mountains in winter.")

    async def run(model: str, rid: str) -> list[int]:
        out: list[int] = []
        async for o in router.generate(rid, ids, LONG, model=model):
            out += o.new_token_ids
        return out

    async def both() -> tuple[list[list[int]], list[tuple[str, str]], list[tuple[str, str]]]:
        """Both models at once; every (request's model, its instance's model) seen in
        prefill and in decode."""
        tasks = [asyncio.create_task(run("a", "a1")), asyncio.create_task(run("b", "b1"))]
        pre: list[tuple[str, str]] = []
        dec: list[tuple[str, str]] = []
        while not all(t.done() for t in tasks):
            for r in list(router.reqs.values()):
                if r.stage is Stage.DECODE and r.decode_rank is not None:
                    dec.append((r.model, router.instances[r.decode_rank].model))
                if r.stage is Stage.PREFILL and r.prefill_rank is not None:
                    pre.append((r.model, router.instances[r.prefill_rank].model))
            await asyncio.sleep(0.01)
        return [t.result() for t in tasks], pre, dec

    outs, pre, dec = lt.run(both())
    assert outs[0] == outs[1] and len(outs[0]) == 48  # the same weights under two names
    assert all(m == i for m, i in pre + dec), (pre, dec)
    assert {m for m, _ in dec} == {"a", "b"}, dec  # both migrated, each to its own model

    def b_at_zero() -> bool:
        inactive = InstanceState.INACTIVE
        return all(i.state is inactive for i in router.instances.values() if i.model == "b")

    deadline = time.monotonic() + WAIT_S
    while not b_at_zero():
        assert time.monotonic() < deadline, service.scaler.events
        time.sleep(0.1)
    seen_events = len(service.scaler.events)

    async def again() -> tuple[list[int], set[InstanceState]]:
        """b's request, and every state b's instances were in while it ran (an idle decode
        instance is drained 0.3 s after it, so they are read during the run, not after)."""
        task = asyncio.create_task(run("b", "b2"))
        roles: set[InstanceState] = set()
        while not task.done():
            roles |= {i.state for i in router.instances.values() if i.model == "b"}
            await asyncio.sleep(0.01)
        return task.result(), roles

    out, roles = lt.run(again())
    assert out == outs[1]  # back from zero: a prefill and a decode instance
    ups = [e for e in service.scaler.events[seen_events:] if e.model == "b" and e.direction == "up"]
    assert ups and all(e.path in ("host", "network") for e in ups), ups
    assert InstanceState.DECODE in roles or InstanceState.MUTATING_TO_DECODE in roles, roles
