"""A transfer's per-receiver result (`TransferResult`) from its ranks' typed replies."""

from __future__ import annotations

import pytest

from blitzscale.cluster.results import TransferResult, transfer_bytes
from blitzscale.cluster.shards import transfer_report
from blitzscale.messages import TransferRankResult


def test_each_receiver_is_timed_from_when_it_and_everything_upstream_was_ready() -> None:
    chains = [[0, 1, 2]]
    results = {
        0: TransferRankResult(start=100.0, received_at=99.9, done_at=101.0, bytes_sent=800),
        1: TransferRankResult(
            start=100.5, received_at=100.0, done_at=102.0, first_layer_at=100.75, bytes_received=800,
            is_target=True, ready_order=[0, 1],
        ),
        2: TransferRankResult(
            start=100.2, received_at=100.1, done_at=102.5, bytes_received=800,
            is_target=True, ready_order=[1, 0],
        ),
    }  # fmt: skip
    report = transfer_report(results, [1, 2], {r: chains for r in (0, 1, 2)}, replied_at=103.0)
    assert sorted(report) == [1, 2] and all(isinstance(v, TransferResult) for v in report.values())
    one, two = report[1], report[2]
    assert one.seconds == pytest.approx(1.5) and one.first_layer_s == pytest.approx(0.25)
    assert one.alloc_s == pytest.approx(0.5) and one.ready_order == (0, 1)
    # rank 2 waits on rank 1 upstream (ready at 100.5), not on its own start (100.2)
    assert two.seconds == pytest.approx(2.0) and two.first_layer_s == pytest.approx(2.0)
    # the head (rank 0) finished sending 1.0 s after the earliest start; replies at 3.0 s
    assert one.senders_done_s == two.senders_done_s == pytest.approx(1.0)
    assert one.replied_s == pytest.approx(3.0)
    assert one.GBps == pytest.approx(800 / 1.5 / 1e9) and transfer_bytes(report) == 1600
