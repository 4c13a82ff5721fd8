"""One trace of a batch: the file (or the slice shipped in the package) and how it is shaped.

A `TraceSpec` is a value: two runs with equal specs replay exactly the same requests, which
is what makes their SLOs comparable. Files are parsed once per process and shaped per run.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any

from blitzscale.client.traces import (
    FORMATS,
    TraceRequest,
    gamma_arrivals,
    load_trace,
    transform,
    with_lengths,
)
from blitzscale.demo.workload import SLICE
from blitzscale.errors import BlitzScaleError, InvalidRequestError

DEMO = "demo"  # `path = "demo"`: the Azure code slice that `blitzscale demo` replays
KNOBS: dict[str, type] = {
    "rate_scale": float,
    "time_scale": float,
    "duration": float,
    "max_input": int,
    "max_output": int,
    "cv": float,
    "seed": int,
}
_MAY_BE_ZERO = ("cv", "seed")  # (the other knobs must be > 0, or >= 1 for counts)
TRACE_KEYS = ("path", "format", *KNOBS)
_SHORT = {
    "rate_scale": "rate",
    "time_scale": "time",
    "duration": "dur",
    "max_input": "in",
    "max_output": "out",
    "cv": "cv",
    "seed": "seed",
}


@dataclass(frozen=True)
class TraceSpec:
    """A trace and its shaping, as `blitzscale.client.traces.transform` applies it."""

    path: str  # as written in the template: the run id and hash must not depend on the cwd
    format: str
    rate_scale: float = 1.0
    time_scale: float = 1.0
    duration: float | None = None
    max_input: int | None = None
    max_output: int | None = None
    # Gamma arrivals: the shaped trace's requests, in order, re-timed with Gamma gaps of
    # this coefficient of variation at the same mean rate over the same span (1: Poisson,
    # above 1: burstier), drawn with `seed`; None keeps the trace's own timestamps.
    cv: float | None = None
    seed: int = 0
    file: Path | None = field(default=None, compare=False)  # resolved path; None for the demo slice
    listed: tuple[str, ...] = field(default=(), compare=False)  # knobs the template fanned out

    @property
    def slug(self) -> str:
        """The label plus each fanned-out knob, for run ids: `demo-rate0.05`."""
        return "-".join([self.label] + [f"{_SHORT[k]}{getattr(self, k):g}" for k in self.listed])

    @property
    def label(self) -> str:
        return DEMO if self.path == DEMO else Path(self.path).stem

    def params(self) -> dict[str, Any]:
        """Everything that decides the requests (not `file`: where the template lay does not)."""
        out = {"path": self.path, "format": self.format}
        out |= {k: getattr(self, k) for k in KNOBS if getattr(self, k) is not None}
        if self.cv is None:  # (the seed draws nothing then: the same requests as before)
            del out["seed"]
        return out

    def describe(self) -> str:
        """Short and readable: `demo rate x0.05 time x2 in<=192 out<=24`."""
        parts = [self.label]
        if self.rate_scale != 1.0:
            parts.append(f"rate x{self.rate_scale:g}")
        if self.time_scale != 1.0:
            parts.append(f"time x{self.time_scale:g}")
        if self.duration is not None:
            parts.append(f"{self.duration:g}s")
        if self.max_input is not None:
            parts.append(f"in<={self.max_input}")
        if self.max_output is not None:
            parts.append(f"out<={self.max_output}")
        if self.cv is not None:
            parts.append(f"gamma cv{self.cv:g} seed{self.seed}")
        return " ".join(parts)


def parse_knob(where: str, key: str, value: Any) -> float | int:
    """One shaping value, typed and in range (transform would refuse it only at run time)."""
    want = KNOBS[key]
    is_number = isinstance(value, want | int) and not isinstance(value, bool)  # 1 is fine for a float
    if not is_number:
        raise InvalidRequestError(f"{where}: {key} must be {want.__name__}, got {value!r}")
    value = want(value)
    if key in _MAY_BE_ZERO:
        low, low_ok = ">= 0", value >= 0
    elif want is int:
        low, low_ok = ">= 1", value >= 1
    else:
        low, low_ok = "> 0", value > 0
    if not low_ok or not math.isfinite(value):
        raise InvalidRequestError(f"{where}: {key} must be {low}, got {value!r}")
    return value


def resolve_source(where: str, table: dict[str, Any], base_dir: Path) -> tuple[str, str, Path | None]:
    """(path as written, format, resolved file) of a trace table; the file must exist."""
    path = table.get("path")
    if not isinstance(path, str) or not path:
        raise InvalidRequestError(f"{where}: path must be a file path or {DEMO!r}, got {path!r}")
    fmt = table.get("format", "azure" if path == DEMO else None)
    if fmt is None:
        raise InvalidRequestError(f"{where}: trace {path!r} needs a format ({', '.join(FORMATS)})")
    if fmt not in FORMATS:
        raise InvalidRequestError(f"{where}: unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    if path == DEMO:
        if fmt != "azure":
            raise InvalidRequestError(f"{where}: the {DEMO!r} slice is an azure trace, not {fmt!r}")
        return path, fmt, None
    file = (base_dir / Path(path).expanduser()).resolve()
    if not file.is_file():
        raise InvalidRequestError(f"{where}: trace file {path!r} not found (looked at {file})")
    return path, fmt, file


@functools.lru_cache(maxsize=8)
def _parsed(file: Path | None, fmt: str) -> tuple[TraceRequest, ...]:
    if file is None:
        with as_file(files("blitzscale.data") / SLICE) as slice_path:
            return tuple(load_trace(slice_path, "azure"))
    return tuple(load_trace(file, fmt))


def load_requests(spec: TraceSpec) -> list[TraceRequest]:
    """The requests one run replays: the parsed trace, shaped by the spec's knobs (and
    re-timed with Gamma arrivals when it has a `cv`)."""
    shaped = transform(
        _parsed(spec.file, spec.format),
        duration=spec.duration,
        time_scale=spec.time_scale,
        rate_scale=spec.rate_scale,
        max_input=spec.max_input,
        max_output=spec.max_output,
    )
    if spec.cv is None or len(shaped) < 2:
        return shaped
    span = shaped[-1].arrival_s - shaped[0].arrival_s
    if not span > 0:
        return shaped
    # n requests over the span: gaps of mean span / (n - 1), arrivals drawn within [0, span]
    arrivals = gamma_arrivals((len(shaped) - 1) / span, spec.cv, span * (1 + 1e-9), spec.seed)
    return with_lengths(arrivals, shaped, 0, 0)


def check_trace(spec: TraceSpec) -> int:
    """Parse and shape now, before any cluster starts: a bad row or an empty slice would
    otherwise fail a run half-way through a batch. Returns the number of requests."""
    try:
        num = len(load_requests(spec))
    except (BlitzScaleError, ValueError, OSError) as e:
        raise InvalidRequestError(f"trace {spec.path!r} ({spec.format}): {e}") from e
    if num == 0:
        raise InvalidRequestError(f"trace {spec.path!r} ({spec.describe()}) has no requests after shaping")
    return num
