"""A simulated live target's weights on the virtual clock: the `Readiness` its engine's live
queue asks (model/readiness.py). The L + 2 segments (embedding, layers, head) land one
after another, evenly over the transfer, the last when the transfer ends."""

from __future__ import annotations

import math

from blitzscale import clock

EPS = 1e-9  # a timer may fire this much early on the virtual clock


class ClockReadiness:
    def __init__(self, start: float, end: float, num_segments: int) -> None:
        self.start = start
        self.end = end
        self.num_segments = num_segments

    def landed_at(self, segment: int) -> float:
        span = max(0.0, self.end - self.start)
        return self.start + span * (segment + 1) / self.num_segments

    def is_ready(self, segment: int) -> bool:
        return clock.now() + EPS >= self.landed_at(segment)

    @property
    def all_ready(self) -> bool:
        return clock.now() + EPS >= self.end

    @property
    def num_ready_prefix(self) -> int:
        if self.all_ready:
            return self.num_segments
        span = self.end - self.start
        n = math.floor(self.num_segments * (clock.now() + EPS - self.start) / span) if span > 0 else 0
        while n > 0 and not self.is_ready(n - 1):  # (rounding)
            n -= 1
        return max(0, min(self.num_segments, n))

    def remaining_s(self) -> float:
        return max(0.0, self.end - clock.now())

    def next_landing(self) -> float | None:
        """When the next segment lands (None: all have)."""
        if self.all_ready:
            return None
        return self.landed_at(self.num_ready_prefix)
