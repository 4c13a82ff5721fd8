"""The demo's workload: a slice of the Azure LLM 2023 code trace shipped in the package,
thinned, slowed and clamped to what paced CPU workers serve in two minutes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib.resources import as_file, files

from blitzscale.client.traces import TraceRequest, load_trace, transform

SLICE = "azure_code_2023_slice.csv"  # CC-BY-4.0, see blitzscale/data/README.md
MODEL_NAMES = "abcdefghijklmnopqrstuvwxyz"  # several models: model-a, model-b, ...
MAX_MODELS = len(MODEL_NAMES)


def model_names(n: int) -> list[str]:
    return [f"model-{MODEL_NAMES[k]}" for k in range(n)]


@dataclass(frozen=True)
class Workload:
    """The demo's defaults: sized for its three paced CPU workers (worker/pacing.py), whose
    steps take three times one quiet core's: one instance cannot keep up with the burst,
    three can."""

    rate_scale: float = 0.07  # keep 7% of the requests (evenly spread)
    time_scale: float = 0.5  # at half the trace's speed
    max_input: int = 128  # prompt tokens
    max_output: int = 24  # output tokens
    duration_s: float | None = None

    def requests(self) -> list[TraceRequest]:
        with as_file(files("blitzscale.data") / SLICE) as path:
            trace = load_trace(path, "azure")
        return transform(
            trace,
            duration=self.duration_s,
            time_scale=self.time_scale,
            rate_scale=self.rate_scale,
            max_input=self.max_input,
            max_output=self.max_output,
        )


def model_slices(
    requests: list[TraceRequest], names: list[str], rounds: int = 2
) -> dict[str, list[TraceRequest]]:
    """Several models' own traces from one: model k gets the k-th of len(names) consecutive
    time slices of `requests`, at its own times, and again one trace length (and a slice)
    later in each further round. Between its rounds a model is idle for the others' slices, long enough
    for a keep-alive shorter than that to take it to zero, and its next round brings it
    back."""
    if not requests or not names:
        return {n: [] for n in names}
    span = max(r.arrival_s for r in requests)
    width = span / len(names) if span > 0 else 1.0
    out: dict[str, list[TraceRequest]] = {}
    for k, name in enumerate(names):
        last = k == len(names) - 1
        mine = [r for r in requests if k * width <= r.arrival_s and (last or r.arrival_s < (k + 1) * width)]
        out[name] = [
            dataclasses.replace(r, arrival_s=r.arrival_s + j * (span + width))
            for j in range(rounds)
            for r in mine
        ]
    return out


def interleaved(by_model: dict[str, list[TraceRequest]]) -> tuple[list[TraceRequest], list[str]]:
    """Every model's requests in one trace by arrival, and each request's model."""
    pairs = sorted(((r, n) for n, rs in by_model.items() for r in rs), key=lambda x: x[0].arrival_s)
    return [r for r, _ in pairs], [n for _, n in pairs]
