"""The cross product of a template: one `RunSpec` per run, each with a stable id.

An id reads `blitz_demo_mode-pd_3f2a9c1b`: the policy, the model and trace when the template
lists several, each knob written as a list, then a hash of every parameter of the run. The
hash, not the readable part, is what a resumed batch matches on, so rewriting a scalar as a
list (which lengthens the slug) still finds the runs already done. Every run's ServeConfig is
built here, so a bad combination (e.g. a band whose lower end passes its upper end) is an error
before the first cluster starts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from blitzscale.batch.template import SIM_ONLY_POLICIES, Template
from blitzscale.batch.traces import TraceSpec, check_trace
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.config import ServeConfig

HASH_CHARS = 8
_MAX_SLUG = 72


@dataclass(frozen=True)
class RunSpec:
    """One live run: a model, a trace, a policy and the template's knobs, as a ServeConfig."""

    run_id: str
    params_hash: str
    model: str
    trace: TraceSpec
    policy: str
    settings: tuple[tuple[str, Any], ...]  # ("router.mode", "pd") for each knob the template sets
    cfg: ServeConfig
    num_requests: int

    @property
    def slo_group(self) -> tuple[str, TraceSpec]:
        """Runs replaying the same requests on the same model share one SLO reference."""
        return (self.model, self.trace)

    def params(self) -> dict[str, Any]:
        return run_params(self.model, self.trace, self.policy, self.settings)


@dataclass(frozen=True)
class BatchPlan:
    name: str
    runs: tuple[RunSpec, ...]
    varied: tuple[str, ...]  # what takes several values: "policy", "model", "trace", "router.mode"

    def varied_values(self, run: RunSpec) -> dict[str, str]:
        """What sets this run apart from the others, for tables and comparison.csv."""
        every = {"model": run.model, "trace": run.trace.describe(), "policy": run.policy}
        every |= {name: _text(value) for name, value in run.settings}
        return {name: every[name] for name in self.varied}


def expand(template: Template) -> BatchPlan:
    counts = {trace: check_trace(trace) for trace in template.traces}
    axes = template.axes
    listed = {a.name for a in axes if a.is_listed}
    runs: list[RunSpec] = []
    for model, trace, policy, values in itertools.product(
        template.models, template.traces, template.policies, itertools.product(*(a.values for a in axes))
    ):
        settings = tuple((a.name, v) for a, v in zip(axes, values, strict=True))
        parts = [policy]
        parts += [model] if len(template.models) > 1 else []
        parts += [trace.slug] if len(template.traces) > 1 else []
        parts += [f"{name.split('.')[1]}-{_text(v)}" for name, v in settings if name in listed]
        digest = params_hash(run_params(model, trace, policy, settings))
        run_id = f"{_slug(parts)}_{digest}"
        cfg = _config(run_id, model, policy, settings)
        runs.append(RunSpec(run_id, digest, model, trace, policy, settings, cfg, counts[trace]))
    seen: set[str] = set()
    for run in runs:
        if run.run_id in seen:
            raise InvalidRequestError(f"two runs have the same parameters: {run.run_id}")
        seen.add(run.run_id)
    return BatchPlan(template.name, tuple(runs), _varied(template))


def run_params(
    model: str, trace: TraceSpec, policy: str, settings: tuple[tuple[str, Any], ...]
) -> dict[str, Any]:
    """Every parameter of a run that the template decides (ServeConfig defaults are not in it)."""
    return {"model": model, "policy": policy, "trace": trace.params(), "settings": dict(settings)}


def params_hash(params: dict[str, Any]) -> str:
    text = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def _config(run_id: str, model: str, policy: str, settings: tuple[tuple[str, Any], ...]) -> ServeConfig:
    sections: dict[str, dict[str, Any]] = defaultdict(dict)
    sections["model"]["name"] = model
    # (fixed-peak / fixed-half: fixed, sized by the simulator from blitz's peak)
    sections["policy"]["name"] = "fixed" if policy in SIM_ONLY_POLICIES else policy
    for name, value in settings:
        section, key = name.split(".", 1)
        sections[section][key] = value
    try:
        return ServeConfig().with_overrides(**sections)
    except (InvalidRequestError, TypeError, ValueError) as e:
        raise InvalidRequestError(f"run {run_id}: {e}") from e


def _varied(template: Template) -> tuple[str, ...]:
    names = [
        name
        for name, count in (
            ("policy", len(template.policies)),
            ("model", len(template.models)),
            ("trace", len(template.traces)),
        )
        if count > 1
    ]
    return tuple(names + [a.name for a in template.axes if len(a.values) > 1])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _slug(parts: list[str]) -> str:
    cleaned = [re.sub(r"[^A-Za-z0-9.]+", "-", p).strip("-").lower() for p in parts]
    return "_".join(p for p in cleaned if p)[:_MAX_SLUG].rstrip("_-")
