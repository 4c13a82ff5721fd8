"""A load from a source still sending joins its chain over NCCL (needs 3 GPUs): the chain's
last target forwards pieces it receives on one communicator, on another, from its own
thread, and every copy is bit-identical."""

from __future__ import annotations

import asyncio

import pytest
import torch

from blitzscale.cluster.config import ClusterConfig
from blitzscale.cluster.local import LocalCluster

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 3, reason="needs 3 CUDA GPUs"),
]
MODEL = "random:tiny-llama3"
SLOW_S = 3.0  # what the first, capped transfer takes


def test_a_load_from_a_busy_source_joins_its_chain_over_nccl() -> None:
    with LocalCluster(ClusterConfig(num_workers=3, device="cuda", transfer_timeout_s=30)) as c:
        rate = asyncio.run(c.load("m", 0, MODEL)).bytes / SLOW_S

        async def scenario() -> tuple[tuple[int, ...], tuple[int, ...]]:
            first = asyncio.ensure_future(
                c.transfer("m", MODEL, [0], [1], max_bytes_per_s=rate, piece_bytes=1 << 14)
            )
            await asyncio.sleep(0.5)
            second = await c.transfer("m", MODEL, [0], [2])
            return (await first)[1].sources, second[2].sources

        assert asyncio.run(scenario()) == ((0,), (1,))
        ref = asyncio.run(c.checksum("m", 0))
        assert [asyncio.run(c.checksum("m", r)) for r in (1, 2)] == [ref, ref]
