"""`blitzscale batch TEMPLATE --simulate PRESET`: a template's runs on the cluster simulator
(blitzscale/sim/batch.py): real simulated runs, the template's knobs applied, knobs the
simulator would ignore refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blitzscale.batch.runner import run_batch
from blitzscale.errors import InvalidRequestError
from blitzscale.sim.batch import check_plan, sim_executor
from tests.batch.conftest import plan_of, write
from tests.batch.test_cli import parse

TEMPLATE = """
[experiment]
name = "sim"
models = ["random:llama3-8b"]
policies = ["blitz", "fixed"]
traces = [{ path = "demo", format = "azure", duration = 120.0 }]
[router]
mode = "pd"
[planner]
prefill_lower = [0.3, 0.5]
[policy]
fixed_prefill = 2
fixed_decode = 1
"""


def test_runs_on_the_simulator_with_the_templates_knobs(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, TEMPLATE)
    outcomes = run_batch(plan, tmp_path / "out", sim_executor(check_plan(plan, "paper-a")))
    assert [o.is_done for o in outcomes] == [True] * 4
    for o in outcomes:
        run_dir = tmp_path / "out" / o.run.run_id
        assert o.summary is not None and o.summary.num_ok == o.summary.num_requests > 50
        assert o.summary.gpu_seconds and o.summary.gpu_seconds > 0
        assert o.summary.slo_attainment is not None
        assert (run_dir / "requests.jsonl").is_file() and (run_dir / "report.html").is_file()
        tail = json.loads((run_dir / "ttft_tail.json").read_text())  # the slowest 1%'s parts
        assert tail["tail_requests"] >= 1 and tail["tail_compute_ms"] > 0
        ups = [e for e in o.events if e["direction"] == "up"]
        if o.run.policy == "fixed":  # the template's 2 + 1 instances, loaded once, never scaled
            assert sorted(r for e in ups for r in e["ranks"]) == [0, 1, 2], ups
    blitz = [o for o in outcomes if o.run.policy == "blitz"]
    # the two prefill bands are two different runs of the same requests
    assert blitz[0].summary != blitz[1].summary


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ("[cluster]\nnum_workers = 4\n", "cluster.num_workers"),
        ("[engine]\nkv_cache_bytes = 1000000\n", "engine.kv_cache_bytes"),
    ],
)
def test_knobs_the_simulator_ignores_are_refused(tmp_path: Path, extra: str, named: str) -> None:
    plan = plan_of(tmp_path, TEMPLATE + extra)
    with pytest.raises(InvalidRequestError, match=named):
        check_plan(plan, "paper-a")


def test_unknown_preset_or_model_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="no preset 'nope'"):
        check_plan(plan_of(tmp_path, TEMPLATE), "nope")
    with pytest.raises(InvalidRequestError, match="no model 'tiny-llama3'"):
        check_plan(plan_of(tmp_path, TEMPLATE.replace("llama3-8b", "tiny-llama3")), "paper-a")


def test_cli_runs_a_template_on_the_simulator(tmp_path: Path) -> None:
    template = write(tmp_path / "b.toml", TEMPLATE.replace('"blitz", "fixed"', '"sllm"'))
    out = tmp_path / "out"
    args = parse(["batch", str(template), "--simulate", "paper-a", "--out", str(out)])
    assert args.func(args) == 0
    runs = json.loads((out / "batch.json").read_text())["runs"]
    assert len(runs) == 2 and {r["status"] for r in runs} == {"done"}


def test_load_shedding_the_template_sets_is_simulated(tmp_path: Path) -> None:
    """Shedding is off on the simulator unless the template sets it, as serve's defaults do:
    one fixed instance past saturation then refuses what live serving would refuse."""
    one = TEMPLATE.replace('"blitz", "fixed"', '"fixed"').replace("prefill_lower = [0.3, 0.5]", "")
    one = one.replace('mode = "pd"', 'mode = "colocated"').replace("fixed_prefill = 2", "fixed_prefill = 1")
    shed = one.replace("[planner]", "max_queue_tokens = 131072\nmax_queue_wait_s = 60.0\n[planner]")
    results = []
    for name, text in (("unbounded", one), ("bounded", shed)):
        plan = plan_of(tmp_path / name, text)
        results += run_batch(plan, tmp_path / name / "out", sim_executor(check_plan(plan, "h200x2")))
    unbounded, bounded = results
    assert unbounded.summary is not None and bounded.summary is not None
    assert unbounded.summary.num_errors == 0
    assert 0 < bounded.summary.num_errors < bounded.summary.num_requests


def test_fixed_peak_and_half_provision_what_blitz_served_at_most(tmp_path: Path) -> None:
    """fixed-peak / fixed-half: the most prefill and decode instances blitz served at once on
    the same model, trace and knobs (half, rounded up), loaded once and never scaled, as
    `simulate` sizes them; found by running blitz when the batch has not (here: listed after)."""
    text = TEMPLATE.replace('"blitz", "fixed"', '"fixed-peak", "fixed-half", "blitz"')
    text = text.replace("prefill_lower = [0.3, 0.5]", "")
    plan = plan_of(tmp_path, text)
    outcomes = run_batch(plan, tmp_path / "out", sim_executor(check_plan(plan, "paper-a")))
    assert [o.is_done for o in outcomes] == [True] * 3
    by = {o.run.policy: o for o in outcomes}
    assert len([e for e in by["blitz"].events if e["direction"] == "up"]) > 2  # (blitz scaled)
    loaded = {p: sorted(r for e in by[p].events if e["direction"] == "up" for r in e["ranks"]) for p in by}
    assert not [e for p in ("fixed-peak", "fixed-half") for e in by[p].events if e["direction"] == "down"]
    peak, half = len(loaded["fixed-peak"]), len(loaded["fixed-half"])
    assert peak >= 3 and half < peak and half >= peak / 2  # (prefill and decode each halved, rounded up)


def test_a_live_batch_refuses_the_policies_sized_by_the_simulator(tmp_path: Path) -> None:
    template = write(tmp_path / "b.toml", TEMPLATE.replace('"blitz", "fixed"', '"blitz", "fixed-peak"'))
    args = parse(["batch", str(template), "--out", str(tmp_path / "out"), "--dry-run"])
    with pytest.raises(InvalidRequestError, match=r"fixed-peak.*--simulate"):
        args.func(args)
    assert not (tmp_path / "out").exists()


def test_the_templates_policy_knobs_reach_the_simulated_policy(tmp_path: Path) -> None:
    """A [policy] knob of a scaling policy (here sllm's host keep-alive) is simulated, not
    dropped: sllm with a 0 s TTL reloads from disk where 30 s keeps host copies."""
    base = TEMPLATE.replace('"blitz", "fixed"', '"sllm"').replace("prefill_lower = [0.3, 0.5]", "")
    plan = plan_of(tmp_path, base + "sllm_ttl_s = [0.0, 30.0]\n")
    outcomes = run_batch(plan, tmp_path / "out", sim_executor(check_plan(plan, "paper-a")))
    assert [o.is_done for o in outcomes] == [True, True]
    disk = {dict(o.run.settings)["policy.sllm_ttl_s"]: o for o in outcomes}
    loads = {ttl: [e["path"] for e in o.events if e["direction"] == "up"] for ttl, o in disk.items()}
    assert loads[0.0].count("disk") > loads[30.0].count("disk"), loads
