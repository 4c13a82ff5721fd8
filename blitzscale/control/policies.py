"""How to scale (design §4, §6): turn the planner's targets into actions on instances.

Every policy but `fixed` shares the instance logic; they differ only in where new weights
come from (`fixed` holds its own counts with the same logic: it only replaces instances it
lost, `fixed_actions`). Per call, in this order:
- grow decode: revive draining decode instances, then warm (SHUTTING_NULL) ones, then mutate
  the least loaded PREFILL instances (decode instances are never loaded: loading and KV
  migration would fight for their inbound link), always leaving one serving prefill instance;
- grow prefill (or colocated): revive draining ones of the role, then warm ones, then load
  new instances. Decode growth that mutation could not cover is loaded as extra prefill
  instances, which a later call mutates;
- shrink: drain, per role, the instance idle longest, if idle at least `scale_down_idle_s`
  (and `reload_cost_factor` times its last load's duration, since it loaded)
  (the idle time is the hysteresis), never the role's last serving instance;
- release warm instances idle at least `shutting_null_keep_s`.
The router executes the returned list in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from blitzscale.control.config import PlannerConfig, PolicyConfig
from blitzscale.control.host_cache import HostCacheState, host_of
from blitzscale.control.planner import Desired, current_counts
from blitzscale.control.snapshot import ClusterSnapshot, InstanceView
from blitzscale.control.snapshot import InstanceState as S
from blitzscale.control.states import can_source, counts_as_prefill, is_serving, steady_state
from blitzscale.core.roles import Role

LoadPath = Literal["network", "host", "disk"]
HOST_POLICIES = ("sllm", "allcache")  # they load from host memory or disk, never from a GPU


@dataclass(frozen=True)
class LoadAction:
    """Load the model onto new instances (they become prefill, or colocated, instances).

    `target_ranks` and `sources` list whole instances' ranks in instance order (`tp` each):
    shard k goes from a source's rank k to a target's rank k. network: chain multicast from
    `sources` to all targets (several sources: one striped chain each) or, without multicast,
    one action per target with one source. host with `sources == (r,)`: stream from rank r's
    host copy; host with no sources: each target reads its own host's DRAM. disk: each
    target reads its own disk. `live`: targets serve while weights arrive (ZigZag), and
    `partner` (an instance id, or None) relays their tasks: it finishes the layers a target
    does not have yet.
    """

    target_ranks: tuple[int, ...]
    path: LoadPath
    sources: tuple[int, ...] = ()
    multicast: bool = False
    live: bool = False
    partner: int | None = None
    model: str = ""  # the model it loads ("": the snapshot's; see control/models.py)


@dataclass(frozen=True)
class MutateAction:
    """A PREFILL instance becomes a decode one (MUTATING_TO_DECODE, then DECODE)."""

    instance_id: int
    model: str = ""


@dataclass(frozen=True)
class DrainAction:
    """Stop giving the instance work; it finishes what it has (SHUTTING_PREFILL / _DECODE)."""

    instance_id: int
    model: str = ""


@dataclass(frozen=True)
class ReleaseAction:
    """A warm instance's weights are freed; its ranks become free."""

    instance_id: int
    model: str = ""


@dataclass(frozen=True)
class ReviveAction:
    """A draining or warm instance serves again in `role`, instantly (its weights are there)."""

    instance_id: int
    role: Role
    model: str = ""


ScaleAction = LoadAction | MutateAction | DrainAction | ReleaseAction | ReviveAction


@dataclass
class _Plan:
    taken: set[int] = field(default_factory=set)  # instances already given an action
    revives: list[ReviveAction] = field(default_factory=list)
    mutates: list[MutateAction] = field(default_factory=list)
    drains: list[DrainAction] = field(default_factory=list)
    num_new: int = 0


