"""The Llama-family forward pass as plain functions over the flat weight views.

`embed`, `run_layers(start, end)` and `logits` are separate so a caller can run any layer
range on given hidden states: live scaling splits one request's layers across instances.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from blitzscale.model.attention import AttentionMetadata, paged_attention
from blitzscale.model.rope import RotaryEmbedding, apply_rotary
from blitzscale.model.weights import ModelWeights

if TYPE_CHECKING:
    from blitzscale.kvcache.cache import KVCache


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


class LlamaModel:
    def __init__(
        self,
        weights: ModelWeights,
        max_positions: int | None = None,
        tp_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.weights = weights
        self.tp_group = tp_group
        self.config = cfg = weights.config
        tp = weights.layout.tp_size
        if tp > 1 and tp_group is None:
            raise ValueError(f"a tensor-parallel shard (tp={tp}) needs its process group")
        self.num_heads = cfg.num_heads // tp
        self.num_kv_heads = cfg.num_kv_heads // tp
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.rope = RotaryEmbedding(
            cfg, max_positions or cfg.max_position_embeddings, weights.dtype, weights.device
        )

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.weights.embed)

    def run_layers(
        self,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        start: int = 0,
        end: int | None = None,
    ) -> torch.Tensor:
        end = self.num_layers if end is None else end
        cos, sin = self.rope.tables(meta.positions)
        for i in range(start, end):
            hidden = self._layer(i, hidden, cos, sin, meta, kv_cache)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        w = self.weights
        return F.linear(rms_norm(hidden, w.norm, self.config.rms_norm_eps), w.lm_head)

    def forward(self, token_ids: torch.Tensor, meta: AttentionMetadata, kv_cache: KVCache) -> torch.Tensor:
        """Logits for every token (tests and references; the engine picks rows first)."""
        return self.logits(self.run_layers(self.embed(token_ids), meta, kv_cache))

    def _layer(
        self,
        i: int,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        w = self.weights.layer(i)
        eps = self.config.rms_norm_eps
        n, d = hidden.shape[0], self.config.head_dim
        x = rms_norm(hidden, w.input_norm, eps)
        q, k, v = F.linear(x, w.qkv, w.qkv_bias).split([self.q_size, self.kv_size, self.kv_size], -1)
        q = apply_rotary(q.view(n, self.num_heads, d), cos, sin)
        k = apply_rotary(k.view(n, self.num_kv_heads, d), cos, sin)
        kv_cache.write(i, k, v.view(n, self.num_kv_heads, d), meta.slot_mapping)
        attn = paged_attention(q, *kv_cache.layer(i), meta, self.scale)
        hidden = hidden + self._reduce(F.linear(attn.reshape(n, self.q_size), w.o))
        x = rms_norm(hidden, w.post_norm, eps)
        gate, up = F.linear(x, w.gate_up).chunk(2, dim=-1)
        return hidden + self._reduce(F.linear(F.silu(gate) * up, w.down))

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Row-parallel outputs are partial sums across TP ranks."""
        if self.tp_group is not None:
            dist.all_reduce(partial, group=self.tp_group)
        return partial
