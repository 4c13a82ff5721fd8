"""The batch template: one TOML file describing a sweep of live runs.

    [experiment]
    name = "blitz-vs-sllm"        # names the default output folder (default: the file's stem)
    models = ["smollm2-135m"]     # default: ["smollm2-135m"]; any name `blitzscale serve` takes
    policies = ["blitz", "sllm"]  # blitz, blitz-nolive, network, network-multicast, sllm, allcache, fixed
                                  # (--simulate also: fixed-peak, fixed-half)
    traces = [                    # inline tables, or one [[experiment.traces]] table per trace
      { path = "demo", rate_scale = 0.05, max_input = 192, max_output = 24 },
      { path = "traces/code.csv", format = "azure", duration = 60.0, rate_scale = [0.02, 0.04] },
    ]

    [router]                      # any ServeConfig section: model server cluster router engine planner policy
    mode = ["pd", "colocated"]    # a list fans out
    [planner]
    scale_down_idle_s = [0.5, 2.0]

Runs are the cross product models x traces x policies x every list-valued knob: the example
above is 1 x 3 x 2 x 2 x 2 = 24 runs. No knob of a ServeConfig takes a list, so a list always
means "one run per value"; a list in a trace table fans out that trace the same way.

Trace keys: `path` is a file, relative to the template's folder, or "demo" for the slice of
the Azure code trace shipped in the package; `format` is azure|burstgpt|mooncake|processed
(optional for "demo"); rate_scale, time_scale, duration (s), max_input, max_output shape the
trace as `blitzscale.client.traces.transform` documents (left out: unchanged); `cv` then
re-times the shaped requests, in order, with Gamma arrivals of that coefficient of variation
at the same mean rate over the same span, drawn with `seed` (default 0): `seed = [0, 1, 2]`
is three draws of one trace, three runs (a seed without `cv` draws nothing: refused).

Policies `fixed-peak` and `fixed-half` (simulated batches only) provision, never scaling,
the most prefill and decode instances blitz served at once on the same model, trace and
knobs, or half of them (the paper's DistServe "full" and "half"); `fixed` provisions the
template's `[policy] fixed_prefill` / `fixed_decode`.

Sections start from `ServeConfig()` defaults, as `blitzscale serve` does without a file;
`[model] name` and `[policy] name` are not allowed because `models` and `policies` set them.
Every value is checked here, before anything runs: an unknown section, key, policy, format
or model, a missing trace file or a value of the wrong type is one error naming it.
"""

from __future__ import annotations

import dataclasses
import itertools
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blitzscale.batch.traces import KNOBS, TRACE_KEYS, TraceSpec, parse_knob, resolve_source
from blitzscale.checkpoint.resolve import DEFAULT_MODEL, resolve_model
from blitzscale.control.config import POLICY_NAMES
from blitzscale.errors import BlitzScaleError, InvalidRequestError
from blitzscale.serve.config import ServeConfig
from blitzscale.tomlfile import read_toml

EXPERIMENT_KEYS = ("name", "models", "traces", "policies")
SIM_ONLY_POLICIES = ("fixed-peak", "fixed-half")  # sized from blitz's peak in the same batch
ROUTER_MODES = ("pd", "colocated")  # RouterConfig takes any string; a typo would run colocated
_SET_BY_EXPERIMENT = {("model", "name"): "models", ("policy", "name"): "policies"}


@dataclass(frozen=True)
class Axis:
    """One knob of one ServeConfig section and the values it takes in the batch."""

    section: str
    key: str
    values: tuple[Any, ...]
    is_listed: bool  # written as a list: its value is part of each run's readable id

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"


@dataclass(frozen=True)
class Template:
    path: Path
    name: str
    models: tuple[str, ...]
    traces: tuple[TraceSpec, ...]
    policies: tuple[str, ...]
    axes: tuple[Axis, ...]


def load_template(path: Path) -> Template:
    return parse_template(read_toml(path, f"template {str(path)!r}"), Path(path))


def parse_template(data: dict[str, Any], path: Path) -> Template:
    """`path` names the template in defaults and anchors relative trace paths."""
    experiment = data.get("experiment")
    if not isinstance(experiment, dict):
        raise InvalidRequestError("the template needs an [experiment] table (name, models, traces, policies)")
    _check_keys("[experiment]", experiment, EXPERIMENT_KEYS)
    name = experiment.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequestError(f"[experiment] name must be a non-empty string, got {name!r}")
    models = _names("models", experiment.get("models", [DEFAULT_MODEL]))
    for model in models:
        try:
            resolve_model(model)
        except BlitzScaleError as e:
            raise InvalidRequestError(f"[experiment] models: {model!r}: {e}") from e
    policies = _names("policies", experiment.get("policies"))
    for policy in policies:
        if policy not in POLICY_NAMES + SIM_ONLY_POLICIES:
            known = ", ".join(POLICY_NAMES + SIM_ONLY_POLICIES)
            raise InvalidRequestError(f"[experiment] policies: unknown policy {policy!r}; known: {known}")
    traces = _traces(experiment.get("traces"), path.parent)
    axes = tuple(_axes(data))
    return Template(path, name, models, traces, policies, axes)


