"""The router's side of live scaling (ZigZag, design §2.3), composed into the router.

Which live target pairs with which source, when an idle source pulls a task (a relay), how
a relay's three steps are sequenced so that every stream between the two ranks is posted
in the same order on both sides, moves of a head task that would miss its SLO on a loading
target, and the live counters `/metrics` exports; the planned split of a target's tasks
(`live_split = "ilp"`) is `SplitPlanner`'s (serve/live_plan.py). The pairs and
relays themselves are the control state's (`serve/state.py`); the router's one task is the
only caller. It reaches the router through `LiveOwner`, the few operations it calls there,
and the workers through the router's data plane.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from blitzscale import clock
from blitzscale.control.costmodel import Profile
from blitzscale.control.live_split import DEFAULT_TIME_LIMIT_S
from blitzscale.control.snapshot import InstanceState
from blitzscale.messages import (
    AbortMsg,
    LiveDoneMsg,
    LiveEvent,
    LiveFailedMsg,
    LiveLoadedMsg,
    LiveReadyMsg,
    RelayedMsg,
    RelayEvent,
    RelayInMsg,
    RelayLostMsg,
    RelayMsg,
    RelayReadyMsg,
    RelaySentMsg,
    SendRelayMsg,
)
from blitzscale.serve.dataplane import DataPlane
from blitzscale.serve.instances import Instance
from blitzscale.serve.live_plan import SplitPlanner
from blitzscale.serve.requests import RouterRequest
from blitzscale.serve.state import ControlState, Relay


class LiveOwner(Protocol):
    """What live scaling uses of the router that composes it."""

    state: ControlState
    data: DataPlane
    connected: set[int]  # ranks whose workers said hello

    def budget_tokens(self, model: str) -> int:
        """Prompt tokens one prefill instance of `model` may have outstanding."""
        ...

    def request_of(self, wire_id: str) -> RouterRequest | None: ...

    def prefilling_on(self, rank: int) -> list[RouterRequest]:
        """Requests whose prompt `rank` holds and has not prefilled, oldest dispatch first."""
        ...

    def cost(self, model: str) -> Profile | None: ...

    def ttft_slo_s(self, model: str) -> float: ...

    def lost(self, r: RouterRequest, why: str, dead: set[int] | None = None) -> None:
        """An instance lost `r`: it runs again if the client has seen nothing yet, else fails."""
        ...

    def wake(self) -> None: ...


class LiveScaling:
    def __init__(
        self,
        router: LiveOwner,
        pd_mode: bool,
        split: str = "greedy",
        split_time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    ) -> None:
        """`pd_mode`: prefill/decode disaggregation (a relayed prompt holds its KV for a
        decode instance), else colocated. `split`: "greedy" or "ilp" (a planned split of
        each loading target's tasks, within `split_time_limit_s` a solve)."""
        self.router = router
        self.pd_mode = pd_mode
        # the state a prefill-side instance serves in once loaded (pd: prefill)
        self.steady = InstanceState.PREFILL if pd_mode else InstanceState.COLOCATED
        self.state: ControlState = router.state
        self._asked: set[int] = set()  # sources asked to relay
        self._moves: dict[int, int] = {}  # live targets asked to hand their head elsewhere -> where
        # the planned split of targets' tasks (live_split = "ilp"; None: the greedy rule)
        self.planner = SplitPlanner(router, self, split_time_limit_s) if split == "ilp" else None
        self.requests_total = 0  # requests whose prefill ran partly on a loading instance
        self.layers_total = 0  # layers run on loading instances
        self.relays_total = 0  # tasks a live target handed to its source
        self.moves_total = 0  # of those, tasks moved to another instance before their SLO
        self.abandoned_total = 0  # live targets given up at once when their weight source died

    @property
    def pairs(self) -> Mapping[int, int | None]:
        return self.state.pairs

    @property
    def relays(self) -> Mapping[str, Relay]:
        return self.state.relays

    # --- pairs ----------------------------------------------------------------------------

    def begin(
        self, targets: tuple[int, ...], source: int | None, weight_sources: tuple[int, ...] = ()
    ) -> None:
        self.state.pair(targets, source, weight_sources)

    def end(self, target: int) -> None:
        """`target` serves normally (or is gone); its source returns to normal when it has
        no other live target."""
        rt, st = self.router, self.state
        if self.planner is not None:
            self.planner.forget(target)
        self._moves.pop(target, None)
        source = st.unpair(target)
        inst = st.get(target)
        if inst is not None and inst.state in (InstanceState.NEW_PREFILL, InstanceState.REFRACTORY_PREFILL):
            st.move(target, self.steady, "(live queue drained)")
        src = st.get(source)
        if src is not None and source is not None and not st.is_source(source):
            self._asked.discard(source)
            if src.state is InstanceState.OLD_PREFILL:
                st.move(source, self.steady, "(its live target is loaded)")
        rt.wake()

    def loading_target(self, rank: int) -> bool:
        """A live target that serves and still waits for weights."""
        t = self.state.get(rank)
        return t is not None and t.live_ready and t.state is InstanceState.NEW_PREFILL

    def has_live_target(self, source: int) -> bool:
        return any(src == source and self.loading_target(t) for t, src in self.pairs.items())

    def budget(self, inst: Instance) -> int:
        """Prompt tokens an instance may have outstanding; a loading live target with a
        source holds the queue of both (the source takes none meanwhile)."""
        budget = self.router.budget_tokens(inst.model)
        if self.pairs.get(inst.rank) is not None and self.loading_target(inst.rank):
            return 2 * budget
        return budget

    def count(self, r: RouterRequest, layers: int) -> None:
        if layers <= 0:
            return
        self.layers_total += layers
        if not r.live:
            r.live = True
            self.requests_total += 1

    # --- relays ---------------------------------------------------------------------------

    async def round(self) -> None:
        """Planned splits are sent; then an idle source pulls a task from its live target
        (ZigZag): the target stops its head task where it is (or the first that reached
        its planned layer) and the source finishes the remaining layers."""
        rt, planner = self.router, self.planner
        if planner is not None:
            await planner.round()
        for target, source in list(self.pairs.items()):  # sends below may yield
            if source is None or source in self._asked or source not in rt.connected:
                continue
            if target in self._moves:
                continue  # its head is being moved elsewhere
            if not self.loading_target(target) and len(rt.prefilling_on(target)) <= 1:
                # loaded, with one task: it finishes that sooner than a relay could (the
                # source would run the same layers after the hidden states' transfer)
                continue
            src, tgt = self.state.get(source), self.state.get(target)
            if src is None or tgt is None or src.state is not InstanceState.OLD_PREFILL:
                continue
            if src.outstanding_tokens > 0 or tgt.outstanding_tokens <= 0:
                continue  # the source has prompts of its own, or the target has none queued
            if planner is not None and planner.all_stay(target):
                continue  # every task there is planned to finish there
            self._asked.add(source)
            await rt.data.send(target, RelayMsg(dst_rank=source))
        await self._rescue()

    async def _rescue(self) -> None:
        """A loading target's head task that would miss its TTFT SLO there (its last layer
        lands too late, and its partner is busy) moves to the instance that finishes it
        soonest, if that one makes it sooner: a relay to an ordinary prefill instance,
        which runs the layers the target has not."""
        rt = self.router
        for target, source in list(self.pairs.items()):  # sends below may yield
            if target in self._moves or (source is not None and source in self._asked):
                continue  # a relay is being asked for already
            tgt = self.state.get(target)
            if tgt is None or not self.loading_target(target) or tgt.loaded_eta is None:
                continue
            slo, cost = rt.ttft_slo_s(tgt.model), rt.cost(tgt.model)
            tasks = rt.prefilling_on(target)
            if slo <= 0 or cost is None or not tasks:
                continue
            head, now = tasks[0], clock.now()
            here = max(0.0, tgt.loaded_eta - now) + cost.prefill_s(len(head.prompt)) / cost.num_layers
            if here <= slo - (now - head.arrival):
                continue  # it makes its SLO where it is
            budget = rt.budget_tokens(tgt.model)
            moving = self._moving_tokens()
            best: tuple[float, int] | None = None
            for inst in self.state:
                if inst.model != tgt.model or inst.state is not self.steady or inst.rank not in rt.connected:
                    continue
                ahead = inst.outstanding_tokens + moving.get(inst.rank, 0)
                if ahead + len(head.prompt) > budget:
                    continue
                there = cost.prefill_s(ahead + len(head.prompt))
                if best is None or there < best[0]:
                    best = (there, inst.rank)
            if best is not None and best[0] < here:
                self._moves[target] = best[1]
                await rt.data.send(target, RelayMsg(dst_rank=best[1]))

    def _moving_tokens(self) -> dict[int, int]:
        """Prompt tokens on their way to each instance by moves not yet relayed: its
        outstanding tokens count them only once they arrive, and two heads rescued to one
        instance in one round would each be promised that instance alone (session 31: on
        paper-b the second of two 4,096-token prompts moved together finished 0.2 s late)."""
        tokens: dict[int, int] = {}
        for target, dst in self._moves.items():
            tasks = self.router.prefilling_on(target)
            if tasks:  # the head being moved is still the target's until it is relayed
                tokens[dst] = tokens.get(dst, 0) + len(tasks[0].prompt)
        return tokens

    def dispatched(self, rank: int) -> None:
        """The router sent `rank` a prompt (a loading target with a planned split re-plans)."""
        if self.planner is not None:
            self.planner.dispatched(rank)

    def on_none(self, target: int) -> None:
        """The target had no task to hand over."""
        if self._moves.pop(target, None) is None:
            self._asked.discard(self.pairs.get(target))  # type: ignore[arg-type]

    async def on_relayed(self, m: RelayedMsg) -> None:
        rt = self.router
        moved_to = self._moves.pop(m.rank, None)
        source = moved_to if moved_to is not None else self.pairs.get(m.rank)
        if source is not None and moved_to is None:
            self._asked.discard(source)
        r = rt.request_of(m.request_id)
        src = self.state.get(source) if source is not None else None
        if moved_to is not None and (src is None or src.state is not self.steady):
            src = None  # the instance it was moving to stopped serving meanwhile: it stays
        if r is None or src is None or source is None or r.prefill_rank != m.rank:
            await rt.data.send(m.rank, SendRelayMsg(request_id=m.request_id, dst_rank=-1))
            if r is None:
                await rt.data.send(m.rank, AbortMsg(request_id=m.request_id))
            return
        self.state.add_relay(r.wire_id, Relay(m.rank, source))
        self.relays_total += 1
        self.moves_total += moved_to is not None
        self.state.take_tokens(m.rank, len(r.prompt))
        self.state.assign(source, len(r.prompt))
        r.prefill_rank, r.relay_from = source, m.rank
        self.count(r, m.live_layers)
        await rt.data.send(
            source,
            RelayInMsg(
                request_id=r.wire_id,
                src_rank=m.rank,
                layer=m.layer,
                prompt_token_ids=r.prompt,
                params=r.sampling_msg(),
                hold_kv=self.pd_mode,
            ),
        )

    async def on_event(self, ev: RelayEvent) -> None:
        rt = self.router
        relay = self.relays.get(ev.request_id)
        if relay is None:
            return
        if isinstance(ev, RelayReadyMsg):  # the source's receives are posted: the target sends
            self.state.relay_sent(ev.request_id)
            await rt.data.send(relay.target, SendRelayMsg(request_id=ev.request_id, dst_rank=ev.rank))
            return
        self.state.end_relay(ev.request_id)
        r = rt.request_of(ev.request_id)
        if isinstance(ev, RelaySentMsg):
            self.state.unassign(relay.target)
            if r is not None:
                r.relay_from = None
        elif isinstance(ev, RelayLostMsg):  # a side died mid-relay
            if r is not None:
                rt.lost(r, f"relay between ranks {relay.target} and {relay.source} failed ({ev.error})")
        else:  # RelayFailedMsg: the source had no room, the target keeps the task
            await rt.data.send(relay.target, SendRelayMsg(request_id=ev.request_id, dst_rank=-1))
            if r is None:
                await rt.data.send(relay.target, AbortMsg(request_id=ev.request_id))
            else:
                self._take_back(r, relay)

    def _take_back(self, r: RouterRequest, relay: Relay) -> None:
        """A relay that did not happen: the request is the target's again."""
        st = self.state
        st.take_tokens(relay.source, len(r.prompt))
        st.unassign(relay.source)
        st.add_tokens(relay.target, len(r.prompt))
        r.prefill_rank, r.relay_from = relay.target, None

    # --- a live target's progress, and dead ranks ----------------------------------------

    def on_live_event(self, ev: LiveEvent) -> None:
        rt = self.router
        inst = self.state.get(ev.rank)
        if inst is None or ev.rank not in self.pairs:
            return
        if isinstance(ev, LiveReadyMsg):
            self.state.set_live_ready(ev.rank, clock.now() + ev.loaded_in_s if ev.loaded_in_s > 0 else None)
            if self.planner is not None:
                self.planner.ready(ev.rank)
        elif isinstance(ev, LiveLoadedMsg) and inst.state is InstanceState.NEW_PREFILL:
            self.state.move(ev.rank, InstanceState.REFRACTORY_PREFILL, "(fully loaded)")
        elif isinstance(ev, LiveDoneMsg):
            self.end(ev.rank)
        elif isinstance(ev, LiveFailedMsg):  # its weights will not all arrive: it serves no more
            self.state.move(ev.rank, InstanceState.INACTIVE, "(live load failed)")
            self.end(ev.rank)
        rt.wake()

    def drop_dead_relays(self, dead: set[int]) -> None:
        """Relays with a dead side end (a target that still has its task takes it back);
        before the router looks for requests on dead ranks."""
        rt = self.router
        for rid, relay in list(self.relays.items()):
            if not {relay.target, relay.source} & dead:
                continue
            self.state.end_relay(rid)
            r = rt.request_of(rid)
            if relay.source in dead and relay.target not in dead and not relay.sent:
                rt.data.send_nowait(relay.target, SendRelayMsg(request_id=rid, dst_rank=-1))
                if r is not None:
                    self._take_back(r, relay)
                else:  # the client left meanwhile: the task the target gets back goes too
                    # (else it runs on for nobody, and in pd mode its KV is held for ever)
                    rt.data.send_nowait(relay.target, AbortMsg(request_id=rid))

    def drop_dead_pairs(self, dead: set[int]) -> None:
        """Dead targets end their pairing (after they went INACTIVE), and a dead source
        leaves its targets on their own."""
        for rank in dead:
            if rank in self.pairs:
                self.end(rank)
            if self.state.is_source(rank):  # its targets go on alone
                self.state.orphan(rank)
                self._asked.discard(rank)
