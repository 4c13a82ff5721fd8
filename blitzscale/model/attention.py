"""Attention over a paged KV cache for a batch of sequences with any number of new tokens.

The batch is flattened to T tokens. Each sequence's keys are gathered through its block
table into a padded [B, blocks * block_size] view and one batched SDPA call covers every
sequence at once (prefill chunks and decode steps alike): no per-request Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionMetadata:
    positions: torch.Tensor  # [T] absolute position of each new token
    slot_mapping: torch.Tensor  # [T] flat cache slot (block * block_size + offset)
    block_tables: torch.Tensor  # [B, max_blocks], padded with block 0
    seq_idx: torch.Tensor  # [T] sequence of each token
    q_idx: torch.Tensor  # [T] index of the token among its sequence's new tokens
    mask: torch.Tensor  # [B, 1, max_query_len, max_blocks * block_size] keys each query sees
    max_query_len: int

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
    ) -> AttentionMetadata:
        """`context_lens[b]` counts sequence b's tokens including its `query_lens[b]` new ones."""
        num_seqs = len(query_lens)
        max_blocks = max(len(bt) for bt in block_tables)
        bt = torch.tensor([row + [0] * (max_blocks - len(row)) for row in block_tables], dtype=torch.long)
        q_lens = torch.tensor(query_lens, dtype=torch.long)
        ctx = torch.tensor(context_lens, dtype=torch.long)
        start = ctx - q_lens
        seq_idx = torch.repeat_interleave(torch.arange(num_seqs), q_lens)
        first = torch.cumsum(q_lens, 0) - q_lens
        q_idx = torch.arange(int(q_lens.sum())) - first[seq_idx]
        positions = start[seq_idx] + q_idx
        slots = bt[seq_idx, positions // block_size] * block_size + positions % block_size
        max_q = int(q_lens.max())
        q_pos = start[:, None] + torch.arange(max_q)[None, :]
        q_pos = torch.minimum(q_pos, (ctx - 1)[:, None])  # padding rows see a valid prefix
        key_pos = torch.arange(max_blocks * block_size)
        mask = key_pos[None, None, :] <= q_pos[:, :, None]
        return cls(
            positions=positions.to(device),
            slot_mapping=slots.to(device),
            block_tables=bt.to(device),
            seq_idx=seq_idx.to(device),
            q_idx=q_idx.to(device),
            mask=mask.unsqueeze(1).to(device),
            max_query_len=max_q,
        )


def paged_attention(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    num_seqs = meta.block_tables.shape[0]
    k = k_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)  # [B, kvh, S, d]
    v = v_cache[meta.block_tables].flatten(1, 2).transpose(1, 2)
    qp = q.new_zeros(num_seqs, meta.max_query_len, q.shape[1], q.shape[2])
    qp[meta.seq_idx, meta.q_idx] = q
    out = F.scaled_dot_product_attention(
        qp.transpose(1, 2), k, v, attn_mask=meta.mask, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2)[meta.seq_idx, meta.q_idx]
