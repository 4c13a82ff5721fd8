"""The seam between the model and its attention kernels.

A backend turns a step's `AttentionMetadata` into a launch plan once per step (`prepare`),
then, for each layer, stores the step's new keys and values in the paged cache and attends
(`forward`). The model holds one backend and calls nothing else for attention.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from blitzscale.model.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: str = "base"
    fuses_rotary: bool = False  # forward(..., rotary=tables) rotates q and k itself

    def prepare(self, meta: AttentionMetadata) -> Any:
        """The step's plan, made on the first call and kept on `meta` for every layer
        (and for later layer ranges run on the same metadata)."""
        if meta.plan is None or meta.plan[0] is not self:
            meta.plan = (self, self.make_plan(meta))
        return meta.plan[1]

    @abstractmethod
    def make_plan(self, meta: AttentionMetadata) -> Any: ...

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim] (rows may be strided views)
        k: torch.Tensor,  # [T, num_kv_heads, head_dim], this step's new keys
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rotary: Any = None,
        out: torch.Tensor | None = None,
        scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Store k, v at `meta.slot_mapping`, then return attention output [T, num_heads, head_dim].
        With `rotary` (only where `fuses_rotary`), q and k are first rotated by it. `out`:
        where the output goes (a view of a static buffer: a piecewise graph's input), the
        tensor returned then. `scales` (with `rotary` only): q, k and v are views of an FP8
        qkv product not yet scaled, (per-token [T, 1], per-column [q + 2 kv]) its scales;
        they are applied as q, k and v are read, and q, k, v hold the scaled values after."""