def scale_actions(
    snapshot: ClusterSnapshot,
    desired: Desired,
    policy_cfg: PolicyConfig,
    planner_cfg: PlannerConfig,
    host_cache: HostCacheState,
) -> list[ScaleAction]:
    return plan_actions(snapshot, desired, policy_cfg, planner_cfg, host_cache)[0]


def plan_actions(
    snapshot: ClusterSnapshot,
    desired: Desired,
    policy_cfg: PolicyConfig,
    planner_cfg: PlannerConfig,
    host_cache: HostCacheState,
) -> tuple[list[ScaleAction], int]:
    """`scale_actions`, and how many new instances it wanted but found no free ranks for
    (what control/models.py reclaims from other models)."""
    if policy_cfg.name == "fixed":
        return fixed_actions(snapshot, policy_cfg, planner_cfg, host_cache), 0
    make_plan = _pd_plan if snapshot.pd_mode else _colo_plan
    plan = make_plan(snapshot, desired, planner_cfg)
    new_prefill = frozenset(a.instance_id for a in plan.revives if a.role == "prefill")
    loads = _loads(snapshot, plan.num_new, policy_cfg, host_cache, new_prefill, frozenset(plan.taken))
    unmet = plan.num_new - sum(len(a.target_ranks) for a in loads) // snapshot.tp
    releases = _releases(snapshot, planner_cfg, plan.taken)
    return [*plan.revives, *plan.mutates, *loads, *plan.drains, *releases], max(0, unmet)


def fixed_actions(
    snapshot: ClusterSnapshot,
    policy_cfg: PolicyConfig,
    planner_cfg: PlannerConfig,
    host_cache: HostCacheState,
) -> list[ScaleAction]:
    """`fixed` never scales with the load, but holds its counts (`fixed_prefill`,
    `fixed_decode`): an instance it lost (its worker died) is loaded again on a free rank,
    from a GPU that holds the model or from disk (it keeps no host copy). Nothing drains.
    Without this a fixed service whose one instance died waited for ever with idle workers."""
    n_pre, n_dec = policy_cfg.fixed_prefill, policy_cfg.fixed_decode if snapshot.pd_mode else 0
    desired = Desired(n_pre, n_pre, n_dec, n_dec, n_pre, n_dec)
    plan = (_pd_plan if snapshot.pd_mode else _colo_plan)(snapshot, desired, planner_cfg)
    loads = _loads(snapshot, plan.num_new, policy_cfg, host_cache, frozenset(), frozenset(plan.taken))
    return [*plan.revives, *plan.mutates, *loads]


def to_zero_actions(snapshot: ClusterSnapshot, planner_cfg: PlannerConfig) -> list[ScaleAction]:
    """A model with no traffic for its keep-alive: every idle steady instance drains (its
    last too), and warm ones are released as usual."""
    drains: list[ScaleAction] = [
        DrainAction(i.id)
        for i in sorted(snapshot.instances, key=lambda i: i.id)
        if i.state in (S.PREFILL, S.DECODE, S.COLOCATED) and _is_idle(i)
    ]
    return [*drains, *_releases(snapshot, planner_cfg, set())]


def next_host_cache(
    cache: HostCacheState, snapshot: ClusterSnapshot, actions: Sequence[ScaleAction]
) -> HostCacheState:
    """The host cache after this call: hosts serving the model, and hosts of every new load
    (a disk read leaves the checkpoint in host memory), used it now."""
    ranks = set(snapshot.gpu_holders)
    ranks.update(r for a in actions if isinstance(a, LoadAction) for r in a.target_ranks)
    for host in sorted({host_of(snapshot, r) for r in ranks}):
        cache = cache.insert(host, snapshot.now, snapshot.model, snapshot.model_bytes)
    return cache


