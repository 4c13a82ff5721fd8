"""A worker's serving side: its engine, the data-plane messages, and KV migrations.

Runs on the worker's main thread between control messages: each `tick` advances pending
KV migrations, runs one engine step and ships the outputs. KV moves over its own process
group, so it never interleaves with weight transfers on the same communicator.

The leader (shard 0) of a tensor-parallel instance serves here like any instance; its
engine's model has the other shards run each step with it, and each KV migration moves
every shard's heads, shard k to shard k (worker/tp.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from blitzscale.control.costmodel import Profile
from blitzscale.core.outputs import RequestOutput
from blitzscale.engine import LLMEngine
from blitzscale.engine.engine import CHECK_EVERY_STEP
from blitzscale.engine.request import RequestStatus
from blitzscale.engine.work import StepTally
from blitzscale.errors import BlitzScaleError, KVIntegrityError
from blitzscale.messages import (
    ActivateMsg,
    ActivateResult,
    GenerateMsg,
    KVFailedMsg,
    KVReadyMsg,
    KVSentMsg,
    LiveSplitMsg,
    Message,
    OutputMsg,
    OutputsMsg,
    RecvKVMsg,
    RelayInMsg,
    RelayMsg,
    SendKVMsg,
    SendRelayMsg,
    StatsMsg,
    StepKindMsg,
    TPKVCommitMsg,
    TPKVDropMsg,
    TPKVRecvMsg,
    TPKVSendMsg,
    TPSetupMsg,
    TPStopMsg,
)
from blitzscale.model.weights import ModelWeights
from blitzscale.worker.dispatch import dispatch, output_msg, short_error, to_params
from blitzscale.worker.p2p import Move, finished, wait_one
from blitzscale.worker.pacing import Pacer
from blitzscale.worker.prefix_ship import PrefixShipping, Reply
from blitzscale.worker.relays import LiveSide
from blitzscale.worker.tp import InstanceReadiness, TPLeader, make_leader
from blitzscale.worker.world import Links

STATS_INTERVAL_S = 0.05
STATS_UNCHANGED_S = 1.0  # stats equal to the last sent go out this often (a heartbeat)
READY_POLL_S = 0.005  # an idle live TP target asks its shards how far they are this often
log = logging.getLogger("blitzscale.worker")
MAX_FAILED_STEPS = 3  # engine steps failing in a row mean the worker itself is broken


class WorkerBrokenError(BlitzScaleError):
    """The engine fails step after step (a sticky device error), or a tensor-parallel step
    failed part-way: the worker must go."""


class ServingLoop:
    def __init__(self, rank: int, links: Links, send: Callable[[Message], None], reply: Reply) -> None:
        self.rank = rank
        self.links = links
        self.send = send
        self.engine: LLMEngine | None = None
        self.tp: TPLeader | None = None  # this engine leads a tensor-parallel instance
        self.ready: InstanceReadiness | None = None  # a live TP target's view of its shards
        self.pace: Profile | None = None  # steps last what it gives (worker/pacing.py)
        self.pacer = Pacer()
        self._asked_at = 0.0
        self.role = ""
        self._recvs: dict[str, Move] = {}
        self._sends: dict[str, Move] = {}
        self.orphans: list[Move] = []  # timed-out receives: their buffers must stay alive
        self.live = LiveSide(self)  # its live-scaling side: relays, live-target events
        self._last_stats = 0.0
        self._sent_stats: StatsMsg | None = None  # the last stats sent, and when
        self._sent_at = 0.0
        self._was_idle = True
        self._failed_steps = 0  # in a row
        self.num_steps = 0  # where the loop's time goes (StatsMsg)
        self.step_s = 0.0
        self.busy_s = 0.0
        self.tally = StepTally()  # the steps above by kind
        self._last_tick = 0.0
        self._had_work = False
        self.waiters = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kv-wait")
        self.prefixes = PrefixShipping(rank, links, self.waiters, reply)  # hot prefixes at scale-up

    @property
    def is_idle(self) -> bool:
        e = self.engine
        return e is None or not (
            not e.is_idle or self._recvs or self._sends or self.live.busy or self.prefixes.busy
        )

    def activate(
        self,
        weights: ModelWeights,
        tokenizer: Any,
        msg: ActivateMsg,
        engine: LLMEngine | None = None,
        kv_room: int | None = None,
    ) -> ActivateResult:
        """Serve `weights` with a new engine (its KV cache within `kv_room` bytes, if given),
        or with `engine`, built on them beforehand."""
        if self.engine is not None:
            raise BlitzScaleError(f"rank {self.rank} is already serving")
        self._sent_stats = None  # (the router dropped this rank's stats when it was released)
        tp = make_leader(self.links, weights)
        if engine is None or tp is not None:  # (a standby engine is TP=1)
            engine = LLMEngine(weights, tokenizer, msg.engine, tp_group=tp, kv_room=kv_room)
        total = engine.counts()["total_blocks"]
        if tp is not None:  # the other shards build their KV caches the same size
            tp.send(
                TPSetupMsg(
                    model=msg.model,
                    num_blocks=total,
                    block_size=msg.engine.block_size,
                    max_model_len=engine.max_model_len,
                    live=msg.live,
                )
            )
            if not tp.all_ok():
                raise BlitzScaleError(f"ranks {list(tp.instance.members)}: a shard of {msg.model} is missing")
        self.engine, self.tp = engine, tp
        self.pace = msg.pace
        self.role = msg.role
        self.live.reset()
        if msg.live:  # a TP target runs a segment once every shard has it
            self.ready = InstanceReadiness(weights.readiness, tp) if tp is not None else None
            self.engine.start_live(self.ready)
        return ActivateResult(num_kv_blocks=total, max_model_len=self.engine.max_model_len)

    def deactivate(self) -> None:
        if not self.is_idle:
            raise BlitzScaleError(f"rank {self.rank} still has requests; drain it first")
        self.drop_engine()

    def drop_engine(self) -> None:
        """Stop serving (a TP instance's other shards drop their KV caches too)."""
        if self.tp is not None:
            self.tp.send(TPStopMsg())
            self.tp.flush()
        self.engine, self.tp, self.ready, self.pace = None, None, None, None
        self.prefixes.drop()
        self.role = ""

    # --- data-plane messages ------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        dispatch(self, msg)  # (worker/dispatch.py: one method below per message)

    @property
    def serving(self) -> bool:
        return self.engine is not None

    def _engine(self) -> LLMEngine:
        assert self.engine is not None
        return self.engine

    def generate(self, msg: GenerateMsg) -> None:
        self._engine().add_request(
            msg.prompt_token_ids, to_params(msg.params), msg.request_id, hold_kv=msg.hold_kv
        )

    def adopt_kv(self, request_id: str) -> None:
        self._engine().handoffs.adopt_held(request_id)

    def relay_out(self, msg: RelayMsg) -> None:
        self.live.relay_out(msg)

    def relay_in(self, msg: RelayInMsg) -> None:
        self.live.start_recv(msg)

    def send_relay(self, msg: SendRelayMsg) -> None:
        self.live.start_send(msg)

    def cancel_relay(self, request_id: str) -> None:
        self._engine().handoffs.cancel_relay(request_id)

    def live_split(self, msg: LiveSplitMsg) -> None:
        live = self._engine().live
        if live is not None:
            live.plan(msg.layers)

    def reset_prefix_cache(self) -> None:
        n = self._engine().reset_prefix_cache()
        log.info("rank %d: prefix cache reset (%d blocks forgotten)", self.rank, n)

    def abort(self, request_id: str) -> None:
        e = self.engine
        assert e is not None
        # A receive in flight lands in its own buffer: the blocks can go now, and the data is
        # dropped when it arrives (the stream stays in order).
        if request_id in self.live.relay_recvs:
            self.live.relay_recvs[request_id].aborted = True
            e.handoffs.cancel_relay(request_id)
            if self.tp is not None:
                self.tp.send(TPKVDropMsg(request_id=request_id))
        elif request_id in self._recvs:
            self._recvs[request_id].aborted = True
            e.handoffs.cancel_import(request_id)
            if self.tp is not None:
                self.tp.send(TPKVDropMsg(request_id=request_id))
        elif not e.abort(request_id) and request_id not in self._sends:  # a held one: free it
            e.handoffs.release_held(request_id)

    def recv_kv(self, msg: RecvKVMsg) -> None:
        e = self.engine
        assert e is not None
        req = e.handoffs.reserve_import(
            msg.request_id, msg.token_ids, msg.num_prompt_tokens, to_params(msg.params), msg.num_emitted_chars
        )
        if msg.rng_state and req.generator is not None:
            req.generator.set_state(torch.frombuffer(bytearray(msg.rng_state), dtype=torch.uint8))
        # The sender holds exactly the blocks of the computed tokens; we may have one more
        # (room for the next token), which stays as it is.
        buf = e.handoffs.kv_buffer(e.handoffs.blocks_for_tokens(req.num_computed_tokens))
        try:
            work = self.links.irecv(buf, msg.src_rank, "kv")
        except (RuntimeError, BlitzScaleError):  # the sender is gone: give the blocks back
            e.handoffs.cancel_import(msg.request_id)
            raise
        done = self.waiters.submit(wait_one, work, buf.device)
        self._recvs[msg.request_id] = Move(done, buf)
        if self.tp is not None:  # every shard receives its heads from the same shard there
            self.tp.send(
                TPKVRecvMsg(request_id=msg.request_id, num_blocks=buf.shape[2], src_rank=msg.src_rank)
            )
        self.send(KVReadyMsg(rank=self.rank, request_id=msg.request_id))

    def send_kv(self, msg: SendKVMsg) -> None:
        e = self.engine
        assert e is not None
        buf = e.handoffs.kv_out(msg.request_id)  # (InvalidRequestError if it holds none here)
        work = self.links.isend(buf, msg.dst_rank, "kv")
        held = e.request(msg.request_id, RequestStatus.HELD)
        if self.tp is not None and held is not None:
            self.tp.send(
                TPKVSendMsg(request_id=msg.request_id, block_ids=list(held.block_ids), dst_rank=msg.dst_rank)
            )
        done = self.waiters.submit(wait_one, work, buf.device)
        self._sends[msg.request_id] = Move(done, buf)

    # --- the loop -----------------------------------------------------------------------

    def tick(self) -> bool:
        """Advance migrations, run one engine step; True if there was anything to do."""
        e = self.engine
        now = time.perf_counter()
        if self._had_work:  # the time since the last tick was spent on work
            self.busy_s += now - self._last_tick
        self._last_tick = now
        self.prefixes.poll(e)
        if e is None:
            self._had_work = False
            return False
        self._poll_migrations(e)
        self.live.poll(e)
        if e.is_live:
            self._ask_shards(e)
            self.live.progress(e)
            if self.engine is None:
                return False
        busy = e.has_unfinished()
        if busy:
            t = time.perf_counter()
            outs = self._step(e)
            dt = time.perf_counter() - t
            self.step_s += dt
            self.num_steps += 1
            self.tally.add(e.last_work, dt)
            if outs:
                self.send(OutputsMsg(rank=self.rank, outputs=[self._output(e, o) for o in outs]))
        self._check_when_idle(e)
        now = time.monotonic()
        if now - self._last_stats >= STATS_INTERVAL_S:
            self._last_stats = now
            stats = self.stats()
            if stats != self._sent_stats or now - self._sent_at >= STATS_UNCHANGED_S:
                self.send(stats)  # (an idle engine's unchanged stats: once a second, not 20 times)
                self._sent_stats, self._sent_at = stats, now
        self._had_work = busy or bool(self._recvs or self._sends or self.live.busy or self.prefixes.busy)
        return self._had_work

    def _ask_shards(self, e: LLMEngine) -> None:
        """A live TP target: how far every shard's weights are, before each step (idle:
        every READY_POLL_S); a shard whose transfer failed fails the target."""
        r = self.ready
        now = time.monotonic()
        if r is None or r.all_ready or (not e.has_unfinished() and now - self._asked_at < READY_POLL_S):
            return
        self._asked_at = now
        r.refresh()
        if r.failed and not self.live.failed:
            self.live.failed = "another shard's weights stopped arriving"

    def _check_when_idle(self, e: LLMEngine) -> None:
        """Once each time the loop goes idle: the KV books must add up (logged if not)."""
        idle = self.is_idle
        if idle and not self._was_idle:
            try:
                e.check_integrity()
            except KVIntegrityError as err:
                log.error("rank %d: %s", self.rank, err)
                if CHECK_EVERY_STEP:
                    raise  # in tests a broken invariant stops the worker
        self._was_idle = idle

    def _step(self, e: LLMEngine) -> list[RequestOutput]:
        """One engine step. If it raises, the requests it may have touched fail with the
        error (the router does not retry them) and the worker goes on serving the rest.
        (Out of device memory in its forward the engine retries smaller steps itself,
        engine/oom.py; elsewhere in a step, that error fails it too, and the allocator's
        cache is freed.) Paced, it lasts its reference time: the rest of it is slept, before
        the outputs go. A tensor-parallel instance's step whose forward failed ends the
        worker at once: its other shards may be inside that step's collectives, and the
        next step's would pair with theirs (a hang, or sums of the wrong tensors); the
        cluster stops the rest of the group and respawns it, and the router runs the
        requests again. (A failure after the forward, in sampling or detokenizing, fails
        the step's requests as on any instance.)"""
        started = time.perf_counter()
        try:
            outs = e.step()
        except Exception as err:
            log.exception("rank %d: an engine step failed", self.rank)
            if self.tp is not None and e.tp_forward_broken:
                members = list(self.tp.instance.members)
                raise WorkerBrokenError(
                    f"rank {self.rank}: a step of the tensor-parallel instance {members} failed"
                    f" ({short_error(err)}); its other shards may be mid-step, so the group must be rebuilt"
                ) from err
            self._failed_steps += 1
            if self._failed_steps >= MAX_FAILED_STEPS:  # broken, not a bad request: die, so the
                raise WorkerBrokenError(  # cluster reruns what it can elsewhere
                    f"rank {self.rank}: {self._failed_steps} engine steps in a row failed"
                ) from err
            error = f"the engine step failed on rank {self.rank}: {short_error(err)}"
            oom = isinstance(err, torch.OutOfMemoryError)
        else:
            self._failed_steps = 0
            if self.pace is not None:
                time.sleep(self.pacer.remainder_s(self.pace, e.last_work, time.perf_counter() - started))
            return outs
        if oom:  # (after the except: the step's tensors went with its traceback)
            e.free_cached_memory()
        return e.fail_unfinished(error)

    @staticmethod
    def _output(e: LLMEngine, o: RequestOutput) -> OutputMsg:
        held = e.request(o.request_id, RequestStatus.HELD) if o.finish_reason == "migrate" else None
        if held is not None and held.generator is not None:
            return output_msg(o, bytes(held.generator.get_state().numpy()))
        return output_msg(o)

    def stats(self) -> StatsMsg:
        e = self.engine
        if e is None:
            return StatsMsg(
                rank=self.rank, num_running=0, num_waiting=0, num_held=0, used_blocks=0, total_blocks=0
            )
        c = e.counts()
        return StatsMsg(
            rank=self.rank,
            num_running=c["running"],
            num_waiting=c["waiting"],
            num_held=c["held"],
            used_blocks=c["used_blocks"],
            total_blocks=c["total_blocks"],
            num_live=c["live"],
            num_steps=self.num_steps,
            step_s=self.step_s,
            busy_s=self.busy_s,
            paced_steps=self.pacer.steps,
            paced_over=self.pacer.over,
            paced_real_s=self.pacer.real_s,
            paced_s=self.pacer.paced_s,
            step_kinds=[
                StepKindMsg(k, t.steps, t.seconds, t.overlapped, t.tokens)
                for k, t in self.tally.kinds.items()
                if t.steps
            ],
            prefix_queries=c["prefix_queries"],
            prefix_hits=c["prefix_hits"],
            oom_retries=c["oom_retries"],
            kv_cache_bytes=e.kv_cache_bytes,
        )

    def _poll_migrations(self, e: LLMEngine) -> None:
        for rid, m, err in finished(self._recvs, self.orphans):
            if m.aborted:
                continue  # its blocks went back when it was aborted
            if err is None and self._shards_landed(e, rid):
                e.handoffs.kv_in(rid, m.buf)
                e.handoffs.commit_import(rid)  # its outputs tell the router it decodes here
            elif err is None:
                e.handoffs.cancel_import(rid)
                why = "receive: another shard's KV did not arrive"
                self.send(KVFailedMsg(rank=self.rank, request_id=rid, error=why))
            else:
                e.handoffs.cancel_import(rid)
                if self.tp is not None:
                    self.tp.send(TPKVDropMsg(request_id=rid))
                self.send(KVFailedMsg(rank=self.rank, request_id=rid, error=f"receive: {err}"))
        for rid, _m, err in finished(self._sends, self.orphans):
            e.handoffs.release_held(rid)
            if err is None:
                self.send(KVSentMsg(rank=self.rank, request_id=rid))
            else:
                self.send(KVFailedMsg(rank=self.rank, request_id=rid, error=f"send: {err}"))

    def _shards_landed(self, e: LLMEngine, rid: str) -> bool:
        """A TP instance: the other shards put their part of the KV in place (or say it
        never came) before the request can run."""
        req = e.request(rid, RequestStatus.IMPORTING)
        if self.tp is None or req is None:
            return True
        self.tp.send(TPKVCommitMsg(request_id=rid, block_ids=list(req.block_ids)))
        return self.tp.all_ok()
