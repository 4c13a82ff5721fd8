"""Per-segment readiness counters: a segment is usable once all its pieces have landed.

Weights arrive segment by segment in layer order (from disk, host memory or another GPU);
a segment may arrive in several stripes, so each segment counts pieces against the number
it expects. The engine runs layer i only when its segment is ready.
"""

from __future__ import annotations

import threading


class SegmentReadiness:
    def __init__(self, num_segments: int, pieces_per_segment: int = 1) -> None:
        self._cond = threading.Condition()
        self._expected = [pieces_per_segment] * num_segments
        self._count = [0] * num_segments

    @property
    def num_segments(self) -> int:
        return len(self._count)

    def set_expected(self, pieces_per_segment: int) -> None:
        with self._cond:
            self._expected = [pieces_per_segment] * len(self._count)

    def add(self, segment: int, pieces: int = 1) -> None:
        """Record `pieces` more pieces of `segment` as landed."""
        with self._cond:
            self._count[segment] += pieces
            if self._count[segment] > self._expected[segment]:
                raise RuntimeError(
                    f"segment {segment} got {self._count[segment]} pieces, expected {self._expected[segment]}"
                )
            self._cond.notify_all()

    def mark_all_ready(self) -> None:
        with self._cond:
            self._count = list(self._expected)
            self._cond.notify_all()

    def reset(self) -> None:
        with self._cond:
            self._count = [0] * len(self._count)

    def is_ready(self, segment: int) -> bool:
        return self._count[segment] >= self._expected[segment]

    @property
    def all_ready(self) -> bool:
        return all(c >= e for c, e in zip(self._count, self._expected, strict=True))

    @property
    def num_ready_prefix(self) -> int:
        """Number of leading segments that are all ready."""
        n = 0
        for c, e in zip(self._count, self._expected, strict=True):
            if c < e:
                break
            n += 1
        return n

    def wait(self, segment: int, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.is_ready(segment), timeout)
