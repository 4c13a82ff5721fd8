"""BlockPool: pure bookkeeping of KV block ownership."""

from __future__ import annotations

import pytest

from blitzscale.kvcache import BlockPool


def test_allocate_and_free_track_counts() -> None:
    pool = BlockPool(8, 16)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert len(set(a + b)) == 8 and set(a + b) == set(range(8))
    assert (pool.num_free_blocks, pool.num_used_blocks) == (0, 8)
    assert not pool.can_allocate(1) and pool.can_allocate(0)
    pool.free(a)
    assert (pool.num_free_blocks, pool.num_used_blocks) == (3, 5)
    assert sorted(pool.allocate(3)) == sorted(a)
    pool.free(a)
    pool.free(b)
    assert pool.num_free_blocks == pool.num_blocks == 8


def test_double_free_raises_and_names_the_block() -> None:
    pool = BlockPool(4, 16)
    ids = pool.allocate(2)
    pool.free(ids)
    with pytest.raises(RuntimeError, match=rf"block {ids[0]} freed twice"):
        pool.free([ids[0]])
    assert pool.num_free_blocks == 4


def test_double_free_within_one_call_raises() -> None:
    pool = BlockPool(4, 16)
    (b,) = pool.allocate(1)
    with pytest.raises(RuntimeError, match=f"block {b}"):
        pool.free([b, b])
    assert pool.num_free_blocks == 4  # the first free went through, the second was refused


def test_freeing_a_block_never_allocated_raises() -> None:
    pool = BlockPool(4, 16)
    with pytest.raises(RuntimeError, match="block 2"):
        pool.free([2])
    with pytest.raises(RuntimeError, match="block 99"):
        pool.free([99])
    assert pool.num_free_blocks == 4


def test_over_allocation_raises_and_changes_nothing() -> None:
    pool = BlockPool(4, 16)
    pool.allocate(3)
    with pytest.raises(RuntimeError, match=r"asked for 2 KV blocks, 1 free"):
        pool.allocate(2)
    assert (pool.num_free_blocks, pool.num_used_blocks) == (1, 3)


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 1), (16, 1), (17, 2), (64, 4), (65, 5)])
def test_blocks_for_tokens(tokens: int, blocks: int) -> None:
    assert BlockPool(8, 16).blocks_for_tokens(tokens) == blocks


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (4, 0), (-1, 16)])
def test_bad_sizes_are_refused(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match=f"got {num_blocks}, {block_size}"):
        BlockPool(num_blocks, block_size)
