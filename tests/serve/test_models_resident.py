"""Three models resident on one CPU worker at once (`[cluster] models_per_rank = 3`, the
issue "Many models on one GPU", item 3): SmolLM2 under three names, requests for all three
sent together over HTTP. Each model gets a slot of its own on the one worker, with its own
engine, loaded once; the worker's steps serve all three; nothing is released or swapped;
every answer is the tokens of one model alone (greedy)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from blitzscale.control.snapshot import InstanceState
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ModelEntry, ServeConfig
from blitzscale.serve.server import ServingCluster

from .conftest import running, start_http, stop_http
from .test_models_swap import _complete, _samples, one_model_alone

MODELS = ("a", "b", "c")
PER_MODEL = 3
KEEP_S = 3600.0  # keep-alive and keep timer: never reached while the test runs


@pytest.fixture(scope="module")
def resident() -> Iterator[tuple[ServingCluster, LoopThread]]:
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 1, "models_per_rank": len(MODELS)},
        model={"keep_alive_s": KEEP_S},
        router={"mode": "colocated"},
        planner={"shutting_null_keep_s": KEEP_S},
        policy={"name": "blitz"},
        models=[ModelEntry(m, "smollm2-135m") for m in MODELS],
    )
    with running(cfg) as pair:
        yield pair


@pytest.fixture(scope="module")
def alone(smollm2_weights: Any, smollm2_tokenizer: Any) -> tuple[list[int], str]:
    return one_model_alone(smollm2_weights, smollm2_tokenizer)


def test_three_models_resident_on_one_worker_serve_together_without_a_swap(
    resident: tuple[ServingCluster, LoopThread], alone: tuple[list[int], str]
) -> None:
    service, lt = resident
    assert service.scaler is not None and service.router is not None
    ids, want = alone
    url, server = start_http(service, lt)
    try:
        for _ in range(2):  # all at once, twice: the second round finds all three resident
            t0 = time.monotonic()
            jobs = [m for m in MODELS for _ in range(PER_MODEL)]
            with ThreadPoolExecutor(len(jobs)) as pool:
                answers = list(pool.map(lambda m: _complete(url, m, ids), jobs))
            took = time.monotonic() - t0
            events = [(e.model, e.direction, e.path, e.ranks) for e in service.scaler.events]
            bad = [(m, code, body) for m, (code, body) in zip(jobs, answers, strict=True) if code != 200]
            assert not bad, (bad[:3], len(bad), f"{took:.1f} s", events)
            for m, (_, body) in zip(jobs, answers, strict=True):
                assert isinstance(body, dict) and body["model"] == m
                assert body["choices"][0]["text"] == want, (m, body["choices"][0]["text"], want)
    finally:
        stop_http(server, lt)
    # one load per model, each into its own slot of worker 0 (ranks 0, 1, 2 = slots 0-2);
    # nothing released, so nothing swapped out
    ups = [e for e in service.scaler.events if e.direction == "up"]
    assert sorted(e.model for e in ups) == sorted(MODELS), events
    assert not [e for e in service.scaler.events if e.direction == "down"], events
    serving = {i.model: i.id for i in service.router.instances.values() if i.state is InstanceState.COLOCATED}
    assert set(serving) == set(MODELS) and sorted(serving.values()) == [0, 1, 2], serving
    held = _samples(service, "blitzscale_model_weight_bytes")
    assert all(held[(m, "gpu")] > 500e6 for m in MODELS), held  # all three on the device at once
    swaps = _samples(service, "blitzscale_model_swaps_total")
    assert all(swaps.get((m, "out"), 0) == 0 for m in MODELS), swaps


def test_models_per_rank_needs_tp_1() -> None:
    with pytest.raises(InvalidRequestError, match="models_per_rank=2 needs tp=1"):
        ServeConfig().with_overrides(
            cluster={"num_workers": 2, "models_per_rank": 2},
            model={"tp": 2},
        )
