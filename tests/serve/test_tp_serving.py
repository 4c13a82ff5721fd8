"""Tensor-parallel instances in the serving cluster (CPU, gloo): `--workers 4 --tp 2`.

Colocated: the first TP2 instance (ranks 0, 1) loads from disk and serves the openai client;
a burst scales up a second one (ranks 2, 3) by chain multicast from it, shard k to shard k
(allcache: from the host copy every shard of the first keeps).
PD: KV migrates from the prefill TP2 instance to the decode one, each shard's heads to the
same shard. Tokens equal a TP=1 engine's on the same weights throughout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from prometheus_client import generate_latest

from blitzscale.checkpoint import load_config, resolve_model
from blitzscale.control.costmodel import Profile
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.errors import InvalidRequestError
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.weights import layout_of
from blitzscale.serve.background import LoopThread
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.events import ScaleEvent
from blitzscale.serve.server import ServingCluster
from tests.conftest import save_tiny_hf_folder
from tests.serve.conftest import FAST_PLANNER, running, start_http, stop_http
from tests.serve.test_cli_serve import CLI, _family, _none_left, _start_serve

PARAMS = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
TEXTS = ["w5 w9 w17 w33 w2", "w100 w200 w300", "w7 " * 30]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_hf_folder(tmp_path_factory.mktemp("tp") / "tiny", "tiny-llama3", seed=3)


@pytest.fixture(scope="module")
def reference(folder: Path) -> dict[str, list[int]]:
    """A TP=1 engine on the same folder: tokens per prompt text."""
    engine = LLMEngine.from_model(str(folder), config=EngineConfig(block_size=16, num_kv_blocks=64))
    tok = engine.tokenizer
    return {t: engine.generate([tok.encode(t)], PARAMS)[0].token_ids for t in TEXTS}


@contextlib.contextmanager
def _service(
    folder: Path,
    tmp: Path,
    mode: str,
    policy: str = "blitz",
    cluster: dict[str, Any] | None = None,
    **planner: Any,
) -> Iterator[tuple[ServingCluster, LoopThread]]:
    cfg = ServeConfig().with_overrides(
        model={"name": str(folder), "tp": 2, "cache_dir": str(tmp)},
        cluster={"num_workers": 4, "transfer_timeout_s": 60, **(cluster or {})},
        # a small prompt budget per instance keeps a burst's backlog in the router's queue,
        # where the planner sees it, however fast the machine prefills the tiny model
        router={"mode": mode, "prefill_budget_tokens": 16},
        planner={**FAST_PLANNER, **planner},
        policy={"name": policy},
    )
    with running(cfg) as pair:
        yield pair


async def _one(service: ServingCluster, rid: str, text: str) -> list[int]:
    assert service.router is not None
    out: list[int] = []
    async for o in service.router.generate(rid, service.router.encode(text), PARAMS):
        out += o.new_token_ids
    return out


def _serving(service: ServingCluster) -> list[tuple[int, ...]]:
    assert service.router is not None
    return sorted(i.ranks for i in service.router.instances.values() if i.accepts is not None)


def _second_instance_up(service: ServingCluster) -> ScaleEvent:
    """The first scale-up event of instance (2, 3), once its load has ended and it serves
    beside (0, 1) (both may come after the burst on a loaded machine). Serving alone does
    not say the load ended: a live target (blitz) serves from the moment its load begins,
    and its event is recorded when the last shard has landed."""
    assert service.scaler is not None
    deadline = time.monotonic() + 180

    def ups() -> list[ScaleEvent]:
        return [e for e in service.scaler.events if e.direction == "up" and e.ranks == (2, 3)]

    while not ups() or _serving(service) != [(0, 1), (2, 3)]:
        assert time.monotonic() < deadline, service.scaler.events
        time.sleep(0.1)
    return ups()[0]


def test_colocated_tp2_serves_openai_and_scales_up_by_multicast(
    folder: Path, reference: dict[str, list[int]], tmp_path: Path
) -> None:
    import openai

    # A slow prefill rate in the planner: the tiny model is fast, the burst must still look big.
    # (and no scale-down while the test looks at the new instance)
    slow = {"tokens_prefilled_per_sec": 5.0, "interval_s": 0.1, "scale_down_idle_s": 600.0}
    with _service(folder, tmp_path, "colocated", **slow) as (service, lt):
        assert service.scaler is not None and service.router is not None
        assert _serving(service) == [(0, 1)]
        url, server = start_http(service, lt)
        try:
            with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120) as client:
                c = client.completions.create(
                    model=str(folder), prompt=TEXTS[0], max_tokens=10, temperature=0
                )
        finally:
            stop_http(server, lt)
        tok = service.router.tokenizer
        assert c.choices[0].text == tok.decode(reference[TEXTS[0]])

        router = service.router
        ran_on: set[int] = set()

        async def burst(n: int) -> list[list[int]]:
            tasks = [asyncio.create_task(_one(service, f"b{n}.{i}", TEXTS[i % 3])) for i in range(n)]
            while not all(t.done() for t in tasks):  # where each request runs
                ran_on.update(r.prefill_rank for r in router.reqs.values() if r.prefill_rank is not None)
                await asyncio.sleep(0.01)
            return [t.result() for t in tasks]

        assert lt.run(burst(24)) == [reference[TEXTS[i % 3]] for i in range(24)], "tokens changed"
        up = _second_instance_up(service)
        assert up.path == "network" and up.sources == (0, 1), service.scaler.events
        assert lt.run(burst(8)) == [reference[TEXTS[i % 3]] for i in range(8)]
        assert 2 in ran_on  # the multicast instance served too
        text = generate_latest(service.registry).decode()
        assert f'blitzscale_transfer_bytes_total{{model="{folder}",path="network"}}' in text


def _check_measured_per_shard(service: ServingCluster, folder: Path, tmp: Path) -> None:
    """The cost model was measured at start on a scratch TP2 instance across ranks 0 and 1
    (the leader's steps could only complete with shard 1 meeting each all-reduce): one
    shard's sizes, as the simulator's TP profiles have them, and kept for a restart."""
    assert service.router is not None
    cost = service.router.served(str(folder)).cost
    assert cost is not None and cost.device.startswith("cpu"), cost
    config = load_config(resolve_model(str(folder)))
    shard = layout_of(config, torch.float32, 2).nbytes
    assert cost.weight_bytes == shard < layout_of(config, torch.float32).nbytes
    assert cost.kv_bytes_per_token == KVCache.bytes_per_block(config, 1, torch.float32, 2)
    assert len(cost.decode_batch) >= 2 and all(ms > 0 for row in cost.decode_ms for ms in row)
    kept = [Profile.from_json(json.loads(p.read_text()), str(p)) for p in (tmp / "profiles").glob("*.json")]
    assert [p.weight_bytes for p in kept] == [shard]


def test_pd_tp2_migrates_kv_between_tp2_instances(
    folder: Path, reference: dict[str, list[int]], tmp_path: Path
) -> None:
    with _service(folder, tmp_path, "pd", max_prefill=1, max_decode=1) as (service, lt):
        assert service.router is not None
        _check_measured_per_shard(service, folder, tmp_path)
        insts = service.router.instances
        assert insts[0].accepts == "prefill" and insts[2].accepts == "decode", _serving(service)

        router = service.router
        decoded_on: set[int] = set()

        async def all_of() -> list[list[int]]:
            tasks = [asyncio.create_task(_one(service, f"p{i}", TEXTS[i % 3])) for i in range(6)]
            while not all(t.done() for t in tasks):  # where each request decodes
                decoded_on.update(r.decode_rank for r in router.reqs.values() if r.decode_rank is not None)
                await asyncio.sleep(0.01)
            return [t.result() for t in tasks]

        assert lt.run(all_of()) == [reference[TEXTS[i % 3]] for i in range(6)]
        assert decoded_on == {2}  # every request's KV went from instance 0 to instance 2


def test_live_tp2_target_serves_as_its_shards_land_and_relays_to_its_partner(
    folder: Path, reference: dict[str, list[int]], tmp_path: Path
) -> None:
    """Weights capped at 250 kB/s (a shard of the tiny model: ~1.7 MB, ~7 s): the new TP2
    instance (2, 3) serves while both shards arrive, running a layer once both have it;
    instance (0, 1), its partner, finishes tasks it started (hidden states sent once, each
    shard's KV to the same shard)."""
    slow = {"tokens_prefilled_per_sec": 5.0, "interval_s": 0.1, "scale_down_idle_s": 600.0}
    cfg = {"transfer_bytes_per_s": 250e3}
    with _service(folder, tmp_path, "colocated", "blitz", cluster=cfg, **slow) as (service, lt):
        assert service.scaler is not None and service.router is not None
        router = service.router

        async def burst(n: int) -> list[list[int]]:
            return await asyncio.gather(*(_one(service, f"l{n}.{i}", TEXTS[i % 3]) for i in range(n)))

        async def waves() -> list[list[int]]:  # prompts keep coming while (2, 3) loads
            out = []
            for _ in range(12):
                out += await burst(6)
                if any(e.path == "network" for e in service.scaler.events if e.direction == "up"):
                    break
            return out

        outs = lt.run(waves(), timeout=300)
        assert outs == [reference[TEXTS[i % 3]] for _ in range(len(outs) // 6) for i in range(6)]
        deadline = time.monotonic() + 120

        def network_ups() -> list[dict[str, Any]]:
            return [e for e in service.scaler.events if e.direction == "up" and e.path == "network"]

        while not (ups := network_ups()):
            assert time.monotonic() < deadline, service.scaler.events
            time.sleep(0.1)
        assert ups[0].ranks == (2, 3) and ups[0].sources == (0, 1), ups
        target = router.instances[2]
        seen = [b for _, _, b in target.transitions]
        assert seen[:1] == ["new_prefill"], seen  # it served while loading
        text = generate_latest(service.registry).decode()
        lines = [ln.split() for ln in text.splitlines() if ln.startswith("blitzscale_live_")]
        counts = {name: float(value) for name, value in lines}
        # (the router's own count of requests that ran a layer there: the test once sampled
        # `router.reqs` for `live` every 10 ms, which can miss a request that ran there and
        # finished between two looks; it failed 2 runs in 7 one day and 0 in 24 the next,
        # so the message carries every live counter should it fail again)
        ran_there = counts.get("blitzscale_live_requests_total", 0)
        assert ran_there >= 1, ("no request ran on the loading instance", counts)
        assert counts.get("blitzscale_live_layers_total", 0) > 0, counts
        assert counts.get("blitzscale_live_relays_total", 0) >= 1, counts  # the partner finished some
        while router.live.pairs or _serving(service) != [(0, 1), (2, 3)]:
            assert time.monotonic() < deadline, (router.live.pairs, _serving(service))
            time.sleep(0.1)
        assert lt.run(burst(6)) == [reference[TEXTS[i % 3]] for i in range(6)]  # and after


def test_allcache_tp2_scales_up_from_the_host_copy_of_every_shard(
    folder: Path, reference: dict[str, list[int]], tmp_path: Path
) -> None:
    slow = {"tokens_prefilled_per_sec": 5.0, "interval_s": 0.1, "scale_down_idle_s": 600.0}
    with _service(folder, tmp_path, "colocated", "allcache", **slow) as (service, lt):
        assert service.scaler is not None and service.router is not None
        pool = service.scaler.cluster.pool
        assert pool.host_holder(str(folder)) == 0  # instance (0, 1)'s shards, in host memory

        async def burst(n: int) -> list[list[int]]:
            return await asyncio.gather(*(_one(service, f"h{n}.{i}", TEXTS[i % 3]) for i in range(n)))

        assert lt.run(burst(24)) == [reference[TEXTS[i % 3]] for i in range(24)], "tokens changed"
        up = _second_instance_up(service)
        assert up.path == "host" and up.sources == (0, 1), service.scaler.events
        assert pool.host_holder(str(folder)) == 0  # still the one host copy
        assert lt.run(burst(8)) == [reference[TEXTS[i % 3]] for i in range(8)]


@pytest.mark.parametrize(
    ("sections", "match"),
    [
        ({"model": {"tp": 2}, "cluster": {"num_workers": 3}}, "workers=3 is not a multiple of tp=2"),
        ({"model": {"tp": 0}}, "tp must be at least 1, got 0"),
    ],
)
def test_wrong_tp_settings_are_refused_naming_the_values(sections: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        ServeConfig().with_overrides(**sections)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--tp", "2", "--workers", "4"], "does not divide num_heads=9, num_kv_heads=3"),  # SmolLM2
        (["--tp", "2", "--workers", "3"], "workers=3 is not a multiple of tp=2"),
    ],
)
def test_serve_refuses_wrong_shapes_before_any_worker_starts(flags: list[str], needle: str) -> None:
    r = subprocess.run([*CLI, "serve", *flags], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert needle in r.stderr, r.stderr
    assert "up on" not in r.stderr, r.stderr  # no worker said hello ("worker N up on cpu")


def test_ctrl_c_stops_a_tp2_server_and_every_worker(folder: Path, tmp_path: Path) -> None:
    toml = (
        f"[model]\nname = '{folder}'\ntp = 2\ncache_dir = '{tmp_path}'\n"
        "[cluster]\nnum_workers = 4\n[router]\nmode = 'colocated'\n[policy]\nname = 'blitz-nolive'\n"
    )
    proc, port = _start_serve(tmp_path, toml)
    try:
        body = {"model": str(folder), "prompt": TEXTS[1], "max_tokens": 10, "temperature": 0}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        children, workers = _family(proc.pid)
        assert len(workers) >= 4
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert _none_left(children + workers) == []
    finally:
        if proc.poll() is None:
            proc.kill()
