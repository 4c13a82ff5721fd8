"""One simulated instance: an engine that speaks the worker's data-plane messages and
takes the time its profile says, on the virtual clock.

Continuous batching as the real engine does it, at the level of steps: a step prefills the
waiting prompts that fit the token budget and KV room (plus one decode token for the
running requests on a colocated instance); otherwise the running requests decode. Runs of
decode steps between events are taken in one jump (an arrival cuts the jump after the step
under way), so a simulation costs per event, not per token. KV is reserved for a request's
prompt plus its `max_tokens` when it is admitted (no preemption). Tokens are placeholders
(id 0); every token's time is kept in the `Recorder` for TBT.

Live scaling: a live target prefills while weights arrive; a prompt's last layer cannot run
before the last weight segment has landed. Asked to relay (ZigZag), it hands its head task
to its partner: the oldest prompt of the step under way, stopped after the layers that have
both landed and been computed by now, else the oldest waiting one (after no layer). Its
hidden states and the KV of those layers cross the link between the two (`relay_move`);
the partner then runs the remaining layers, its share of the prompt's prefill time.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from blitzscale import clock
from blitzscale.control.costmodel import Profile
from blitzscale.messages import (
    AbortMsg,
    AdoptKVMsg,
    GenerateMsg,
    KVFailedMsg,
    KVReadyMsg,
    LiveDoneMsg,
    LiveLoadedMsg,
    LiveReadyMsg,
    Message,
    OutputMsg,
    OutputsMsg,
    RecvKVMsg,
    RejectedMsg,
    RelayedMsg,
    RelayFailedMsg,
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

STATS_EVERY_S = 0.1  # at most this often a changed instance reports its numbers


class Recorder:
    """Every request's token times (the client's TBTs), by request id."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._tbts: dict[str, list[tuple[float, int]]] = {}  # (gap, count) runs

    def first(self, rid: str, at: float) -> None:
        self._last[rid] = at
        self._tbts.setdefault(rid, [])

    def steps(self, rid: str, start: float, step_s: float, n: int) -> None:
        """`n` tokens from decode steps of `step_s` starting at `start`."""
        if n <= 0 or rid not in self._last:
            return
        runs = self._tbts[rid]
        runs.append((start + step_s - self._last[rid], 1))
        if n > 1:
            runs.append((step_s, n - 1))
        self._last[rid] = start + n * step_s

    def tbts(self, rid: str) -> tuple[float, ...]:
        return tuple(gap for gap, n in self._tbts.get(rid, ()) for _ in range(n))

    def forget(self, rid: str) -> None:
        self._last.pop(rid, None)
        self._tbts.pop(rid, None)


def base_id(wire_id: str) -> str:
    """The router's request id of a worker-side id (a rerun adds '#n')."""
    base, sep, tail = wire_id.rpartition("#")
    return base if sep and tail.isdigit() else wire_id


@dataclass
class SimRequest:
    id: str
    prompt: int
    max_tokens: int
    hold_kv: bool = False
    output: int = 0  # tokens produced
    emitted: int = 0  # of which the router has been told
    blocks: int = 0  # reserved
    layers_done: int = 0  # a relayed prompt: layers its live target ran
    left: float = 1.0  # share of its prefill still to compute here

    @property
    def context(self) -> int:
        return self.prompt + self.output

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.output


@dataclass
class EngineShape:
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    kv_blocks: int


