"""A load refused for want of device memory is not the rank's fault (issue "Many models on
one GPU"): the worker answers `no_room` (an out-of-memory error while its buffer is
allocated), and the loads put the rank back to wait a short while, without counting the
failure toward taking it out of service; any other failure still counts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from blitzscale.cluster.calls import ClusterOpError
from blitzscale.control.backoff import LoadBackoff
from blitzscale.messages import ReplyMsg, decode, encode
from blitzscale.serve.loads import Loads


class _Owner:
    """The few parts of the scaler `Loads._load_failed` uses."""

    def __init__(self) -> None:
        self.moves: list[tuple[int, str]] = []
        self.restarted: list[int] = []
        self.backoff = LoadBackoff(base_s=1.0, max_s=60.0, max_failures=3)
        self.router: Any = SimpleNamespace(respawner=SimpleNamespace(restart=self.restarted.append))
        self.cluster: Any = SimpleNamespace(pool=SimpleNamespace(gpu_holders=lambda model: []))
        self.state: Any = SimpleNamespace(move=lambda i, state, why: self.moves.append((i, why)))
        self.failures = 0
        self.metrics: Any = SimpleNamespace(load_failures=SimpleNamespace(inc=self._count))
        self.tp = 1

    def _count(self) -> None:
        self.failures += 1

    def instance_ids(self, ranks: Any) -> tuple[int, ...]:
        return tuple(ranks)


def _error(no_room: bool) -> ClusterOpError:
    reply = ReplyMsg(op_id=1, rank=2, ok=False, error="CUDA out of memory", no_room=no_room)
    return ClusterOpError("load m on rank 2", {2: reply})


def test_no_room_waits_without_counting_other_failures_count() -> None:
    owner = _Owner()
    loads = Loads(owner)  # type: ignore[arg-type]
    for _ in range(5):  # more than max_failures: never out of service
        loads._load_failed((2,), _error(no_room=True), "m")
    assert owner.backoff.out_of_service == set() and owner.backoff.num_failed == 0
    assert owner.failures == 0 and owner.restarted == []
    assert owner.moves == [(2, "(no room)")] * 5
    assert not owner.backoff.may_load(2, 0.0)  # (it waits base_s before the next try)

    for _ in range(3):
        loads._load_failed((2,), _error(no_room=False), "m")
    assert owner.backoff.out_of_service == {2} and owner.restarted == [2] and owner.failures == 3


def test_the_reply_and_the_error_say_no_room() -> None:
    back = decode(encode(ReplyMsg(op_id=1, rank=0, ok=False, error="x", no_room=True)))
    assert isinstance(back, ReplyMsg) and back.no_room
    assert _error(True).no_room and not _error(False).no_room
    mixed = ClusterOpError(
        "load",
        {
            0: ReplyMsg(op_id=1, rank=0, ok=False, error="oom", no_room=True),
            1: ReplyMsg(op_id=1, rank=1, ok=False, error="disk gone"),
            2: ReplyMsg(op_id=1, rank=2, ok=True),
        },
    )
    assert not mixed.no_room  # (one rank failed for another reason)


def test_backoff_no_room_waits_base_s_and_keeps_the_count() -> None:
    b = LoadBackoff(base_s=2.0, max_failures=3)
    b.failed(0, 0.0)
    b.no_room(0, 10.0)
    assert not b.may_load(0, 11.9) and b.may_load(0, 12.0)
    assert not b.failed(0, 12.0)  # the second counted failure: still in service
    assert b.failed(0, 20.0) and b.out_of_service == {0}
