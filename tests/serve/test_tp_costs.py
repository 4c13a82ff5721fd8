"""The cost models of tensor-parallel instances at start (serve/costs.py): measured by rank 0
on its instance group as one shard's, or a `[model] profile` given as one shard's or as the
whole model's on one device (what `blitzscale profile` measures), and nothing else."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from blitzscale.cluster.commands import CostQuery
from blitzscale.control.costmodel import CostReport, Profile, ProfileError, load_profile
from blitzscale.serve.config import ModelEntry, ServeConfig
from blitzscale.serve.costs import cost_models, shape_reports

WHOLE = load_profile("llama3-8b-h200")  # 16.06 GB, 128 KiB of KV a token, 32 layers
SHARD = replace(WHOLE, name="llama3-8b-h200-tp2", weight_bytes=8_200_000_000, kv_bytes_per_token=65536)


class _Workers:
    """Rank 0 as serve asks it: the model's sizes (one shard's when asked with tp > 1) and,
    when asked to measure, the shard's profile."""

    def __init__(self) -> None:
        self.queries: list[CostQuery] = []

    async def cost_report(self, rank: int, query: CostQuery) -> CostReport:
        self.queries.append(query)
        big = 2 if query.model == "big" else 1  # another model of twice the size
        p = SHARD if query.tp > 1 else WHOLE
        sizes = (p.weight_bytes * big, p.kv_bytes_per_token, p.num_layers)
        return CostReport(WHOLE.device, *sizes, profile=p if query.measure else None)


def _costs(given: Profile | None = None, models: int = 1) -> tuple[dict[str, Any], _Workers]:
    entries = [ModelEntry("m", "random:tiny-llama3"), ModelEntry("big", "random:tiny-llama3")][:models]
    cfg = ServeConfig().with_overrides(models=entries, model={"tp": 2}, cluster={"num_workers": 2})
    served = cfg.served_models()
    folders = {m.name: "f" for m in served}
    workers = _Workers()
    shapes = asyncio.run(shape_reports(workers, cfg, served, folders, cfg.engine))  # type: ignore[arg-type]
    out = asyncio.run(cost_models(workers, cfg, served, folders, cfg.engine, shapes, given))  # type: ignore[arg-type]
    return out, workers


def test_a_tp_instance_is_measured_as_one_shard_on_its_group() -> None:
    costs, workers = _costs()
    assert costs["m"] == SHARD
    measured = [q for q in workers.queries if q.measure]
    assert [q.tp for q in measured] == [2]


def test_another_model_is_scaled_from_the_shard_by_its_own_shards_size() -> None:
    costs, _ = _costs(models=2)
    assert costs["big"].weight_bytes == 2 * SHARD.weight_bytes
    assert costs["big"].decode_ms[0][0] == pytest.approx(2 * SHARD.decode_ms[0][0], rel=1e-3)


@pytest.mark.parametrize("given", [WHOLE, SHARD])
def test_a_profile_file_of_the_whole_model_or_of_a_shard_is_taken_as_given(given: Profile) -> None:
    costs, workers = _costs(given)
    assert costs["m"] == given and not any(q.measure for q in workers.queries)


@pytest.mark.parametrize("given", [WHOLE, SHARD])
def test_other_models_are_scaled_from_a_given_profile_in_its_own_sizes(given: Profile) -> None:
    """A whole-model file is compared with the other models' whole sizes, a shard's with
    their shards': "big" (twice the size) costs twice either way."""
    costs, _ = _costs(given, models=2)
    assert costs["big"].weight_bytes == 2 * given.weight_bytes
    assert costs["big"].decode_ms[0][0] == pytest.approx(2 * given.decode_ms[0][0], rel=1e-3)


def test_a_profile_file_of_another_model_is_refused() -> None:
    other = replace(WHOLE, weight_bytes=WHOLE.weight_bytes // 3)
    with pytest.raises(ProfileError, match="is of another model"):
        _costs(other)
