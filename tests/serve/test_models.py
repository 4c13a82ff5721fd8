"""Two models on one pool of three CPU workers (SmolLM2 under two names, so two models
with their own copies): both serve the tokens of a local engine; the idle one scales to
zero, keeping the cluster's one host copy of it, and comes back from that copy (no disk
read) by reclaiming an idle rank of the other, which holds every rank by then."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from blitzscale.control.snapshot import InstanceState
from blitzscale.core.sampling import SamplingParams
from blitzscale.errors import BlitzScaleError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ModelEntry, ServeConfig
from blitzscale.serve.server import ServingCluster

from .conftest import running, start_http, stop_http

PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPT = "The lighthouse keeper counted the ships that passed"
WAIT_S = 300  # a loaded machine loads, streams and releases slowly: generous limits


@pytest.fixture(scope="module")
def two_models() -> Iterator[tuple[ServingCluster, LoopThread]]:
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 3},
        router={"mode": "colocated"},
        planner={"scale_down_idle_s": 0.3, "shutting_null_keep_s": 0.3, "reload_cost_factor": 0.0},
        policy={"name": "blitz"},
        # a keeps every rank it can get; b goes to zero 3 s after its last request
        models=[
            ModelEntry("a", "smollm2-135m", min_instances=3),
            ModelEntry("b", "smollm2-135m", keep_alive_s=3.0),
        ],
    )
    with running(cfg) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(smollm2_weights: Any, smollm2_tokenizer: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, tokens) of a local engine: what a one-model server gives."""
    from blitzscale.engine import EngineConfig, LLMEngine

    engine = LLMEngine(smollm2_weights, smollm2_tokenizer, EngineConfig())
    ids = list(engine.tokenizer(PROMPT).input_ids)
    return ids, engine.generate([ids], PARAMS)[0].token_ids


async def _one(service: ServingCluster, rid: str, ids: list[int], model: str) -> list[int]:
    assert service.router is not None
    out: list[int] = []
    async for o in service.router.generate(rid, ids, PARAMS, model=model):
        out += o.new_token_ids
    return out


def _serving(service: ServingCluster, model: str) -> list[int]:
    assert service.router is not None
    return sorted(i.id for i in service.router.instances.values() if i.model == model and i.accepts)


def _holding(service: ServingCluster, model: str) -> list[int]:
    assert service.router is not None
    inactive = InstanceState.INACTIVE
    return sorted(
        i.id for i in service.router.instances.values() if i.model == model and i.state is not inactive
    )


def _wait(what: str, ok: Any, service: ServingCluster) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ok():
        assert service.scaler is not None
        assert time.monotonic() < deadline, f"{what}: {service.scaler.events}"
        time.sleep(0.1)


def _host_copies_on_workers(service: ServingCluster, lt: LoopThread, model: str) -> list[int]:
    """Ranks whose worker answers for a host copy of `model` (asked of every worker)."""
    cluster = service.cluster
    assert cluster is not None

    async def probe(rank: int) -> bool:
        try:
            await cluster.checksum(model, rank, host_copy=True)
            return True
        except BlitzScaleError:
            return False

    async def all_ranks() -> list[bool]:
        return list(await asyncio.gather(*(probe(r) for r in cluster.alive_ranks())))

    return [r for r, has in zip(cluster.alive_ranks(), lt.run(all_ranks()), strict=True) if has]


def test_two_models_serve_scale_to_zero_and_come_back_by_reclaiming_a_rank(
    reference: tuple[list[int], list[int]], two_models: tuple[ServingCluster, LoopThread]
) -> None:
    service, lt = two_models
    assert service.router is not None and service.scaler is not None
    ids, want = reference

    async def both() -> list[list[int]]:
        return list(await asyncio.gather(_one(service, "a0", ids, "a"), _one(service, "b0", ids, "b")))

    assert lt.run(both()) == [want, want]

    # b has no request for its keep-alive: to zero; a takes the rank b gave back
    _wait(
        "b to zero, a on every rank",
        lambda: not _holding(service, "b") and len(_serving(service, "a")) == 3,
        service,
    )
    pool = service.cluster.pool  # type: ignore[union-attr]
    assert pool.gpu_holders("b") == []
    assert service.router.health()["status"] == "ok"  # at zero is not broken
    assert len(_host_copies_on_workers(service, lt, "b")) == 1  # the cluster's one host copy of b
    assert len(_host_copies_on_workers(service, lt, "a")) <= 1
    events = service.scaler.events
    disk_b = sum(1 for e in events if e.model == "b" and e.path == "disk")
    seen = len(events)

    # b's next request waits in the queue while a idle rank of a is reclaimed for it
    assert lt.run(_one(service, "b1", ids, "b")) == want
    later = service.scaler.events[seen:]
    released_a = [e for e in later if e.model == "a" and e.direction == "down"]
    up_b = [e for e in later if e.model == "b" and e.direction == "up"]
    assert released_a, later
    assert up_b and up_b[0].path == "host", later  # from its host copy, not the disk
    assert up_b[0].ranks == released_a[0].ranks
    assert sum(1 for e in service.scaler.events if e.model == "b" and e.path == "disk") == disk_b
    assert len(_serving(service, "a")) == 2  # a keeps what it had: b never took its last
    assert len(_host_copies_on_workers(service, lt, "b")) == 1
    revived = [
        t
        for i in service.router.instances.values()
        for t in i.transitions
        if t[1:] == ("shutting_null", "colocated")
    ]
    assert len(revived) <= 1, revived  # no tug of war over the reclaimed rank


def test_models_list_route_by_model_and_metrics_by_model(
    two_models: tuple[ServingCluster, LoopThread], reference: tuple[list[int], list[int]]
) -> None:
    service, lt = two_models
    url, server = start_http(service, lt)
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=60) as r:
            assert [m["id"] for m in json.load(r)["data"]] == ["a", "b"]
        body = {"model": "nope", "prompt": PROMPT, "max_tokens": 2}
        req = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        assert e.value.code == 404 and "nope" in e.value.read().decode()
        body = {"model": "b", "prompt": reference[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        req = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            out = json.load(r)
        assert out["model"] == "b" and out["usage"]["completion_tokens"] == 12
        with urllib.request.urlopen(f"{url}/metrics", timeout=60) as r:
            text = r.read().decode()
        assert 'blitzscale_host_copies{model="b"} 1.0' in text
        assert 'blitzscale_queue_requests{model="a"}' in text
        assert 'blitzscale_instances{model="a",role="colocated",state="colocated"}' in text
        assert 'blitzscale_transfer_bytes_total{model="b",path="host"}' in text
    finally:
        stop_http(server, lt)