def _check_keys(where: str, table: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise InvalidRequestError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(known)}")


def _names(key: str, value: Any) -> tuple[str, ...]:
    """A string or a non-empty list of distinct strings."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise InvalidRequestError(f"[experiment] {key} must be a non-empty list of names, got {value!r}")
    _no_duplicates(f"[experiment] {key}", values)
    return tuple(values)


def _no_duplicates(where: str, values: list[Any]) -> None:
    for i, v in enumerate(values):
        if v in values[:i]:
            raise InvalidRequestError(f"{where} lists {v!r} twice")


def _traces(value: Any, base_dir: Path) -> tuple[TraceSpec, ...]:
    tables = [value] if isinstance(value, dict) else value
    if not isinstance(tables, list) or not tables:
        raise InvalidRequestError(f"[experiment] traces must be a non-empty list of tables, got {value!r}")
    specs: list[TraceSpec] = []
    for i, table in enumerate(tables):
        where = f"[experiment] traces[{i}]"
        if not isinstance(table, dict):
            raise InvalidRequestError(
                f"{where} must be a table {{ path = ..., format = ... }}, got {table!r}"
            )
        _check_keys(where, table, TRACE_KEYS)
        if "seed" in table and "cv" not in table:  # (runs that differ by a seed would be the same)
            raise InvalidRequestError(
                f"{where}: seed draws the Gamma arrivals of cv; without cv the trace keeps its own "
                "timestamps and the seed draws nothing"
            )
        path, fmt, file = resolve_source(where, table, base_dir)
        knobs = {k: _listed(table[k]) for k in KNOBS if k in table}
        for k, values in knobs.items():
            _no_duplicates(f"{where} {k}", values)
        choices = [[(k, parse_knob(where, k, v)) for v in values] for k, values in knobs.items()]
        listed = tuple(k for k in knobs if isinstance(table[k], list))
        for combo in itertools.product(*choices):
            specs.append(TraceSpec(path, fmt, **dict(combo), file=file, listed=listed))
    _no_duplicates("[experiment] traces", specs)
    return tuple(specs)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _axes(data: dict[str, Any]) -> list[Axis]:
    """Every key of every ServeConfig section, typed; scalars are axes of one value."""
    base = ServeConfig()
    sections = [f.name for f in dataclasses.fields(ServeConfig)]
    axes: list[Axis] = []
    for section, table in data.items():
        if section == "experiment":
            continue
        if section not in sections:
            known = ", ".join(["experiment", *sections])
            raise InvalidRequestError(f"unknown section [{section}]; known sections: {known}")
        if not isinstance(table, dict):
            raise InvalidRequestError(f"[{section}] must be a table, got {table!r}")
        hints = typing.get_type_hints(type(getattr(base, section)))
        for key, value in table.items():
            if key not in hints:
                known = ", ".join(sorted(hints))
                raise InvalidRequestError(f"[{section}]: unknown key {key!r}; known keys: {known}")
            if (section, key) in _SET_BY_EXPERIMENT:
                what = _SET_BY_EXPERIMENT[section, key]
                raise InvalidRequestError(f"[{section}] {key}: set it with [experiment] {what} instead")
            values = _listed(value)
            if not values:
                raise InvalidRequestError(f"[{section}] {key} is an empty list: it would give no runs")
            _no_duplicates(f"[{section}] {key}", values)
            typed = tuple(_typed(section, key, v, hints[key]) for v in values)
            axes.append(Axis(section, key, typed, is_listed=isinstance(value, list)))
    return axes


def _typed(section: str, key: str, value: Any, want: Any) -> Any:
    """`value` as the field's type; an int is accepted for a float (TOML writes `1`, not `1.0`)."""
    if isinstance(want, type):
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or isinstance(value, bool) != (want is bool):
            raise InvalidRequestError(f"[{section}] {key} must be {want.__name__}, got {value!r}")
    if (section, key) == ("router", "mode") and value not in ROUTER_MODES:
        raise InvalidRequestError(f"[router] mode: unknown mode {value!r}; known: {', '.join(ROUTER_MODES)}")
    return value