@dataclass
class SimEngine:
    rank: int
    role: str
    profile: Profile
    shape: EngineShape
    emit: Callable[[Message], None]
    recorder: Recorder
    kv_move: Callable[[int, int, str, int], None]  # (src, dst, request id, tokens)
    relay_move: Callable[[int, int, str, int, int], None] = lambda *a: None  # (+ layers done)
    loaded_at: float | None = None  # a live target: when its last weight segment lands
    cores: HostCores = field(default_factory=lambda: HostCores(0))  # its node's, shared
    waiting: deque[SimRequest] = field(default_factory=deque)
    running: list[SimRequest] = field(default_factory=list)
    held: dict[str, SimRequest] = field(default_factory=dict)
    importing: dict[str, SimRequest] = field(default_factory=dict)
    prefilling: list[SimRequest] = field(default_factory=list)  # in the step under way
    relaying: dict[str, SimRequest] = field(default_factory=dict)  # target: handed over, not sent
    relayed_in: dict[str, SimRequest] = field(default_factory=dict)  # source: reserved, on the wire
    relayed: deque[SimRequest] = field(default_factory=deque)  # source: arrived, to finish
    used_blocks: int = 0

    def __post_init__(self) -> None:
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stats_due: asyncio.TimerHandle | None = None
        self._last_stats = -math.inf
        self._live_events: set[type] = set()
        self._live_t0 = 0.0  # when the live target's weights began to arrive
        self._step_at = (0.0, 0.0)  # the prefill step under way: (start, seconds a layer)

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
    def is_idle(self) -> bool:
        return not (
            self.waiting
            or self.running
            or self.held
            or self.importing
            or self.prefilling
            or self.relaying
            or self.relayed_in
            or self.relayed
        )

    @property
    def is_live(self) -> bool:
        """A live target whose weights are still arriving."""
        return self.loaded_at is not None

    def live_events(self, first_layers_at: float) -> None:
        """A live target tells the router when its first layers and its last land."""
        loop = asyncio.get_running_loop()
        now = clock.now()
        self._live_t0 = now
        loop.call_later(max(0.0, first_layers_at - now), self._live, LiveReadyMsg)
        assert self.loaded_at is not None
        loop.call_later(max(0.0, self.loaded_at - now), self._loaded)

    def _live(self, kind: type) -> None:
        if kind not in self._live_events:
            self._live_events.add(kind)
            self.emit(kind(rank=self.rank))

    def _loaded(self) -> None:
        self._live(LiveLoadedMsg)
        self._wake.set()

    # --- messages ---------------------------------------------------------------------

    def handle(self, msg: Message) -> None:
        if isinstance(msg, GenerateMsg):
            self._generate(msg)
        elif isinstance(msg, AbortMsg):
            self._abort(msg.request_id)
        elif isinstance(msg, RecvKVMsg):
            self._reserve_import(msg)
        elif isinstance(msg, SendKVMsg):
            r = self.held.get(msg.request_id)
            if r is None:
                self.emit(KVFailedMsg(rank=self.rank, request_id=msg.request_id, error="holds no KV here"))
            else:
                self.kv_move(self.rank, msg.dst_rank, msg.request_id, r.context)
        elif isinstance(msg, AdoptKVMsg):
            r = self.held.pop(msg.request_id, None)
            if r is not None:
                r.hold_kv = False
                self.running.append(r)
        elif isinstance(msg, RelayMsg):
            self._relay_out()
        elif isinstance(msg, SendRelayMsg):
            self._send_relay(msg)
        elif isinstance(msg, RelayInMsg):
            self._reserve_relay(msg)
        self._changed()

    # --- relays (ZigZag) ----------------------------------------------------------------

    def _layers_done_now(self) -> int:
        """Layers the step under way has run by now: landed, and computed."""
        p, now = self.profile, clock.now()
        if self.loaded_at is None:
            return 0
        span = max(1e-9, self.loaded_at - self._live_t0)
        landed = math.floor((p.num_layers + 2) * (now - self._live_t0) / span) - 1  # (embedding first)
        start, per_layer = self._step_at
        computed = math.floor((now - start) / per_layer) if per_layer > 0 else 0
        return max(0, min(p.num_layers - 1, landed, computed))

    def _relay_out(self) -> None:
        """Target: the oldest prompt of the step under way (where it stopped), else the
        oldest waiting one (nothing run yet)."""
        if self.loaded_at is None:
            self.emit(RelayNoneMsg(rank=self.rank))
            return
        if self.prefilling:
            r = self.prefilling.pop(0)
            r.layers_done = self._layers_done_now()
        elif self.waiting:
            r = self.waiting.popleft()
            r.layers_done = 0
        else:
            self.emit(RelayNoneMsg(rank=self.rank))
            return
        self.relaying[r.id] = r
        self.emit(RelayedMsg(rank=self.rank, request_id=r.id, layer=r.layers_done, live_layers=r.layers_done))

    def _send_relay(self, msg: SendRelayMsg) -> None:
        r = self.relaying.get(msg.request_id)
        if r is None:
            return
        if msg.dst_rank < 0:  # the source had no room: back to the head of the queue
            del self.relaying[r.id]
            self._free(r)
            self.waiting.appendleft(r)
            return
        self.relay_move(self.rank, msg.dst_rank, r.id, r.prompt, r.layers_done)

    def relay_sent(self, rid: str) -> None:
        """Target: the task's hidden states and KV have gone."""
        r = self.relaying.pop(rid, None)
        if r is not None:
            self._free(r)
            self.emit(RelaySentMsg(rank=self.rank, request_id=rid))
        self._changed()

    def _reserve_relay(self, msg: RelayInMsg) -> None:
        n = len(msg.prompt_token_ids)
        total = min(n + msg.params.max_tokens, self.shape.max_model_len)
        r = SimRequest(msg.request_id, n, max(1, total - n), hold_kv=msg.hold_kv)
        if not self._reserve(r):
            self.emit(RelayFailedMsg(rank=self.rank, request_id=msg.request_id, error="no room"))
            return
        r.layers_done, r.left = msg.layer, 1.0 - msg.layer / self.profile.num_layers
        self.relayed_in[r.id] = r
        self.emit(RelayReadyMsg(rank=self.rank, request_id=msg.request_id))

    def relay_arrived(self, rid: str) -> None:
        """Source: the relayed task is here; its remaining layers run next."""
        r = self.relayed_in.pop(rid, None)
        if r is not None:
            self.relayed.append(r)
        self._changed()

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.shape.block_size)

    def _generate(self, msg: GenerateMsg) -> None:
        n, m = len(msg.prompt_token_ids), msg.params.max_tokens
        total = min(n + m, self.shape.max_model_len)
        if self._blocks(total) > self.shape.kv_blocks:
            self.emit(
                RejectedMsg(rank=self.rank, request_id=msg.request_id, error="too long for the KV cache")
            )
            return
        self.waiting.append(SimRequest(msg.request_id, n, max(1, total - n), hold_kv=msg.hold_kv))

    def _abort(self, rid: str) -> None:
        for coll in (self.held, self.importing, self.relaying, self.relayed_in):
            r = coll.pop(rid, None)
            if r is not None:
                self._free(r)
        for coll in (self.waiting, self.running, self.prefilling, self.relayed):
            for r in [r for r in coll if r.id == rid]:
                coll.remove(r)
                self._free(r)

    def _reserve_import(self, msg: RecvKVMsg) -> None:
        n = len(msg.token_ids)
        total = min(msg.num_prompt_tokens + msg.params.max_tokens, self.shape.max_model_len)
        r = SimRequest(msg.request_id, msg.num_prompt_tokens, max(1, total - msg.num_prompt_tokens))
        r.output = r.emitted = n - msg.num_prompt_tokens
        if not self._reserve(r):
            self.emit(KVFailedMsg(rank=self.rank, request_id=msg.request_id, error="no room"))
            return
        self.importing[msg.request_id] = r
        self.emit(KVReadyMsg(rank=self.rank, request_id=msg.request_id))

    def _reserve(self, r: SimRequest) -> bool:
        """KV blocks for `r`'s prompt and its output, if there is room."""
        need = self._blocks(min(r.prompt + r.max_tokens, self.shape.max_model_len))
        if self.used_blocks + need > self.shape.kv_blocks:
            return False
        r.blocks = need
        self.used_blocks += need
        return True

    def kv_sent(self, rid: str) -> None:
        """Prefill side: the request's KV has left."""
        r = self.held.pop(rid, None)
        if r is not None:
            self._free(r)
        self._changed()

    def kv_arrived(self, rid: str) -> None:
        """Decode side: the KV is here; the request decodes with the others."""
        r = self.importing.pop(rid, None)
        if r is not None:
            self.running.append(r)
        self._changed()

    def _free(self, r: SimRequest) -> None:
        self.used_blocks -= r.blocks
        r.blocks = 0

    # --- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if self.loaded_at is not None and clock.now() >= self.loaded_at:
                self._live(LiveLoadedMsg)  # (in this order, whichever comes first)
                self._live(LiveDoneMsg)  # nothing is left half-run: it serves normally
                self.loaded_at = None
            batch = self._admit()
            if batch:
                with self.cores.computing(self.rank):
                    await self._prefill(batch)
            elif self.running:
                with self.cores.computing(self.rank):
                    await self._decode()
            else:
                self._wake.clear()
                await self._wake.wait()

    def _admit(self) -> list[SimRequest]:
        batch: list[SimRequest] = []
        tokens = 0
        s = self.shape
        while self.relayed and len(self.running) + len(batch) < s.max_num_seqs:  # (blocks reserved)
            r = self.relayed[0]
            if batch and tokens + r.prompt * r.left > s.max_num_batched_tokens:
                break
            batch.append(self.relayed.popleft())
            tokens += math.ceil(r.prompt * r.left)
        while self.waiting and len(self.running) + len(batch) < s.max_num_seqs:
            r = self.waiting[0]
            if batch and tokens + r.prompt > s.max_num_batched_tokens:
                break
            need = self._blocks(r.prompt + r.max_tokens)
            if self.used_blocks + need > s.kv_blocks:
                break
            self.waiting.popleft()
            r.blocks = need
            self.used_blocks += need
            batch.append(r)
            tokens += r.prompt
        return batch

    async def _prefill(self, batch: list[SimRequest]) -> None:
        p = self.profile
        tokens = sum(math.ceil(r.prompt * r.left) for r in batch)
        decoding = list(self.running) if self.role == "colocated" else []
        # A mixed step reads the weights once: its decodes cost what as many more prompt
        # tokens would (a prefill step plus a whole decode step would count the weights
        # twice), plus what attending to their contexts adds over the shortest profiled one.
        step = p.prefill_s(tokens + len(decoding))
        if decoding:
            b, ctx = len(decoding), sum(r.context for r in decoding) / len(decoding)
            step += max(0.0, p.decode_s(b, ctx) - p.decode_s(b, min(ctx, p.decode_context[0])))
        step *= self.cores.stretch(self.rank)
        start = clock.now()
        self.prefilling = list(batch)
        self._step_at = (start, step / p.num_layers)
        if self.loaded_at is not None and start < self.loaded_at:  # weights still arriving
            # layer by layer: the last one runs once its weights have landed
            step = max(step, self.loaded_at - start + step / p.num_layers)
        await asyncio.sleep(step)
        now = clock.now()
        outs = []
        for r in decoding:
            if r in self.running:
                self.recorder.steps(base_id(r.id), start, step, 1)
                r.output += 1
                if r.remaining <= 0:
                    outs.append(self._finish(r))
        done, self.prefilling = self.prefilling, []  # (without those aborted meanwhile)
        for r in done:
            r.output = 1
            self.recorder.first(base_id(r.id), now)
            if r.remaining <= 0:  # done at its first token, as the engine's stop check says
                self._free(r)
                outs.append(self._out(r, True, "length"))
            elif r.hold_kv:
                self.held[r.id] = r
                outs.append(self._out(r, True, "migrate"))
            else:
                self.running.append(r)
                outs.append(self._out(r, False, None))
        self._send(outs)

    async def _decode(self) -> None:
        running = list(self.running)
        step = self.profile.decode_s(len(running), sum(r.context for r in running) / len(running))
        step *= self.cores.stretch(self.rank)
        k = min(r.remaining for r in running)
        start = clock.now()
        self._wake.clear()
        try:
            async with asyncio.timeout(k * step):  # (not wait_for: it can swallow a cancel)
                await self._wake.wait()
        except TimeoutError:
            done = k
        else:
            done = min(k, max(1, math.ceil((clock.now() - start) / step - 1e-9)))
            await asyncio.sleep(max(0.0, start + done * step - clock.now()))  # the step under way ends
        outs = []
        for r in running:
            if r not in self.running:
                continue  # aborted meanwhile
            self.recorder.steps(base_id(r.id), start, step, done)
            r.output += done
            if r.remaining <= 0:
                outs.append(self._finish(r))
        self._send(outs)

    def _finish(self, r: SimRequest) -> OutputMsg:
        self.running.remove(r)
        self._free(r)
        return self._out(r, True, "length")

    def _out(self, r: SimRequest, finished: bool, reason: str | None) -> OutputMsg:
        """Every token since the last output (the first token, then the rest at the end:
        the router needs no more, the token times are the recorder's)."""
        new, r.emitted = r.output - r.emitted, r.output
        return OutputMsg(
            request_id=r.id,
            new_token_ids=[0] * new,
            text_delta="",
            finished=finished,
            finish_reason=reason,
            num_prompt_tokens=r.prompt,
            num_output_tokens=r.output,
        )

    def _send(self, outs: list[OutputMsg]) -> None:
        if outs:
            self.emit(OutputsMsg(rank=self.rank, outputs=outs))
        self._changed()

    # --- stats ------------------------------------------------------------------------

    def _changed(self) -> None:
        self._wake.set()
        if self._stats_due is None:
            wait = max(0.0, self._last_stats + STATS_EVERY_S - clock.now())
            self._stats_due = asyncio.get_running_loop().call_later(wait, self._report)

    def _report(self) -> None:
        self._stats_due = None
        self._last_stats = clock.now()
        self.emit(self.stats())

    def stats(self) -> StatsMsg:
        return StatsMsg(
            rank=self.rank,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_held=len(self.held),
            used_blocks=self.used_blocks,
            total_blocks=self.shape.kv_blocks,
            num_live=len(self.waiting) if self.is_live else 0,
        )
