"""Scale actions per policy (design §4, §6): exact action lists on hand-built snapshots."""

from __future__ import annotations

import pytest

from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.host_cache import HostCacheState
from blitzscale.control.planner import Desired, desired_counts
from blitzscale.control.policies import (
    DrainAction,
    LoadAction,
    MutateAction,
    ReleaseAction,
    ReviveAction,
    ScaleAction,
    scale_actions,
    source_instances,
)
from blitzscale.control.snapshot import ClusterSnapshot
from blitzscale.control.snapshot import InstanceState as S

from .builders import inst, snap, want

PLANNER = PlannerConfig()  # drain after 0.333 s idle, release warm instances after 1 s
NO_CACHE = HostCacheState()


def act(s: ClusterSnapshot, d: Desired, policy: str = "blitz", max_sources: int = 4) -> list[ScaleAction]:
    return scale_actions(s, d, PolicyConfig(name=policy, max_sources=max_sources), PLANNER, NO_CACHE)


def test_scale_from_zero_without_a_host_copy_reads_disk() -> None:
    # One prefill and one decode wanted: two prefill loads, one of which a later call mutates.
    empty = snap(free=(0, 1, 2, 3))
    for policy in ("blitz", "network", "network-multicast"):
        assert act(empty, want(1, 1), policy) == [LoadAction((0,), "disk"), LoadAction((1,), "disk")]


def test_scale_from_zero_streams_the_one_host_copy_without_live_serving() -> None:
    empty = snap(free=(0, 1, 2, 3), host_holder=3)
    assert act(empty, want(1, 1)) == [LoadAction((0, 1), "host", (3,), multicast=True)]
    assert act(empty, want(1, 1), "network") == [
        LoadAction((0,), "host", (3,)),
        LoadAction((1,), "host", (3,)),
    ]


def test_one_eligible_source_feeds_one_chain_to_all_targets() -> None:
    s = snap(inst(0, S.PREFILL, running=4), inst(1, S.DECODE, running=9), free=(2, 3, 4))
    # Weights come from the decode instance; the prefill one relays the live targets' tasks.
    assert act(s, want(3, 1)) == [LoadAction((2, 3), "network", (1,), multicast=True, live=True, partner=0)]
    assert act(s, want(3, 1), "blitz-nolive") == [LoadAction((2, 3), "network", (1,), multicast=True)]
    assert act(s, want(3, 1), "network-multicast") == [LoadAction((2, 3), "network", (1,), multicast=True)]
    assert act(s, want(3, 1), "network") == [
        LoadAction((2,), "network", (1,)),
        LoadAction((3,), "network", (1,)),
    ]


def test_two_eligible_sources_stripe_least_loaded_first() -> None:
    s = snap(inst(0, S.PREFILL), inst(1, S.DECODE, running=5), inst(2, S.DECODE, running=2), free=(3, 4, 5))
    assert act(s, want(3, 2)) == [LoadAction((3, 4), "network", (2, 1), multicast=True, live=True, partner=0)]
    assert act(s, want(3, 2), max_sources=1) == [
        LoadAction((3, 4), "network", (2,), multicast=True, live=True, partner=0)
    ]
    # Without multicast each target gets its own source, round robin.
    assert act(s, want(3, 2), "network") == [
        LoadAction((3,), "network", (2,)),
        LoadAction((4,), "network", (1,)),
    ]


def test_only_decode_and_idle_instances_send_weights_by_default() -> None:
    s = snap(
        inst(0, S.PREFILL, running=1),  # busy prefill: its outbound link carries KV migrations
        inst(1, S.PREFILL, idle_for=0.1),  # idle prefill: fine
        inst(2, S.DECODE, running=3),
        inst(3, S.OLD_PREFILL),  # paired with a live target
        inst(4, S.NEW_PREFILL),  # has only part of the weights
        inst(5, S.LOADING),
        inst(6, S.SHUTTING_NULL, idle_for=0.1),
        inst(7, S.DECODE, idle_for=0.2),
        inst(8, S.DECODE),
        holders=(0, 1, 2, 3, 6, 7),  # 8's copy is not in the pool (yet)
    )
    assert [i.id for i in source_instances(s, PolicyConfig())] == [1, 6, 7, 2]
    everyone = PolicyConfig(sources_only_decode=False)
    assert [i.id for i in source_instances(s, everyone)] == [1, 6, 7, 0, 2]


