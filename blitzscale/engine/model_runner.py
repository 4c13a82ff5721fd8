"""Turns a scheduler step into tensors, runs the model, and returns the rows to sample."""

from __future__ import annotations

import torch

from blitzscale.engine.scheduler import SchedulerOutput
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.llama import LlamaModel


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = model.weights.device

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Float32 logits of the requests that sample this step, in scheduled order."""
        token_ids: list[int] = []
        query_lens, context_lens, tables, last = [], [], [], []
        for s in out.scheduled:
            r = s.request
            start = r.num_computed_tokens
            token_ids += r.token_ids[start : start + s.num_new_tokens]
            query_lens.append(s.num_new_tokens)
            context_lens.append(start + s.num_new_tokens)
            tables.append(r.block_ids)
            if s.completes_prompt:
                last.append(len(token_ids) - 1)
        meta = AttentionMetadata.build(
            query_lens, context_lens, tables, self.kv_cache.block_size, self.device
        )
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        hidden = self.model.run_layers(self.model.embed(ids), meta, self.kv_cache)
        rows = torch.tensor(last, dtype=torch.long, device=self.device)
        return self.model.logits(hidden[rows]).float()
