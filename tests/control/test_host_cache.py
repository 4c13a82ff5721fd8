"""ServerlessLLM's per-host cache with a TTL, alone and driving the `sllm` policy over time."""

from __future__ import annotations

from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.host_cache import HostCacheState, host_of
from blitzscale.control.policies import LoadAction, next_host_cache, scale_actions
from blitzscale.control.snapshot import InstanceState as S

from .builders import inst, snap, want

SLLM = PolicyConfig(name="sllm")  # TTL 30 s
HOSTS = (0, 0, 1, 1)  # ranks 0-1 on host 0, ranks 2-3 on host 1


def test_an_entry_lives_for_its_ttl_after_the_last_use() -> None:
    cache = HostCacheState(ttl_s=30.0).insert(host=0, now=10.0)
    assert cache.lookup(0, 10.0) and cache.lookup(0, 39.9)
    assert not cache.lookup(0, 40.0) and not cache.lookup(1, 10.0)
    cache = cache.insert(0, 35.0)  # used again: the TTL starts over
    assert cache.lookup(0, 64.9) and not cache.lookup(0, 65.0)
    assert cache.insert(1, 70.0).last_used == ((1, 70.0),)  # expired entries are dropped
    assert cache.cached_hosts(50.0) == (0,)


def test_ranks_the_snapshot_does_not_map_are_on_host_0() -> None:
    s = snap(hosts=(0, 1))
    assert [host_of(s, r) for r in range(4)] == [0, 1, 0, 0]


def test_sllm_misses_then_hits_then_misses_after_the_ttl() -> None:
    cfg, cache = PlannerConfig(), HostCacheState(ttl_s=SLLM.sllm_ttl_s)
    cold = snap(now=0.0, free=(0, 1, 2, 3), hosts=HOSTS)
    actions = scale_actions(cold, want(1, 1), SLLM, cfg, cache)
    assert actions == [LoadAction((0,), "disk"), LoadAction((1,), "disk")]
    cache = next_host_cache(cache, cold, actions)
    assert cache.last_used == ((0, 0.0),)
    # Everything released; 20 s later host 0 still has the checkpoint in DRAM.
    again = snap(now=20.0, free=(0, 1, 2, 3), hosts=HOSTS)
    assert scale_actions(again, want(1, 1), SLLM, cfg, cache) == [
        LoadAction((0,), "host"),
        LoadAction((1,), "host"),
    ]
    # 31 s after its last use it is gone.
    late = snap(now=31.0, free=(0, 1, 2, 3), hosts=HOSTS)
    assert scale_actions(late, want(1, 1), SLLM, cfg, cache) == [
        LoadAction((0,), "disk"),
        LoadAction((1,), "disk"),
    ]


def test_serving_keeps_a_host_cache_alive() -> None:
    cache = HostCacheState(ttl_s=30.0).insert(1, 0.0)
    serving = snap(inst(2, S.PREFILL, running=1), now=25.0, hosts=HOSTS)
    cache = next_host_cache(cache, serving, [])
    assert cache.lookup(1, 50.0)


def test_sllm_places_new_instances_on_hosts_with_a_hit_first() -> None:
    cache = HostCacheState(ttl_s=30.0).insert(1, 90.0)
    s = snap(inst(0, S.DECODE, running=1), free=(1, 2, 3), hosts=HOSTS)
    assert scale_actions(s, want(3, 1), SLLM, PlannerConfig(), cache) == [
        LoadAction((2,), "host"),
        LoadAction((3,), "host"),
        LoadAction((1,), "disk"),
    ]
