"""Prefix-aware routing: the router's index of the prompt blocks each instance was sent
(serve/prefixes.py), and `Router.pick` weighing an instance's likely cached prefix against
its load. The router runs over the simulated cluster, in process."""

from __future__ import annotations

import asyncio

from blitzscale.cluster.config import ClusterConfig
from blitzscale.control.snapshot import InstanceState
from blitzscale.serve.models import ServedModel
from blitzscale.serve.prefixes import InstancePrefixes, PrefixIndex
from blitzscale.serve.requests import RouterRequest
from blitzscale.serve.router import Router, RouterConfig
from blitzscale.sim.cluster import SimCluster
from blitzscale.sim.links import Topology
from tests.serve.test_budgets import profile

BLOCK = 4


def test_hashes_cover_full_blocks_but_the_last_token_and_equal_prefixes_hash_equal() -> None:
    a = PrefixIndex.hashes(list(range(13)), BLOCK)
    assert len(a) == 3  # 12 tokens in full blocks; the 13th is computed anyway
    assert len(PrefixIndex.hashes(list(range(12)), BLOCK)) == 2  # the last token's block is not
    b = PrefixIndex.hashes([*range(8), 99, 99, 99, 99, 5], BLOCK)
    assert a[:2] == b[:2] and a[2] != b[2]


def test_an_instance_forgets_its_least_recently_used_blocks_past_its_capacity() -> None:
    p = InstancePrefixes(epoch=1)
    first = PrefixIndex.hashes(list(range(17)), BLOCK)
    second = PrefixIndex.hashes(list(range(100, 117)), BLOCK)
    p.record(first, capacity=6)
    p.record(second, capacity=6)
    assert len(p) == 6 and p.match(second) == 4
    assert p.match(first) == 0  # its first two blocks went, so nothing of it leads
    p.record(second[:1], capacity=0)
    assert len(p) == 0


def test_a_new_engine_or_a_reset_forgets_what_an_instance_held() -> None:
    idx = PrefixIndex()
    h = PrefixIndex.hashes(list(range(33)), BLOCK)
    idx.record("m", 1, 10.0, h, 100)
    assert idx.cached_blocks("m", 1, 10.0, h) == 8
    assert idx.cached_blocks("other", 1, 10.0, h) == 0  # per model
    assert idx.cached_blocks("m", 1, 11.0, h) == 0  # loaded again since: an empty cache
    assert idx.num_blocks("m", 1) == 0
    idx.record("m", 1, 11.0, h, 100)
    idx.record("m", 2, 11.0, h, 100)
    idx.forget(2)
    assert idx.num_blocks("m", 1) == 8 and idx.num_blocks("m", 2) == 0
    idx.forget()
    assert idx.num_blocks("m", 1) == 0


def _router(prefix_aware: bool = True, block: int = BLOCK, workers: int = 2) -> Router:
    topo = Topology(
        nodes=1, gpus_per_node=workers, nvlink_bytes_per_s=1e11, nic_bytes_per_s=1e10,
        pcie_bytes_per_s=1e10, ssd_bytes_per_s=1e9,
    )  # fmt: skip
    cluster = SimCluster(topo, profile(1000.0), ClusterConfig(num_workers=workers))
    cfg = RouterConfig(mode="colocated", prefix_aware=prefix_aware)
    router = Router(cfg, cluster, cluster.data, None, "m", 1000, 8192)
    router.add_model(
        ServedModel("m", None, 1000, 8192, cost=profile(1000.0), max_num_seqs=16, prefix_block_size=block)
    )
    for rank in range(workers):
        router.state.move(rank, InstanceState.LOADING, model="m")
        router.state.move(rank, InstanceState.COLOCATED)
        router.state.loaded(rank, 1.0)
        router.connected.add(rank)
    return router


def _request(router: Router, prompt: list[int]) -> RouterRequest:
    return RouterRequest(id=f"r{len(prompt)}-{prompt[-1]}", prompt=prompt, params=None, model="m")  # type: ignore[arg-type]


def test_a_prompt_goes_where_its_prefix_was_sent_unless_that_instance_is_far_busier() -> None:
    async def main() -> None:
        router = _router()
        shared = list(range(64))
        first = _request(router, [*shared, 1000])
        prefix = router._prefix_of(first)
        assert prefix is not None and len(prefix) == 16
        inst = router.instances[1]
        router._note_prefix(first, inst, prefix)  # as a dispatch to rank 1 does
        assert router.num_prefix_routed == 0  # nothing was cached there yet

        second = _request(router, [*shared, 2000])
        hashes = router._prefix_of(second)
        assert router.pick("colocated", 65, "m", None).rank == 0  # by load alone: the first
        assert router.pick("colocated", 65, "m", hashes).rank == 1  # by prefix: where it is
        router._note_prefix(second, router.instances[1], hashes)
        assert (router.num_prefix_routed, router.prefix_routed_tokens) == (1, 64)

        # past a quarter of the engine's batch (16 // 4) more requests than the least
        # loaded, the cache no longer pulls work there
        for _ in range(5):
            router.state.assign(1)
        assert router.pick("colocated", 65, "m", hashes).rank == 0
        router.state.unassign(1)
        assert router.pick("colocated", 65, "m", hashes).rank == 1

        # more prompt work waiting there than the prefix saves: the other one
        router.state.assign(1, 100)
        assert router.pick("colocated", 65, "m", hashes).rank == 0

    asyncio.run(main())


def test_a_reset_or_a_reload_forgets_and_routing_by_prefix_can_be_turned_off() -> None:
    async def main() -> None:
        router = _router()
        r = _request(router, [*range(64), 7])
        h = router._prefix_of(r)
        router._note_prefix(r, router.instances[1], h)
        assert router.pick("colocated", 65, "m", h).rank == 1
        router.state.loaded(1, 1.0)  # its weights loaded again: a new engine, an empty cache
        router.state.instance(1).loaded_at = 2.0  # (the simulated clock stood still)
        assert router.pick("colocated", 65, "m", h).rank == 0
        router._note_prefix(r, router.instances[1], h)
        await router.reset_prefix_cache()
        assert router.prefixes.num_blocks("m", 1) == 0

        assert _router(prefix_aware=False)._prefix_of(r) is None
        assert _router(block=0)._prefix_of(r) is None  # its engines cache no prefixes

    asyncio.run(main())
