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

import torch

from blitzscale.engine.live_order import LiveOrder, LiveTask
from blitzscale.engine.prompt_logprobs import record, whole_prompt_spans
from blitzscale.engine.request import Request
from blitzscale.engine.sync import wait_for_device
from blitzscale.kvcache.cache import KVCache
from blitzscale.kvcache.pool import BlockPool
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.llama import LlamaModel
from blitzscale.model.readiness import Readiness

__all__ = ["LiveOrder", "LiveQueue", "LiveTask", "finish_relayed", "prefill_metadata"]


def prefill_metadata(reqs: list[Request], block_size: int, device: torch.device) -> AttentionMetadata:
    """Attention metadata of whole prompts computed from scratch (no chunking)."""
    lens = [r.num_tokens for r in reqs]
    return AttentionMetadata.build(lens, lens, [r.block_ids for r in reqs], block_size, device)


class LiveQueue(LiveOrder):
    """The live target's prefill tasks (ordered by `LiveOrder`). `step` runs one stage for
    a batch of tasks."""

    def __init__(
        self,
        model: LlamaModel,
        kv_cache: KVCache,
        pool: BlockPool,
        max_batched_tokens: int,
        readiness: Readiness | None = None,
    ) -> None:
        super().__init__(pool, max_batched_tokens, readiness or model.weights.readiness, model.num_layers)
        self.model = model
        self.kv_cache = kv_cache

    @torch.inference_mode()
    def step(self) -> list[tuple[Request, torch.Tensor]]:
        """Run one stage of one batch. Returns (request, logits row) for the tasks that just
        ran the head: their prompt is complete and they leave the queue."""
        batch = self.next_batch()
        if not batch:
            return []
        stage = batch[0].stage
        if stage == 0:
            for t in batch:
                ids = torch.tensor(t.request.token_ids, dtype=torch.long, device=self.model.weights.device)
                t.hidden = self.model.embed(ids)
            self.ran(batch, stage)
            wait_for_device(self.model.weights.device)
            return []
        reqs = [t.request for t in batch]
        hidden = torch.cat([t.hidden for t in batch])  # type: ignore[misc]
        lens = [r.num_tokens for r in reqs]
        if stage == self.head_stage:
            record(self.model.logits, hidden, whole_prompt_spans(reqs))
            last = torch.tensor(lens, device=hidden.device).cumsum(0) - 1
            logits = self.model.logits(hidden[last]).float()
            return list(zip(self.ran(batch, stage), logits, strict=True))
        meta = prefill_metadata(reqs, self.kv_cache.block_size, hidden.device)
        # While weights arrive: one layer, then choose again. Once all are here: the rest.
        loading = not self.readiness.all_ready
        start, end = self.layers(stage, loading)
        out = self.model.run_layers(hidden, meta, self.kv_cache, start=start, end=end)
        for t, h in zip(batch, out.split(lens), strict=True):
            t.hidden = h
        self.ran(batch, stage, (start, end), loading)
        wait_for_device(out.device)  # the next step's metadata copies would wait with the GIL
        return []


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
        record(model.logits, hidden, whole_prompt_spans(group))
        last = torch.tensor([r.num_tokens for r in group], device=device).cumsum(0) - 1
        for i, row in zip(idx, model.logits(hidden[last]).float(), strict=True):
            rows[i] = row
    return torch.stack([rows[i] for i in range(len(reqs))])
