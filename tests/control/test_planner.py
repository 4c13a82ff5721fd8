"""The planner (design §5) on hand-computed snapshots: each constraint binding alone, the
decision rule, and the bounds. Rates are round numbers so every range is checkable by hand."""

from __future__ import annotations

import pytest

from blitzscale.control.config import PlannerConfig
from blitzscale.control.planner import Current, Desired, band_range, current_counts, desired_counts
from blitzscale.control.snapshot import InstanceState as S

from .builders import inst, snap

# prefill band 0.5/0.7 of 1000 tokens/s; decode 0.75/0.95 of 100 blocks; migration 0.4/0.8 of 1000.
CFG = PlannerConfig(
    tokens_prefilled_per_sec=1000, tokens_transferred_per_sec=1000, max_blocks_per_instance=100
)


def test_prefill_throughput_alone_scales_prefill_to_the_middle_of_its_range() -> None:
    # W = 2100 queued + 700 held by live targets = 2800 -> [2800/700, ceil(2800/500)] = [4, 6].
    s = snap(inst(0, S.PREFILL), inst(1, S.DECODE), queued=2100, live=700)
    assert desired_counts(s, CFG) == Desired(4, 6, 1, 1, 5, 1)


def test_decode_memory_alone_counts_blocks_of_draining_decode_instances_too() -> None:
    # D = 100 + 90 + 95 = 285 blocks -> [285/95, ceil(285/75)] = [3, 4]; 2 decode instances now
    # (the draining one is demand, not capacity); blocks per instance from the snapshot.
    s = snap(
        inst(0, S.PREFILL, used=40, total=100),  # prefill KV is not decode memory
        inst(1, S.DECODE, used=100, total=100),
        inst(2, S.DECODE, used=90, total=100),
        inst(3, S.SHUTTING_DECODE, used=95, total=100),
    )
    assert desired_counts(s, PlannerConfig(tokens_prefilled_per_sec=1000)) == Desired(1, 1, 3, 4, 1, 4)


def test_kv_migration_alone_scales_decode() -> None:
    # 2000 tokens to migrate -> [2000/800, 2000/400] = [3, 5]; memory (10 blocks) wants only 1.
    s = snap(inst(0, S.PREFILL), inst(1, S.DECODE, used=10), migrating=2000)
    assert desired_counts(s, CFG) == Desired(1, 1, 3, 5, 1, 4)


def test_decode_range_is_the_largest_min_and_the_largest_max_of_its_constraints() -> None:
    # memory 285 blocks -> [3, 4]; migration 1400 tokens -> [ceil(1.75), ceil(3.5)] = [2, 4].
    # 4 decode instances now: inside [3, 4], so nothing changes.
    decode = [inst(i, S.DECODE, used=u) for i, u in ((1, 100), (2, 100), (3, 85), (4, 0))]
    s = snap(inst(0, S.PREFILL), *decode, migrating=1400)
    assert desired_counts(s, CFG) == Desired(1, 1, 3, 4, 1, 4)


def test_a_demand_exactly_on_the_upper_band_does_not_round_up() -> None:
    assert band_range(2100, 1000, 0.5, 0.7) == (3, 5)
    assert band_range(0, 1000, 0.5, 0.7) == (0, 0)


def test_scale_down_is_by_one_instance_per_call_and_never_below_one_per_role() -> None:
    s = snap(*(inst(i, S.PREFILL, idle_for=5) for i in range(4)), inst(4, S.DECODE), inst(5, S.DECODE))
    assert desired_counts(s, CFG) == Desired(1, 1, 1, 1, 3, 1)
    lone = snap(inst(0, S.PREFILL, idle_for=5), inst(1, S.DECODE, idle_for=5))
    assert desired_counts(lone, CFG) == Desired(1, 1, 1, 1, 1, 1)


def test_an_empty_cluster_wants_one_instance_per_role() -> None:
    assert desired_counts(snap(), CFG) == Desired(1, 1, 1, 1, 1, 1)


def test_configured_bounds_clamp_ranges_and_targets() -> None:
    cfg = PlannerConfig(
        tokens_prefilled_per_sec=1000, max_blocks_per_instance=100, min_prefill=2, max_prefill=3, max_decode=2
    )
    # W = 7000 -> [10, 14], clamped to [3, 3]; decode wants 1 but the min is 1.
    busy = snap(inst(0, S.PREFILL), inst(1, S.DECODE), queued=7000)
    assert desired_counts(busy, cfg) == Desired(3, 3, 1, 1, 3, 1)
    assert desired_counts(snap(), cfg) == Desired(2, 2, 1, 1, 2, 1)
    # 6 prefill and 4 decode instances, max 3 and 2: the bounds win over "one per call".
    over = snap(*(inst(i, S.PREFILL) for i in range(6)), *(inst(i, S.DECODE) for i in range(6, 10)))
    assert desired_counts(over, cfg) == Desired(2, 2, 1, 1, 3, 2)


def test_instances_being_added_count_and_draining_ones_do_not() -> None:
    states = [
        S.LOADING,
        S.NEW_PREFILL,
        S.OLD_PREFILL,
        S.REFRACTORY_PREFILL,
        S.PREFILL,
        S.MUTATING_TO_DECODE,
        S.DECODE,
        S.SHUTTING_PREFILL,
        S.SHUTTING_DECODE,
        S.SHUTTING_NULL,
        S.INACTIVE,
    ]
    s = snap(*(inst(i, st) for i, st in enumerate(states)))
    assert current_counts(s) == Current(prefill=5, decode=2)
    colocated = snap(
        *(inst(i, st) for i, st in enumerate([S.COLOCATED, S.LOADING, S.SHUTTING_NULL])), pd_mode=False
    )
    assert current_counts(colocated) == Current(prefill=2, decode=0)


def test_colocated_mode_combines_prefill_throughput_and_memory_in_one_role() -> None:
    # memory 200 blocks -> [3, 3]; W = 700 -> [1, 2]; combined [3, 3]; 2 instances now.
    s = snap(inst(0, S.COLOCATED, used=100), inst(1, S.COLOCATED, used=100), queued=700, pd_mode=False)
    assert desired_counts(s, CFG) == Desired(3, 3, 0, 0, 3, 0)
    # Prefill throughput alone: W = 2800 -> [4, 6] -> 5.
    s = snap(inst(0, S.COLOCATED), queued=2800, migrating=10**6, pd_mode=False)
    assert desired_counts(s, CFG) == Desired(4, 6, 0, 0, 5, 0)


@pytest.mark.parametrize("blocks", [0, 100])
def test_no_block_size_known_means_no_memory_constraint(blocks: int) -> None:
    s = snap(inst(0, S.PREFILL), inst(1, S.DECODE, used=500, total=blocks))
    d = desired_counts(s, PlannerConfig())
    assert (d.decode_min, d.decode_max) == ((1, 1) if blocks == 0 else (6, 7))
