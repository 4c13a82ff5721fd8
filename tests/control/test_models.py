"""Several models on one pool (control/models.py): per-model planning on shared free ranks,
scale to zero after the keep-alive, back from zero, reclaim of idle ranks, host memory."""

from __future__ import annotations

import dataclasses

import pytest

from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.host_cache import HostCacheState, host_copy_room
from blitzscale.control.models import ModelView, bounds, pool_actions
from blitzscale.control.policies import (
    DrainAction,
    LoadAction,
    ReleaseAction,
    ReviveAction,
    next_host_cache,
)
from blitzscale.control.snapshot import ClusterSnapshot, InstanceView
from blitzscale.control.snapshot import InstanceState as S

from .builders import NOW, inst, snap

BLITZ = PolicyConfig(name="blitz")
SLLM = PolicyConfig(name="sllm")
CFG = PlannerConfig()
NO_CACHE = HostCacheState()


def view(
    name: str,
    *instances: InstanceView,
    free: tuple[int, ...] = (),
    requests: int = 0,
    queued: int = 0,
    idle_for: float | None = None,
    keep_alive_s: float = 30.0,
    min_instances: int = 0,
    host_holder: int | None = None,
    pd_mode: bool = False,
    holders: tuple[int, ...] | None = None,
) -> ModelView:
    """A model's view; `idle_for`: its last request came that long before NOW."""
    s = snap(*instances, free=free, queued=queued, pd_mode=pd_mode, host_holder=host_holder, holders=holders)
    s = dataclasses.replace(s, model=name)
    last = None if idle_for is None else NOW - idle_for
    return ModelView(
        s,
        requests=requests,
        last_request_at=last,
        started_at=0.0,
        min_instances=min_instances,
        keep_alive_s=keep_alive_s,
    )


def test_one_model_with_an_endless_keep_alive_plans_as_before() -> None:
    # a burst on one colocated instance with two free ranks: what scale_actions alone does
    m = view(
        "a", inst(0, S.COLOCATED, running=4), free=(1, 2), requests=8, queued=4000, keep_alive_s=float("inf")
    )
    actions = pool_actions([m], BLITZ, CFG, NO_CACHE)
    loads = [a for a in actions if isinstance(a, LoadAction)]
    assert loads and all(a.model == "a" and a.path == "network" and a.sources == (0,) for a in loads)


def test_an_idle_model_past_its_keep_alive_drains_its_last_instance_then_releases_it() -> None:
    idle = inst(1, S.COLOCATED, idle_for=60.0, loaded_for=100.0)
    m = view("b", idle, idle_for=31.0)
    assert pool_actions([m], BLITZ, CFG, NO_CACHE) == [DrainAction(1, model="b")]
    warm = inst(1, S.SHUTTING_NULL, idle_for=5.0, loaded_for=100.0)
    assert pool_actions([view("b", warm, idle_for=40.0)], BLITZ, CFG, NO_CACHE) == [
        ReleaseAction(1, model="b")
    ]
    # within its keep-alive it keeps its one instance
    assert pool_actions([view("b", idle, idle_for=29.0)], BLITZ, CFG, NO_CACHE) == []
    # a model that must stay up never goes to zero
    assert pool_actions([view("b", idle, idle_for=1e6, min_instances=1)], BLITZ, CFG, NO_CACHE) == []


def test_a_model_at_zero_stays_there_until_a_request_then_comes_back_from_its_host_copy() -> None:
    assert pool_actions([view("b", free=(0, 1, 2), idle_for=100.0)], BLITZ, CFG, NO_CACHE) == []
    back = view("b", free=(0, 1, 2), requests=1, queued=10, host_holder=2)
    assert pool_actions([back], BLITZ, CFG, NO_CACHE) == [
        LoadAction((0,), "host", (2,), multicast=True, model="b")
    ]
    # with no host copy: disk; with a GPU copy (another instance of it): the network
    assert pool_actions([view("b", free=(0,), requests=1, queued=10)], BLITZ, CFG, NO_CACHE) == [
        LoadAction((0,), "disk", model="b")
    ]