def test_busy_prefill_instances_send_only_when_nothing_else_holds_the_model() -> None:
    s = snap(inst(0, S.PREFILL, running=3), inst(1, S.PREFILL, running=1), free=(2, 3), host_holder=3)
    assert act(s, want(3)) == [LoadAction((2,), "network", (1, 0), multicast=True, live=True, partner=0)]


def test_warm_and_draining_instances_are_revived_before_anything_loads() -> None:
    s = snap(
        inst(0, S.PREFILL, running=8),
        inst(1, S.DECODE, running=8),
        inst(5, S.SHUTTING_NULL, idle_for=0.1),
        inst(6, S.SHUTTING_PREFILL, running=1),
        free=(2, 3),
    )
    assert act(s, want(2, 1)) == [ReviveAction(6, "prefill")]
    assert act(s, want(3, 1)) == [ReviveAction(6, "prefill"), ReviveAction(5, "prefill")]
    assert act(s, want(4, 1)) == [
        ReviveAction(6, "prefill"),
        ReviveAction(5, "prefill"),
        LoadAction((2,), "network", (1,), multicast=True, live=True, partner=0),
    ]
    # Decode growth takes the warm instance too: reviving needs no load, so no inbound fight.
    assert act(s, want(1, 2)) == [ReviveAction(5, "decode")]


def test_decode_grows_by_mutating_the_least_loaded_prefill_instance() -> None:
    s = snap(inst(0, S.PREFILL, running=3), inst(1, S.PREFILL, running=1), inst(2, S.DECODE), free=(3, 4))
    assert act(s, want(2, 2)) == [
        MutateAction(1),
        LoadAction((3,), "network", (2,), multicast=True, live=True, partner=0),
    ]
    # A tie: 0 is mutated (lowest id), so 1 relays, though 0 would win the tie otherwise.
    busy1 = snap(inst(0, S.PREFILL, running=1), inst(1, S.PREFILL, running=1), inst(2, S.DECODE), free=(3, 4))
    mutate, load = act(busy1, want(2, 2))
    assert mutate == MutateAction(0) and isinstance(load, LoadAction) and load.partner == 1
    assert act(s, want(1, 2)) == [MutateAction(1)]


def test_the_last_serving_prefill_instance_is_never_mutated() -> None:
    # Prefill 0 stays; a new prefill instance is loaded now and mutated by a later call.
    s = snap(inst(0, S.PREFILL), inst(1, S.DECODE, running=2), inst(9, S.LOADING), free=(2, 3))
    assert act(s, want(1, 2)) == []  # the loading instance is already the spare
    s = snap(inst(0, S.PREFILL), inst(1, S.DECODE, running=2), free=(2, 3))
    assert act(s, want(1, 2)) == [LoadAction((2,), "network", (1,), multicast=True, live=True, partner=0)]


def test_cold_start_in_pd_mode_takes_a_load_then_a_mutation() -> None:
    cfg, policy = PlannerConfig(), PolicyConfig()
    step1 = snap(free=(0, 1, 2, 3), host_holder=0)
    assert scale_actions(step1, desired_counts(step1, cfg), policy, cfg, NO_CACHE) == [
        LoadAction((0, 1), "host", (0,), multicast=True)
    ]
    loading = snap(inst(0, S.LOADING), inst(1, S.LOADING), free=(2, 3), holders=())
    assert scale_actions(loading, desired_counts(loading, cfg), policy, cfg, NO_CACHE) == []
    loaded = snap(inst(0, S.PREFILL, idle_for=0.05), inst(1, S.PREFILL, idle_for=0.05), free=(2, 3))
    assert scale_actions(loaded, desired_counts(loaded, cfg), policy, cfg, NO_CACHE) == [MutateAction(0)]