def source_instances(
    snapshot: ClusterSnapshot, policy_cfg: PolicyConfig, new_prefill: frozenset[int] = frozenset()
) -> list[InstanceView]:
    """Instances that can send weights, best first: idle, then least loaded, then lowest id.

    With `sources_only_decode`, prefill instances (and `new_prefill`, those being revived
    into prefill) are skipped, as their outbound links carry KV migrations, unless no other
    instance holds the model: a busy prefill instance's link still beats host memory or disk.
    """
    holders = set(snapshot.gpu_holders)
    able = [i for i in snapshot.instances if can_source(i.state) and i.ranks and holders.issuperset(i.ranks)]
    if policy_cfg.sources_only_decode:
        spare = [i for i in able if _spares_links(i, snapshot.pd_mode) and i.id not in new_prefill]
        able = spare or able
    return sorted(able, key=lambda i: (not _is_idle(i), _load(i), i.id))


def live_partner(snapshot: ClusterSnapshot, exclude: frozenset[int] = frozenset()) -> int | None:
    """The instance that relays a live target's tasks (design §2.3): a serving prefill (or
    colocated) instance, the most loaded first, as it is the one the new instance relieves.
    It need not be a weight source: in PD mode those are usually decode instances. Instances
    already given an action this round (`exclude`: mutating, draining) are not asked."""
    steady = S.PREFILL if snapshot.pd_mode else S.COLOCATED
    able = [i for i in snapshot.instances if i.state is steady and i.id not in exclude]
    if not able:
        return None
    return max(able, key=lambda i: (_load(i), -i.id)).id


def _load(i: InstanceView) -> int:
    return i.num_running + i.num_waiting


def _is_idle(i: InstanceView) -> bool:
    return i.idle_since is not None and _load(i) == 0


def _spares_links(i: InstanceView, pd_mode: bool) -> bool:
    """Its outbound link carries no KV migration (nothing migrates in colocated mode)."""
    return not pd_mode or i.state in (S.DECODE, S.SHUTTING_DECODE, S.SHUTTING_NULL) or _is_idle(i)


def _by_id(snapshot: ClusterSnapshot, state: S) -> list[InstanceView]:
    return sorted(snapshot.in_states(state), key=lambda i: i.id)


def _serves_as(role: Role, state: S) -> bool:
    if role == "decode":
        return state is S.DECODE
    return is_serving(state) and (role == "colocated" or counts_as_prefill(state))


def _revive(plan: _Plan, role: Role, need: int, candidates: Iterable[InstanceView]) -> int:
    """Revive up to `need` candidates into `role`; returns how many are still needed."""
    for i in candidates:
        if need <= 0:
            break
        if i.id not in plan.taken:
            plan.revives.append(ReviveAction(i.id, role))
            plan.taken.add(i.id)
            need -= 1
    return need


def _drain_one(plan: _Plan, snapshot: ClusterSnapshot, role: Role, cfg: PlannerConfig) -> None:
    serving = [i for i in snapshot.instances if _serves_as(role, i.state) and i.id not in plan.taken]
    idle = [
        i
        for i in serving
        if i.state is steady_state(role)
        and _is_idle(i)
        and _idle_enough(i, snapshot.now, cfg.scale_down_idle_s, cfg)
    ]
    if len(serving) > 1 and idle:
        victim = min(idle, key=lambda i: (i.idle_since or snapshot.now, i.id))
        plan.drains.append(DrainAction(victim.id))
        plan.taken.add(victim.id)