def test_free_ranks_are_shared_and_a_model_with_requests_takes_them_first() -> None:
    a = view(
        "a", inst(0, S.COLOCATED, running=4), free=(2,), requests=9, queued=9000, keep_alive_s=float("inf")
    )
    b = view("b", free=(2,), requests=1, queued=10, host_holder=1)
    actions = pool_actions([a, b], BLITZ, CFG, NO_CACHE)
    targets = [(x.model, x.target_ranks) for x in actions if isinstance(x, LoadAction)]
    assert len(targets) == 1  # one free rank: one load, never two onto the same rank
    assert targets[0][1] == (2,)


def test_a_request_to_a_model_with_no_free_rank_reclaims_an_idle_rank_of_another() -> None:
    # model a holds every rank, all idle (and it has no request); b has one waiting
    a_insts = [inst(r, S.COLOCATED, idle_for=1.0, loaded_for=100.0) for r in range(3)]
    a = view("a", *a_insts, idle_for=1.0, keep_alive_s=float("inf"), min_instances=3)
    b = view("b", requests=1, queued=10, host_holder=0)
    actions = pool_actions([a, b], BLITZ, CFG, NO_CACHE)
    assert actions == [DrainAction(0, model="a")]  # the longest idle first (ties: lowest id)
    # next round it is warm: released at once for b, and a does not revive it meanwhile
    a_insts[0] = inst(0, S.SHUTTING_NULL, idle_for=0.1, loaded_for=100.0)
    a = dataclasses.replace(a, snapshot=dataclasses.replace(a.snapshot, instances=tuple(a_insts)))
    actions = pool_actions([a, b], BLITZ, CFG, NO_CACHE)
    assert ReleaseAction(0, model="a") in actions
    assert not any(isinstance(x, ReviveAction | LoadAction) for x in actions if x.model == "a")


def test_a_model_in_use_does_not_revive_what_is_reclaimed_for_a_model_without_ranks() -> None:
    # a has a request and wants its three instances; one was drained for b and is warm
    a_insts = (
        inst(0, S.SHUTTING_NULL, idle_for=0.1, loaded_for=100.0),
        inst(1, S.COLOCATED, running=1),
        inst(2, S.COLOCATED, idle_for=1.0),
    )
    a = view("a", *a_insts, requests=1, keep_alive_s=float("inf"), min_instances=3)
    b = view("b", requests=1, queued=10, host_holder=0)
    actions = pool_actions([a, b], BLITZ, CFG, NO_CACHE)
    assert actions == [ReleaseAction(0, model="a")]  # released for b, not revived for a


def test_reclaim_never_takes_the_last_instance_of_a_model_in_use_nor_a_busy_one() -> None:
    a = view("a", inst(0, S.COLOCATED, idle_for=5.0), requests=1, keep_alive_s=float("inf"))
    c = view("c", inst(1, S.COLOCATED, running=1), inst(2, S.COLOCATED, idle_for=5.0), requests=1)
    b = view("b", requests=1, queued=10)
    actions = pool_actions([a, c, b], BLITZ, CFG, NO_CACHE)
    assert [x for x in actions if isinstance(x, DrainAction)] == [DrainAction(2, model="c")]
    # c's only idle one is its last serving one? then nothing can be reclaimed
    c = view("c", inst(1, S.COLOCATED, idle_for=5.0), requests=1)
    assert not [x for x in pool_actions([a, c, b], BLITZ, CFG, NO_CACHE) if isinstance(x, DrainAction)]


def test_warm_instances_are_reclaimed_before_serving_ones() -> None:
    a = view(
        "a",
        inst(0, S.COLOCATED, idle_for=50.0),
        inst(1, S.SHUTTING_NULL, idle_for=0.1, loaded_for=100.0),
        keep_alive_s=float("inf"),
    )
    b = view("b", requests=1, queued=10)
    assert pool_actions([a, b], BLITZ, CFG, NO_CACHE) == [ReleaseAction(1, model="a")]


def test_with_slots_reclaim_frees_a_slot_on_a_gpu_the_needy_model_is_not_on() -> None:
    """Two GPUs of two slots each (rank r on GPU r % 2): b serves on rank 0 (GPU 0) and
    wants a second instance; a's idle instances are on rank 2 (GPU 0, idle longest) and
    rank 1 (GPU 1). A slot freed on GPU 0 could not take b (a GPU holds a model once), so
    a's instance on GPU 1 is drained, not the longest idle one."""

    def slots(v: ModelView) -> ModelView:
        return dataclasses.replace(v, snapshot=dataclasses.replace(v.snapshot, slot_workers=2))

    idle = (inst(2, S.COLOCATED, idle_for=50.0), inst(1, S.COLOCATED, idle_for=5.0))
    a = slots(view("a", *idle, min_instances=2, keep_alive_s=float("inf")))
    b = view("b", inst(0, S.COLOCATED, running=8), requests=40, queued=40_000, keep_alive_s=float("inf"))
    assert pool_actions([a, slots(b)], BLITZ, CFG, NO_CACHE) == [DrainAction(1, model="a")]
    # without slots each rank is a GPU: the longest idle goes first
    a = view("a", *idle, min_instances=2, keep_alive_s=float("inf"))
    assert pool_actions([a, b], BLITZ, CFG, NO_CACHE) == [DrainAction(2, model="a")]