def test_scale_down_drains_the_instance_idle_longest_once_past_the_threshold() -> None:
    s = snap(
        inst(0, S.PREFILL, idle_for=0.5),
        inst(1, S.PREFILL, idle_for=2.0),
        inst(2, S.PREFILL, running=1),
        inst(3, S.DECODE, idle_for=0.2),  # idle, but not for 0.333 s yet
        inst(4, S.DECODE, idle_for=0.3),
        inst(5, S.DECODE, idle_for=1.0),
    )
    assert act(s, want(2, 2)) == [DrainAction(1), DrainAction(5)]
    assert act(s, want(1, 1)) == [DrainAction(1), DrainAction(5)]  # one per role per call
    fresh = snap(inst(0, S.PREFILL, idle_for=0.3), inst(1, S.PREFILL, running=1))
    assert act(fresh, want(1)) == []


def test_an_instance_is_not_drained_or_released_sooner_than_a_reload_would_pay_back() -> None:
    """A 1.2 s load (CPU workers) keeps the instance 3 x 1.2 s; a 45 ms one (NVLink) leaves
    the paper's sub-second thresholds in charge."""
    slow = snap(
        inst(0, S.PREFILL, running=1),
        inst(1, S.PREFILL, idle_for=2.0, loaded_for=2.5, load_s=1.2),  # idle 2 s < 3.6 s
        inst(2, S.DECODE, running=1),
        inst(3, S.DECODE, idle_for=1.0, loaded_for=1.0, load_s=0.045),
    )
    assert act(slow, want(1, 1)) == [DrainAction(3)]
    later = snap(
        inst(0, S.PREFILL, running=1),
        inst(1, S.PREFILL, idle_for=3.7, loaded_for=3.7, load_s=1.2),
        inst(2, S.DECODE, running=1),
    )
    assert act(later, want(1, 1)) == [DrainAction(1)]
    just_loaded = snap(
        inst(0, S.PREFILL, running=1), inst(1, S.PREFILL, idle_for=9.0, loaded_for=1.0, load_s=1.2)
    )
    assert act(just_loaded, want(1)) == []  # idle since before its load ended: still too fresh
    warm = snap(
        inst(0, S.PREFILL, running=1),
        inst(1, S.DECODE, running=1),
        inst(4, S.SHUTTING_NULL, idle_for=2.0, load_s=1.2),
        inst(5, S.SHUTTING_NULL, idle_for=3.7, load_s=1.2),
    )
    assert act(warm, want(1, 1)) == [ReleaseAction(5)]


def test_the_last_serving_instance_of_a_role_is_never_drained() -> None:
    s = snap(inst(0, S.PREFILL, idle_for=5), inst(1, S.LOADING), inst(2, S.DECODE, idle_for=5))
    assert act(s, want(1, 1)) == []


def test_warm_instances_are_released_after_the_keep_time() -> None:
    s = snap(
        inst(0, S.PREFILL, running=1),
        inst(1, S.DECODE, running=1),
        inst(4, S.SHUTTING_NULL, idle_for=1.5),
        inst(5, S.SHUTTING_NULL, idle_for=0.5),
        inst(6, S.SHUTTING_NULL, idle_for=3.0),
    )
    assert act(s, want(1, 1)) == [ReleaseAction(4), ReleaseAction(6)]
    assert act(s, want(2, 1)) == [ReviveAction(4, "prefill"), ReleaseAction(6)]


def test_actions_come_in_execution_order() -> None:
    s = snap(
        inst(0, S.PREFILL, idle_for=1.0),
        inst(1, S.PREFILL, idle_for=2.0),
        inst(2, S.PREFILL, idle_for=3.0),
        inst(3, S.PREFILL, running=1),
        inst(4, S.DECODE, running=5),
        inst(5, S.SHUTTING_NULL, idle_for=4.0),
    )
    # Decode 1 -> 4: revive 5, mutate 0 and 1 (unloaded, lowest ids); prefill 4 -> 2, 1 wanted:
    # drain 2, idle longest. The revived warm instance is not released.
    assert act(s, want(1, 4)) == [ReviveAction(5, "decode"), MutateAction(0), MutateAction(1), DrainAction(2)]


