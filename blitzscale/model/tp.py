"""Tensor parallelism as one shard of a model sees it (Megatron-style).

Rank k of an instance holds shard k of every layer (model/layout.py): the q/k/v, gate and
up projections split by output (heads, intermediate rows), o and down by input, so each
layer's two row-parallel outputs are partial sums that one all-reduce per projection
completes. Embedding, norms and lm_head are whole on every shard, so after each all-reduce
every shard holds the same residual stream and the same logits.

`TensorParallel` is the instance's group as the model uses it. The instance's leader (shard
0) runs the engine; every forward it runs must also run on the other shards at the same
time, in the same order (their all-reduces meet its own). A leader therefore passes a
subclass whose `on_layers` tells the other shards what to run (worker/tp.py); the base class
does nothing there and serves the other shards themselves, and tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from blitzscale.model.attention import AttentionMetadata


class TensorParallel:
    def __init__(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        if not 0 <= rank < size or size < 2:
            raise ValueError(f"tensor-parallel rank {rank} of size {size}")
        self.group = group
        self.rank = rank
        self.size = size

    def all_reduce(self, partial: torch.Tensor) -> None:
        """Sum the shards' partial outputs in place (every shard gets the same sum)."""
        dist.all_reduce(partial, group=self.group)

    def on_layers(
        self,
        token_ids: torch.Tensor | None,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        start: int,
        end: int,
    ) -> None:
        """Called before this shard runs layers [start, end) of a step. `token_ids`: what
        `hidden` was embedded from (None: hidden states from elsewhere, e.g. a relay)."""