def test_bounds_keep_the_model_within_its_instances() -> None:
    m = ModelView(ClusterSnapshot(0, (), 0, 0, 0, (), (), None), min_instances=2, max_instances=3)
    colo = bounds(CFG, m, pd_mode=False)
    assert (colo.min_prefill, colo.max_prefill) == (2, 3)
    pd = bounds(CFG, m, pd_mode=True)
    assert (pd.min_prefill, pd.min_decode, pd.max_prefill, pd.max_decode) == (1, 1, 2, 2)


def test_sllm_host_cache_stays_within_each_hosts_budget_lru_beyond_it() -> None:
    gb = 1 << 30
    cache = HostCacheState(ttl_s=100.0, capacity_bytes=2 * gb)
    for t, model in enumerate(["a", "b", "a", "c", "d", "a"]):
        cache = cache.insert(0, float(t), model, gb)
        assert cache.host_bytes(0, float(t)) <= 2 * gb
    assert cache.lookup(0, 6.0, "a") and cache.lookup(0, 6.0, "d")
    assert not cache.lookup(0, 6.0, "b") and not cache.lookup(0, 6.0, "c")  # least recently used


def test_sllm_over_several_models_misses_to_disk_once_evicted_and_the_budget_holds() -> None:
    """Three models take turns on one host whose DRAM holds two checkpoints: each turn's
    cache stays within the budget, and the model evicted (least recently used) loads from
    disk, the ones still cached from host memory."""
    gb = 1 << 30
    cache = HostCacheState(ttl_s=1000.0, capacity_bytes=2 * gb)
    paths = []
    for t, name in enumerate(["a", "b", "c", "a", "c"]):
        m = view(name, free=(0,), requests=1, queued=10)
        m = dataclasses.replace(m, snapshot=dataclasses.replace(m.snapshot, now=float(t), model_bytes=gb))
        actions = pool_actions([m], SLLM, CFG, cache)
        load = next(a for a in actions if isinstance(a, LoadAction))
        paths.append(load.path)
        cache = next_host_cache(cache, m.snapshot, actions)
        assert cache.host_bytes(0, float(t)) <= 2 * gb
    assert paths == ["disk", "disk", "disk", "disk", "host"]  # a was evicted by c (LRU)


def test_blitz_host_copies_make_room_within_the_budget_or_none_is_made() -> None:
    gb = 1 << 30
    copies = {"a": (0, gb), "b": (0, gb), "c": (1, gb)}
    assert host_copy_room(copies, 1, gb, 2 * gb, evictable=["a"]) == []  # host 1 has room
    assert host_copy_room(copies, 0, gb, 2 * gb, evictable=["b", "a"]) == ["b"]
    assert host_copy_room(copies, 0, gb, 2 * gb, evictable=["c"]) is None  # c is not on host 0
    assert host_copy_room(copies, 0, 5 * gb, 0, evictable=[]) == []  # no budget: always room


def test_pd_mode_reclaim_keeps_one_instance_per_role_of_a_model_that_must_stay_up() -> None:
    a = view(
        "a",
        inst(0, S.PREFILL, idle_for=9.0),
        inst(1, S.DECODE, idle_for=9.0),
        inst(2, S.PREFILL, idle_for=5.0),
        keep_alive_s=float("inf"),
        pd_mode=True,
    )
    b = view("b", requests=1, queued=10, pd_mode=True)  # needs a prefill and a decode instance
    drains = [x for x in pool_actions([a, b], BLITZ, CFG, NO_CACHE) if isinstance(x, DrainAction)]
    assert drains == [DrainAction(0, model="a")]  # one of its two prefill ones; never its decode
    # a model with no request and a keep-alive gives everything idle
    a = dataclasses.replace(a, keep_alive_s=60.0, last_request_at=NOW - 1.0)
    drains = [x for x in pool_actions([a, b], BLITZ, CFG, NO_CACHE) if isinstance(x, DrainAction)]
    assert drains == [DrainAction(0, model="a"), DrainAction(1, model="a")]


