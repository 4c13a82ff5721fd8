"""`blitzscale batch TEMPLATE --simulate PRESET`: a batch template's runs on the simulator.

The template is the same one a live batch runs. Each run's model must be one the simulator
knows (`random:llama3-8b` is read as `llama3-8b`), its `[router]`, `[planner]` and `[engine]`
settings apply to the simulated control plane as they would to `serve`, and the preset
replaces `[cluster]` (so a template that sets `[cluster]` or `[server]` knobs is refused:
they would be ignored). Policy `fixed` runs the template's `[policy] fixed_prefill` /
`fixed_decode` instances; `fixed-peak` and `fixed-half` the most instances blitz served at
once on the same model, trace and knobs (or half), as `simulate` sizes them. SLO attainment
is judged against the model's SLOs in the simulator's models.toml (the paper's), not
against a reference run: a simulated run has no noise to calibrate away.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from blitzscale.batch.plan import BatchPlan, RunSpec
from blitzscale.batch.runner import Execute
from blitzscale.batch.template import SIM_ONLY_POLICIES
from blitzscale.batch.traces import load_requests
from blitzscale.client.record import write_records
from blitzscale.client.report import write_report
from blitzscale.client.summary import Summary, summarize
from blitzscale.demo.result import RunResult
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.events import events_json
from blitzscale.sim.compare import split_stats, tail_parts
from blitzscale.sim.config import SimConfigError, SimModel, SimPreset, load_model, load_preset
from blitzscale.sim.runner import SimSetup, sim_report_info, simulate, sized_fixed

REFUSED_SECTIONS = ("cluster", "server", "model")  # the preset (or nothing) stands for them
# engine knobs the simulator does not use: KV room comes from the profile (or num_kv_blocks),
# the context from models.toml, and a simulated step has no host work to overlap
REFUSED_ENGINE = ("kv_cache_bytes", "gpu_memory_utilization", "max_model_len", "overlap")
RANDOM = "random:"
FIXED_COUNTS = ("fixed_prefill", "fixed_decode")  # [policy] knobs that size `fixed` runs


def sim_model_name(model: str) -> str:
    return model.removeprefix(RANDOM)


def check_plan(plan: BatchPlan, preset_name: str) -> SimPreset:
    """Every run can be simulated on the preset: known models with a profile for its device,
    no knob the simulator would ignore. Raises InvalidRequestError naming the first problem."""
    try:
        preset = load_preset(preset_name)
        for run in plan.runs:
            preset.instance_profile(load_model(sim_model_name(run.model)))
    except SimConfigError as e:
        raise InvalidRequestError(f"--simulate {preset_name}: {e}") from e
    for run in plan.runs:
        for name, _ in run.settings:
            section, key = name.split(".", 1)
            if section in REFUSED_SECTIONS or (section == "engine" and key in REFUSED_ENGINE):
                raise InvalidRequestError(
                    f"--simulate: the template sets {name}, which the simulator does not use "
                    f"(preset {preset.name!r} gives the cluster); remove it to simulate"
                )
    return preset


def _setup(run: RunSpec, preset: SimPreset, model: SimModel) -> tuple[SimSetup, str]:
    """Only what the template sets moves off the simulator's defaults (its planner rates
    come from the profile, its engine is a GPU's, load shedding is off)."""
    cfg = run.cfg
    knobs: dict[str, dict[str, Any]] = {"planner": {}, "engine": {}, "router": {}, "policy": {}}
    for name, v in run.settings:
        section, key = name.split(".", 1)
        if section in knobs:
            knobs[section][key] = v
    base = SimSetup(preset=preset, model=model)
    shedding = {"max_queue_tokens": 0, "max_queue_wait_s": 0.0}  # off, unless the template sets it
    shedding.update({k: v for k, v in knobs["router"].items() if k in shedding})
    router = replace(cfg.router, **shedding)
    setup = replace(
        base,
        mode=cfg.router.mode,
        planner_overrides=knobs["planner"],
        engine=replace(base.engine, **knobs["engine"]),
        router=router,
        fixed=(cfg.policy.fixed_prefill, cfg.policy.fixed_decode),
        # the rest of [policy] (fixed's counts are `fixed`; the scaling policies take these)
        policy_overrides={k: v for k, v in knobs["policy"].items() if k not in FIXED_COUNTS},
    )
    return setup, "fixed-peak" if run.policy == "fixed" else run.policy


def sim_executor(preset: SimPreset) -> Execute:
    # blitz's peak (prefill-side, decode instances serving at once) per model, trace and
    # knobs: what fixed-peak and fixed-half provision
    peaks: dict[tuple[str, Any, tuple[tuple[str, Any], ...]], tuple[int, int]] = {}

    def execute(run: RunSpec, run_dir: Path, reference: Summary | None) -> RunResult:
        model = load_model(sim_model_name(run.model))
        setup, policy = _setup(run, preset, model)
        requests = load_requests(run.trace)
        group = (run.model, run.trace, run.settings)
        if run.policy in SIM_ONLY_POLICIES:
            if group not in peaks:  # (blitz not run first in this batch, or run before a resume)
                peaks[group] = simulate(setup, requests, "blitz").peak
            setup, policy = sized_fixed(setup, peaks[group], run.policy), run.policy
        res = simulate(setup, requests, policy)
        if policy == "blitz":
            peaks[group] = res.peak
        summary = summarize(res.records, model.ttft_slo_s, model.tbt_slo_s)
        summary = replace(summary, gpu_seconds=res.gpu_seconds)
        write_records(run_dir / "requests.jsonl", res.records)
        # where the slowest 1%'s time to first token went (each record has its own parts)
        tail = tail_parts(res.records).columns()
        (run_dir / "ttft_tail.json").write_text(json.dumps(tail, indent=2) + "\n")
        if res.relays or res.split_solve_s:  # live scaling: its relays (and planned splits)
            stats = split_stats(res.split_solve_s, res.split_fallbacks) | {"relays": res.relays}
            (run_dir / "live_split.json").write_text(json.dumps(stats, indent=2) + "\n")
        info = sim_report_info(run.policy, res.states)
        report = write_report(run_dir, res.records, summary, res.samples, events_json(res.events), info)
        return RunResult(run.policy, summary, res.records, res.samples, res.events, report)

    return execute
