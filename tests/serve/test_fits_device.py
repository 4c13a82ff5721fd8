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
from blitzscale.serve.costs import check_fits_device, models_per_rank, shape_reports

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


def test_a_model_over_the_workers_memory_cap_names_the_cap() -> None:
    with pytest.raises(
        InvalidRequestError,
        match=r"143.00 GB a worker may hold \(\[cluster\] worker_memory_bytes\); raise it",
    ):
        check_fits_device("big", BIG, tp=1, capped=True)


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
    shapes = asyncio.run(shape_reports(small, cfg, models, folders, cfg.engine))
    with pytest.raises(InvalidRequestError, match="'a' does not fit a rank"):
        models_per_rank(cfg, shapes, cfg.engine)  # (serve: before the cost model is measured)
    assert len(small.queries) == 2 and not any(q.measure for q in small.queries)


@pytest.mark.parametrize(
    "device,asked,n,want",
    [
        ("cuda", 0, 2, 2),  # two 8B models (16 GB + 1 GB of KV each) on an 80 GB GPU: both resident
        ("cuda", 0, 6, 3),  # 80 x 0.85 (gpu_memory_utilization) = 68 GB: three of 17.07 GB fit
        ("cuda", 0, 1, 1),  # one model: one engine, the whole device
        ("cpu", 0, 3, 1),  # a CPU worker's memory is its host's: one unless asked
        ("cuda", 3, 6, 3),  # asked: as asked
    ],
)
def test_models_per_rank_is_derived_from_the_device_and_the_models(
    device: str, asked: int, n: int, want: int
) -> None:
    cfg = ServeConfig().with_overrides(
        models=[ModelEntry(f"m{i}", "random:tiny-llama3") for i in range(n)],
        cluster={"device": device, "num_workers": 1, "models_per_rank": asked},
    )
    models = cfg.served_models()
    h100: Any = _Workers(memory=80 * GB)
    shapes = asyncio.run(shape_reports(h100, cfg, models, {m.name: "f" for m in models}, cfg.engine))
    assert models_per_rank(cfg, shapes, cfg.engine) == want


def test_asked_for_more_models_per_rank_than_fit_is_refused_with_how_many_would() -> None:
    cfg = ServeConfig().with_overrides(
        models=[ModelEntry(f"m{i}", "random:tiny-llama3") for i in range(6)],
        cluster={"device": "cuda", "num_workers": 1, "models_per_rank": 6},
    )
    models = cfg.served_models()
    h100: Any = _Workers(memory=80 * GB)
    shapes = asyncio.run(shape_reports(h100, cfg, models, {m.name: "f" for m in models}, cfg.engine))
    with pytest.raises(InvalidRequestError, match=r"models_per_rank=6.*at most 3 such models fit a rank"):
        models_per_rank(cfg, shapes, cfg.engine)