def test_one_model_that_never_scales_to_zero_gets_exactly_the_single_model_actions() -> None:
    """The one-entry case is the old path: the same actions as scale_actions, tagged."""
    from blitzscale.control.planner import desired_counts
    from blitzscale.control.policies import scale_actions

    cases = [
        snap(inst(0, S.PREFILL, running=3), inst(1, S.DECODE, used=90, total=100), free=(2, 3), queued=9000),
        snap(
            inst(0, S.PREFILL, idle_for=50.0),
            inst(1, S.DECODE, idle_for=50.0),
            inst(2, S.PREFILL, idle_for=50.0),
        ),
        snap(inst(0, S.COLOCATED, running=8), free=(1, 2), queued=6000, pd_mode=False),
        snap(
            inst(0, S.SHUTTING_NULL, idle_for=5.0),
            inst(1, S.COLOCATED, running=2),
            pd_mode=False,
            queued=5000,
        ),
        snap(free=(0, 1, 2), queued=100, host_holder=1),
    ]
    for policy in (BLITZ, SLLM, PolicyConfig(name="network")):
        for s in cases:
            m = ModelView(dataclasses.replace(s, model="m"), requests=1)
            want = scale_actions(m.snapshot, desired_counts(m.snapshot, CFG), policy, CFG, NO_CACHE)
            got = pool_actions([m], policy, CFG, NO_CACHE)
            assert got == [dataclasses.replace(a, model="m") for a in want], (policy.name, s)


def test_models_waiting_at_zero_for_the_one_rank_get_it_in_turn() -> None:
    """The issue "Many models on one GPU": b and c wait with no instance and one rank is
    free. One of them loads onto it (before the fix the one that claimed the rank was held
    back because the other lacked one, and nothing loaded at all)."""
    a = view("a", idle_for=1.0)  # released: it gave the rank back
    b = view("b", free=(0,), requests=6, queued=60, host_holder=0)
    c = view("c", free=(0,), requests=6, queued=60, host_holder=0)
    assert pool_actions([a, b, c], BLITZ, CFG, NO_CACHE) == [
        LoadAction((0,), "host", (0,), multicast=True, model="b")
    ]
    # c's turn comes once b's requests are done: b's idle instance is given back for it
    c = view("c", requests=6, queued=60, host_holder=0)  # (no free rank now)
    served = inst(0, S.COLOCATED, idle_for=0.1, loaded_for=5.0, load_s=1.0)
    b = view("b", served, requests=0, idle_for=0.1, host_holder=0)
    assert pool_actions([a, b, c], BLITZ, CFG, NO_CACHE) == [DrainAction(0, model="b")]
    # while b still serves requests, c waits (b's last instance is never taken)
    busy = view("b", inst(0, S.COLOCATED, running=2), requests=2, host_holder=0)
    assert pool_actions([a, busy, c], BLITZ, CFG, NO_CACHE) == []


def test_models_waiting_at_zero_each_get_a_first_instance_before_any_gets_more() -> None:
    # two free ranks, two models at zero whose queues each want both ranks
    b = view("b", free=(0, 1), requests=40, queued=40000, host_holder=0)
    c = view("c", free=(0, 1), requests=40, queued=40000, host_holder=1)
    loads = [x for x in pool_actions([b, c], BLITZ, CFG, NO_CACHE) if isinstance(x, LoadAction)]
    assert sorted((x.model, x.target_ranks) for x in loads) == [("b", (0,)), ("c", (1,))]
    # alone, a model at zero still scales out at once
    loads = [x for x in pool_actions([b], BLITZ, CFG, NO_CACHE) if isinstance(x, LoadAction)]
    assert [x.target_ranks for x in loads] == [(0, 1)]


def test_a_model_at_zero_is_not_kept_from_its_warm_instance_by_a_model_that_lacks_a_rank() -> None:
    # b's own warm instance serves it again at once; c, also waiting, gets nothing taken
    b = view("b", inst(0, S.SHUTTING_NULL, idle_for=0.5, loaded_for=9.0), requests=3, queued=30)
    c = view("c", requests=3, queued=30, host_holder=0)
    assert pool_actions([b, c], BLITZ, CFG, NO_CACHE) == [ReviveAction(0, "colocated", model="b")]


