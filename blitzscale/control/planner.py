"""When to scale (design §5): per role, a [min, max] instance range from three constraints,
then a target from the decision rule. A pure function of the snapshot, like Ray Serve's
autoscaling policy (context -> desired replicas), with bounds applied around it.

Constraints (each gives [ceil(demand / (upper * rate)), ceil(demand / (lower * rate))]):
1. decode memory: used KV blocks of instances holding decode KV, rate = blocks per instance;
2. KV migration: tokens waiting to migrate, rate = tokens a decode instance receives a second;
3. prefill throughput: queued prompt tokens + tokens held by live targets, rate = tokens an
   instance prefills a second.
A role's min is the largest min (every constraint must stay under its upper band) and its max
the largest max (scale down only when every constraint is over-provisioned).

In colocated mode there is one role, "colocated": its range combines prefill throughput and
memory (every instance both prefills and decodes; nothing migrates). It is reported in the
prefill_* fields of `Desired`, with decode_* all 0, and uses the prefill bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blitzscale.control.config import PlannerConfig
from blitzscale.control.snapshot import ClusterSnapshot
from blitzscale.control.states import (
    counts_as_colocated,
    counts_as_decode,
    counts_as_prefill,
    holds_decode_kv,
)

_EPS = 1e-9  # a demand that exactly fills a band must not round up on float error


@dataclass(frozen=True)
class Desired:
    prefill_min: int
    prefill_max: int
    decode_min: int
    decode_max: int
    prefill_target: int
    decode_target: int


@dataclass(frozen=True)
class Current:
    """Instances a role has now, or is getting (see `states.counts_as_*`)."""

    prefill: int  # colocated instances in colocated mode
    decode: int  # always 0 in colocated mode


def current_counts(snapshot: ClusterSnapshot) -> Current:
    states = [i.state for i in snapshot.instances]
    if not snapshot.pd_mode:
        return Current(sum(counts_as_colocated(s) for s in states), 0)
    return Current(sum(counts_as_prefill(s) for s in states), sum(counts_as_decode(s) for s in states))


# A model with no cost model and no [planner] tokens_prefilled_per_sec: a CPU worker's rate
# (SmolLM2-135M, one thread). Served models have a cost model; this is for the rest.
FALLBACK_PREFILL_RATE = 2000.0


# The prefill band of a model without a TTFT SLO: seconds of queued prompt work per instance.
DEFAULT_PREFILL_BAND = (0.5, 0.7)
# With a TTFT SLO: an instance holds at most this share of it in queued prompt work, so the
# last prompt in its queue keeps the rest for its own prefill and for a scale-up to land;
# the lower edge keeps the default band's hysteresis (0.5 / 0.7).
SLO_QUEUE_SHARE = 0.5
BAND_HYSTERESIS = DEFAULT_PREFILL_BAND[0] / DEFAULT_PREFILL_BAND[1]


def prefill_band(ttft_slo_s: float, lower: float = 0.0, upper: float = 0.0) -> tuple[float, float]:
    """The prefill band (lower, upper): the edges given (0: derived), the upper one from a
    model's TTFT SLO (0: none, the default band's), the lower one from the upper."""
    if not upper:
        upper = SLO_QUEUE_SHARE * ttft_slo_s if ttft_slo_s > 0 else DEFAULT_PREFILL_BAND[1]
        upper = max(upper, lower / BAND_HYSTERESIS)  # (above a lower edge given)
    return (lower or BAND_HYSTERESIS * upper, upper)


def band_range(demand: float, rate: float, lower: float, upper: float) -> tuple[int, int]:
    """Instances that keep each one between `lower` and `upper` of `rate` busy."""
    if demand <= 0 or rate <= 0:
        return (0, 0)
    return (math.ceil(demand / (upper * rate) - _EPS), math.ceil(demand / (lower * rate) - _EPS))


def _max_blocks(snapshot: ClusterSnapshot, cfg: PlannerConfig) -> int:
    if cfg.max_blocks_per_instance:
        return cfg.max_blocks_per_instance
    return max((i.total_blocks for i in snapshot.instances), default=0)


def _merge(*ranges: tuple[int, int]) -> tuple[int, int]:
    return (max(lo for lo, _ in ranges), max(hi for _, hi in ranges))


def decide(current: int, lo: int, hi: int, bound_lo: int, bound_hi: int) -> tuple[int, int, int]:
    """The decision rule: clamp [lo, hi] into the bounds (at least one instance, `bound_hi`
    0 = none); under-provisioned -> the middle of the range, over-provisioned -> one fewer.

    Returns the clamped (lo, hi, target). When `current` exceeds the configured max by more
    than one, the target is that max (bounds win); policies still drain one per call.
    """
    floor = max(1, bound_lo)
    ceil = bound_hi if bound_hi > 0 else math.inf
    lo = int(min(max(lo, floor), ceil))
    hi = int(min(max(hi, lo), ceil))
    if lo > current:
        target = math.ceil((lo + hi) / 2)
    elif hi < current:
        target = current - 1
    else:
        target = current
    return lo, hi, int(min(max(target, floor), ceil))


def desired_counts(snapshot: ClusterSnapshot, cfg: PlannerConfig) -> Desired:
    cur = current_counts(snapshot)
    blocks = sum(i.used_blocks for i in snapshot.instances if holds_decode_kv(i.state, snapshot.pd_mode))
    memory = band_range(blocks, _max_blocks(snapshot, cfg), cfg.decode_lower, cfg.decode_upper)
    prompt_tokens = snapshot.queued_prompt_tokens + snapshot.live_target_tokens
    rate = cfg.tokens_prefilled_per_sec or FALLBACK_PREFILL_RATE
    lower, upper = prefill_band(0.0, cfg.prefill_lower, cfg.prefill_upper)  # (bounds: with its SLO)
    prefill = band_range(prompt_tokens, rate, lower, upper)
    if not snapshot.pd_mode:
        lo, hi, target = decide(cur.prefill, *_merge(prefill, memory), cfg.min_prefill, cfg.max_prefill)
        return Desired(lo, hi, 0, 0, target, 0)
    migration = band_range(
        snapshot.migrating_tokens, cfg.tokens_transferred_per_sec, cfg.migration_lower, cfg.migration_upper
    )
    p_lo, p_hi, p_target = decide(cur.prefill, *prefill, cfg.min_prefill, cfg.max_prefill)
    d_lo, d_hi, d_target = decide(cur.decode, *_merge(memory, migration), cfg.min_decode, cfg.max_decode)
    return Desired(p_lo, p_hi, d_lo, d_hi, p_target, d_target)
