"""Several models on one pool of ranks: per-model planning, scale to zero, reclaim.

A pure function over per-model views, like the rest of `control/` (the router's scaler
and the simulator share it). Each `ModelView` is the model's own snapshot (its instances,
queue, copies; the free ranks are the whole pool's) and its bounds. Per call:
- a model with requests, or one that must stay up, is planned on its own with the planner
  and the policy (`policies.plan_actions`), on the ranks still free after the models
  before it took theirs;
- a model without a request for its keep-alive (and `min_instances` 0) scales to zero:
  its idle instances drain (its last too) and warm ones are released; a model at zero
  with no request stays there (its next request waits in the queue and brings it back:
  a warm copy is revived, else GPU copies stream, else its host copy, else disk);
- a model with requests that found no free rank for a new instance reclaims ranks from
  other models: warm (SHUTTING_NULL) instances first (released now, not after
  `shutting_null_keep_s`), then idle serving ones (drained now, released once warm),
  never a model's last instance of a role while it has requests or must stay up
  (`min_instances` is what a model keeps while the pool has room: a model with
  requests may take it down to one instance per role). Models
  with requests are planned first, and while one lacks ranks the models that do not
  lack any do not grow (else they would revive what is reclaimed for it); but a model
  with requests and nothing serving them (`_unserved`) starts on the rank it found,
  the one whose oldest request waited longest first, and while several wait so each
  gets its first instance before any gets more (models taking turns on one rank).
Every action is tagged with its model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.host_cache import HostCacheState
from blitzscale.control.planner import FALLBACK_PREFILL_RATE, Desired, desired_counts, prefill_band
from blitzscale.control.policies import (
    DrainAction,
    LoadAction,
    ReleaseAction,
    ReviveAction,
    ScaleAction,
    fixed_actions,
    plan_actions,
    to_zero_actions,
)
from blitzscale.control.snapshot import ClusterSnapshot, InstanceView
from blitzscale.control.snapshot import InstanceState as S
from blitzscale.control.states import is_serving

STEADY = (S.PREFILL, S.DECODE, S.COLOCATED)


@dataclass(frozen=True)
class ModelView:
    snapshot: ClusterSnapshot  # the model's own picture (free ranks: the pool's)
    requests: int = 0  # its requests queued or in flight
    waiting_since: float | None = None  # when its oldest queued request arrived (None: none queued)
    last_request_at: float | None = None  # None: none since the service started
    started_at: float = 0.0  # when the service started (the keep-alive's clock until then)
    min_instances: int = 0  # 0: it may scale to zero
    max_instances: int = 0  # 0: no bound
    keep_alive_s: float = math.inf
    prefill_rate: float = 0.0  # prompt tokens/s one instance prefills, from its cost model (0: unknown)
    ttft_slo_s: float = 0.0  # its time-to-first-token SLO (0: none)

    @property
    def name(self) -> str:
        return self.snapshot.model

    @property
    def scales_to_zero(self) -> bool:
        return self.min_instances == 0 and math.isfinite(self.keep_alive_s)

    @property
    def expired(self) -> bool:
        """No request for its keep-alive: it goes to zero."""
        if not self.scales_to_zero or self.requests:
            return False
        last = self.started_at if self.last_request_at is None else self.last_request_at
        return self.snapshot.now - last >= self.keep_alive_s

    @property
    def must_stay_up(self) -> bool:
        return not self.scales_to_zero


def bounds(cfg: PlannerConfig, m: ModelView, pd_mode: bool) -> PlannerConfig:
    """The planner for model `m`: its prefill rate (the config's, else its cost model's),
    its prefill band (the config's, else from its TTFT SLO) and the role bounds within its
    [min_instances, max_instances]."""
    if not cfg.tokens_prefilled_per_sec:
        rate = m.prefill_rate or FALLBACK_PREFILL_RATE
        cfg = dataclasses.replace(cfg, tokens_prefilled_per_sec=rate)
    lower, upper = prefill_band(m.ttft_slo_s, cfg.prefill_lower, cfg.prefill_upper)
    cfg = dataclasses.replace(cfg, prefill_lower=lower, prefill_upper=upper)
    lo, hi = m.min_instances, m.max_instances
    if not pd_mode:
        min_p = max(cfg.min_prefill, lo)
        caps = [c for c in (cfg.max_prefill, hi) if c]
        max_p = max(min_p, min(caps)) if caps else 0
        return dataclasses.replace(cfg, min_prefill=min_p, max_prefill=max_p)
    min_d = max(cfg.min_decode, lo - cfg.min_prefill)
    if not hi:
        return dataclasses.replace(cfg, min_decode=min_d)
    max_p = max(cfg.min_prefill, min(cfg.max_prefill or hi, hi - min_d))
    max_d = max(min_d, min(cfg.max_decode or hi, hi - cfg.min_prefill))
    return dataclasses.replace(cfg, min_decode=min_d, max_prefill=max_p, max_decode=max_d)


def _capped(d: Desired, max_instances: int) -> Desired:
    """At most `max_instances` in all: prefill gives way first, each role keeps one."""
    if not max_instances or d.prefill_target + d.decode_target <= max_instances:
        return d
    over = d.prefill_target + d.decode_target - max_instances
    p = max(1, d.prefill_target - over)
    dec = max(1 if d.decode_target else 0, d.decode_target - (over - (d.prefill_target - p)))
    return dataclasses.replace(d, prefill_target=p, decode_target=dec)


def pool_actions(
    models: Sequence[ModelView],
    policy_cfg: PolicyConfig,
    planner_cfg: PlannerConfig,
    host_cache: HostCacheState,
) -> list[ScaleAction]:
    """Every model's actions for this round, each tagged with its model (see above).
    `host_cache` (sllm) is the cluster's, every model's entries in it."""
    if not models:
        return []
    if policy_cfg.name == "fixed":
        return _fixed_replacements(models, policy_cfg, planner_cfg, host_cache)
    claimed: set[int] = set()
    planned: list[tuple[str, list[ScaleAction]]] = []
    short: dict[str, int] = {}
    unserved = {m.name for m in models if _unserved(m)}
    for m in sorted(models, key=lambda m: _order(m, unserved)):
        snap = m.snapshot
        snap = dataclasses.replace(snap, free_ranks=tuple(r for r in snap.free_ranks if r not in claimed))
        if m.expired:
            acts = to_zero_actions(snap, planner_cfg)
        elif not snap.instances and not m.requests and not m.must_stay_up:
            continue  # at zero, and nothing asks for it
        else:
            cfg = bounds(planner_cfg, m, snap.pd_mode)
            # while several wait with nothing to serve them, each gets its first instance
            # (one per role) before any gets more
            cap = 1 if m.name in unserved and len(unserved) > 1 else m.max_instances
            desired = _capped(desired_counts(snap, cfg), cap)
            acts, unmet = plan_actions(snap, desired, policy_cfg, cfg, host_cache)
            if unmet and m.requests:
                short[m.name] = unmet
        claimed.update(r for a in acts if isinstance(a, LoadAction) for r in a.target_ranks)
        planned.append((m.name, acts))
    out: list[ScaleAction] = []
    for name, acts in planned:
        # While one lacks ranks the others do not grow (else they would revive what is
        # reclaimed for it), but a model with requests and nothing serving them starts:
        # the rank it claimed is one no model planned after it could have had.
        if short and name not in short and name not in unserved:
            acts = [a for a in acts if not isinstance(a, LoadAction | ReviveAction)]
        out += [dataclasses.replace(a, model=name) for a in acts]
    if short:
        out += reclaim(models, short, out)
    return out


def _fixed_replacements(
    models: Sequence[ModelView],
    policy_cfg: PolicyConfig,
    planner_cfg: PlannerConfig,
    host_cache: HostCacheState,
) -> list[ScaleAction]:
    """`fixed`: no model scales, none goes to zero; each one's lost instances are loaded
    again (`policies.fixed_actions`), on ranks no model before it took this round."""
    claimed: set[int] = set()
    out: list[ScaleAction] = []
    for m in models:
        snap = dataclasses.replace(
            m.snapshot, free_ranks=tuple(r for r in m.snapshot.free_ranks if r not in claimed)
        )
        acts = fixed_actions(snap, policy_cfg, planner_cfg, host_cache)
        claimed.update(r for a in acts if isinstance(a, LoadAction) for r in a.target_ranks)
        out += [dataclasses.replace(a, model=m.name) for a in acts]
    return out


def _order(m: ModelView, unserved: set[str]) -> tuple[bool, bool, float]:
    """Models with requests first, those with nothing to serve them before the others,
    each the one whose oldest queued request waited longest first (a rank given back for
    one is not taken by another that just got a request)."""
    since = math.inf if m.waiting_since is None else m.waiting_since
    return (not m.requests, m.name not in unserved, since)


def _unserved(m: ModelView) -> bool:
    """It has requests and no instance serving or loading for them (at zero, or only
    draining or warm ones, which it may revive)."""
    return m.requests > 0 and not any(
        is_serving(i.state) or i.state in (S.LOADING, S.MUTATING_TO_DECODE) for i in m.snapshot.instances
    )


def reclaim(
    models: Sequence[ModelView], short: dict[str, int], planned: list[ScaleAction]
) -> list[ScaleAction]:
    """Ranks for models with requests and no free rank (`short`: model -> instances it
    lacks), taken from other models: warm instances first, then idle serving ones (idle
    now: a request is waiting for the rank). With several models resident per GPU, not
    an instance on a GPU that already holds every model short of ranks (the slot it frees
    could take none of them: its GPU holds a model once)."""
    taken = {(a.model, a.instance_id) for a in planned if not isinstance(a, LoadAction)}
    # ranks already on their way back: releases, and other models' own drains (warm next round)
    coming = sum(
        1
        for a in planned
        if isinstance(a, ReleaseAction) or (isinstance(a, DrainAction) and a.model not in short)
    )
    need = sum(short.values()) - coming
    if need <= 0:
        return []
    needy = set(short)
    # with slots, a rank freed on a GPU that holds every needy model already helps none
    useless = set.intersection(*(m.snapshot.gpus_with_model() for m in models if m.name in needy))
    warm: list[tuple[float, str, InstanceView]] = []
    idle: list[tuple[float, str, InstanceView]] = []
    for m in models:
        if m.name in needy:
            continue
        w = m.snapshot.slot_workers
        for i in m.snapshot.instances:
            if (m.name, i.id) in taken or i.idle_since is None or i.num_running or i.num_waiting:
                continue
            if w and {r % w for r in i.ranks} <= useless:
                continue
            if i.state is S.SHUTTING_NULL:
                warm.append((i.idle_since, m.name, i))
            elif i.state in STEADY:
                idle.append((i.idle_since, m.name, i))
    out: list[ScaleAction] = []
    for _, name, i in sorted(warm, key=lambda x: (x[0], x[1], x[2].id))[:need]:
        out.append(ReleaseAction(i.id, model=name))
    need -= len(out)
    drained = {(a.model, a.instance_id) for a in planned if isinstance(a, DrainAction)}
    serving = {m.name: _serving_by_state(m, drained) for m in models}
    keep = {m.name: m.requests > 0 or m.must_stay_up for m in models}
    for _, name, i in sorted(idle, key=lambda x: (x[0], x[1], x[2].id)):
        if need <= 0:
            break
        left = serving[name]
        if keep[name] and left.get(i.state, 0) <= 1:
            continue  # its model's last instance of this role, and the model is in use
        left[i.state] = left.get(i.state, 0) - 1
        out.append(DrainAction(i.id, model=name))
        need -= 1
    return out


def _serving_by_state(m: ModelView, drained: set[tuple[str, int]]) -> dict[S, int]:
    """Its steady instances per state, less those its own plan drains this round."""
    counts: dict[S, int] = {}
    for i in m.snapshot.instances:
        if i.state in STEADY and (m.name, i.id) not in drained:
            counts[i.state] = counts.get(i.state, 0) + 1
    return counts