def test_a_warm_instance_is_released_for_a_waiting_model_without_its_keep_timer() -> None:
    """Another model's request waits for the rank: the idle model's instance is drained,
    then released as soon as it is warm, whatever `shutting_null_keep_s` and the reload
    cost say (they only keep a warm instance for its own model's next request)."""
    slow = dataclasses.replace(CFG, shutting_null_keep_s=3600.0, reload_cost_factor=100.0)
    b = view("b", requests=6, queued=60, host_holder=0)
    idle = inst(0, S.COLOCATED, idle_for=0.1, loaded_for=2.0, load_s=1.0)
    a = view("a", idle, idle_for=0.1, keep_alive_s=3600.0)
    assert pool_actions([a, b], BLITZ, slow, NO_CACHE) == [DrainAction(0, model="a")]
    warm = inst(0, S.SHUTTING_NULL, idle_for=0.0, loaded_for=2.0, load_s=1.0)
    a = view("a", warm, idle_for=0.2, keep_alive_s=3600.0)
    assert pool_actions([a, b], BLITZ, slow, NO_CACHE) == [ReleaseAction(0, model="a")]
    # with no one waiting it is not released before its keep timer (its model revives it)
    b = view("b", idle_for=50.0, keep_alive_s=3600.0)
    assert pool_actions([a, b], BLITZ, slow, NO_CACHE) == [ReviveAction(0, "colocated", model="a")]


def test_the_model_waiting_longest_gets_the_rank_given_back() -> None:
    """a's instance was released for b; a gets a request before b's load starts: both
    wait with nothing to serve them, and b, whose request is the older, takes the rank
    (else a would take back what was given up for b, for as long as a gets requests)."""
    a = view("a", free=(0,), requests=1, queued=10, host_holder=0)
    b = view("b", free=(0,), requests=6, queued=60)
    a = dataclasses.replace(a, waiting_since=NOW - 0.1)
    b = dataclasses.replace(b, waiting_since=NOW - 20.0)
    assert pool_actions([a, b], BLITZ, CFG, NO_CACHE) == [LoadAction((0,), "disk", model="b")]
    a = dataclasses.replace(a, waiting_since=NOW - 30.0)  # the other way round
    assert pool_actions([a, b], BLITZ, CFG, NO_CACHE) == [
        LoadAction((0,), "host", (0,), multicast=True, model="a")
    ]


def test_the_prefill_band_comes_from_the_models_ttft_slo_unless_set() -> None:
    """An instance may hold half the SLO in queued prompt work (upper edge), the lower edge
    at the default band's ratio; no SLO: the default band; edges set by hand are kept."""
    m = ModelView(ClusterSnapshot(0, (), 0, 0, 0, (), (), None))
    tight = bounds(CFG, dataclasses.replace(m, ttft_slo_s=0.45), pd_mode=True)
    assert tight.prefill_upper == pytest.approx(0.225) and tight.prefill_lower == pytest.approx(0.225 * 5 / 7)
    none = bounds(CFG, m, pd_mode=True)
    assert (none.prefill_lower, none.prefill_upper) == pytest.approx((0.5, 0.7))
    fixed = bounds(
        PlannerConfig(prefill_lower=0.2, prefill_upper=0.3), dataclasses.replace(m, ttft_slo_s=9.0), True
    )
    assert (fixed.prefill_lower, fixed.prefill_upper) == (0.2, 0.3)
    lower_only = bounds(PlannerConfig(prefill_lower=0.3), dataclasses.replace(m, ttft_slo_s=0.45), True)
    assert lower_only.prefill_lower == 0.3 and lower_only.prefill_upper == pytest.approx(0.42)  # above it


def test_a_tighter_slo_asks_for_more_instances_for_the_same_queue() -> None:
    queued = view("a", inst(0, S.COLOCATED, running=4), free=(1, 2, 3, 4, 5), requests=8, queued=4000)
    loose, tight = (
        sum(
            isinstance(a, LoadAction)
            for a in pool_actions([dataclasses.replace(queued, ttft_slo_s=slo)], BLITZ, CFG, NO_CACHE)
        )
        for slo in (5.0, 0.1)
    )
    assert tight > loose >= 0
