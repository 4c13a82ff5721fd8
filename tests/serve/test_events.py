"""Scale events are typed (`ScaleEvent`), and their JSON keeps the shape saved runs have."""

from __future__ import annotations

import json

from blitzscale.serve.events import ScaleEvent, events_json

SAVED_KEYS = [
    "model",
    "time",
    "direction",
    "path",
    "ranks",
    "sources",
    "seconds",
    "bytes",
    "nodes",
    "source_nodes",
]


def _up() -> ScaleEvent:
    return ScaleEvent(
        model="m",
        time=12.5,
        direction="up",
        path="network",
        ranks=(2, 3),
        sources=(0, 1),
        seconds=0.75,
        bytes=1000,
        nodes=("local",),
        source_nodes=("local",),
        link_s=0.5,
        first_layer_s=0.1,
        senders_done_s=0.6,
        replied_s=0.7,
    )


def test_a_transfer_event_writes_the_keys_and_lists_saved_runs_have() -> None:
    d = _up().to_json()
    assert list(d) == [*SAVED_KEYS, "link_s", "first_layer_s", "senders_done_s", "replied_s"]
    assert d["ranks"] == [2, 3] and d["sources"] == [0, 1] and d["nodes"] == ["local"]
    assert json.loads(json.dumps(d)) == d


def test_a_release_says_standby_and_leaves_out_what_it_has_not() -> None:
    down = ScaleEvent("m", 3.0, "down", "release", (4,), (), 0.0, 10, ("local",), (), standby=True)
    d = down.to_json()
    assert list(d) == [*SAVED_KEYS, "standby"] and d["standby"] is True and d["sources"] == []
    assert not down.is_up and _up().is_up


def test_shifted_counts_time_from_a_start_and_changes_nothing_else() -> None:
    e = _up()
    s = e.shifted(10.0)
    assert s.time == 2.5 and s.ranks == e.ranks and s.link_s == e.link_s
    assert events_json([e, s])[1]["time"] == 2.5