def _pd_plan(snapshot: ClusterSnapshot, desired: Desired, cfg: PlannerConfig) -> _Plan:
    plan, cur = _Plan(), current_counts(snapshot)
    warm = _by_id(snapshot, S.SHUTTING_NULL)
    need_d = desired.decode_target - cur.decode
    if need_d > 0:
        need_d = _revive(plan, "decode", need_d, [*_by_id(snapshot, S.SHUTTING_DECODE), *warm])
        serving_p = sum(_serves_as("prefill", i.state) for i in snapshot.instances)
        mutable = sorted(snapshot.in_states(S.PREFILL), key=lambda i: (_load(i), i.id))
        for i in mutable[: max(0, min(need_d, serving_p - 1))]:
            plan.mutates.append(MutateAction(i.id))
            plan.taken.add(i.id)
        need_d -= len(plan.mutates)
    # Decode growth mutation could not cover is loaded now as prefill, to be mutated later.
    need_p = desired.prefill_target + max(0, need_d) - (cur.prefill - len(plan.mutates))
    if need_p > 0:
        plan.num_new = _revive(plan, "prefill", need_p, [*_by_id(snapshot, S.SHUTTING_PREFILL), *warm])
    elif need_p < 0:
        _drain_one(plan, snapshot, "prefill", cfg)
    if desired.decode_target < cur.decode:
        _drain_one(plan, snapshot, "decode", cfg)
    return plan


def _colo_plan(snapshot: ClusterSnapshot, desired: Desired, cfg: PlannerConfig) -> _Plan:
    plan = _Plan()
    need = desired.prefill_target - current_counts(snapshot).prefill
    if need > 0:
        draining = [*_by_id(snapshot, S.SHUTTING_DECODE), *_by_id(snapshot, S.SHUTTING_NULL)]
        plan.num_new = _revive(plan, "colocated", need, draining)
    elif need < 0:
        _drain_one(plan, snapshot, "colocated", cfg)
    return plan


def _releases(snapshot: ClusterSnapshot, cfg: PlannerConfig, taken: set[int]) -> list[ReleaseAction]:
    return [
        ReleaseAction(i.id)
        for i in _by_id(snapshot, S.SHUTTING_NULL)
        if i.id not in taken
        and i.idle_since is not None
        and _idle_enough(i, snapshot.now, cfg.shutting_null_keep_s, cfg)
    ]


def _idle_enough(i: InstanceView, now: float, base_s: float, cfg: PlannerConfig) -> bool:
    """Idle (and loaded) for at least `base_s`, and for `reload_cost_factor` times what
    loading it again would cost: a CPU load of seconds is not undone a second later."""
    keep = max(base_s, cfg.reload_cost_factor * i.load_s)
    idle = i.idle_since is not None and now - i.idle_since >= keep
    return idle and (i.loaded_at is None or now - i.loaded_at >= keep)


