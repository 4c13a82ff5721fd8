"""A scale event: one load onto new instances ("up") or one release ("down"), as the scaler
records it (`Scaler.events`). Reports and saved runs hold its JSON (`to_json`), whose shape
saved runs already have: the optional fields appear only when they say something."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Direction = Literal["up", "down"]


@dataclass(frozen=True)
class ScaleEvent:
    """`time` on the clock the scaler ran on (runs shift it to their start: `shifted`);
    `seconds` the whole operation as the scaler saw it. A transfer adds, over its targets,
    the link's own time (`link_s`), the first usable layer (`first_layer_s`), when the
    senders were done and when every reply was in; a release says whether the worker kept
    its buffer and engine as its standby."""

    model: str
    time: float
    direction: Direction
    path: str  # "disk", "network", "host" (up); "release" (down)
    ranks: tuple[int, ...]
    sources: tuple[int, ...]
    seconds: float
    bytes: int
    nodes: tuple[str, ...]  # where the ranks live, each node once
    source_nodes: tuple[str, ...]
    link_s: float | None = None
    first_layer_s: float | None = None
    senders_done_s: float | None = None
    replied_s: float | None = None
    standby: bool | None = None

    @property
    def is_up(self) -> bool:
        return self.direction == "up"

    def shifted(self, t0: float) -> ScaleEvent:
        """The same event with its time counted from `t0`."""
        return dataclasses.replace(self, time=self.time - t0)

    def to_json(self) -> dict[str, Any]:
        """As reports, events.json and the demo write it (lists; no empty optional field)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def events_json(events: list[ScaleEvent]) -> list[dict[str, Any]]:
    return [e.to_json() for e in events]
