"""The live queue's order and stages, torch-free (design §2.3, ZigZag): which live tasks run
next, how far each is, and which one a relay takes. `LiveQueue` (engine/live.py) computes
the stages it picks; the simulator's engine (sim/engine.py) times them by its profile.

A task's stage is the index of the next weight segment it needs: 0 = embedding, 1 + i =
layer i, L + 1 = head; a task at stage s has run layers [0, s - 1).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blitzscale.engine.request import Handoff, Request
from blitzscale.kvcache.pool import BlockPool
from blitzscale.model.readiness import Readiness

if TYPE_CHECKING:
    import torch


@dataclass
class LiveTask:
    request: Request
    stage: int = 0  # next weight segment to run (0: embedding)
    hidden: torch.Tensor | None = None  # residual stream after layer stage - 2

    @property
    def layers_done(self) -> int:
        return max(0, self.stage - 1)


class LiveOrder:
    """A live target's prefill tasks: FCFS, preferring tasks whose next segment landed."""

    def __init__(
        self, pool: BlockPool, max_batched_tokens: int, readiness: Readiness, num_layers: int
    ) -> None:
        self.pool = pool
        self.max_batched_tokens = max_batched_tokens
        self.readiness = readiness
        self.num_layers = num_layers
        self.waiting: deque[Request] = deque()  # no KV blocks yet
        self.tasks: list[LiveTask] = []  # FCFS, blocks for the whole prompt allocated
        self.layers_run = 0  # (request, layer) pairs run while weights were incomplete
        # the router's split (control/live_split.py), by request id: layers a task runs here
        # while weights arrive (num_layers: all of it; none: the greedy rule decides)
        self.caps: dict[str, int] = {}
        self.last_run: tuple[int, float] | None = None  # the last step's (tokens, share of layers)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.tasks)

    @property
    def head_stage(self) -> int:
        return self.num_layers + 1

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def plan(self, caps: dict[str, int]) -> None:
        """The router's split for the tasks queued here (ids not here are ignored): a task
        stops after its layers (its partner takes it from there) and one planned to stay
        whole is not handed over while weights arrive."""
        here = {r.request_id for r in self.waiting} | {t.request.request_id for t in self.tasks}
        self.caps = {rid: min(max(k, 0), self.num_layers) for rid, k in caps.items() if rid in here}

    def _parked(self, t: LiveTask) -> bool:
        """`t` ran the layers its plan gives it here and waits for its partner."""
        cap = self.caps.get(t.request.request_id)
        if cap is None or cap >= self.num_layers or self.readiness.all_ready:
            return False
        return max(t.stage, 1) > cap

    def awaiting_layers(self) -> list[LiveTask]:
        """The tasks whose next segment has not landed (parked ones wait for their partner)."""
        return [t for t in self.tasks if not self._parked(t) and not self.readiness.is_ready(t.stage)]

    def _stays(self, req: Request) -> bool:
        return self.caps.get(req.request_id) == self.num_layers and not self.readiness.all_ready

    def remove(self, req: Request) -> bool:
        """Drop a request (aborted; the caller frees its blocks). False if it is not here."""
        self.caps.pop(req.request_id, None)
        if req in self.waiting:
            self.waiting.remove(req)
            return True
        for t in self.tasks:
            if t.request is req:
                self.tasks.remove(t)
                return True
        return False

    def next_batch(self) -> list[LiveTask]:
        """Admit what fits, then pick the batch of this step's stage (empty: none runnable)."""
        self._admit()
        self.last_run = None
        return self._pick()

    def _admit(self) -> None:
        while self.waiting:
            req = self.waiting[0]
            need = self.pool.blocks_for_tokens(req.num_tokens)
            if not self.pool.can_allocate(need):
                return
            self.waiting.popleft()
            req.block_ids = self.pool.allocate(need)
            self.tasks.append(LiveTask(req))

    def _pick(self) -> list[LiveTask]:
        """The first task (FCFS) whose next segment has landed, with every other task at
        that stage (a batch runs one stage), up to the token budget."""
        runnable = [t for t in self.tasks if not self._parked(t)]
        first = next((t for t in runnable if self.readiness.is_ready(t.stage)), None)
        if first is None:
            return []
        batch, tokens = [], 0
        for t in runnable:
            if t.stage == first.stage and (
                not batch or tokens + t.request.num_tokens <= self.max_batched_tokens
            ):
                batch.append(t)
                tokens += t.request.num_tokens
        return batch

    def layers(self, stage: int, loading: bool) -> tuple[int, int]:
        """The layers a batch at `stage` (1..L) runs: one while weights arrive, else the rest."""
        start = stage - 1
        return start, (start + 1 if loading else self.num_layers)

    def ran(
        self, batch: list[LiveTask], stage: int, layers: tuple[int, int] = (0, 0), loading: bool = False
    ) -> list[Request]:
        """`batch` ran `stage` (a layer stage: `layers`, as `layers(stage)` said before it
        ran, `loading` if the weights were incomplete then): move it on. Returns the
        requests that ran the head (their prompt is complete; they leave the queue)."""
        if stage == 0:
            for t in batch:
                t.stage = 1
            return []
        if stage == self.head_stage:
            for t in batch:
                self.tasks.remove(t)
                self.caps.pop(t.request.request_id, None)
                t.request.num_computed_tokens = t.request.num_tokens
            return [t.request for t in batch]
        start, end = layers
        self.last_run = (sum(t.request.num_tokens for t in batch), (end - start) / self.num_layers)
        if loading:
            self.layers_run += len(batch)
            for t in batch:
                t.request.live_layers += 1
        for t in batch:
            t.stage = end + 1
        return []

    def relay_head(self, newest: bool = False) -> Request | None:
        """Take a task off the queue, stopped where it is (its `handoff` says where): the
        head (oldest), or with `newest` the last one (once loaded, the head is about to
        finish here anyway). Under a split plan: the oldest task parked at its planned
        layer, else the oldest not planned to stay here whole."""
        if newest:
            if self.tasks and not self.waiting:
                return self._hand(self.tasks.pop())
            return self._hand_waiting(self.waiting.pop()) if self.waiting else None
        parked = next((t for t in self.tasks if self._parked(t)), None)
        if parked is None:
            parked = next((t for t in self.tasks if not self._stays(t.request)), None)
        if parked is not None:
            self.tasks.remove(parked)
            return self._hand(parked)
        req = next((r for r in self.waiting if not self._stays(r)), None)
        if req is None:
            return None
        self.waiting.remove(req)
        return self._hand_waiting(req)

    def _hand(self, t: LiveTask) -> Request:
        self.caps.pop(t.request.request_id, None)
        t.request.handoff = Handoff(t.layers_done, t.hidden if t.layers_done else None)
        return t.request

    def _hand_waiting(self, req: Request) -> Request:
        self.caps.pop(req.request_id, None)
        req.handoff = Handoff(0)
        return req

    def put_back(self, req: Request) -> None:
        """A relay that did not happen: the task is the head again, where it stopped."""
        h, req.handoff = req.handoff, None
        if not req.block_ids or h is None:
            self.waiting.appendleft(req)
            return
        stage = h.layer + 1 if h.layer else 0
        self.tasks.insert(0, LiveTask(req, stage, h.hidden))
