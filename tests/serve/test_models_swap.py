"""Three models on one CPU worker (SmolLM2 under three names), requests for all three sent
at once over HTTP (the issue "Many models on one GPU"): the one rank is swapped from model
to model, each model's requests are served in turn (none is refused with 429 or fails),
and each gives the tokens of one model alone (greedy). The warm instance given up for
another model's waiting request is released at once, not after `shutting_null_keep_s`
nor after the model's keep-alive (both set far beyond the test's length here). The worker
has a standby engine (as GPU workers do by default): the three models have one shape, so
every load, from disk or from the host copy, lands in its buffer and every activation
takes the engine already built (worker/standby.py), never building one."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from blitzscale.core.sampling import SamplingParams
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ModelEntry, ServeConfig
from blitzscale.serve.server import ServingCluster

from .conftest import running, start_http, stop_http

MODELS = ("a", "b", "c")
PER_MODEL = 6
MAX_TOKENS = 12
PROMPT = "The lighthouse keeper counted the ships that passed"
WAIT_S = 600  # a loaded machine loads and serves slowly: generous limits
QUEUE_WAIT_S = 180.0  # a request still queued after this gets 429 (the 60 s, tripled)
KEEP_S = 3600.0  # keep-alive and keep timer: never reached while the test runs


@pytest.fixture(scope="module")
def three_on_one() -> Iterator[tuple[ServingCluster, LoopThread]]:
    cfg = ServeConfig().with_overrides(
        cluster={"num_workers": 1, "standby": "on"},
        model={"keep_alive_s": KEEP_S},
        router={"mode": "colocated", "max_queue_wait_s": QUEUE_WAIT_S},
        planner={"shutting_null_keep_s": KEEP_S},
        policy={"name": "blitz"},
        models=[ModelEntry(m, "smollm2-135m") for m in MODELS],
    )
    with running(cfg) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(smollm2_weights: Any, smollm2_tokenizer: Any) -> tuple[list[int], str]:
    return one_model_alone(smollm2_weights, smollm2_tokenizer)


def one_model_alone(weights: Any, tokenizer: Any) -> tuple[list[int], str]:
    """(prompt ids, completion text) of a local engine: what one model alone gives."""
    from blitzscale.engine import EngineConfig, LLMEngine

    engine = LLMEngine(weights, tokenizer, EngineConfig())
    ids = list(engine.tokenizer(PROMPT).input_ids)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    return ids, engine.generate([ids], params)[0].text


def _complete(url: str, model: str, ids: list[int]) -> tuple[int, dict | str]:
    body = {"model": model, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_concurrent_requests_for_three_models_on_one_worker_are_all_served(
    three_on_one: tuple[ServingCluster, LoopThread], reference: tuple[list[int], str]
) -> None:
    service, lt = three_on_one
    assert service.scaler is not None
    ids, want = reference
    url, server = start_http(service, lt)
    try:
        t0 = time.monotonic()
        jobs = [m for m in MODELS for _ in range(PER_MODEL)]
        with ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(lambda m: _complete(url, m, ids), jobs))
        took = time.monotonic() - t0
    finally:
        stop_http(server, lt)
    events = [(e.model, e.direction, e.path, round(e.time, 1)) for e in service.scaler.events]
    refused = [(m, code, body) for m, (code, body) in zip(jobs, answers, strict=True) if code != 200]
    assert not refused, (refused[:3], len(refused), f"{took:.1f} s", events)
    for m, (_, body) in zip(jobs, answers, strict=True):
        assert isinstance(body, dict) and body["model"] == m
        assert body["usage"]["completion_tokens"] == MAX_TOKENS
        assert body["choices"][0]["text"] == want, (m, body["choices"][0]["text"], want)
    # the one rank went from model to model: every model was loaded onto it, and given
    # back for the next long before its keep timer or keep-alive (else those waited 429s)
    ups = [e for e in service.scaler.events if e.direction == "up"]
    down = [e.model for e in service.scaler.events if e.direction == "down"]
    assert {e.model for e in ups} == set(MODELS) and len(down) >= len(MODELS) - 1, events
    # one shape: every load went into the standby's buffer, every release gave it back
    assert _activations(service, "standby") == len(ups) and _activations(service, "built") == 0, events
    assert all(e.standby for e in service.scaler.events if e.direction == "down"), events
    # per-model metrics: swaps in (the first GPU copy, from disk or the host copy) and out
    # (the last released), with their seconds; weight bytes where they are now
    swaps = _samples(service, "blitzscale_model_swaps_total")
    seconds = _samples(service, "blitzscale_model_swap_seconds_count")
    for m in MODELS:
        assert swaps[(m, "in")] >= 1 and seconds[(m, "in")] == swaps[(m, "in")], (m, swaps)
    assert sum(swaps[(m, "out")] for m in MODELS) == len(down), (swaps, events)
    held = _samples(service, "blitzscale_model_weight_bytes")
    on_gpu = [m for m in MODELS if held[(m, "gpu")] > 0]
    assert len(on_gpu) == 1 and held[(on_gpu[0], "gpu")] > 500e6, held  # (one rank: one model)


def _samples(service: ServingCluster, name: str) -> dict[tuple[str, str], float]:
    """(model, the other label's value) -> value, of metric sample `name`."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(generate_latest(service.registry).decode()):
        for sample in family.samples:
            if sample.name == name:
                other = sample.labels.get("direction", sample.labels.get("where", ""))
                out[(sample.labels["model"], other)] = sample.value
    return out


def _activations(service: ServingCluster, engine: str) -> float:
    from prometheus_client import generate_latest

    key = f'blitzscale_activations_total{{engine="{engine}"}}'
    lines = [x for x in generate_latest(service.registry).decode().splitlines() if x.startswith(key)]
    return float(lines[0].split()[-1]) if lines else 0.0
