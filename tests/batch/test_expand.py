"""A template expands into the documented cross product, with stable ids and loadable configs."""

from __future__ import annotations

import tomllib
from pathlib import Path

from blitzscale.batch.runner import write_plan
from blitzscale.batch.template import load_template
from blitzscale.serve.config import ServeConfig, load_serve_config
from tests.batch.conftest import plan_of, write

SWEEP = """
[experiment]
name = "sweep"
models = ["smollm2-135m", "random:tiny-llama3"]
policies = ["blitz", "sllm", "allcache"]
traces = [
  { path = "trace.csv", format = "processed", max_output = 2 },
  { path = "demo", rate_scale = [0.05, 0.1], max_input = 192 },
]
[router]
mode = ["pd", "colocated"]
[planner]
scale_down_idle_s = [0.5, 2]
tokens_prefilled_per_sec = 600
[cluster]
num_workers = 3
"""


def test_cross_product_of_models_traces_policies_and_every_list(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, SWEEP)
    # 2 models x 3 traces (demo fans out over rate_scale) x 3 policies x 2 modes x 2 idle times
    assert len(plan.runs) == 2 * 3 * 3 * 2 * 2
    assert plan.varied == ("policy", "model", "trace", "router.mode", "planner.scale_down_idle_s")
    combos = {
        (r.model, r.trace, r.policy, r.cfg.router.mode, r.cfg.planner.scale_down_idle_s) for r in plan.runs
    }
    assert len(combos) == len(plan.runs)
    assert {r.trace.rate_scale for r in plan.runs if r.trace.path == "demo"} == {0.05, 0.1}
    for run in plan.runs:
        assert run.cfg.model.name == run.model and run.cfg.policy.name == run.policy
        assert run.cfg.cluster.num_workers == 3  # scalars apply to every run
        assert run.cfg.planner.tokens_prefilled_per_sec == 600.0  # an int given for a float knob
        assert run.cfg.engine == ServeConfig().engine  # sections left out keep the defaults
    assert {r.num_requests for r in plan.runs if r.trace.path == "trace.csv"} == {4}


def test_a_list_fans_out_in_any_section(tmp_path: Path) -> None:
    text = """
[experiment]
policies = "blitz"
traces = { path = "trace.csv", format = "processed" }
[engine]
num_kv_blocks = [128, 256, 512]
[policy]
sources_only_decode = [true, false]
"""
    plan = plan_of(tmp_path, text)
    assert plan.name == "t"  # the template's file name when [experiment] has none
    assert sorted((r.cfg.engine.num_kv_blocks, r.cfg.policy.sources_only_decode) for r in plan.runs) == [
        (n, b) for n in (128, 256, 512) for b in (False, True)
    ]
    assert all(r.model == "smollm2-135m" for r in plan.runs)  # the default model


def test_ids_are_stable_readable_and_unique(tmp_path: Path) -> None:
    first = plan_of(tmp_path / "a", SWEEP)
    again = plan_of(tmp_path / "b", SWEEP)  # another folder: ids do not depend on where it lies
    ids = [r.run_id for r in first.runs]
    assert ids == [r.run_id for r in again.runs]
    assert len(set(ids)) == len(ids)
    run = next(r for r in first.runs if r.policy == "sllm" and r.cfg.router.mode == "colocated")
    assert run.run_id.startswith("sllm_")
    assert "mode-colocated" in run.run_id and run.run_id.endswith("_" + run.params_hash)
    assert all(c.isalnum() or c in "._-" for c in run.run_id)
    # writing a scalar as a one-value list changes the readable part, never the hash
    one = plan_of(tmp_path / "c", SWEEP.replace("num_workers = 3", "num_workers = [3]"))
    assert [r.params_hash for r in one.runs] == [r.params_hash for r in first.runs]


def test_configs_are_written_and_load_back(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, SWEEP)
    out = tmp_path / "out"
    write_plan(plan, out)
    for run in plan.runs:
        assert load_serve_config(out / run.run_id / "config.toml") == run.cfg
        table = tomllib.loads((out / run.run_id / "run.toml").read_text())["run"]
        assert table["id"] == run.run_id and table["policy"] == run.policy and table["model"] == run.model
        assert table["trace"] == run.trace.params()
        assert table["settings"]["router.mode"] == run.cfg.router.mode


def test_trace_paths_are_relative_to_the_template(tmp_path: Path) -> None:
    write(tmp_path / "data" / "t.csv", "timestamp_ms,prefill,decode\n0,1,1\n")
    template = write(
        tmp_path / "conf" / "b.toml",
        '[experiment]\npolicies = ["blitz"]\ntraces = [{ path = "../data/t.csv", format = "processed" }]\n',
    )
    (trace,) = load_template(template).traces
    assert trace.file == (tmp_path / "data" / "t.csv").resolve() and trace.path == "../data/t.csv"
