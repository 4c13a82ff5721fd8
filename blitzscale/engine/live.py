"""Live scaling inside one engine (design §2.3, ZigZag).

Two halves, one per side of a live pair:

- `LiveQueue`, on the live *target* (weights still arriving): prefill tasks advance one
  weight segment at a time (embedding, layer 0..L-1, head), in FCFS order but preferring
  tasks whose next segment has landed; a task waits, partly executed, until its next
  segment is there. A task is at a segment boundary between steps, so it can be handed
  over (`relay_head`) with the hidden states after its last layer (`Request.handoff`).
- `finish_relayed`, on the *source*: a relayed task's remaining layers [k, L); then it is
  sampled and lives on like any other request (held for migration, or running).

Statuses (LIVE, RELAYING, RELAYED_IN) are the engine's request table's; this module only
orders and computes.

A task's stage is the index of the next weight segment it needs: 0 = embedding, 1 + i =
layer i, L + 1 = head. So "is the next stage runnable" is just the readiness counter of
that segment, and a task at stage s has run layers [0, s - 1).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from blitzscale.engine.request import Handoff, Request
from blitzscale.engine.sync import wait_for_device
from blitzscale.kvcache.cache import KVCache
from blitzscale.kvcache.pool import BlockPool
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.llama import LlamaModel
from blitzscale.model.readiness import Readiness


@dataclass
class LiveTask:
    request: Request
    stage: int = 0  # next weight segment to run (0: embedding)
    hidden: torch.Tensor | None = None  # residual stream after layer stage - 2

    @property
    def layers_done(self) -> int:
        return max(0, self.stage - 1)


def prefill_metadata(reqs: list[Request], block_size: int, device: torch.device) -> AttentionMetadata:
    """Attention metadata of whole prompts computed from scratch (no chunking)."""
    lens = [r.num_tokens for r in reqs]
    return AttentionMetadata.build(lens, lens, [r.block_ids for r in reqs], block_size, device)


class LiveQueue:
    """The live target's prefill tasks. `step` runs one stage for a batch of tasks."""

    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        pool: BlockPool,
        max_batched_tokens: int,
        readiness: Readiness | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.pool = pool
        self.max_batched_tokens = max_batched_tokens
        self.readiness: Readiness = readiness or model.weights.readiness
        self.num_layers = model.num_layers
        self.waiting: deque[Request] = deque()  # no KV blocks yet
        self.tasks: list[LiveTask] = []  # FCFS, blocks for the whole prompt allocated
        self.layers_run = 0  # (request, layer) pairs run while weights were incomplete
        self.last_run: tuple[int, float] | None = None  # the last step's (tokens, share of layers)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.tasks)

    @property
    def head_stage(self) -> int:
        return self.num_layers + 1

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def remove(self, req: Request) -> bool:
        """Drop a request (aborted; the caller frees its blocks). False if it is not here."""
        if req in self.waiting:
            self.waiting.remove(req)
            return True
        for t in self.tasks:
            if t.request is req:
                self.tasks.remove(t)
                return True
        return False

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
        first = next((t for t in self.tasks if self.readiness.is_ready(t.stage)), None)
        if first is None:
            return []
        batch, tokens = [], 0
        for t in self.tasks:
            if t.stage == first.stage and (
                not batch or tokens + t.request.num_tokens <= self.max_batched_tokens
            ):
                batch.append(t)
                tokens += t.request.num_tokens
        return batch

    @torch.inference_mode()
    def step(self) -> list[tuple[Request, torch.Tensor]]:
        """Run one stage of one batch. Returns (request, logits row) for the tasks that just
        ran the head: their prompt is complete and they leave the queue."""
        self._admit()
        self.last_run = None
        batch = self._pick()
        if not batch:
            return []
        stage = batch[0].stage
        if stage == 0:
            for t in batch:
                ids = torch.tensor(t.request.token_ids, dtype=torch.long, device=self.model.weights.device)
                t.hidden = self.model.embed(ids)
                t.stage = 1
            wait_for_device(self.model.weights.device)
            return []
        reqs = [t.request for t in batch]
        hidden = torch.cat([t.hidden for t in batch])  # type: ignore[misc]
        lens = [r.num_tokens for r in reqs]
        if stage == self.head_stage:
            last = torch.tensor(lens, device=hidden.device).cumsum(0) - 1
            logits = self.model.logits(hidden[last]).float()
            for t in batch:
                self.tasks.remove(t)
                t.request.num_computed_tokens = t.request.num_tokens
            return list(zip(reqs, logits, strict=True))
        meta = prefill_metadata(reqs, self.kv_cache.block_size, hidden.device)
        # While weights arrive: one layer, then choose again. Once all are here: the rest.
        loading = not self.readiness.all_ready
        start = stage - 1
        end = start + 1 if loading else self.num_layers
        out = self.model.run_layers(hidden, meta, self.kv_cache, start=start, end=end)
        self.last_run = (sum(lens), (end - start) / self.num_layers)
        if loading:
            self.layers_run += len(batch)
            for t in batch:
                t.request.live_layers += 1
        for t, h in zip(batch, out.split(lens), strict=True):
            t.hidden = h
            t.stage = end + 1
        wait_for_device(out.device)  # the next step's metadata copies would wait with the GIL
        return []

    def relay_head(self, newest: bool = False) -> Request | None:
        """Take a task off the queue, stopped where it is (its `handoff` says where): the
        head (oldest), or with `newest` the last one (once loaded, the head is about to
        finish here anyway)."""
        if self.tasks and not (newest and self.waiting):
            t = self.tasks.pop(-1 if newest else 0)
            t.request.handoff = Handoff(t.layers_done, t.hidden if t.layers_done else None)
            return t.request
        if self.waiting:
            req = self.waiting.pop() if newest else self.waiting.popleft()
            req.handoff = Handoff(0)
            return req
        return None

    def put_back(self, req: Request) -> None:
        """A relay that did not happen: the task is the head again, where it stopped."""
        h, req.handoff = req.handoff, None
        if not req.block_ids or h is None:
            self.waiting.appendleft(req)
            return
        stage = h.layer + 1 if h.layer else 0
        self.tasks.insert(0, LiveTask(req, stage, h.hidden))


@torch.inference_mode()
def finish_relayed(model: LlamaModel, kv_cache: KVCache, reqs: list[Request]) -> torch.Tensor:
    """Run layers [layer, L) of relayed requests (`handoff` arrived) and return their
    last-token logits (float32). One group per starting layer (a batch shares one range)."""
    device = model.weights.device
    rows: dict[int, torch.Tensor] = {}
    by_layer: dict[int, list[int]] = {}
    for i, r in enumerate(reqs):
        assert r.handoff is not None and r.handoff.ready
        by_layer.setdefault(r.handoff.layer, []).append(i)
    for layer, idx in by_layer.items():
        group = [reqs[i] for i in idx]
        if layer == 0:
            ids = torch.tensor([x for r in group for x in r.token_ids], dtype=torch.long, device=device)
            hidden = model.embed(ids)
        else:
            hidden = torch.cat([r.handoff.hidden for r in group])  # type: ignore[misc,union-attr]
        meta = prefill_metadata(group, kv_cache.block_size, device)
        hidden = model.run_layers(hidden, meta, kv_cache, start=layer)
        last = torch.tensor([r.num_tokens for r in group], device=device).cumsum(0) - 1
        for i, row in zip(idx, model.logits(hidden[last]).float(), strict=True):
            rows[i] = row
    return torch.stack([rows[i] for i in range(len(reqs))])
