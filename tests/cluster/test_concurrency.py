"""Cluster operations on different ranks run side by side (each on its own ranks, in the
order it was called there): nothing waits behind an unrelated load or transfer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from blitzscale.checkpoint.convert import convert
from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster
from blitzscale.messages import LoadResult

M = "tiny"
SRC = "random:tiny-llama3"
SLOW_S = 5.0  # what a capped load or transfer takes here (long beside any quick operation)
T = TypeVar("T")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert(SRC, tmp_path_factory.mktemp("tiny") / "bz")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(ClusterConfig(num_workers=4, transfer_timeout_s=60))
    with c:
        yield c


def _rate(c: LocalCluster) -> float:
    """Bytes per second that make one copy of the model take SLOW_S to move."""
    size = asyncio.run(c.load(M, 0, SRC)).bytes
    asyncio.run(c.release(M, 0))
    return size / SLOW_S


async def _timed(aw: Awaitable[T]) -> tuple[float, float, T]:
    t = time.monotonic()
    out = await aw
    return t, time.monotonic(), out


def test_disk_loads_on_two_ranks_overlap(cluster: LocalCluster, tiny_dir: Path) -> None:
    rate = _rate(cluster)

    async def both() -> list[tuple[float, float, LoadResult]]:
        loads = [cluster.load(M, r, str(tiny_dir), max_bytes_per_s=rate) for r in (1, 2)]
        return await asyncio.gather(*(_timed(x) for x in loads))

    t0 = time.monotonic()
    (s1, e1, r1), (s2, e2, r2) = asyncio.run(both())
    wall = time.monotonic() - t0
    own = r1.seconds + r2.seconds  # each load's own time, measured on its worker
    assert min(r1.seconds, r2.seconds) >= 0.8 * SLOW_S  # the cap held
    assert wall < 0.8 * own, f"two {SLOW_S} s loads took {wall:.1f} s: they ran one after the other"
    assert s2 < e1 and s1 < e2
    for r in (1, 2):
        asyncio.run(cluster.release(M, r))


def test_a_finished_load_is_activated_and_released_while_another_load_runs(
    cluster: LocalCluster, tiny_dir: Path
) -> None:
    rate = _rate(cluster)

    async def scenario() -> tuple[float, float]:
        slow = asyncio.ensure_future(_timed(cluster.load(M, 2, str(tiny_dir), max_bytes_per_s=rate)))
        await cluster.load(M, 1, SRC)  # quick
        await cluster.set_role(1, "decode")  # any command on the finished rank
        await cluster.release(M, 1)
        quick_done = time.monotonic()
        _, slow_done, _ = await slow
        return quick_done, slow_done

    quick_done, slow_done = asyncio.run(scenario())
    assert quick_done < slow_done
    asyncio.run(cluster.release(M, 2))


def test_a_transfer_does_not_delay_a_release_or_a_mutation(cluster: LocalCluster) -> None:
    rate = _rate(cluster)

    async def scenario() -> tuple[float, float]:
        await asyncio.gather(cluster.load(M, 0, SRC), cluster.load(M, 3, SRC))
        transfer = asyncio.ensure_future(
            _timed(cluster.transfer(M, SRC, [0], [1], max_bytes_per_s=rate, piece_bytes=1 << 16))
        )
        await asyncio.sleep(0.2)  # the transfer is under way
        await cluster.release(M, 3)
        await cluster.set_role(2, "decode")
        others_done = time.monotonic()
        _, transfer_done, _ = await transfer
        return others_done, transfer_done

    others_done, transfer_done = asyncio.run(scenario())
    assert others_done < transfer_done
    assert asyncio.run(cluster.checksum(M, 1)) == asyncio.run(cluster.checksum(M, 0))
    for r in (0, 1):
        asyncio.run(cluster.release(M, r))


def test_operations_on_one_rank_keep_their_order(cluster: LocalCluster) -> None:
    async def scenario() -> list[str]:
        order: list[str] = []

        async def step(name: str, aw: Awaitable[Any]) -> None:
            await aw
            order.append(name)

        await asyncio.gather(
            step("load", cluster.load(M, 0, SRC)),
            step("checksum", cluster.checksum(M, 0)),  # would fail before the load
            step("release", cluster.release(M, 0)),
        )
        return order

    assert asyncio.run(scenario()) == ["load", "checksum", "release"]


def test_an_operation_on_several_ranks_keeps_its_place_on_each(cluster: LocalCluster, tiny_dir: Path) -> None:
    """A transfer 0 -> 1 is called while rank 0 is still loading; a checksum on rank 1 called
    after it must wait for it (rank 1 holds nothing before), although rank 1 is free."""
    rate = _rate(cluster)

    async def scenario() -> tuple[str, str]:
        load = asyncio.ensure_future(cluster.load(M, 0, str(tiny_dir), max_bytes_per_s=rate))
        await asyncio.sleep(0)  # the load has its place on rank 0
        transfer = asyncio.ensure_future(cluster.transfer(M, SRC, [0], [1]))
        await asyncio.sleep(0)
        on_1 = await cluster.checksum(M, 1)
        await asyncio.gather(load, transfer)
        return on_1, await cluster.checksum(M, 0)

    on_1, on_0 = asyncio.run(scenario())
    assert on_1 == on_0
    for r in (0, 1):
        asyncio.run(cluster.release(M, r))
