"""A model that cannot fit one rank's device (its share of the weights and the KV cache of
one request of its whole context) is refused at start with the sizes involved, before any
cost probe or load (serve/costs.py); a CPU worker reports its host's memory."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from blitzscale.cluster.commands import CostQuery
from blitzscale.control.costmodel import CostReport
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.config import ModelEntry, ServeConfig
from blitzscale.serve.costs import check_fits_device, cost_models

GB = 10**9
# Llama-3-70B-shaped in bf16: 141 GB of weights, 320 KiB of KV per token, 8192 tokens
BIG = CostReport("NVIDIA H200", 141 * GB, 320 * 1024, 80, device_memory_bytes=143 * GB, context_len=8192)


def test_a_model_over_one_device_is_refused_naming_every_size() -> None:
    with pytest.raises(InvalidRequestError) as err:
        check_fits_device("big", BIG, tp=1)
    msg = str(err.value)
    for part in (
        "'big'",
        "141.00 GB per rank (tp=1)",
        "8192-token context",
        "2.68 GB of KV",
        "143.00 GB",
        "H200",
    ):
        assert part in msg, (part, msg)


def test_a_larger_tp_or_a_device_of_unknown_size_passes() -> None:
    check_fits_device("big", BIG, tp=2)  # 70.5 GB + 1.3 GB per rank
    check_fits_device("big", CostReport("?", 141 * GB, 320 * 1024, 80), tp=1)  # (0: unknown)


class _Workers:
    """A cluster's cost_report, answering with a device of `memory` bytes."""

    def __init__(self, memory: int) -> None:
        self.memory = memory
        self.queries: list[CostQuery] = []

    async def cost_report(self, rank: int, query: CostQuery) -> CostReport:
        self.queries.append(query)
        return CostReport(
            "NVIDIA H100", 16 * GB, 128 * 1024, 32, device_memory_bytes=self.memory, context_len=8192
        )


def test_the_check_comes_before_any_measurement() -> None:
    cfg = ServeConfig().with_overrides(models=[ModelEntry("a", "random:tiny-llama3"), ModelEntry("b")])
    models = cfg.served_models()
    folders = {m.name: "folder" for m in models}
    small: Any = _Workers(memory=12 * GB)
    with pytest.raises(InvalidRequestError, match="'a' does not fit a rank"):
        asyncio.run(cost_models(small, cfg, models, folders, cfg.engine))
    assert small.queries and not any(q.measure for q in small.queries)
