"""Several models on one simulated pool (the same scaler and policies as the server):
each model's own slice of the trace, twice; between its rounds it scales to zero. blitz
brings it back from a GPU copy or its one host copy, never the disk; sllm, whose hosts
cache what they loaded for a while, reads the disk on a miss."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from blitzscale.client.traces import load_trace, transform
from blitzscale.demo.workload import model_slices
from blitzscale.sim.config import load_model, load_preset
from blitzscale.sim.runner import SimSetup, simulate

TRACE = Path(__file__).parents[2] / "blitzscale" / "data" / "azure_code_2023_slice.csv"
NAMES = ["m-a", "m-b", "m-c"]


@pytest.fixture(scope="module")
def workload() -> tuple[SimSetup, list, list[str]]:
    trace = transform(load_trace(TRACE, "azure"), duration=60)
    pairs = sorted(
        ((r, n) for n, rs in model_slices(trace, NAMES).items() for r in rs), key=lambda x: x[0].arrival_s
    )
    setup = SimSetup(preset=load_preset("paper-a"), model=load_model("llama3-8b"))
    copy = setup.preset.instance_profile(setup.model).weight_bytes
    # 5 s keep-alive; room for three copies per host, under both policies; one model a GPU
    # (they take turns on it: the subject here)
    setup = replace(
        setup, models=tuple(NAMES), keep_alive_s=5.0, host_memory_bytes=3 * copy, models_per_rank=1
    )
    return setup, [r for r, _ in pairs], [n for _, n in pairs]


def _loads(res: object) -> Counter[tuple[str, str]]:
    events = res.events  # type: ignore[attr-defined]
    return Counter((e.model, e.path) for e in events if e.direction == "up" and e.time > 0)


def test_blitz_brings_models_back_from_zero_without_reading_the_disk(workload: tuple) -> None:
    setup, trace, models = workload
    res = simulate(setup, trace, "blitz", trace_models=models)
    assert len(res.records) == len(trace) and all(r.is_ok for r in res.records)
    loads = _loads(res)
    assert not [k for k in loads if k[1] == "disk"], loads  # after bring-up: never the disk
    assert {m for m, p in loads if p == "host"} == set(NAMES), loads  # each came back from its host copy
    releases = Counter(e.model for e in res.events if e.direction == "down")
    assert set(releases) == set(NAMES)  # each went to zero (or down) between its rounds


def test_sllm_under_the_same_host_memory_misses_to_disk(workload: tuple) -> None:
    setup, trace, models = workload
    res = simulate(setup, trace, "sllm", trace_models=models)
    assert all(r.is_ok for r in res.records)
    loads = _loads(res)
    assert {p for _, p in loads} <= {"host", "disk"} and any(p == "disk" for _, p in loads), loads


def test_one_model_runs_as_before_and_requests_name_only_served_models(workload: tuple) -> None:
    from blitzscale.errors import BlitzScaleError

    setup, trace, models = workload
    single = SimSetup(preset=setup.preset, model=setup.model)
    assert single.model_names == (setup.model.name,)
    with pytest.raises(BlitzScaleError, match="2 models for"):
        simulate(setup, trace, "blitz", trace_models=models[:2])


def test_the_cli_simulates_several_models_and_counts_disk_loads(tmp_path: Path) -> None:
    import json

    from blitzscale.cli.main import main

    out = tmp_path / "sim"
    argv = ["simulate", "--trace", str(TRACE), "--duration", "60", "--policy", "blitz,sllm", "--quiet"]
    extra = ["--models", "3", "--keep-alive", "5", "--host-memory-gb", "48.2", "--out", str(out)]
    assert main([*argv, *extra, "--models-per-rank", "1"]) == 0
    rows = {r["policy"]: r for r in json.loads((out / "comparison.json").read_text())}
    assert rows["blitz"]["ok"] == rows["blitz"]["requests"] == rows["sllm"]["ok"] > 0
    assert rows["blitz"]["disk_loads"] == 3  # each model once, at bring-up; never again
    assert rows["sllm"]["disk_loads"] > 3
    assert rows["blitz"]["models_per_rank"] == 1
    # by default as many as fit: three 8B models (16 GB + 1 GB of KV for one 8k request
    # each) share each 80 GB GPU, so the GPUs that take a model take all three
    assert main([*argv, *extra[:-2], "--policy", "blitz", "--out", str(out / "resident")]) == 0
    [row] = json.loads((out / "resident" / "comparison.json").read_text())
    assert row["models_per_rank"] == 3 and row["ok"] == row["requests"] == rows["blitz"]["ok"]
    assert main([*argv, "--models", "27", "--out", str(out)]) == 2


def test_three_models_on_one_worker_take_turns_on_its_rank() -> None:
    """The issue "Many models on one GPU" on the simulator (the server's scaler and
    policies): 6 requests each for three models at once on one CPU worker, keep-alive
    and keep timer an hour. The rank goes from model to model, each released as soon as
    the next one's requests wait, and every request is served; before the fix the first
    release left the rank free and nothing loaded (every queued request got 429)."""
    from blitzscale.client.traces import TraceRequest
    from blitzscale.serve.router import RouterConfig

    cpu = load_preset("cpu4")
    one = replace(cpu, topology=replace(cpu.topology, gpus_per_node=1))
    setup = SimSetup(
        preset=one,
        model=load_model("smollm2-135m"),
        mode="colocated",
        router=RouterConfig(mode="colocated", max_queue_tokens=0, max_queue_wait_s=60.0),
        planner_overrides={"shutting_null_keep_s": 3600.0},
        models=tuple(NAMES),
        keep_alive_s=3600.0,
    )
    trace = [TraceRequest(0.01 * k, 12, 12) for k in range(18)]
    models = [NAMES[k % 3] for k in range(18)]
    res = simulate(setup, trace, "blitz", trace_models=models)
    assert len(res.records) == 18 and all(r.is_ok for r in res.records), res.events
    ups = [e.model for e in res.events if e.direction == "up"]
    downs = [e.model for e in res.events if e.direction == "down"]
    assert set(ups) == set(NAMES) and len(downs) >= 2, res.events
    # each release comes right after the last request of the model it held ended (not
    # its keep timer), and the next model's load right behind it
    for down in (e for e in res.events if e.direction == "down"):
        last = max(r.end_s or 0.0 for r, m in zip(res.records, models, strict=True) if m == down.model)
        assert down.time - last < 2.0, (down, last)
        starts = [e.time - e.seconds for e in res.events if e.direction == "up"]  # (time: its end)
        nxt = min(t for t in starts if t >= down.time - 1e-9)
        assert nxt - down.time < 1.0, res.events


def test_three_models_resident_on_one_gpu_share_its_steps_without_a_swap() -> None:
    """Several models resident per GPU on the simulator (`models_per_rank`): three 8B
    models on one simulated H800-class GPU, 6 requests each at once. Each is loaded once
    into a slot of its own and none is released; the engines share the device, so while
    all three decode each token takes about three times as long as one model's alone."""
    from statistics import mean

    from blitzscale.client.traces import TraceRequest
    from blitzscale.serve.router import RouterConfig

    a = load_preset("paper-a")
    one_gpu = replace(a, topology=replace(a.topology, gpus_per_node=1, nodes=1))

    def run(names: list[str], per_rank: int) -> tuple[object, float]:
        setup = SimSetup(
            preset=one_gpu,
            model=load_model("llama3-8b"),
            mode="colocated",
            router=RouterConfig(mode="colocated", max_queue_tokens=0, max_queue_wait_s=60.0),
            planner_overrides={"shutting_null_keep_s": 3600.0},
            models=tuple(names) if len(names) > 1 else (),
            keep_alive_s=3600.0,
            models_per_rank=per_rank,
        )
        n = 6 * len(names)
        trace = [TraceRequest(20 + 0.01 * k, 200, 200) for k in range(n)]
        models = [names[k % len(names)] for k in range(n)] if len(names) > 1 else None
        res = simulate(setup, trace, "blitz", trace_models=models)
        assert len(res.records) == n and all(r.is_ok for r in res.records), res.events
        return res, mean(mean(r.tbts_s) for r in res.records)

    resident, tbt3 = run(NAMES, 3)
    ups = sorted(e.model for e in resident.events if e.direction == "up")  # type: ignore[attr-defined]
    assert ups == sorted(NAMES), resident.events  # type: ignore[attr-defined]
    assert not [e for e in resident.events if e.direction == "down"]  # type: ignore[attr-defined]
    _, tbt1 = run(NAMES[:1], 1)
    assert 2.5 < tbt3 / tbt1 < 3.5, (tbt3, tbt1)