def _flat(groups: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
    return tuple(r for g in groups for r in g)


def _new_slots(
    snapshot: ClusterSnapshot,
    n: int,
    cfg: PolicyConfig,
    cache: HostCacheState,
    near: Sequence[int] = (),
) -> list[tuple[int, ...]]:
    """Up to `n` groups of `tp` consecutive, tp-aligned free ranks, lowest first (`sllm`
    puts hosts with a cache hit first, as ServerlessLLM's locality-aware placement does),
    in node order (`by_node`): the nodes of `near` (the weights' sources) first."""
    if n <= 0:
        return []
    free, tp = set(snapshot.free_ranks), snapshot.tp
    starts = [r for r in sorted(free) if r % tp == 0 and free.issuperset(range(r, r + tp))]
    slots = [tuple(range(r, r + tp)) for r in starts]
    if cfg.name == "sllm":
        slots.sort(key=lambda s: not cache.lookup(host_of(snapshot, s[0]), snapshot.now, snapshot.model))
    return by_node(snapshot, slots, near)[:n]


def by_node(
    snapshot: ClusterSnapshot, slots: list[tuple[int, ...]], near: Sequence[int]
) -> list[tuple[int, ...]]:
    """`slots` grouped by node, the nodes of `near` first (in its order), then the others by
    their first slot; within a node, as given. A chain through them (transfer/plan.py) thus
    stays inside the sources' node (NVLink) before it crosses to another, once per node."""
    order: dict[int, int] = {}
    for r in near:
        order.setdefault(host_of(snapshot, r), len(order))
    for slot in slots:
        order.setdefault(host_of(snapshot, slot[0]), len(order))
    return sorted(slots, key=lambda s: order[host_of(snapshot, s[0])])


def _chains(
    snapshot: ClusterSnapshot,
    slots: list[tuple[int, ...]],
    chosen: tuple[int, ...],
    nearby: list[InstanceView],
) -> list[tuple[tuple[int, ...], list[tuple[int, ...]]]]:
    """A multicast's targets as chains (sources, targets): those on the chosen sources'
    nodes in one (NVLink); those on another node that holds the model, from the best
    instance there (NVLink; any role: the rule that spares prefill instances' links is about
    the network); the rest in one chain from the chosen sources, node by node over the
    network. One chain through all of them would hand every target its weights at the pace
    of the chain's slowest hop, a NIC: ~16x later than NVLink for those that need none."""
    chosen_hosts = {host_of(snapshot, r) for r in chosen}
    local = [s for s in slots if host_of(snapshot, s[0]) in chosen_hosts]
    chains: list[tuple[tuple[int, ...], list[tuple[int, ...]]]] = [(chosen, local)] if local else []
    remote: list[tuple[int, ...]] = []
    by_host: dict[int, list[tuple[int, ...]]] = {}
    for s in slots:
        if host_of(snapshot, s[0]) not in chosen_hosts:
            by_host.setdefault(host_of(snapshot, s[0]), []).append(s)
    for host, group in by_host.items():
        there = next((i for i in nearby if host_of(snapshot, i.ranks[0]) == host), None)
        if there is not None:
            chains.append((there.ranks, group))
        else:
            remote += group
    if remote:
        chains.append((chosen, remote))
    return chains


def _nearest(
    snapshot: ClusterSnapshot, slot: tuple[int, ...], sources: list[InstanceView], k: int
) -> InstanceView:
    """The source for one target (no multicast): one on the target's node if any, in turn."""
    same = [i for i in sources if host_of(snapshot, i.ranks[0]) == host_of(snapshot, slot[0])]
    pick = same or sources
    return pick[k % len(pick)]


def _loads(
    snapshot: ClusterSnapshot,
    n: int,
    cfg: PolicyConfig,
    cache: HostCacheState,
    new_prefill: frozenset[int],
    taken: frozenset[int] = frozenset(),
) -> list[LoadAction]:
    if n <= 0:
        return []
    host_policy = cfg.name in HOST_POLICIES
    sources = [] if host_policy else source_instances(snapshot, cfg, new_prefill)
    chosen = _flat(i.ranks for i in sources[: cfg.max_sources]) if cfg.multicast else ()
    slots = _new_slots(snapshot, n, cfg, cache, near=chosen or _flat(i.ranks for i in sources))
    if not slots:
        return []
    if cfg.name == "allcache":
        return [LoadAction(s, "host") for s in slots]
    if cfg.name == "sllm":
        hit = [cache.lookup(host_of(snapshot, s[0]), snapshot.now, snapshot.model) for s in slots]
        return [LoadAction(s, "host" if h else "disk") for s, h in zip(slots, hit, strict=True)]
    if sources and cfg.multicast:
        live = cfg.live
        partner = live_partner(snapshot, new_prefill | taken) if live else None
        nearby = source_instances(snapshot, replace(cfg, sources_only_decode=False), new_prefill)
        return [
            LoadAction(_flat(group), "network", src, multicast=True, live=live, partner=partner)
            for src, group in _chains(snapshot, slots, chosen, nearby)
        ]
    if sources:
        return [
            LoadAction(s, "network", _nearest(snapshot, s, sources, k).ranks) for k, s in enumerate(slots)
        ]
    # Scale from zero: no GPU holds the model, so nothing can serve alongside a live target.
    if snapshot.host_holder is not None:
        host = (snapshot.host_holder,)
        if cfg.multicast:
            return [LoadAction(_flat(slots), "host", host, multicast=True)]
        return [LoadAction(s, "host", host) for s in slots]
    return [LoadAction(s, "disk") for s in slots]
