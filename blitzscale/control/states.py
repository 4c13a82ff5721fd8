"""The instance state machine (design §4) as data, and the predicates policies count with.

Normal transitions are listed per state; every state may also fall back to INACTIVE, because
a worker can die or a load can fail at any time (and SHUTTING_NULL -> INACTIVE is the normal
release).
"""

from __future__ import annotations

from blitzscale.control.snapshot import InstanceState as S
from blitzscale.core.roles import Role

_NORMAL: dict[S, frozenset[S]] = {
    S.INACTIVE: frozenset({S.LOADING, S.NEW_PREFILL}),
    # A plain load ends as a prefill instance (PD mode) or a colocated one; decode instances
    # are only made by mutating prefill ones.
    S.LOADING: frozenset({S.PREFILL, S.COLOCATED}),
    # A live target serves while loading, then drains its live queue (or has none left).
    S.NEW_PREFILL: frozenset({S.REFRACTORY_PREFILL, S.PREFILL, S.COLOCATED}),
    S.REFRACTORY_PREFILL: frozenset({S.PREFILL, S.COLOCATED}),
    S.OLD_PREFILL: frozenset({S.PREFILL, S.COLOCATED}),
    S.PREFILL: frozenset({S.OLD_PREFILL, S.MUTATING_TO_DECODE, S.SHUTTING_PREFILL}),
    S.MUTATING_TO_DECODE: frozenset({S.DECODE}),
    S.DECODE: frozenset({S.SHUTTING_DECODE}),
    # A colocated instance holds running requests like a decode one, so it drains the same way.
    S.COLOCATED: frozenset({S.OLD_PREFILL, S.SHUTTING_DECODE}),
    # A draining instance can be revived into the role it was leaving.
    S.SHUTTING_PREFILL: frozenset({S.SHUTTING_NULL, S.PREFILL}),
    S.SHUTTING_DECODE: frozenset({S.SHUTTING_NULL, S.DECODE, S.COLOCATED}),
    # The warm pool: revived instantly into any role, or released.
    S.SHUTTING_NULL: frozenset({S.PREFILL, S.DECODE, S.COLOCATED}),
}

TRANSITIONS: dict[S, frozenset[S]] = {
    s: nxt | ({S.INACTIVE} if s is not S.INACTIVE else frozenset()) for s, nxt in _NORMAL.items()
}

_PREFILL_CAPACITY = frozenset({S.LOADING, S.NEW_PREFILL, S.OLD_PREFILL, S.REFRACTORY_PREFILL, S.PREFILL})
_SERVING = frozenset({S.PREFILL, S.DECODE, S.COLOCATED, S.NEW_PREFILL, S.OLD_PREFILL, S.REFRACTORY_PREFILL})
_NO_FULL_WEIGHTS = frozenset({S.INACTIVE, S.LOADING, S.NEW_PREFILL})


def check_transition(a: S, b: S) -> None:
    """Raise if an instance may not go from `a` to `b`."""
    if b not in TRANSITIONS[a]:
        raise ValueError(f"illegal instance transition {a.name} -> {b.name}")


def is_serving(state: S) -> bool:
    """Accepts new requests (draining, mutating and loading instances do not)."""
    return state in _SERVING


def is_shutting(state: S) -> bool:
    return state in (S.SHUTTING_PREFILL, S.SHUTTING_DECODE, S.SHUTTING_NULL)


def holds_weights(state: S) -> bool:
    """Has the whole model on its GPUs (a live target has only some layers)."""
    return state not in _NO_FULL_WEIGHTS


def counts_as_prefill(state: S) -> bool:
    """Prefill capacity in PD mode, including instances being added (every load becomes a
    prefill instance). Draining instances do not count: they are on their way out."""
    return state in _PREFILL_CAPACITY


def counts_as_decode(state: S) -> bool:
    """Decode capacity in PD mode; a mutating instance is decode capacity being added."""
    return state in (S.DECODE, S.MUTATING_TO_DECODE)


def counts_as_colocated(state: S) -> bool:
    """Capacity in colocated mode: colocated instances and any being added."""
    return state is S.COLOCATED or state in _PREFILL_CAPACITY


def holds_decode_kv(state: S, pd_mode: bool) -> bool:
    """Instances whose used KV blocks are decode-memory demand (design §5, constraint 1);
    a draining instance still holds the blocks of the requests it is finishing."""
    if pd_mode:
        return state in (S.DECODE, S.MUTATING_TO_DECODE, S.SHUTTING_DECODE)
    return state in (S.COLOCATED, S.SHUTTING_DECODE)


def can_source(state: S) -> bool:
    """Can send its weights: holds them all and is not already paired with a live target."""
    return holds_weights(state) and state is not S.OLD_PREFILL


def steady_state(role: Role) -> S:
    """The state a role's instances are drained from and revived into."""
    return {"prefill": S.PREFILL, "decode": S.DECODE, "colocated": S.COLOCATED}[role]


def shutting_state(role: Role) -> S:
    """The draining state of a role (colocated instances drain like decode ones)."""
    return S.SHUTTING_PREFILL if role == "prefill" else S.SHUTTING_DECODE
