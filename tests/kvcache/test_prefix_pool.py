"""The block pool's prefix cache: shared blocks, holders, eviction order, reset."""

from __future__ import annotations

import pytest

from blitzscale.kvcache.pool import BlockPool
from blitzscale.kvcache.prefix import ROOT, block_hash, extend_hashes


def test_equal_prefixes_hash_equal_and_any_earlier_token_changes_every_later_hash() -> None:
    a = extend_hashes([], list(range(12)), 3, 4)
    assert a == extend_hashes([], [*range(12), 99], 3, 4)
    b = extend_hashes([], [7, *range(1, 12)], 3, 4)
    assert all(x != y for x, y in zip(a, b, strict=True))  # the first block differs: all differ
    kept = a[:1]
    assert extend_hashes(kept, list(range(12)), 3, 4) == a and kept == a  # extended in place
    assert a[0] == block_hash(ROOT, [0, 1, 2, 3]) and len(a[0]) == 16
    toks = [(i * 7919) % 50_000 for i in range(1000)]  # block by block, as `block_hash` chains
    chained = [block_hash(ROOT, toks[:16])]
    for i in range(1, 62):
        chained.append(block_hash(chained[-1], toks[16 * i : 16 * (i + 1)]))
    part = extend_hashes([], toks, 10, 16)
    assert extend_hashes(part, toks, 62, 16) == chained and extend_hashes([], toks, 62, 16) == chained


def test_shared_blocks_count_their_holders_and_stay_cached_when_free() -> None:
    pool = BlockPool(4, 4)
    a = pool.allocate(2)
    pool.register(a[0], b"h0")
    pool.register(a[1], b"h1")
    assert pool.cached_prefix([b"h0", b"h1", b"h2"]) == a
    assert pool.cached_prefix([b"hx", b"h1"]) == []
    pool.share(a[:1])  # a second request takes the first block
    assert pool.refs(a[0]) == 2 and pool.num_used_blocks == 2
    pool.free(a)  # the first request ends: block 0 still held, block 1 cached and free
    assert pool.refs(a[0]) == 1 and pool.refs(a[1]) == 0 and pool.num_free_blocks == 3
    assert pool.num_idle(a) == 1
    pool.share([a[1]])  # a cached free block comes back with its contents
    assert pool.refs(a[1]) == 1 and pool.num_free_blocks == 2
    pool.free(a)
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 2 and pool.check() == []
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free([a[0]])


def test_empty_blocks_go_first_then_the_least_recently_freed_cached_ones() -> None:
    pool = BlockPool(3, 4)
    x, y, z = pool.allocate(3)
    pool.register(x, b"x")
    pool.register(y, b"y")
    pool.free([y])
    pool.free([x])  # y was freed first: evicted first
    pool.free([z])  # never registered: handed out before any cached block
    assert pool.allocate(1) == [z] and pool.evictions == 0
    assert pool.allocate(1) == [y] and pool.evictions == 1
    assert pool.cached_prefix([b"y"]) == [] and pool.cached_prefix([b"x"]) == [x]
    assert pool.check() == []


def test_registering_is_for_held_blocks_and_a_known_prefix_keeps_its_block() -> None:
    pool = BlockPool(3, 4)
    a, b, _ = pool.allocate(3)
    pool.register(a, b"p")
    pool.register(b, b"p")  # the same prefix computed twice: the first block keeps it
    pool.register(a, b"q")  # a registered block keeps its prefix
    assert pool.cached_prefix([b"p"]) == [a] and not pool.is_registered(b)
    pool.free([b])
    with pytest.raises(RuntimeError, match="only a held block"):
        pool.register(b, b"r")
    with pytest.raises(RuntimeError, match="not in the prefix cache"):
        pool.share([b])


