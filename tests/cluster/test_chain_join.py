"""A load whose source is still sending an earlier load of the same model joins that chain
(cluster/flights.py): the chain's last target forwards each layer as it lands there, so
the new load neither waits for the source nor takes its link. On CPU workers over gloo."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from blitzscale.cluster.calls import ClusterOpError
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.flights import Flight, Flights
from blitzscale.cluster.lines import RankLines
from blitzscale.cluster.local import LocalCluster
from blitzscale.cluster.results import TransferResult

M = "tiny"
SRC = "random:tiny-llama3"
SLOW_S = 4.0  # what the first, capped transfer takes (long beside the rest)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(ClusterConfig(num_workers=6, transfer_timeout_s=60)) as c:
        yield c


def _slow_rate(c: LocalCluster) -> float:
    """Bytes per second that make one copy of the model take SLOW_S to move (rank 0 holds it)."""
    return asyncio.run(c.load(M, 0, SRC)).bytes / SLOW_S


def test_loads_from_a_busy_source_extend_its_chain_and_get_identical_weights(cluster: LocalCluster) -> None:
    rate = _slow_rate(cluster)

    async def scenario() -> tuple[dict[int, TransferResult], ...]:
        first = asyncio.ensure_future(
            cluster.transfer(M, SRC, [0], [1], max_bytes_per_s=rate, piece_bytes=1 << 14)
        )
        await asyncio.sleep(0.5)  # under way: rank 0 is sending
        second = asyncio.ensure_future(cluster.transfer(M, SRC, [0], [2]))
        await asyncio.sleep(0.5)
        third = await cluster.transfer(M, SRC, [0], [3])  # the chain is 0 -> 1 -> 2 -> 3 now
        return await first, await second, third

    first, second, third = asyncio.run(scenario())
    assert first[1].sources == (0,)
    assert second[2].sources == (1,), "the second load did not take the weights from rank 1"
    assert third[3].sources == (2,)
    ref = asyncio.run(cluster.checksum(M, 0))
    assert [asyncio.run(cluster.checksum(M, r)) for r in (1, 2, 3)] == [ref] * 3
    assert sorted(cluster.pool.gpu_holders(M)) == [0, 1, 2, 3]
    for r in range(4):
        asyncio.run(cluster.release(M, r))


def test_a_load_from_an_idle_source_takes_it_from_the_source(cluster: LocalCluster) -> None:
    asyncio.run(cluster.load(M, 0, SRC))
    asyncio.run(cluster.transfer(M, SRC, [0], [1]))
    report = asyncio.run(cluster.transfer(M, SRC, [0], [2]))
    assert report[2].sources == (0,)
    for r in range(3):
        asyncio.run(cluster.release(M, r))


def test_tensor_parallel_instances_join_shard_by_shard(cluster: LocalCluster) -> None:
    """Instance [0, 1] sends to [2, 3], slowly; a load of [4, 5] from it joins: shard k
    comes from rank 2 + k, the first load's shard k."""
    model = "tiny-tp2"
    rate = _slow_rate(cluster) / 2  # (a shard is about half the model)
    asyncio.run(cluster.release(M, 0))
    asyncio.run(cluster.load_instance(model, [0, 1], SRC))

    async def scenario() -> dict[int, TransferResult]:
        first = asyncio.ensure_future(
            cluster.transfer_instances(
                model, SRC, [[0, 1]], [[2, 3]], max_bytes_per_s=rate, piece_bytes=1 << 14
            )
        )
        await asyncio.sleep(0.5)
        joined = await cluster.transfer_instances(model, SRC, [[0, 1]], [[4, 5]])
        await first
        return joined

    joined = asyncio.run(scenario())
    assert (joined[4].sources, joined[5].sources) == ((2,), (3,))
    refs = [asyncio.run(cluster.checksum(model, r)) for r in (0, 1)]
    assert refs[0] != refs[1]  # two different shards
    for k in (0, 1):
        assert [asyncio.run(cluster.checksum(model, r)) for r in (2 + k, 4 + k)] == [refs[k]] * 2
    for r in range(6):
        asyncio.run(cluster.release(model, r))