@pytest.mark.parametrize("policy", ["blitz", "sllm", "allcache", "network"])
def test_fixed_never_scales_with_the_load_but_the_others_do(policy: str) -> None:
    busy = (inst(0, S.PREFILL, running=5, waiting=40), inst(1, S.DECODE, running=9))
    s = snap(*busy, inst(2, S.SHUTTING_NULL, idle_for=9.0), free=(3,), queued=50_000)
    assert act(s, want(3, 2), "fixed") == []  # at its counts (1 + 1): nothing, however loaded
    assert act(s, want(3, 2), policy) != []
    idle = snap(inst(0, S.PREFILL, idle_for=99.0), inst(1, S.DECODE, idle_for=99.0), free=(2,))
    assert act(idle, want(1, 1), "fixed") == []  # and never drains


def test_fixed_loads_again_an_instance_it_lost() -> None:
    """(Its worker died: the rank is free again. A fixed service whose one instance died
    once waited for ever, its requests refused after a minute in the queue.)"""
    lost_decode = snap(inst(0, S.PREFILL), free=(1, 2))
    assert act(lost_decode, want(0), "fixed") == [LoadAction((1,), "network", (0,))]  # mutated next
    loaded = snap(inst(0, S.PREFILL), inst(1, S.PREFILL, idle_for=1.0), free=(2,))
    assert act(loaded, want(0), "fixed") == [MutateAction(0)]
    lost_all = snap(free=(0, 1, 2), pd_mode=False)
    assert act(lost_all, want(0), "fixed") == [LoadAction((0,), "disk")]  # colocated: fixed_prefill 1
    warm = snap(inst(0, S.PREFILL), inst(1, S.SHUTTING_NULL, idle_for=5.0), free=(2,))
    assert act(warm, want(0), "fixed") == [ReviveAction(1, "decode")]


def test_allcache_always_loads_from_host_memory() -> None:
    with_sources = snap(inst(0, S.DECODE), free=(1, 2), host_holder=0)
    expected = [LoadAction((1,), "host"), LoadAction((2,), "host")]
    assert act(with_sources, want(2, 1), "allcache") == expected
    assert act(snap(free=(1, 2)), want(1, 1), "allcache") == expected


def test_tensor_parallel_targets_are_aligned_groups_of_free_ranks() -> None:
    s = snap(inst(0, S.DECODE, ranks=(0, 1)), free=(2, 3, 5, 6, 7, 8, 9), tp=2)
    # (4, 5) has 4 busy; 5 alone is no instance; (6, 7) and (8, 9) are free. Live: every
    # shard's chain lands at once and the targets' leaders serve (no partner: none serves).
    assert act(s, want(3, 1)) == [
        LoadAction((2, 3, 6, 7, 8, 9), "network", (0, 1), multicast=True, live=True, partner=None)
    ]


def test_colocated_mode_revives_and_loads_colocated_instances() -> None:
    s = snap(
        inst(0, S.COLOCATED, running=4),
        inst(3, S.SHUTTING_DECODE, running=1),
        inst(4, S.SHUTTING_NULL, idle_for=0.1),
        free=(1, 2),
        pd_mode=False,
    )
    # Nothing migrates in colocated mode, so every instance may send, the revived ones too.
    assert act(s, want(5)) == [
        ReviveAction(3, "colocated"),
        ReviveAction(4, "colocated"),
        LoadAction((1, 2), "network", (4, 3, 0), multicast=True, live=True, partner=0),
    ]
    idle = snap(inst(0, S.COLOCATED, idle_for=1.0), inst(1, S.COLOCATED, running=1), pd_mode=False)
    assert act(idle, want(1)) == [DrainAction(0)]


def test_live_partner_is_the_most_loaded_steady_serving_instance() -> None:
    from blitzscale.control.policies import live_partner

    s = snap(
        inst(0, S.PREFILL, running=1),
        inst(1, S.PREFILL, running=5),
        inst(2, S.OLD_PREFILL, running=9),  # already relays for another target
        inst(3, S.DECODE, running=20),
        free=(4,),
    )
    assert live_partner(s) == 1
    assert live_partner(s, exclude=frozenset({1})) == 0
    only_decode = snap(inst(3, S.DECODE, running=20), free=(4,))
    assert live_partner(only_decode) is None
