"""Which instance takes a prompt (or a prefilled request for decode), composed into the
router: the instances that take a role's work now and have room, the least loaded of them,
an instance's likely cached share of the prompt counting as work it need not do, and, when
a loading live target is among them, where the prompt is prefilled first
(control/routing.py). It reads the control state; it changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from blitzscale import clock
from blitzscale.control.costmodel import Profile
from blitzscale.control.routing import Option, finish_first
from blitzscale.control.snapshot import InstanceState
from blitzscale.core.roles import Role
from blitzscale.serve.instances import Instance
from blitzscale.serve.prefixes import PrefixIndex
from blitzscale.serve.state import ControlState


class PlacementLive(Protocol):
    """What placement asks of live scaling."""

    @property
    def pairs(self) -> Mapping[int, int | None]: ...

    def loading_target(self, rank: int) -> bool: ...

    def has_live_target(self, source: int) -> bool: ...

    def budget(self, inst: Instance) -> int:
        """Prompt tokens `inst` may have outstanding (a loading target: its pair's)."""
        ...


class PlacementOwner(Protocol):
    """What placement asks of the router that composes it."""

    state: ControlState
    connected: set[int]  # ranks whose workers said hello
    prefixes: PrefixIndex

    def max_requests(self, model: str) -> int: ...

    def cost(self, model: str) -> Profile | None: ...

    def prefix_block_size(self, model: str) -> int: ...


class Placement:
    def __init__(self, router: PlacementOwner, live: PlacementLive, colocated: bool) -> None:
        self.router = router
        self.live = live
        self.colocated = colocated

    def accepts(self, inst: Instance) -> str | None:
        """The role `inst` takes work in now (live states serve the mode's first role).

        ZigZag: a live target takes new prompts once its first layers have landed; from then
        until it is fully loaded its source takes none from the queue: it finishes its own,
        then pulls the target's partly run tasks (relays), so the two work as one pipeline
        on the target's queue. Once loaded, both take prompts as usual."""
        if inst.state is InstanceState.NEW_PREFILL and not inst.live_ready:
            return None  # no layer has landed yet
        if inst.state is InstanceState.OLD_PREFILL and self.live.has_live_target(inst.rank):
            return None
        role = inst.accepts
        if role == "prefill" and self.colocated:
            return "colocated"
        return role

    def pick(self, role: Role, need_tokens: int, want: str, prefix: list[bytes] | None) -> Instance | None:
        """The least loaded instance of model `want` taking `role` work. `prefix`: the
        prompt's block hashes; an instance's likely cached share of them counts as prompt
        work it need not do."""
        fits = self._candidates(role, need_tokens, want)
        if not fits:
            return None
        cached = self._cached(want, fits, prefix)
        if any(self.live.loading_target(i.rank) for i in fits):
            return self._finish_first(role, need_tokens, want, fits, cached)
        if not prefix:
            return min(fits, key=lambda i: (i.outstanding_tokens, i.num_assigned))
        return min(fits, key=lambda i: (i.outstanding_tokens - cached(i), i.num_assigned))

    def _cached(
        self, want: str, fits: list[Instance], prefix: list[bytes] | None
    ) -> Callable[[Instance], int]:
        """Tokens of a prompt with block hashes `prefix` that an instance likely holds in its
        prefix cache; 0 past a quarter of the engine's batch more requests than the least
        loaded of `fits` (the cache no longer pulls work there), or without a prefix."""
        if not prefix:
            return lambda inst: 0
        rt = self.router
        block = rt.prefix_block_size(want)
        near = min(i.num_assigned for i in fits) + max(1, rt.max_requests(want) // 4)

        def cached(inst: Instance) -> int:
            if inst.num_assigned > near:
                return 0
            return block * rt.prefixes.cached_blocks(want, inst.rank, inst.loaded_at, prefix)

        return cached

    def _candidates(
        self, role: Role, need_tokens: int, want: str, over_budget: list[Instance] | None = None
    ) -> list[Instance]:
        """Instances of model `want` taking `role` work that have room for `need_tokens`
        (`over_budget`, if given, gets those whose prompt tokens alone leave no room)."""
        rt = self.router
        fits: list[Instance] = []
        for inst in rt.state.instances.values():
            if inst.model != want or self.accepts(inst) != role or inst.rank not in rt.connected:
                continue
            if inst.num_assigned >= rt.max_requests(want):
                continue
            if (
                role != "decode"
                and inst.outstanding_tokens
                and (inst.outstanding_tokens + need_tokens > self.live.budget(inst))
            ):
                if over_budget is not None:
                    over_budget.append(inst)
                continue
            fits.append(inst)
        return fits

    def _finish_first(
        self, role: Role, need_tokens: int, want: str, fits: list[Instance], cached: Callable[[Instance], int]
    ) -> Instance | None:
        """With a loading live target among `fits`: the instance where the prompt is
        prefilled first, or None if it finishes sooner by waiting for one whose prompt
        budget is full (control/routing.py); an instance holding the prompt's prefix
        (`cached`) prefills only the rest."""
        st, live = self.router.state, self.live
        cost = self.router.cost(want)
        if cost is None:  # (no rate to compare in: the least loaded, as for the rest)
            return min(fits, key=lambda i: (i.outstanding_tokens, i.num_assigned))
        full: list[Instance] = []
        self._candidates(role, need_tokens, want, full)
        now = clock.now()
        options = []
        for inst, room in [(i, True) for i in fits] + [(i, False) for i in full]:
            loading = live.loading_target(inst.rank)
            eta = inst.loaded_eta if loading else None
            source = live.pairs.get(inst.rank) if loading else None
            src = st.get(source) if source is not None else None
            pipeline = None
            if src is not None:  # its partner's own prompts and those of all its targets
                targets = [st.get(t) for t, s in live.pairs.items() if s == source]
                pipeline = src.outstanding_tokens + sum(t.outstanding_tokens for t in targets if t)
            left = max(0.0, eta - now) if eta is not None else 0.0
            options.append(Option(inst.rank, inst.outstanding_tokens, room, left, pipeline, cached(inst)))
        rank = finish_first(options, need_tokens, cost.prefill_rate())
        return st.instances[rank] if rank is not None else None
