"""One simulated instance: the engine's own request table, scheduler, KV block pool, hand-off
books and live order (engine/), stepped on the virtual clock by a step-time profile instead
of a forward pass, and answering the worker's data-plane messages through the worker's own
dispatcher (worker/dispatch.py).

A step is the engine's (sim/steps.py: the live queue's stage, relayed prompts, then the
scheduler's batch: chunked prefill, decodes in every step, blocks allocated as tokens need
them, preemption when they run out) and lasts what the paced worker's rule gives for its
work (worker/pacing.py). A run of decode-only steps is taken in one jump (the scheduler
would choose the same batch each time until a request stops, blocks run out or something
happens); a message or a finished move cuts the jump after the step under way. Tokens are
placeholders (id 0); a request's first token and its last go to the router, and every
token's time is kept in the `Recorder` for TBT.

Messages are handled when they arrive (a real worker takes them between steps); a request
aborted during a step is left out of it. KV migrations and relays move simulated bytes over
the cluster's links (`kv_move`, `relay_move`); their ends are the cluster's callbacks here.
A live target's segments land evenly over its transfer (sim/readiness.py).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass

from blitzscale import clock
from blitzscale.control.costmodel import Profile
from blitzscale.core.sampling import SamplingParams
from blitzscale.core.validate import validate_request
from blitzscale.engine.handoff_book import HandoffBook
from blitzscale.engine.live_order import LiveOrder
from blitzscale.engine.output import OutputProcessor
from blitzscale.engine.request import Request, RequestStatus
from blitzscale.engine.scheduler import Scheduler
from blitzscale.engine.table import RequestTable
from blitzscale.errors import InvalidRequestError
from blitzscale.kvcache.pool import BlockPool
from blitzscale.messages import (
    GenerateMsg,
    KVReadyMsg,
    LiveDoneMsg,
    LiveLoadedMsg,
    LiveReadyMsg,
    LiveSplitMsg,
    Message,
    OutputMsg,
    OutputsMsg,
    RecvKVMsg,
    RelayedMsg,
    RelayInMsg,
    RelayMsg,
    RelayNoneMsg,
    RelayReadyMsg,
    RelaySentMsg,
    SendKVMsg,
    SendRelayMsg,
    StatsMsg,
)
from blitzscale.sim.cores import HostCores
from blitzscale.sim.readiness import ClockReadiness
from blitzscale.sim.recorder import Recorder, base_id
from blitzscale.sim.steps import Step, advance, decode_run, plan, reserve, unreserve
from blitzscale.worker.dispatch import dispatch, output_msg, to_params
from blitzscale.worker.pacing import step_s

__all__ = ["EngineShape", "Recorder", "SimEngine", "base_id"]
S = RequestStatus
STATS_EVERY_S = 0.1  # at most this often a changed instance reports its numbers
ANY_TOKEN = 1 << 31  # simulated prompts are placeholders: the router checked the vocabulary


@dataclass
class EngineShape:
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    kv_blocks: int
    prefix_caching: bool = False  # as the engine's: full prompt blocks cached by prefix hash


@dataclass
class _Jump:
    """A run of decode-only steps under way."""

    start: float
    step: float
    k: int
    cut: int = 0  # set: the run ends after this many steps


class SimEngine:
    def __init__(
        self,
        rank: int,
        role: str,
        profile: Profile,
        shape: EngineShape,
        emit: Callable[[Message], None],
        recorder: Recorder,
        kv_move: Callable[[int, int, str, int], None],  # (src, dst, request id, tokens)
        relay_move: Callable[[int, int, str, int, int], None] = lambda *a: None,  # (+ layers done)
        loaded_at: float | None = None,  # a live target: when its last weight segment lands
        cores: HostCores | None = None,  # its node's, shared
        device: HostCores | None = None,  # its GPU, shared by the engines resident on it (1 core)
    ) -> None:
        self.rank, self.role, self.profile, self.shape = rank, role, profile, shape
        self.send = emit
        self.recorder = recorder
        self.kv_move, self.relay_move = kv_move, relay_move
        self.cores = cores if cores is not None else HostCores(0)
        self.device = device if device is not None else HostCores(0)
        self.pool = BlockPool(shape.kv_blocks, shape.block_size)
        self.table = RequestTable(self.pool)
        self.scheduler = Scheduler(
            self.pool, shape.max_num_batched_tokens, shape.max_num_seqs, self.table, shape.prefix_caching
        )
        self.outputs = OutputProcessor(None, set(), shape.max_model_len)
        self.handoffs = HandoffBook(self, self.table, self.scheduler, self.outputs, profile.num_layers)
        self.live: LiveOrder | None = None
        self.loaded_at = loaded_at
        self.up_at = clock.now()  # (the cluster starts an engine as it can serve, live or loaded)
        self._sending: set[str] = set()  # held requests whose KV is on the wire
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stats_due: asyncio.TimerHandle | None = None
        self._last_stats = -math.inf
        self._live_events: set[type] = set()
        self._jump: _Jump | None = None
        self._pending: list[OutputMsg] = []  # outputs of the step under way

    # --- life -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._report()

    def stop(self) -> asyncio.Task[None] | None:
        """Cancel the engine's loop (returned, to be awaited) and its pending report."""
        if self._task is not None:
            self._task.cancel()
        if self._stats_due is not None:
            self._stats_due.cancel()
        return self._task

    @property
    def serving(self) -> bool:
        return True

    @property
    def is_idle(self) -> bool:
        return not self.table

    @property
    def is_live(self) -> bool:
        """A live target whose live queue is still there."""
        return self.live is not None

    @property
    def used_blocks(self) -> int:
        return self.pool.num_used_blocks

    @property
    def held(self) -> list[str]:
        return self.table.ids(S.HELD)

    def live_events(self, first_layers_at: float) -> None:
        """Start as a live target: its weights land from now until `loaded_at`; it tells the
        router when its first layers and its last have landed."""
        assert self.loaded_at is not None
        now = clock.now()
        readiness = ClockReadiness(now, self.loaded_at, self.profile.num_layers + 2)
        p, budget = self.profile, self.shape.max_num_batched_tokens
        self.live = LiveOrder(self.pool, budget, readiness, p.num_layers)
        loop = asyncio.get_running_loop()
        loop.call_later(max(0.0, first_layers_at - now), self._live_ready)
        loop.call_later(max(0.0, self.loaded_at - now), self._loaded)

    def _live_ready(self) -> None:
        if self.live is not None:  # (when its last layer lands, as the worker's estimate)
            self._live_event(LiveReadyMsg, loaded_in_s=self.live.readiness.remaining_s())

    def _live_event(self, kind: type, **fields: float) -> None:
        if kind not in self._live_events:
            self._live_events.add(kind)
            self.send(kind(rank=self.rank, **fields))

    def _loaded(self) -> None:
        self._cut()
        self._live_event(LiveLoadedMsg)
        self._changed()

    def _check_live(self) -> None:
        live = self.live
        if live is not None and live.readiness.all_ready and not live and not self.table.count(S.RELAYING):
            self._live_event(LiveLoadedMsg)  # (in this order, whichever comes first)
            self.live = None  # drained: it serves normally
            self.loaded_at = None
            self._live_event(LiveDoneMsg)

    # --- the engine's checks (HandoffOwner) -----------------------------------------------

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """As `LLMEngine.validate`: a request that can never run here."""
        validate_request(prompt_token_ids, params, ANY_TOKEN, self.shape.max_model_len)
        n = len(prompt_token_ids)
        need = self.pool.blocks_for_tokens(min(n + params.max_tokens, self.shape.max_model_len))
        if need > self.pool.num_blocks:
            raise InvalidRequestError(
                f"prompt plus max_tokens needs {need} KV blocks, the cache holds {self.pool.num_blocks}"
            )

    def check_new_id(self, request_id: str) -> None:
        if request_id in self.table:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")

    # --- messages (worker/dispatch.py) ---------------------------------------------------

    def handle(self, msg: Message) -> None:
        self._cut()
        dispatch(self, msg)
        self._changed()

    def generate(self, msg: GenerateMsg) -> None:
        params = to_params(msg.params)
        self.validate(msg.prompt_token_ids, params)
        self.check_new_id(msg.request_id)
        req = Request(msg.request_id, list(msg.prompt_token_ids), params, hold_kv=msg.hold_kv)
        self.recorder.reached(base_id(msg.request_id), clock.now(), self.up_at)
        if self.live is not None and not self.live.readiness.all_ready:
            self.table.add(req, S.LIVE)
            self.live.add(req)
        else:  # once loaded, new work skips the live queue, which only drains
            self.scheduler.add(req)

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()

    def live_split(self, msg: LiveSplitMsg) -> None:
        if self.live is not None:
            self.live.plan(msg.layers)

    def abort(self, request_id: str) -> None:
        """As the real worker: a receive in flight gives its blocks back; a request the step
        works on ends with an "abort" output; a held one not being sent is freed."""
        req = self.table.get(request_id)
        if req is None:
            return
        if req.status is S.RELAYED_IN and not (req.handoff is not None and req.handoff.ready):
            self.handoffs.cancel_relay(request_id)
        elif req.status is S.IMPORTING:
            self.handoffs.cancel_import(request_id)
        elif req.status in (S.WAITING, S.RUNNING, S.LIVE, S.RELAYED_IN):
            if req.status is S.LIVE and self.live is not None:
                self.live.remove(req)
            else:
                self.scheduler.remove(req)
            self.table.release(req, "abort")
            self.send(OutputsMsg(rank=self.rank, outputs=[output_msg(self.outputs.make_output(req))]))
        elif req.status is S.HELD and request_id not in self._sending:
            self.handoffs.release_held(request_id)

    def recv_kv(self, msg: RecvKVMsg) -> None:
        self.handoffs.reserve_import(
            msg.request_id, msg.token_ids, msg.num_prompt_tokens, to_params(msg.params), msg.num_emitted_chars
        )
        self.send(KVReadyMsg(rank=self.rank, request_id=msg.request_id))

    def send_kv(self, msg: SendKVMsg) -> None:
        r = self.table.get(msg.request_id, S.HELD)
        if r is None or msg.request_id in self._sending:
            raise InvalidRequestError(f"request {msg.request_id!r} holds no KV here")
        self._sending.add(msg.request_id)
        self.kv_move(self.rank, msg.dst_rank, msg.request_id, r.num_tokens)

    def adopt_kv(self, request_id: str) -> None:
        self.handoffs.adopt_held(request_id)

    def relay_out(self, msg: RelayMsg) -> None:
        r = self.handoffs.relay_out()
        if r is None or r.handoff is None:
            self.send(RelayNoneMsg(rank=self.rank))
            return
        layer = r.handoff.layer
        self.recorder.relay_began(base_id(r.request_id), clock.now())
        self.send(RelayedMsg(rank=self.rank, request_id=r.request_id, layer=layer, live_layers=r.live_layers))

    def relay_in(self, msg: RelayInMsg) -> None:
        params = to_params(msg.params)
        self.handoffs.reserve_relay(msg.request_id, msg.prompt_token_ids, params, msg.layer, msg.hold_kv)
        if msg.layer == 0:  # nothing computed there: this instance runs the whole prompt
            self.handoffs.commit_relay(msg.request_id, None)
            self.recorder.relay_ended(base_id(msg.request_id), clock.now())
        self.send(RelayReadyMsg(rank=self.rank, request_id=msg.request_id))

    def send_relay(self, msg: SendRelayMsg) -> None:
        if msg.dst_rank < 0:
            self.handoffs.relay_cancelled(msg.request_id)
            return
        r = self.table.get(msg.request_id, S.RELAYING)
        if r is None or r.handoff is None:
            raise InvalidRequestError(f"request {msg.request_id!r} is not being relayed here")
        self.relay_move(self.rank, msg.dst_rank, r.request_id, r.num_tokens, r.handoff.layer)

    def cancel_relay(self, request_id: str) -> None:
        self.handoffs.cancel_relay(request_id)

    # --- ends of moves (the cluster's callbacks) ------------------------------------------

    def kv_sent(self, rid: str) -> None:
        """Prefill side: the request's KV has left."""
        self._cut()
        self._sending.discard(rid)
        self.handoffs.release_held(rid)
        self._changed()

    def kv_arrived(self, rid: str) -> None:
        """Decode side: the KV is here; the request decodes with the others."""
        self._cut()
        if self.table.get(rid, S.IMPORTING) is not None:
            self.handoffs.commit_import(rid)
        self._changed()

    def reserve_prefixes(self, num_blocks: int) -> list[int]:
        """A new instance: room for hot prefix blocks on their way (cluster.ship_prefixes)."""
        self._cut()
        ids = self.handoffs.reserve_prefixes(num_blocks)
        self._changed()
        return ids

    def prefixes_arrived(self, block_ids: list[int], blocks: list[tuple[bytes, bytes, int]]) -> None:
        """Their bytes crossed the link: cached here now."""
        self._cut()
        self.handoffs.commit_prefixes(block_ids, blocks)
        self._changed()

    def relay_sent(self, rid: str) -> None:
        """Target: the task's hidden states and KV have gone."""
        self._cut()
        if self.table.get(rid, S.RELAYING) is not None:
            self.handoffs.relay_sent(rid)
            self.send(RelaySentMsg(rank=self.rank, request_id=rid))
        self._changed()

    def relay_arrived(self, rid: str) -> None:
        """Source: the relayed task is here; its remaining layers run next."""
        self._cut()
        r = self.table.get(rid, S.RELAYED_IN)
        if r is not None and r.handoff is not None and not r.handoff.ready:
            self.handoffs.commit_relay(rid, None)
        self.recorder.relay_ended(base_id(rid), clock.now())
        self._changed()

    # --- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._check_live()
            sc = self.scheduler
            queried, hit = sc.prefix_queries, sc.prefix_hits
            step = plan(self.live, self.table, sc, self.profile.num_layers, self._sample)
            self.recorder.prefix(sc.prefix_queries - queried, sc.prefix_hits - hit)
            if step.is_empty:
                self._flush()
                await self._idle()
                continue
            with self.cores.computing(self.rank), self.device.computing(self.rank):
                await self._execute(step)

    async def _idle(self) -> None:
        """Until something happens (or a live task's next segment lands)."""
        self._wake.clear()
        wait = None
        if self.live is not None and self.live.tasks and isinstance(self.live.readiness, ClockReadiness):
            at = self.live.readiness.next_landing()
            wait = None if at is None else max(0.0, at - clock.now())
        since = clock.now()
        try:
            async with asyncio.timeout(wait):
                await self._wake.wait()
        except TimeoutError:
            pass
        if wait is not None and self.live is not None:
            for t in self.live.awaiting_layers():
                self.recorder.waited_for_layers(base_id(t.request.request_id), clock.now() - since)

    async def _execute(self, step: Step) -> None:
        start = clock.now()
        for r in step.prompts:
            self.recorder.started(base_id(r.request_id), start)
        if step.live is not None:
            for t in step.live.batch:
                self.recorder.started(base_id(t.request.request_id), start)
        # (engines resident on one device take turns: each step as long as theirs together)
        dur = step_s(self.profile, step.work) * self.cores.stretch(self.rank) * self.device.stretch(self.rank)
        done = 1
        if step.decode_only(self.scheduler):
            k = decode_run(step.rows, self.pool, self.shape.max_model_len)
            if k > 1:
                reserve(step.rows, self.pool, k)
                done = await self._jump_run(start, dur, k)
                unreserve(step.rows, self.pool, done)
            else:
                done = 1
            if done == 1:
                await asyncio.sleep(max(0.0, start + dur - clock.now()))
        else:
            await asyncio.sleep(dur)
        now = clock.now()
        for r in step.completed:  # (sampled when the step began; their tokens come now)
            if r.num_output_tokens == 1:
                self.recorder.first(base_id(r.request_id), now)
        if step.live is not None:
            lv = step.live
            live = self.live
            batch = [t for t in lv.batch if live is not None and t in live.tasks]  # (not relayed)
            if live is not None:
                live.ran(batch, lv.stage, lv.layers, lv.loading)
        if done > 1:
            rows = advance(step.rows, self.pool, done)
        else:
            rows = []
            for s in step.rows:
                r = s.request
                if r.status is not S.RUNNING:
                    continue  # aborted meanwhile
                sampling = s.completes_prompt
                r.num_computed_tokens += s.num_new_tokens
                # (prompt blocks only: a simulated request's output tokens are placeholders)
                self.scheduler.cache_computed(r, r.num_prompt_tokens)
                if sampling:
                    rows.append(r)
        for r in rows:
            self._sample(r)
            rid = base_id(r.request_id)
            if r.num_output_tokens == 1:
                self.recorder.first(rid, now)
            else:
                self.recorder.steps(rid, start, dur, done)
        self._flush()
        self._changed()

    async def _jump_run(self, start: float, step: float, k: int) -> int:
        """Decode steps from `start`, `k` at most, until something cuts the run: how many
        ran (the one under way when it was cut ends first)."""
        jump = self._jump = _Jump(start, step, k)
        self._wake.clear()
        try:
            async with asyncio.timeout(k * step):
                await self._wake.wait()
        except TimeoutError:
            pass
        done = jump.cut or k
        self._jump = None
        await asyncio.sleep(max(0.0, start + done * step - clock.now()))
        return done

    def _cut(self) -> None:
        """Something is about to change: a decode run under way ends after its current step."""
        j = self._jump
        if j is not None and not j.cut:
            j.cut = min(j.k, max(1, math.ceil((clock.now() - j.start) / j.step - 1e-9)))

    def _sample(self, req: Request) -> None:
        """A request's next token (a placeholder): stop checks, then its output, if the
        router needs it (its first token, held for migration, or its last)."""
        req.token_ids.append(0)
        reason = self.outputs.check_stop(req)
        if reason is not None:
            self.scheduler.finish(req, reason)
            self._pending.append(output_msg(self.outputs.make_output(req)))
        elif req.hold_kv:
            self._pending.append(output_msg(self.handoffs.hold(req)))
        elif req.num_emitted_tokens == 0:
            self._pending.append(output_msg(self.outputs.make_output(req)))

    def _flush(self) -> None:
        if self._pending:
            outs, self._pending = self._pending, []
            self.send(OutputsMsg(rank=self.rank, outputs=outs))

    # --- stats ------------------------------------------------------------------------

    def _changed(self) -> None:
        self._wake.set()
        if self._stats_due is None:
            wait = max(0.0, self._last_stats + STATS_EVERY_S - clock.now())
            self._stats_due = asyncio.get_running_loop().call_later(wait, self._report)

    def _report(self) -> None:
        self._stats_due = None
        self._last_stats = clock.now()
        self.send(self.stats())

    def stats(self) -> StatsMsg:
        c = self.table.counts()
        return StatsMsg(
            rank=self.rank,
            num_running=c.get(S.RUNNING, 0),
            num_waiting=c.get(S.WAITING, 0),
            num_held=c.get(S.HELD, 0),
            used_blocks=self.pool.num_used_blocks,
            total_blocks=self.pool.num_blocks,
            num_live=c.get(S.LIVE, 0),
        )
