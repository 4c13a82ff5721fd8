"""Plans follow the nodes (ClusterSnapshot.host_of_rank, from Ray or ranks_per_host): new
instances go on the weights' source node first and a chain visits one node after another,
so it crosses between nodes once per node; without a multicast each target gets a source on
its own node when there is one."""

from __future__ import annotations

from itertools import pairwise

from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.host_cache import HostCacheState
from blitzscale.control.policies import LoadAction, by_node, scale_actions
from blitzscale.control.snapshot import ClusterSnapshot
from blitzscale.control.snapshot import InstanceState as S

from .builders import inst, snap, want

# Ranks 0, 2, 4 on node 0; 1, 3, 5 on node 1 (as Ray may interleave bundles).
INTERLEAVED = (0, 1, 0, 1, 0, 1)


def _act(s: ClusterSnapshot, policy: str, prefill: int, decode: int) -> list[LoadAction]:
    out = scale_actions(
        s, want(prefill, decode), PolicyConfig(name=policy), PlannerConfig(), HostCacheState()
    )
    return [a for a in out if isinstance(a, LoadAction)]


def test_each_node_gets_its_weights_over_nvlink_where_it_can() -> None:
    # The decode instance on rank 1 (node 1) is the chosen source: free ranks on node 1 come
    # first, in a chain of their own (NVLink), so they do not wait at the pace of a chain
    # that crosses to another node (a NIC). Node 0 has a model holder too (the prefill
    # instance on rank 0): its targets load from it, over NVLink, crossing no network.
    s = snap(
        inst(0, S.PREFILL, running=4), inst(1, S.DECODE, running=9), free=(2, 3, 4, 5), hosts=INTERLEAVED
    )
    local, other = _act(s, "blitz-nolive", 5, 1)
    assert local == LoadAction((3, 5), "network", (1,), multicast=True)
    assert other == LoadAction((2, 4), "network", (0,), multicast=True)
    for a in (local, other):
        assert {INTERLEAVED[r] for r in (*a.sources, *a.target_ranks)} == {INTERLEAVED[a.sources[0]]}
    # Fewer targets than free ranks: those on the source's node are taken.
    (b,) = _act(s, "blitz-nolive", 3, 1)
    assert b.target_ranks == (3, 5)


def test_nodes_that_hold_no_copy_are_one_chain_crossing_once_per_node() -> None:
    hosts = (0, 1, 1, 2, 2, 0)  # the source (rank 0) on node 0; nodes 1 and 2 hold nothing
    s = snap(inst(0, S.DECODE, running=9), free=(1, 2, 3, 4, 5), hosts=hosts, pd_mode=True)
    local, remote = _act(s, "blitz-nolive", 6, 1)
    assert local == LoadAction((5,), "network", (0,), multicast=True)
    assert remote.sources == (0,) and sorted(remote.target_ranks) == [1, 2, 3, 4]
    crossings = sum(hosts[x] != hosts[y] for x, y in pairwise((0, *remote.target_ranks)))
    assert crossings == 2  # into node 1, then into node 2


def test_without_topology_the_order_is_the_ranks_own() -> None:
    s = snap(inst(0, S.PREFILL, running=4), inst(1, S.DECODE, running=9), free=(2, 3, 4, 5))
    (a,) = _act(s, "blitz-nolive", 5, 1)
    assert a.target_ranks == (2, 3, 4, 5)


def test_one_source_per_target_prefers_one_on_the_targets_node() -> None:
    hosts = (0, 0, 1, 1, 0, 1)  # sources: rank 0 (node 0) and rank 2 (node 1)
    s = snap(
        inst(0, S.DECODE, idle_for=0.1),
        inst(2, S.DECODE, idle_for=0.1),
        inst(1, S.PREFILL, running=5),
        free=(3, 4, 5),
        hosts=hosts,
        pd_mode=True,
    )
    loads = _act(s, "network", 4, 2)
    assert len(loads) == 3, loads
    for a in loads:
        assert hosts[a.sources[0]] == hosts[a.target_ranks[0]], loads


def test_by_node_groups_slots_nearest_first() -> None:
    s = snap(free=(0, 1, 2, 3, 4, 5), hosts=(0, 1, 2, 0, 1, 2))
    slots = [(r,) for r in range(6)]
    assert by_node(s, slots, near=(2,)) == [(2,), (5,), (0,), (3,), (1,), (4,)]
    assert by_node(s, slots, near=()) == [(0,), (3,), (1,), (4,), (2,), (5,)]
