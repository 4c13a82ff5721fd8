"""Small constructors for hand-computed snapshots: every number in a test is visible in it."""

from __future__ import annotations

from blitzscale.control.planner import Desired
from blitzscale.control.snapshot import ClusterSnapshot, InstanceView
from blitzscale.control.snapshot import InstanceState as S
from blitzscale.control.states import holds_weights

NOW = 100.0


def inst(
    id: int,
    state: S,
    *,
    ranks: tuple[int, ...] | None = None,
    running: int = 0,
    waiting: int = 0,
    used: int = 0,
    total: int = 0,
    idle_for: float | None = None,
    loaded_for: float | None = None,
    load_s: float = 0.0,
) -> InstanceView:
    """An instance on rank `id` (unless `ranks`); `idle_for`: idle for that long before NOW;
    `loaded_for`: its last load ended that long before NOW, and took `load_s`."""
    idle_since = None if idle_for is None else NOW - idle_for
    loaded_at = None if loaded_for is None else NOW - loaded_for
    return InstanceView(
        id, ranks or (id,), state, running, waiting, used, total, idle_since, loaded_at, load_s
    )


def snap(
    *instances: InstanceView,
    now: float = NOW,
    queued: int = 0,
    live: int = 0,
    migrating: int = 0,
    free: tuple[int, ...] = (),
    holders: tuple[int, ...] | None = None,
    host_holder: int | None = None,
    tp: int = 1,
    pd_mode: bool = True,
    hosts: tuple[int, ...] = (),
) -> ClusterSnapshot:
    """By default the pool's GPU holders are the ranks of every instance holding weights."""
    if holders is None:
        holders = tuple(sorted(r for i in instances if holds_weights(i.state) for r in i.ranks))
    return ClusterSnapshot(
        now, tuple(instances), queued, live, migrating, free, holders, host_holder, tp, pd_mode, hosts
    )


def want(prefill: int, decode: int = 0) -> Desired:
    """A planner decision with only the targets set (policies read nothing else)."""
    return Desired(prefill, prefill, decode, decode, prefill, decode)
