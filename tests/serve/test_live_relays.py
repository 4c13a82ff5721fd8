"""Relays of a live target whose source died (serve/live.py `drop_dead_relays`), with the
router's side reduced to what LiveScaling asks of it and a data plane that records what it
is told to send."""

from __future__ import annotations

from typing import Any

from blitzscale.messages import AbortMsg, Message, SendRelayMsg
from blitzscale.serve.live import LiveScaling
from blitzscale.serve.state import ControlState, Relay


class _Recorded:
    """A data plane that keeps what the router sends, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, Message]] = []

    async def send(self, rank: int, msg: Message) -> None:
        self.sent.append((rank, msg))

    def send_nowait(self, rank: int, msg: Message) -> None:
        self.sent.append((rank, msg))

    async def recv(self) -> Message:
        raise AssertionError("nothing is received here")


class _Router:
    def __init__(self) -> None:
        self.state = ControlState()
        self.data = _Recorded()
        self.connected: set[int] = set()
        self.requests: dict[str, Any] = {}

    def budget_tokens(self, model: str) -> int:
        return 1024

    def request_of(self, wire_id: str) -> Any:
        return self.requests.get(wire_id)

    def lost(self, r: Any, why: str, dead: set[int] | None = None) -> None:
        raise AssertionError("no request is lost here")

    def wake(self) -> None:
        pass


def test_a_task_given_back_by_a_dead_source_is_dropped_if_its_client_left() -> None:
    """The client left while its task waited to be relayed (the router forgot it), then the
    source died before the relay was sent: the target gets the task back and must drop it,
    or it runs on for nobody (in pd mode its KV would be held for a migration that never
    comes: a leak the soak saw once). A relay to a live source is left alone."""
    router = _Router()
    live = LiveScaling(router, pd_mode=True)
    router.state.add_relay("gone#1", Relay(target=2, source=1))
    router.state.add_relay("other#1", Relay(target=3, source=0))
    live.drop_dead_relays({1})
    assert router.data.sent == [
        (2, SendRelayMsg(request_id="gone#1", dst_rank=-1)),
        (2, AbortMsg(request_id="gone#1")),
    ]
    assert set(live.relays) == {"other#1"}