def test_reset_forgets_every_prefix_and_leaves_held_blocks_alone() -> None:
    pool = BlockPool(3, 4)
    a, b = pool.allocate(2)
    pool.register(a, b"a")
    pool.register(b, b"b")
    pool.free([b])
    assert pool.reset_prefix_cache() == 2
    assert pool.cached_prefix([b"a"]) == [] and pool.refs(a) == 1 and pool.num_free_blocks == 2
    assert pool.check() == []


def _chain(pool: BlockPool, tokens: list[int], hits: int = 0) -> list[int]:
    """A sequence's full blocks, allocated, registered (parents known), then freed: cached."""
    hashes = extend_hashes([], tokens, len(tokens) // pool.block_size, pool.block_size)
    ids = pool.allocate(len(hashes))
    for i, (b, h) in enumerate(zip(ids, hashes, strict=True)):
        pool.register(b, h, hashes[i - 1] if i else ROOT, hits)
    pool.free(ids)
    return ids


def test_hot_prefixes_are_the_reused_chains_parents_first_within_the_budget() -> None:
    pool = BlockPool(16, 2)
    a = _chain(pool, [1, 2, 3, 4, 5, 6])  # 3 blocks
    b = _chain(pool, [1, 2, 3, 4, 9, 9, 8, 8])  # shares a's first two blocks: only 2 new ones
    c = _chain(pool, [7, 7, 7, 7])  # 2 blocks, never reused
    assert len(b) == 4 and pool.num_cached_blocks == 7
    assert pool.hot_prefixes(10) == []  # nothing was taken from the cache yet
    pool.share(a[:2])  # a request took a's first two blocks, twice
    pool.free(a[:2])
    pool.share(a[:2])
    pool.free(a[:2])
    b_only = [x for x in b if pool.is_registered(x)]  # (its first two were a's already)
    pool.share([a[0], a[1], *b_only[:1]])  # and one took b's third block
    pool.free([a[0], a[1], *b_only[:1]])
    hot = pool.hot_prefixes(10)
    assert [h.block for h in hot] == [a[0], a[1], b_only[0]]  # depth order, reused ones only
    assert [h.hits for h in hot] == [3, 3, 1]
    assert hot[0].parent == ROOT and hot[1].parent == hot[0].hash and hot[2].parent == hot[1].hash
    assert [h.block for h in pool.hot_prefixes(2)] == [a[0], a[1]]  # the hottest within 2 blocks
    assert pool.hot_prefixes(0) == [] and not set(c) & {h.block for h in hot}


def test_a_hot_block_whose_first_blocks_were_evicted_is_not_shipped() -> None:
    pool = BlockPool(3, 2)
    a = _chain(pool, [1, 2, 3, 4, 5, 6], hits=1)  # all three hot, all cached
    assert [h.block for h in pool.hot_prefixes(3)] == a
    pool.allocate(1)  # the least recently freed cached block (the first) goes
    assert pool.evictions == 1 and pool.hot_prefixes(3) == []  # the rest is unreachable
    assert pool.check() == []


def test_imported_blocks_register_as_cached_and_a_known_prefix_is_kept_once() -> None:
    src = BlockPool(8, 2)
    hot = _chain(src, [1, 2, 3, 4], hits=2)
    blocks = [(h.hash, h.parent, h.hits) for h in src.hot_prefixes(8)]
    dst = BlockPool(8, 2)
    mine = _chain(dst, [1, 2])  # the target computed the first block itself meanwhile
    ids = dst.allocate(len(blocks))
    registered = sum(dst.register(b, h, p, n) for b, (h, p, n) in zip(ids, blocks, strict=True))
    dst.free(ids)
    assert registered == 1 and len(hot) == 2
    hashes = [h for h, _, _ in blocks]
    assert dst.cached_prefix(hashes) == [mine[0], ids[1]]
    assert dst.num_cached_blocks == 2 and dst.num_free_blocks == 8 and dst.check() == []
    assert [h.hits for h in dst.hot_prefixes(8)] == [0, 2]  # (its own first block comes along: the chain)
    dst.reset_prefix_cache()
    assert dst.hot_prefixes(8) == [] and dst.check() == []
