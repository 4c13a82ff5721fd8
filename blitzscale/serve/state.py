"""The control plane's state, with one owner: instances and their states, the work each
holds, live pairs and relays.

The router (request flow), the scaler (policy execution) and live scaling read it and
change it only through these methods; every state change is checked against
`control/states.py` here. All callers run on the service's one event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from blitzscale import clock
from blitzscale.control.snapshot import InstanceState, InstanceView
from blitzscale.control.states import check_transition
from blitzscale.messages import StatsMsg
from blitzscale.serve.instances import Instance

log = logging.getLogger("blitzscale.instances")


@dataclass
class Relay:
    """A task on its way from a live target to its source."""

    target: int
    source: int
    sent: bool = False  # the source's receives are posted and the target was told to send


class ControlState:
    def __init__(self, tp: int = 1, default_model: str = "") -> None:
        """`tp`: ranks per instance; an instance is ranks [id, id + tp), id a multiple of tp.
        An instance belongs to one model from its load to its release (`default_model`
        where a move names none)."""
        self.tp = tp
        self.default_model = default_model
        self._instances: dict[int, Instance] = {}
        self._pairs: dict[int, int | None] = {}  # live target -> its source (None: no source)
        self._weights_from: dict[int, frozenset[int]] = {}  # live target -> the ranks sending its weights
        self._relays: dict[str, Relay] = {}  # by wire request id

    # --- reading ------------------------------------------------------------------------

    @property
    def instances(self) -> Mapping[int, Instance]:
        """Every instance ever used, by id (= first rank); read-only."""
        return MappingProxyType(self._instances)

    def get(self, rank: int | None) -> Instance | None:
        return self._instances.get(rank) if rank is not None else None

    def __iter__(self) -> Iterator[Instance]:
        return iter(list(self._instances.values()))

    def views(self, model: str | None = None) -> tuple[InstanceView, ...]:
        """The instances that hold or get weights (of `model`, None: of every model), for a
        snapshot."""
        return tuple(
            i.view()
            for i in self._instances.values()
            if i.state is not InstanceState.INACTIVE and (model is None or i.model == model)
        )

    def owner(self, rank: int) -> int:
        """The id of the instance `rank` belongs to (its first rank)."""
        return rank - rank % self.tp

    def is_free(self, rank: int) -> bool:
        inst = self._instances.get(self.owner(rank))
        return inst is None or inst.state is InstanceState.INACTIVE

    # --- states -------------------------------------------------------------------------

    def instance(self, rank: int) -> Instance:
        """The instance on `rank`, made (INACTIVE) on first use."""
        inst = self._instances.get(rank)
        if inst is None:
            if rank % self.tp:
                raise ValueError(f"rank {rank} is not an instance's first rank (tp={self.tp})")
            ranks = tuple(range(rank, rank + self.tp))
            inst = self._instances[rank] = Instance(id=rank, ranks=ranks)
        return inst

    def move(self, rank: int, new: InstanceState, why: str = "", model: str | None = None) -> Instance:
        """Move an instance along the design's state machine (an illegal move raises
        ValueError). Leaving INACTIVE it takes `model` (None: the default model); going
        INACTIVE forgets its work, its engine's numbers and its model."""
        inst = self.instance(rank)
        if new is inst.state:
            return inst
        check_transition(inst.state, new)
        if inst.state is InstanceState.INACTIVE:
            inst.model = model or self.default_model
        elif model is not None and model != inst.model:
            raise ValueError(f"instance {inst.id} serves {inst.model!r}, not {model!r}")
        log.info("instance %d (%s): %s -> %s %s", inst.id, inst.model, inst.state.value, new.value, why)
        inst.transitions.append((clock.now(), inst.state.value, new.value))
        inst.state = new
        if new is InstanceState.INACTIVE:  # nothing is on it any more: a reload starts clean
            inst.num_assigned = inst.outstanding_tokens = 0
            inst.stats = None
            inst.live_ready = False
            inst.model = ""
        if new in (InstanceState.LOADING, InstanceState.NEW_PREFILL):
            inst.live_ready = False
        if new is not InstanceState.NEW_PREFILL:  # (loaded, or gone)
            inst.loaded_eta = None
        inst.idle_since = clock.now() if inst.is_idle else None  # a new state: a new clock
        return inst

    def set_live_ready(self, rank: int, loaded_eta: float | None = None) -> None:
        """A live target's first layers have landed: it may take prompts; its last should
        land at `loaded_eta` (None: unknown)."""
        inst = self._instances.get(rank)
        if inst is not None and inst.state is InstanceState.NEW_PREFILL:
            inst.live_ready = True
            inst.loaded_eta = loaded_eta

    def loaded(self, rank: int, seconds: float) -> None:
        """Its weights just finished loading, in `seconds` (what loading again would cost)."""
        inst = self.instance(rank)
        inst.loaded_at, inst.load_s = clock.now(), seconds

    def on_stats(self, s: StatsMsg) -> None:
        inst = self._instances.get(s.rank)
        if inst is None or inst.state is InstanceState.INACTIVE:
            return  # a stray last report of an engine that is gone
        inst.stats = s
        self._touch(inst)

    # --- work held ----------------------------------------------------------------------

    def assign(self, rank: int, prompt_tokens: int = 0) -> None:
        """A request is now (also) this instance's, with `prompt_tokens` still to prefill."""
        inst = self._instances[rank]
        inst.num_assigned += 1
        inst.outstanding_tokens += prompt_tokens
        inst.idle_since = None

    def unassign(self, rank: int | None) -> None:
        inst = self.get(rank)
        if inst is not None and inst.num_assigned > 0:
            inst.num_assigned -= 1
            self._touch(inst)

    def add_tokens(self, rank: int, n: int) -> None:
        """Prompt tokens handed (back) to an instance that already holds their request."""
        inst = self.get(rank)
        if inst is not None:
            inst.outstanding_tokens += n
            inst.idle_since = None

    def take_tokens(self, rank: int | None, n: int) -> None:
        """Prompt tokens no longer outstanding here (never below zero: an instance that
        went INACTIVE was cleared already)."""
        inst = self.get(rank)
        if inst is not None:
            inst.outstanding_tokens = max(0, inst.outstanding_tokens - n)

    def _touch(self, inst: Instance) -> None:
        if not inst.is_idle:
            inst.idle_since = None
        elif inst.idle_since is None:
            inst.idle_since = clock.now()

    # --- live pairs -----------------------------------------------------------------------

    @property
    def pairs(self) -> Mapping[int, int | None]:
        """Live target -> its source (None: it loads on its own); read-only."""
        return MappingProxyType(self._pairs)

    def pair(
        self, targets: tuple[int, ...], source: int | None, weight_sources: tuple[int, ...] = ()
    ) -> None:
        """`targets` load live, `source` relaying for them; their weights come from
        `weight_sources` (none: from the host copy or disk)."""
        for t in targets:
            self._pairs[t] = source
            self._weights_from[t] = frozenset(weight_sources)

    def unpair(self, target: int) -> int | None:
        """`target` is no live target any more; its source (if any)."""
        self._weights_from.pop(target, None)
        return self._pairs.pop(target, None)

    def starved(self, gone: set[int]) -> dict[int, list[int]]:
        """Live targets (not in `gone`) some of whose weight sources are in `gone`, with
        those sources: the rest of their layers will not come."""
        return {
            t: sorted(src & gone) for t, src in self._weights_from.items() if t not in gone and src & gone
        }

    def orphan(self, source: int) -> None:
        """`source` is gone: its targets go on alone."""
        for t, src in list(self._pairs.items()):
            if src == source:
                self._pairs[t] = None

    def is_source(self, rank: int) -> bool:
        return rank in self._pairs.values()

    # --- relays ---------------------------------------------------------------------------

    @property
    def relays(self) -> Mapping[str, Relay]:
        return MappingProxyType(self._relays)

    def add_relay(self, wire_id: str, relay: Relay) -> None:
        self._relays[wire_id] = relay

    def end_relay(self, wire_id: str) -> Relay | None:
        return self._relays.pop(wire_id, None)

    def relay_sent(self, wire_id: str) -> None:
        self._relays[wire_id].sent = True
