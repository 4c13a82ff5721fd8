"""A worker's side of live scaling (design §2.3), composed into `ServingLoop`.

As a live target: report progress (first layers in, fully loaded, drained), hand a task
over (`RelayMsg`) and send its hidden states and KV of layers [0, k) once told to. As a
source: reserve blocks and post the receives for a relayed task, then let the engine
finish it. Every stream between two ranks is posted in the order the router sequenced.
It reaches the engine, the links and the outbox through `LiveSideLoop`, what it uses of
the serving loop.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from blitzscale.engine import LLMEngine
from blitzscale.engine.request import RequestStatus
from blitzscale.errors import BlitzScaleError
from blitzscale.messages import (
    LiveDoneMsg,
    LiveEvent,
    LiveFailedMsg,
    LiveLoadedMsg,
    LiveReadyMsg,
    LostMsg,
    Message,
    RelayedMsg,
    RelayInMsg,
    RelayLostMsg,
    RelayMsg,
    RelayNoneMsg,
    RelayReadyMsg,
    RelaySentMsg,
    SendRelayMsg,
    TPKVCommitMsg,
    TPKVDropMsg,
    TPKVRecvMsg,
    TPKVSendMsg,
)
from blitzscale.worker.p2p import Move, finished, short_error, to_params, wait_all
from blitzscale.worker.tp import TPLeader
from blitzscale.worker.world import Links


class LiveSideLoop(Protocol):
    """What the live side uses of the serving loop that composes it."""

    rank: int
    links: Links
    engine: LLMEngine | None
    tp: TPLeader | None  # the engine leads a tensor-parallel instance
    waiters: ThreadPoolExecutor  # threads that wait on point-to-point moves
    orphans: list[Move]  # failed moves: a receive may still land in their buffers

    def send(self, msg: Message) -> None:
        """To the router (the worker's outbox)."""
        ...

    def drop_engine(self) -> None: ...


class LiveSide:
    """Composed into the serving loop (`ServingLoop.live`)."""

    def __init__(self, loop: LiveSideLoop) -> None:
        self.loop = loop
        self.relay_recvs: dict[str, Move] = {}  # source side
        self.relay_sends: dict[str, Move] = {}  # target side
        self._events: set[type[LiveEvent]] = set()  # live-target events already sent
        self.failed = ""  # set (from the transfer thread) when a live target's load fails

    @property
    def busy(self) -> bool:
        return bool(self.relay_recvs or self.relay_sends)

    def reset(self) -> None:
        """A new engine: nothing of the last live load applies."""
        self._events = set()
        self.failed = ""

    def relay_out(self, msg: RelayMsg) -> None:
        """Target: stop a live task where it is and report it; it is sent when the source
        has posted its receives (SendRelayMsg), so every stream between the two stays in order."""
        e = self.loop.engine
        assert e is not None
        r = e.handoffs.relay_out()
        if r is None:
            self.loop.send(RelayNoneMsg(rank=self.loop.rank))
            return
        assert r.handoff is not None
        self.loop.send(
            RelayedMsg(
                rank=self.loop.rank,
                request_id=r.request_id,
                layer=r.handoff.layer,
                live_layers=r.live_layers,
            )
        )

    def start_recv(self, msg: RelayInMsg) -> None:
        e = self.loop.engine
        assert e is not None
        req = e.handoffs.reserve_relay(
            msg.request_id, msg.prompt_token_ids, to_params(msg.params), msg.layer, msg.hold_kv
        )
        if msg.layer == 0:  # nothing computed there: this instance runs the whole prompt
            e.handoffs.commit_relay(msg.request_id, None)
        else:
            hidden = e.handoffs.hidden_buffer(req.num_tokens)
            buf = e.handoffs.kv_buffer(len(req.block_ids), msg.layer)
            works = [
                self.loop.links.irecv(hidden, msg.src_rank, "kv"),
                self.loop.links.irecv(buf, msg.src_rank, "kv"),
            ]
            done = self.loop.waiters.submit(wait_all, works, buf.device)
            self.relay_recvs[msg.request_id] = Move(done, buf, hidden=hidden)
            if self.loop.tp is not None:  # each shard: its heads' KV, from the same shard there
                self.loop.tp.send(
                    TPKVRecvMsg(
                        request_id=msg.request_id,
                        num_blocks=len(req.block_ids),
                        src_rank=msg.src_rank,
                        num_layers=msg.layer,
                    )
                )
        self.loop.send(RelayReadyMsg(rank=self.loop.rank, request_id=msg.request_id))

    def start_send(self, msg: SendRelayMsg) -> None:
        e = self.loop.engine
        assert e is not None
        if msg.dst_rank < 0:
            e.handoffs.relay_cancelled(msg.request_id)
            return
        r = e.request(msg.request_id, RequestStatus.RELAYING)
        if r is None or r.handoff is None:
            raise BlitzScaleError(f"request {msg.request_id!r} is not being relayed here")
        if r.handoff.layer == 0:
            e.handoffs.relay_sent(msg.request_id)
            self.loop.send(RelaySentMsg(rank=self.loop.rank, request_id=msg.request_id))
            return
        assert r.handoff.hidden is not None
        buf = e.handoffs.kv_out(msg.request_id, (0, r.handoff.layer))
        hidden = r.handoff.hidden.contiguous()
        works = [
            self.loop.links.isend(hidden, msg.dst_rank, "kv"),
            self.loop.links.isend(buf, msg.dst_rank, "kv"),
        ]
        done = self.loop.waiters.submit(wait_all, works, buf.device)
        self.relay_sends[msg.request_id] = Move(done, buf, hidden=hidden)
        if self.loop.tp is not None:  # the hidden states go once (every shard has them)
            self.loop.tp.send(
                TPKVSendMsg(
                    request_id=msg.request_id,
                    block_ids=list(r.block_ids),
                    dst_rank=msg.dst_rank,
                    num_layers=r.handoff.layer,
                )
            )

    def poll(self, e: LLMEngine) -> None:
        for rid, m, err in finished(self.relay_recvs, self.loop.orphans):
            req = e.request(rid, RequestStatus.RELAYED_IN)
            if err is None and not m.aborted and req is not None and req.handoff is not None:
                if self._shards_landed(rid, req.block_ids, req.handoff.layer):
                    e.handoffs.kv_in(rid, m.buf, (0, req.handoff.layer))
                    e.handoffs.commit_relay(rid, m.hidden)
                    continue
                err = RuntimeError("another shard's KV did not arrive")
            elif err is not None and self.loop.tp is not None:
                self.loop.tp.send(TPKVDropMsg(request_id=rid))
            e.handoffs.cancel_relay(rid)
            if err is not None:
                text = f"relay from a live target failed: {short_error(err)}"
                self.loop.send(RelayLostMsg(rank=self.loop.rank, request_id=rid, error=text))
        for rid, _m, err in finished(self.relay_sends, self.loop.orphans):
            e.handoffs.relay_sent(rid)
            if err is None:
                self.loop.send(RelaySentMsg(rank=self.loop.rank, request_id=rid))
            else:
                text = f"relay send: {short_error(err)}"
                self.loop.send(RelayLostMsg(rank=self.loop.rank, request_id=rid, error=text))

    def _shards_landed(self, rid: str, block_ids: list[int], layers: int) -> bool:
        """A TP source: every other shard puts its part of the relayed KV in place (or says
        it never came) before the task runs on."""
        tp = self.loop.tp
        if tp is None:
            return True
        tp.send(TPKVCommitMsg(request_id=rid, block_ids=list(block_ids), num_layers=layers))
        return tp.all_ok()

    def progress(self, e: LLMEngine) -> None:
        """Tell the router how a live target is doing: first layers in, fully loaded, and
        back to normal once its live queue is drained."""
        if self.failed and not self.relay_sends:
            self._fail(e, self.failed)
            return
        ready = e.readiness
        if LiveReadyMsg not in self._events and ready.num_ready_prefix >= 2:
            self._event(LiveReadyMsg, loaded_in_s=ready.remaining_s())
        if LiveLoadedMsg not in self._events and ready.all_ready:
            self._event(LiveLoadedMsg)
        if e.live_drained:
            e.end_live()
            self._event(LiveDoneMsg)

    def _event(self, event: type[LiveEvent], **fields: float) -> None:
        self._events.add(event)
        self.loop.send(event(rank=self.loop.rank, **fields))

    def _fail(self, e: LLMEngine, error: str) -> None:
        """The weights will never all arrive: every request here is lost (the router runs
        again those that have no output yet), and the engine goes."""
        self._event(LiveFailedMsg)
        for rid in e.request_ids():
            self.loop.send(LostMsg(rank=self.loop.rank, request_id=rid, error=error))
        self.loop.drop_engine()
        self.failed = ""
