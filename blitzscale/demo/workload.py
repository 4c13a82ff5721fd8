"""The demo's workload: a slice of the Azure LLM 2023 code trace shipped in the package,
thinned and clamped to what CPU workers serve in a minute or two."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import as_file, files

from blitzscale.client.traces import TraceRequest, load_trace, transform

SLICE = "azure_code_2023_slice.csv"  # CC-BY-4.0, see blitzscale/data/README.md


@dataclass(frozen=True)
class Workload:
    rate_scale: float = 0.07  # keep 7% of the requests (evenly spread)
    time_scale: float = 1.0
    max_input: int = 192  # prompt tokens
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
