"""Per-segment readiness counters: a segment is usable once all its pieces have landed.

Weights arrive segment by segment in layer order (from disk, host memory or another GPU);
a segment may arrive in several stripes, so each segment counts pieces against the number
it expects. The engine runs layer i only when its segment is ready.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Readiness(Protocol):
    """What a live engine asks of its weights: which segments it may run."""

    def is_ready(self, segment: int) -> bool: ...

    @property
    def all_ready(self) -> bool: ...

    @property
    def num_ready_prefix(self) -> int: ...

    def remaining_s(self) -> float:
        """Seconds until the last segment lands, as far as can be told (0: unknown or all in)."""
        ...


class SegmentReadiness:
    def __init__(self, num_segments: int, pieces_per_segment: int = 1) -> None:
        self._cond = threading.Condition()
        self._expected = [pieces_per_segment] * num_segments
        self._count = [0] * num_segments
        self._ready_at: list[float | None] = [None] * num_segments
        self._reset_at = time.perf_counter()
        self._failed = ""  # why the load filling these segments stopped, if it did

    @property
    def num_segments(self) -> int:
        return len(self._count)

    def set_expected(self, pieces_per_segment: int | list[int]) -> None:
        """Pieces each segment arrives in (one number for all, or one per segment)."""
        n = len(self._count)
        counts = [pieces_per_segment] * n if isinstance(pieces_per_segment, int) else pieces_per_segment
        if len(counts) != n:
            raise ValueError(f"expected {n} piece counts, got {len(counts)}")
        with self._cond:
            self._expected = list(counts)

    def add(self, segment: int, pieces: int = 1) -> None:
        """Record `pieces` more pieces of `segment` as landed."""
        with self._cond:
            self._count[segment] += pieces
            if self._count[segment] == self._expected[segment]:
                self._ready_at[segment] = time.perf_counter()
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
            self._ready_at = [None] * len(self._count)
            self._reset_at = time.perf_counter()
            self._failed = ""

    def fail(self, why: str) -> None:
        """The load filling these segments stopped: whoever waits on one stops waiting."""
        with self._cond:
            self._failed = why or "the load stopped"
            self._cond.notify_all()

    @property
    def failed(self) -> str:
        return self._failed

    def remaining_s(self) -> float:
        """Seconds until every piece has landed, at the rate they came since the last
        `reset` (a transfer's start); 0 when none has landed yet or all have."""
        with self._cond:
            landed, expected = sum(self._count), sum(self._expected)
            elapsed = time.perf_counter() - self._reset_at
        if landed <= 0 or landed >= expected:
            return 0.0
        return elapsed * (expected - landed) / landed

    def first_ready_at(self, segment: int) -> float | None:
        """perf_counter() time at which segments [0, segment] had all become ready."""
        times = self._ready_at[: segment + 1]
        return None if any(t is None for t in times) else max(times)  # type: ignore[type-var]

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
        """Whether `segment` is ready, once it is, or the load failed, or `timeout` passed."""
        with self._cond:
            return self._cond.wait_for(lambda: self.is_ready(segment) or bool(self._failed), timeout) and (
                self.is_ready(segment)
            )
