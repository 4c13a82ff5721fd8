"""The router's side of live scaling (ZigZag, design §2.3), as a part of `Router`.

Which live target pairs with which source, when an idle source pulls a task (a relay), how
a relay's three steps are sequenced so that every stream between the two ranks is posted
in the same order on both sides, and the live counters `/metrics` exports. The state
lives on the router (one asyncio task writes it); this class only groups the logic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blitzscale.control.snapshot import InstanceState
from blitzscale.messages import (
    AbortMsg,
    LiveDoneMsg,
    LiveEvent,
    LiveFailedMsg,
    LiveLoadedMsg,
    LiveReadyMsg,
    Message,
    RelayedMsg,
    RelayEvent,
    RelayInMsg,
    RelayLostMsg,
    RelayMsg,
    RelayReadyMsg,
    RelaySentMsg,
    SendRelayMsg,
)
from blitzscale.serve.instances import Instance
from blitzscale.serve.requests import RouterRequest

if TYPE_CHECKING:
    import asyncio

    from blitzscale.serve.router import RouterConfig


class LiveScaling:
    cfg: RouterConfig
    instances: dict[int, Instance]
    reqs: dict[str, RouterRequest]
    connected: set[int]
    _wake: asyncio.Event

    def _init_live(self) -> None:
        # live target rank -> its source's rank (None: no source to relay to), relays in
        # flight (request id -> [target, source, sent]), sources asked to relay.
        self.live_pairs: dict[int, int | None] = {}
        self._relays: dict[str, list[Any]] = {}
        self._relay_asked: set[int] = set()
        self.live_requests_total = 0  # requests whose prefill ran partly on a loading instance
        self.live_layers_total = 0  # layers run on loading instances
        self.relays_total = 0  # tasks a live target handed to its source

    if TYPE_CHECKING:

        async def _send(self, rank: int, msg: Message) -> None: ...
        def _unassign(self, rank: int | None) -> None: ...
        def _lost(self, r: RouterRequest, why: str) -> None: ...

    def begin_live(self, targets: tuple[int, ...], source: int | None) -> None:
        for t in targets:
            self.live_pairs[t] = source

    def end_live(self, target: int) -> None:
        """`target` serves normally (or is gone); its source returns to normal when it has
        no other live target."""
        source = self.live_pairs.pop(target, None)
        inst = self.instances.get(target)
        steady = InstanceState.PREFILL if self.cfg.mode == "pd" else InstanceState.COLOCATED
        if inst is not None and inst.state in (InstanceState.NEW_PREFILL, InstanceState.REFRACTORY_PREFILL):
            inst.set_state(steady, "(live queue drained)")
        src = self.instances.get(source) if source is not None else None
        if src is not None and source not in self.live_pairs.values():
            self._relay_asked.discard(source)  # type: ignore[arg-type]
            if src.state is InstanceState.OLD_PREFILL:
                src.set_state(steady, "(its live target is loaded)")
        self._wake.set()

    async def _relay_round(self) -> None:
        """An idle source pulls a task from its live target (ZigZag): the target stops its
        head task where it is and the source finishes the remaining layers."""
        for target, source in list(self.live_pairs.items()):  # sends below may yield
            if source is None or source in self._relay_asked or source not in self.connected:
                continue
            src, tgt = self.instances.get(source), self.instances.get(target)
            if src is None or tgt is None or src.state is not InstanceState.OLD_PREFILL:
                continue
            if src.outstanding_tokens > 0 or tgt.outstanding_tokens <= 0:
                continue  # the source has prompts of its own, or the target has none queued
            self._relay_asked.add(source)
            await self._send(target, RelayMsg(dst_rank=source))

    async def _on_relayed(self, m: RelayedMsg) -> None:
        source = self.live_pairs.get(m.rank)
        if source is not None:
            self._relay_asked.discard(source)
        r = self.reqs.get(m.request_id)
        src = self.instances.get(source) if source is not None else None
        if r is None or src is None or r.prefill_rank != m.rank:
            await self._send(m.rank, SendRelayMsg(request_id=m.request_id, dst_rank=-1))
            if r is None:
                await self._send(m.rank, AbortMsg(request_id=m.request_id))
            return
        self._relays[r.id] = [m.rank, source, False]
        self.relays_total += 1
        tgt = self.instances.get(m.rank)
        if tgt is not None:
            tgt.take_tokens(len(r.prompt))
        src.outstanding_tokens += len(r.prompt)
        src.num_assigned += 1
        r.prefill_rank, r.relay_from = source, m.rank
        self._count_live(r, m.live_layers)
        await self._send(
            source,  # type: ignore[arg-type]
            RelayInMsg(
                request_id=r.id,
                src_rank=m.rank,
                layer=m.layer,
                prompt_token_ids=r.prompt,
                params=r.sampling_msg(),
                hold_kv=self.cfg.mode == "pd",
            ),
        )

    async def _on_relay_event(self, ev: RelayEvent) -> None:
        relay = self._relays.get(ev.request_id)
        if relay is None:
            return
        if isinstance(ev, RelayReadyMsg):  # the source's receives are posted: the target sends
            relay[2] = True
            await self._send(relay[0], SendRelayMsg(request_id=ev.request_id, dst_rank=ev.rank))
        elif isinstance(ev, RelaySentMsg):
            del self._relays[ev.request_id]
            self._unassign(relay[0])
            r = self.reqs.get(ev.request_id)
            if r is not None:
                r.relay_from = None
        elif isinstance(ev, RelayLostMsg):  # a side died mid-relay
            del self._relays[ev.request_id]
            r = self.reqs.get(ev.request_id)
            if r is not None:
                self._lost(r, f"relay between ranks {relay[0]} and {relay[1]} failed ({ev.error})")
        else:  # RelayFailedMsg: the source had no room, the target keeps the task
            del self._relays[ev.request_id]
            await self._send(relay[0], SendRelayMsg(request_id=ev.request_id, dst_rank=-1))
            r = self.reqs.get(ev.request_id)
            if r is None:
                await self._send(relay[0], AbortMsg(request_id=ev.request_id))
            else:
                self._take_back(r, relay)

    def _take_back(self, r: RouterRequest, relay: list[Any]) -> None:
        """A relay that did not happen: the request is the target's again."""
        target, source = relay[0], relay[1]
        src, tgt = self.instances.get(source), self.instances.get(target)
        if src is not None:
            src.take_tokens(len(r.prompt))
        self._unassign(source)
        if tgt is not None:
            tgt.outstanding_tokens += len(r.prompt)
        r.prefill_rank, r.relay_from = target, None

    def _count_live(self, r: RouterRequest, layers: int) -> None:
        if layers <= 0:
            return
        self.live_layers_total += layers
        if not r.live:
            r.live = True
            self.live_requests_total += 1

    def _on_live_event(self, ev: LiveEvent) -> None:
        inst = self.instances.get(ev.rank)
        if inst is None or ev.rank not in self.live_pairs:
            return
        if isinstance(ev, LiveReadyMsg):
            inst.live_ready = True
        elif isinstance(ev, LiveLoadedMsg) and inst.state is InstanceState.NEW_PREFILL:
            inst.set_state(InstanceState.REFRACTORY_PREFILL, "(fully loaded)")
        elif isinstance(ev, LiveDoneMsg):
            self.end_live(ev.rank)
        elif isinstance(ev, LiveFailedMsg):  # its weights will not all arrive: it serves no more
            inst.set_state(InstanceState.INACTIVE, "(live load failed)")
            self.end_live(ev.rank)
        self._wake.set()

    def _loading_target(self, rank: int) -> bool:
        """A live target that serves and still waits for weights."""
        t = self.instances.get(rank)
        return t is not None and t.live_ready and t.state is InstanceState.NEW_PREFILL

    def _has_live_target(self, source: int) -> bool:
        return any(src == source and self._loading_target(t) for t, src in self.live_pairs.items())

    def _budget(self, inst: Instance) -> int:
        """Prompt tokens an instance may have outstanding; a loading live target with a
        source holds the queue of both (the source takes none meanwhile)."""
        if self.live_pairs.get(inst.rank) is not None and self._loading_target(inst.rank):
            return 2 * self.cfg.prefill_budget_tokens
        return self.cfg.prefill_budget_tokens
