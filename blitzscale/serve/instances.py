"""One instance as the control plane sees it: a record that only `serve/state.py`
(`ControlState`) changes."""

from __future__ import annotations

from dataclasses import dataclass, field

from blitzscale import clock
from blitzscale.control.snapshot import InstanceState, InstanceView
from blitzscale.messages import StatsMsg

SERVING_ROLE = {
    InstanceState.PREFILL: "prefill",
    InstanceState.DECODE: "decode",
    InstanceState.COLOCATED: "colocated",
    InstanceState.NEW_PREFILL: "prefill",
    InstanceState.OLD_PREFILL: "prefill",
    InstanceState.REFRACTORY_PREFILL: "prefill",
}


@dataclass
class Instance:
    id: int  # = its first rank
    ranks: tuple[int, ...]
    state: InstanceState = InstanceState.INACTIVE
    model: str = ""  # the model it holds or loads ("" while INACTIVE)
    stats: StatsMsg | None = None
    outstanding_tokens: int = 0  # prompt tokens dispatched and not yet prefilled
    num_assigned: int = 0  # requests it is responsible for now
    live_ready: bool = False  # a live target whose first layers have landed
    loaded_eta: float | None = None  # a live target: when its last layer should land
    idle_since: float | None = field(default_factory=clock.now)
    loaded_at: float | None = None  # when its weights last finished loading
    load_s: float = 0.0  # how long that took
    transitions: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.ranks[0]

    @property
    def accepts(self) -> str | None:
        """The role new work may be sent to this instance in, or None."""
        return SERVING_ROLE.get(self.state)

    @property
    def is_idle(self) -> bool:
        s = self.stats
        busy = s is not None and (s.num_running or s.num_waiting or s.num_held or s.num_live)
        return not busy and self.num_assigned == 0

    def view(self) -> InstanceView:
        s = self.stats
        return InstanceView(
            id=self.id,
            ranks=self.ranks,
            state=self.state,
            model=self.model,
            num_running=s.num_running if s else 0,
            num_waiting=(s.num_waiting + s.num_live if s else self.num_assigned),
            used_blocks=s.used_blocks if s else 0,
            total_blocks=s.total_blocks if s else 0,
            idle_since=self.idle_since,
            loaded_at=self.loaded_at,
            load_s=self.load_s,
        )
