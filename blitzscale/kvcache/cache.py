"""The KV cache tensors of one instance: per layer, keys and values in fixed-size blocks."""

from __future__ import annotations

import torch

from blitzscale.model.config import ModelConfig


class KVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        tp_size: int = 1,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        kv_heads = cfg.num_kv_heads // tp_size
        # Zero-filled: padded block-table entries read stale but finite values, never NaN.
        self.data = torch.zeros(
            cfg.num_layers,
            2,
            num_blocks,
            block_size,
            kv_heads,
            cfg.head_dim,
            dtype=dtype,
            device=device,
        )

    @staticmethod
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype, tp_size: int = 1) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return cfg.num_layers * 2 * block_size * (cfg.num_kv_heads // tp_size) * cfg.head_dim * itemsize

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, 0], self.data[i, 1]

    def gather_blocks(self, block_ids: list[int], layers: tuple[int, int] | None = None) -> torch.Tensor:
        """The given blocks of every layer (or of layers [a, b)), packed contiguously
        ([layers, 2, n, ...])."""
        a, b = layers or (0, self.data.shape[0])
        return self.data[a:b, :, block_ids].contiguous()

    def scatter_blocks(
        self, block_ids: list[int], packed: torch.Tensor, layers: tuple[int, int] | None = None
    ) -> None:
        a, b = layers or (0, self.data.shape[0])
        self.data[a:b, :, block_ids] = packed

    def packed_shape(self, num_blocks: int, num_layers: int | None = None) -> tuple[int, ...]:
        d = self.data.shape
        return (d[0] if num_layers is None else num_layers, d[1], num_blocks, *d[3:])

    def write(self, i: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        k_cache, v_cache = self.layer(i)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)
