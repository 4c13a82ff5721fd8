"""A live target's estimate of when its last layer lands (`SegmentReadiness.remaining_s`,
sent in its `LiveReadyMsg`): the rate its first pieces came at since the transfer began."""

from __future__ import annotations

import time

from blitzscale.model.readiness import SegmentReadiness


def test_remaining_seconds_follow_the_rate_so_far() -> None:
    ready = SegmentReadiness(4, pieces_per_segment=2)
    ready.reset()  # (a transfer's start)
    assert ready.remaining_s() == 0.0  # nothing landed: unknown
    time.sleep(0.2)
    ready.add(0, 2)  # a quarter of the pieces in >= 0.2 s: three quarters to go
    left = ready.remaining_s()
    assert left >= 0.6 - 1e-6
    assert left < 60  # (however slow the machine, the same order)
    for seg in (1, 2, 3):
        ready.add(seg, 2)
    assert ready.remaining_s() == 0.0  # all in
