"""KV hand-offs: a request's KV leaving this engine's cache or entering it.

The books (statuses, blocks; reserve, then commit or cancel) are `HandoffBook`'s
(engine/handoff_book.py, torch-free: the simulator keeps them too); this adds the KV itself:
`kv_out` packs a held or relaying request's blocks, `kv_buffer` and `hidden_buffer` are
what a receive lands in, and `kv_in` scatters a received buffer.

The engine composes one (`LLMEngine.handoffs`); the serving loop calls it there. It uses
of the engine only what `HandoffOwner` names, and the engine's components it is given.
"""

from __future__ import annotations

import torch

from blitzscale.engine.handoff_book import HandoffBook, HandoffOwner
from blitzscale.engine.output import OutputProcessor
from blitzscale.engine.request import RequestStatus
from blitzscale.engine.scheduler import Scheduler
from blitzscale.engine.table import RequestTable
from blitzscale.errors import InvalidRequestError
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.config import ModelConfig

S = RequestStatus
__all__ = ["HandoffOwner", "KVHandoffs"]


class KVHandoffs(HandoffBook):
    def __init__(
        self,
        engine: HandoffOwner,
        table: RequestTable,
        scheduler: Scheduler,
        kv_cache: KVCache,
        outputs: OutputProcessor,
        model_config: ModelConfig,
    ) -> None:
        super().__init__(engine, table, scheduler, outputs, model_config.num_layers)
        self.kv_cache = kv_cache
        self.model_config = model_config

    # --- KV in and out of this engine's cache (migration, relays) -----------------------

    def kv_out(self, request_id: str, layers: tuple[int, int] | None = None) -> torch.Tensor:
        """A held or relaying request's KV blocks packed for sending (layers [a, b))."""
        req = self.table.get(request_id, S.HELD, S.RELAYING)
        if req is None:
            raise InvalidRequestError(f"request {request_id!r} holds no KV here")
        return self.kv_cache.gather_blocks(req.block_ids, layers)

    def kv_buffer(self, num_blocks: int, layers: int | None = None) -> torch.Tensor:
        """An empty packed buffer for `num_blocks` blocks (of the first `layers` layers)."""
        kv = self.kv_cache
        shape = kv.packed_shape(num_blocks) if layers is None else kv.packed_shape(num_blocks, layers)
        return torch.empty(shape, dtype=kv.data.dtype, device=kv.data.device)

    def kv_in(self, request_id: str, buf: torch.Tensor, layers: tuple[int, int] | None = None) -> None:
        """Scatter a received packed buffer into an importing / relayed-in request's first
        blocks."""
        req = self.table.get(request_id, S.IMPORTING, S.RELAYED_IN)
        if req is None:
            raise InvalidRequestError(f"request {request_id!r} is not receiving KV here")
        self.kv_cache.scatter_blocks(req.block_ids[: buf.shape[2]], buf, layers)

    @property
    def block_bytes(self) -> int:
        """One block's KV, every layer's keys and values (what a packed block takes)."""
        d = self.kv_cache.data
        return d[:, :, 0].numel() * d.element_size()

    def blocks_out(self, block_ids: list[int]) -> torch.Tensor:
        """These blocks' KV, packed for sending (hot prefixes: a copy, so the blocks may be
        reused as soon as the copy is queued)."""
        return self.kv_cache.gather_blocks(block_ids)

    def blocks_in(self, block_ids: list[int], buf: torch.Tensor) -> None:
        self.kv_cache.scatter_blocks(block_ids, buf)

    def hidden_buffer(self, num_tokens: int) -> torch.Tensor:
        """An empty residual-stream buffer for `num_tokens` tokens (a relay's hidden states)."""
        kv = self.kv_cache.data
        return torch.empty((num_tokens, self.model_config.hidden_size), dtype=kv.dtype, device=kv.device)