def test_a_failed_chain_fails_the_load_that_joined_it_at_once() -> None:
    """The source of 0 -> 1 dies while 1 forwards to 2 (a joined load): 2 must not wait out
    the transfer timeout, and neither new copy enters the pool."""
    timeout_s = 120.0
    with LocalCluster(ClusterConfig(num_workers=3, transfer_timeout_s=timeout_s)) as c:
        rate = _slow_rate(c)

        async def scenario() -> list[BaseException | dict[int, TransferResult]]:
            first = asyncio.ensure_future(
                c.transfer(M, SRC, [0], [1], max_bytes_per_s=rate, piece_bytes=1 << 14)
            )
            await asyncio.sleep(0.5)
            second = asyncio.ensure_future(c.transfer(M, SRC, [0], [2]))
            await asyncio.sleep(0.5)
            threading.Thread(target=c.procs[0].kill).start()
            return await asyncio.gather(first, second, return_exceptions=True)

        t = time.monotonic()
        first, second = asyncio.run(scenario())
        elapsed = time.monotonic() - t
        assert isinstance(first, ClusterOpError) and isinstance(second, ClusterOpError)
        assert second.replies[1].error.startswith("TransferError: segment"), second.replies[1].error
        assert not second.replies[2].ok
        assert elapsed < timeout_s / 2, f"the joined load waited {elapsed:.1f} s"
        assert c.pool.models_on(1) == c.pool.models_on(2) == []


def test_flights_join_the_latest_load_stemming_from_a_busy_source() -> None:
    flights = Flights()
    a = Flight.of("m", [0], [1])
    with flights.flying(a):
        assert flights.joinable("m", [0], 1) is a
        assert flights.joinable("m", [5], 1) is None  # another source: not busy
        assert flights.joinable("other", [0], 1) is None
        assert flights.joinable("m", [0], 2) is None  # a tp=2 load cannot join a tp=1 chain
        b = a.joined_by([2])
        with flights.flying(b):
            assert flights.joinable("m", [0], 1) is b  # the chain grows: 0 -> 1 -> 2 -> ...
            assert b.senders == {1} and b.tails == (2,)
    with flights.flying(b):  # rank 0 sends nothing now: a load from it starts afresh
        assert flights.joinable("m", [0], 1) is None
    assert flights.joinable("m", [0], 1) is None


def test_an_operation_sharing_a_rank_runs_beside_it_and_holds_back_those_after_both() -> None:
    lines = RankLines()

    async def scenario() -> list[str]:
        order: list[str] = []
        first_may_end, shared_started = asyncio.Event(), asyncio.Event()

        async def first() -> None:  # holds rank 1 until the shared one has started
            async with lines.holding([1]):
                await first_may_end.wait()
            order.append("first")

        async def shared() -> None:  # holds rank 2, shares rank 1: starts at once
            async with lines.holding([2], sharing=[1]):
                shared_started.set()
            order.append("shared")

        async def after() -> None:  # called last on rank 1: waits for both
            async with lines.holding([1]):
                order.append("after")

        tasks = [asyncio.ensure_future(first())]
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(shared()))
        await asyncio.wait_for(shared_started.wait(), 30)  # (it did not wait for the first)
        tasks.append(asyncio.ensure_future(after()))
        for _ in range(5):
            await asyncio.sleep(0)
        assert "after" not in order  # the first one still holds rank 1
        first_may_end.set()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["shared", "first", "after"]


def test_a_source_that_holds_nothing_fails_its_receivers_at_once(cluster: LocalCluster) -> None:
    """What a joined load meets when the chain's tail lost its weights before the join
    reached it: the tail refuses, and breaks its links so its receivers do not wait out
    the transfer timeout (60 s here)."""
    t = time.monotonic()
    with pytest.raises(ClusterOpError) as err:
        asyncio.run(cluster.transfer(M, SRC, [3], [2]))
    assert "holds no copy" in err.value.replies[3].error
    assert not err.value.replies[2].ok
    assert time.monotonic() - t < 30
    assert cluster.pool.models_on(2) == []
    asyncio.run(cluster.load(M, 3, SRC))  # the rebuilt link carries the next transfer
    asyncio.run(cluster.transfer(M, SRC, [3], [2]))
    assert asyncio.run(cluster.checksum(M, 2)) == asyncio.run(cluster.checksum(M, 3))
    for r in (2, 3):
        asyncio.run(cluster.release(M, r))
