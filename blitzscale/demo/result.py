"""What one policy's run leaves: its summary, records, scale events and report (the demo's,
a batch's and the simulator's runs alike)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from blitzscale.client.record import RequestRecord
from blitzscale.client.summary import Summary
from blitzscale.serve.events import ScaleEvent

Paced = tuple[int, int, float, float]  # a run's paced steps: all, over their reference, compute s, paced s


@dataclass
class RunResult:
    policy: str
    summary: Summary
    records: list[RequestRecord]
    samples: list[tuple[float, int]] = field(default_factory=list)
    events: list[ScaleEvent] = field(default_factory=list)  # times from the run's start
    report: Path | None = None
    live: tuple[int, int, int] = (0, 0, 0)  # requests, layers and relays of live scaling
    by_model: dict[str, list[RequestRecord]] = field(default_factory=dict)  # several models' records
    paced: Paced = (0, 0, 0.0, 0.0)  # the workers' paced steps (worker/pacing.py)
