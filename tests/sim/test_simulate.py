"""A simulated cluster runs our own control plane end to end: every request of a trace
slice is served, the scale-ups go the way each policy says, and a run is deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blitzscale.cli.main import main
from blitzscale.client.traces import load_trace, transform
from blitzscale.sim.config import SimConfigError, load_model, load_preset
from blitzscale.sim.runner import SimSetup, simulate

TRACE = Path(__file__).parents[2] / "blitzscale" / "data" / "azure_code_2023_slice.csv"


@pytest.fixture(scope="module")
def setup() -> SimSetup:
    return SimSetup(preset=load_preset("paper-a"), model=load_model("llama3-8b"))


@pytest.fixture(scope="module")
def trace() -> list:
    return transform(load_trace(TRACE, "azure"), duration=20)


def test_blitz_serves_every_request_and_scales_over_the_network(setup: SimSetup, trace: list) -> None:
    res = simulate(setup, trace, "blitz")
    assert len(res.records) == len(trace) and all(r.is_ok for r in res.records)
    assert [r.output_tokens for r in res.records] == [max(1, t.output_tokens) for t in trace]
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in res.records)
    ups = [e for e in res.events if e.direction == "up"]
    assert ups[0].path == "disk"  # the first instance, from disk
    assert len(ups) > 2 and {e.path for e in ups[1:]} == {"network"}  # then GPU to GPU only
    assert 0 < res.gpu_seconds <= setup.preset.topology.world_size * (res.samples[-1][0] + 30)
    again = simulate(setup, trace, "blitz")
    assert [(r.ttft_s, r.e2e_s) for r in again.records] == [(r.ttft_s, r.e2e_s) for r in res.records]


def test_serverless_llm_loads_from_host_memory_or_disk_never_from_gpus(setup: SimSetup, trace: list) -> None:
    res = simulate(setup, trace, "sllm")
    assert all(r.is_ok for r in res.records)
    paths = {e.path for e in res.events if e.direction == "up" and e.time > 0}  # after bring-up
    assert paths <= {"disk", "host"} and "host" in paths


def test_fixed_provisioning_never_scales(setup: SimSetup, trace: list) -> None:
    from dataclasses import replace

    res = simulate(replace(setup, fixed=(2, 1)), trace, "fixed-peak")
    assert all(r.is_ok for r in res.records)
    assert [e.path for e in res.events if e.direction == "up"] == ["disk", "network"]
    assert not [e for e in res.events if e.direction == "down"]


def test_a_row_of_zero_tokens_is_sent_as_one_and_recorded_as_sent(setup: SimSetup) -> None:
    """(An API refuses an empty prompt and max_tokens 0; the replay client sends such a row as
    one token each way, and so does the simulator, whose record once said 0 for a 1-token
    prompt.)"""
    from dataclasses import replace

    from blitzscale.client.traces import TraceRequest

    rows = [TraceRequest(0.0, 0, 0), TraceRequest(0.5, 40, 3)]
    res = simulate(replace(setup, fixed=(1, 1)), rows, "fixed-peak")
    assert all(r.is_ok for r in res.records)
    sent = [(r.input_tokens, r.requested_output_tokens, r.output_tokens) for r in res.records]
    assert sent == [(1, 1, 1), (40, 3, 3)]


def test_a_planned_live_split_is_solved_and_sent(setup: SimSetup) -> None:
    """live_split = "ilp": each dispatch to a loading live target re-plans its tasks (a plan
    that did not fall back is sent), and every request is served. (That an engine follows a
    plan: tests/engine/test_live_split_order.py and the worker conformance script; what the
    split changes against greedy: docs/benchmarks.md.)"""
    from dataclasses import replace

    from blitzscale.serve.router import RouterConfig

    mooncake = load_trace(TRACE.parent / "mooncake_synthetic_slice.jsonl", "mooncake")
    trace = transform(mooncake, max_input=4096)
    # (a wall-clock limit far above a solve's milliseconds: a busy machine never falls back)
    router = RouterConfig(
        mode="pd", max_queue_tokens=0, max_queue_wait_s=0, live_split="ilp", live_split_time_limit_s=30.0
    )
    res = simulate(replace(setup, router=router), trace, "blitz")
    assert len(res.records) == len(trace) and all(r.is_ok for r in res.records)
    assert res.split_solve_s and res.relays > 0 and res.split_fallbacks == 0
    greedy = simulate(setup, trace, "blitz")
    assert not greedy.split_solve_s and greedy.split_fallbacks == 0


def test_the_cli_writes_each_policy_and_a_comparison(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    argv = ["simulate", "--trace", str(TRACE), "--duration", "10", "--policy", "blitz,sllm"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    rows = json.loads((out / "comparison.json").read_text())
    assert [r["policy"] for r in rows] == ["blitz", "sllm"]
    for policy in ("blitz", "sllm"):
        summary = json.loads((out / policy / "summary.json").read_text())
        assert summary["num_ok"] == summary["num_requests"] > 0
        assert summary["gpu_seconds"] > 0 and summary["sim_wall_s"] >= 0
        assert (out / policy / "requests.jsonl").is_file() and (out / policy / "report.html").is_file()


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--policy", "blitz,nope"], "nope"),
        (["--format", "parquet"], "--format"),
        (["--rate-scale", "0"], "--rate-scale"),
        (["--preset", "no-such-cluster"], "no-such-cluster"),
        (["--model", "gpt-5"], "gpt-5"),
        (["--live-split", "lp"], "--live-split"),
        (["--keep-alive", "3", "--host-memory-gb", "8"], "--host-memory-gb: only with --models"),
        (["--rate-scale", "1e9"], "at most 20,000,000 are replayed or simulated"),
    ],
)
def test_bad_values_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    argv = ["simulate", "--trace", str(TRACE), "--out", str(tmp_path / "x"), "--quiet", *extra]
    assert main(argv) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_preset_file_with_a_bad_topology_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "mine.toml"
    bad.write_text(
        "[topology]\nnodes = 0\ngpus_per_node = 8\nnvlink_bytes_per_s = 1e9\n"
        "nic_bytes_per_s = 1e9\npcie_bytes_per_s = 1e9\nssd_bytes_per_s = 1e9\n"
        '[device]\nname = "a800"\nmemory_bytes = 80e9\n'
    )
    with pytest.raises(SimConfigError, match="nodes"):
        load_preset(str(bad))


def test_planner_knobs_from_the_command_line_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--trace", str(TRACE), "--duration", "5", "--policy", "blitz", "--quiet"]
    assert (
        main(
            [
                *argv,
                "--out",
                str(tmp_path / "a"),
                "--planner",
                "prefill_upper=0.5",
                "--planner",
                "prefill_lower=0.3",
            ]
        )
        == 0
    )
    assert main([*argv, "--out", str(tmp_path / "b"), "--planner", "prefil_upper=0.5"]) == 2
    assert "prefil_upper" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "c"), "--planner", "prefill_upper"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
