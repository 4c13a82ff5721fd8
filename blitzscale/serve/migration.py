"""KV migration in pd mode: a prefilled request's KV on its way to a decode instance.

One owner for the requests between prefill and decode: those waiting for a decode instance
(`pending`, bounded by `max_migration_wait_s`), those whose hand-off is under way (the
request's own `decode_rank`), and aborted ones whose hand-off must still run to its end
(`aborting`). Part of the router (it composes one): the router's task is the only caller.

Every posted receive between two ranks must be matched, whatever the client does: a stream
carries no request id, so a receive left posted would swallow the next hand-off between the
pair and give its request another request's KV (a wrong answer with HTTP 200).

It reaches the router through `MigrationOwner`, the few operations it calls there, and the
workers through the router's data plane.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Protocol

from blitzscale import clock
from blitzscale.control.snapshot import InstanceState
from blitzscale.core.roles import Role
from blitzscale.errors import UnavailableError
from blitzscale.messages import (
    AbortMsg,
    AdoptKVMsg,
    KVFailedMsg,
    KVReadyMsg,
    KVSentMsg,
    LostMsg,
    RecvKVMsg,
    RequestEvent,
    SendKVMsg,
)
from blitzscale.serve.dataplane import DataPlane
from blitzscale.serve.instances import Instance
from blitzscale.serve.requests import RouterRequest, Stage
from blitzscale.serve.state import ControlState

BECOMING_DECODE = (InstanceState.MUTATING_TO_DECODE, InstanceState.DECODE)


class MigrationOwner(Protocol):
    """What KV migration uses of the router that composes it."""

    state: ControlState
    data: DataPlane
    connected: set[int]  # ranks whose workers said hello

    def pick(self, role: Role, need_tokens: int = 0, model: str | None = None) -> Instance | None:
        """The least loaded instance of `model` taking `role` work, if any."""
        ...

    @property
    def reqs(self) -> Mapping[str, RouterRequest]:
        """The requests the router serves, by id."""
        ...

    def finish(self, r: RouterRequest) -> None:
        """`r` is done: its assignment is released and the router forgets it."""
        ...

    def wake(self) -> None: ...


class KVMigrations:
    def __init__(self, router: MigrationOwner, max_wait_s: float) -> None:
        """`max_wait_s`: a prefilled request no decode instance took this long fails (0: never)."""
        self.router = router
        self.max_wait_s = max_wait_s
        self.pending: deque[RouterRequest] = deque()  # waiting for a decode instance
        self.aborting: dict[str, RouterRequest] = {}  # aborted, hand-off still to be matched

    @property
    def waiting_tokens(self) -> int:
        """Prompt tokens prefilled and waiting for a decode instance (the planner's input)."""
        return sum(len(r.prompt) for r in self.pending)

    # --- starting and retrying ----------------------------------------------------------

    async def start(self, r: RouterRequest) -> None:
        """`r` was prefilled and holds its KV: adopt it in place, hand it to a decode
        instance (which allocates first and posts its receive), or wait for one."""
        rt = self.router
        if r.migrating_since is None:
            r.migrating_since = clock.now()
        if self.can_adopt(r):
            await self._adopt(r, rt.state.instances[r.prefill_rank])  # type: ignore[index]
            return
        inst = rt.pick("decode", model=r.model)
        if inst is None:
            self.pending.append(r)
            return
        r.decode_rank = inst.rank
        rt.state.assign(inst.rank)
        await rt.data.send(
            inst.rank,
            RecvKVMsg(
                request_id=r.wire_id,
                src_rank=r.prefill_rank,  # type: ignore[arg-type]
                token_ids=r.token_ids,
                num_prompt_tokens=len(r.prompt),
                num_emitted_chars=len(r.text),
                params=r.sampling_msg(),
                rng_state=r.rng_state,
            ),
        )

    async def retry(self) -> None:
        """Every dispatch round: the waiting requests try again, or fail once overdue."""
        rt, now = self.router, clock.now()
        limit = self.max_wait_s
        for _ in range(len(self.pending)):
            r = self.pending.popleft()
            if r.stage is not Stage.MIGRATING or r.id not in rt.reqs:
                continue
            overdue = limit and r.migrating_since is not None and now - r.migrating_since > limit
            if overdue and not self.can_adopt(r):
                # no decode instance took it in time: drop the held KV, fail the request
                await rt.data.send(r.prefill_rank, AbortMsg(request_id=r.wire_id))  # type: ignore[arg-type]
                r.out.put_nowait(
                    UnavailableError(f"no decode instance could take the request within {limit:g} s")
                )
                rt.finish(r)
                continue
            await self.start(r)

    def can_adopt(self, r: RouterRequest) -> bool:
        rt = self.router
        own = rt.state.get(r.prefill_rank)
        return own is not None and own.state in BECOMING_DECODE and own.rank in rt.connected

    async def _adopt(self, r: RouterRequest, inst: Instance) -> None:
        """The prefill instance holding `r`'s KV is turning into a decode one: it decodes
        `r` itself. (Migrating to a new decode instance would wait for one that may never
        come, while the held KV keeps the mutation from draining.)"""
        r.decode_rank, r.prefill_rank = inst.rank, None
        r.move(Stage.DECODE)
        await self.router.data.send(inst.rank, AdoptKVMsg(request_id=r.wire_id))

    # --- events of a live request -------------------------------------------------------

    async def on_event(self, r: RouterRequest, ev: RequestEvent) -> bool:
        """A hand-off event of a request the client still waits for; False if it is none."""
        rt = self.router
        if isinstance(ev, KVReadyMsg):  # the decode side's receive is posted: the prefill side sends
            await rt.data.send(r.prefill_rank, SendKVMsg(request_id=r.wire_id, dst_rank=ev.rank))  # type: ignore[arg-type]
        elif isinstance(ev, KVSentMsg):
            rt.state.unassign(r.prefill_rank)
            r.prefill_rank = None
            r.move(Stage.DECODE)
        elif isinstance(ev, KVFailedMsg) and ev.rank == r.decode_rank and r.stage is Stage.MIGRATING:
            rt.state.unassign(r.decode_rank)  # no room there: try again later
            r.decode_rank = None
            self.pending.append(r)
        else:
            return False
        return True

    # --- aborts -------------------------------------------------------------------------

    async def abort(self, r: RouterRequest) -> None:
        """The client left while the KV moves: the decode side may have posted its receive.
        So the decode side drops the request now (its blocks go; the data is discarded when
        it lands) and the prefill side still sends, or frees the KV if the decode side never
        posted (`on_aborted_event`)."""
        assert r.decode_rank is not None
        await self.router.data.send(r.decode_rank, AbortMsg(request_id=r.wire_id))
        self.router.state.unassign(r.decode_rank)
        r.move(Stage.ABORTING)
        self.aborting[r.wire_id] = r

    async def on_aborted_event(self, ev: RequestEvent) -> None:
        """An aborted request's hand-off runs to its end so both sides stay matched."""
        r = self.aborting.get(ev.request_id)
        if r is None:
            return
        prefill = r.prefill_rank
        if isinstance(ev, KVReadyMsg) and prefill is not None:  # the receive is posted: match it
            await self.router.data.send(prefill, SendKVMsg(request_id=r.wire_id, dst_rank=ev.rank))
            return
        if isinstance(ev, KVFailedMsg | LostMsg) and ev.rank != prefill and prefill is not None:
            # nothing was posted: free it
            await self.router.data.send(prefill, AbortMsg(request_id=r.wire_id))
        elif not isinstance(ev, KVSentMsg | KVFailedMsg | LostMsg):
            return
        self._end_aborted(r)

    def drop_dead(self, dead: set[int]) -> None:
        """Aborted hand-offs with a dead side end; the surviving prefill side frees its KV."""
        for r in list(self.aborting.values()):
            if r.prefill_rank in dead or r.decode_rank in dead:
                if r.prefill_rank not in dead:  # the KV cannot go anywhere now
                    self.router.data.send_nowait(r.prefill_rank, AbortMsg(request_id=r.wire_id))  # type: ignore[arg-type]
                self._end_aborted(r)

    def _end_aborted(self, r: RouterRequest) -> None:
        self.aborting.pop(r.wire_id, None)
        self.router.state.unassign(r.prefill_rank)
        r.prefill_rank = r.decode_rank = None
        r.move(Stage.DONE)
        self.router.wake()
