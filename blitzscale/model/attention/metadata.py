"""A step's attention metadata: what every backend needs, built once on the host.

Everything is linear in the step's tokens plus its block tables: per-sequence query and key
lengths, never a [query, key] mask (the reference backend makes the masks it needs per call,
one sequence at a time). On CUDA all integer fields travel in one pinned buffer and one
asynchronous copy, so building a step's metadata never waits for the GPU; each field starts
on a 16-byte boundary of it, so that a Triton kernel reading it sees the same alignment at
every step (an unaligned view compiled another variant of the kernel mid-serving).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

ALIGN_ELEMS = 2  # int64 elements in 16 bytes: every field of the packed buffer starts aligned


@dataclass
class AttentionMetadata:
    positions: torch.Tensor  # [T] absolute position of each new token
    slot_mapping: torch.Tensor  # [T] flat cache slot (block * block_size + offset); -1: don't store
    block_tables: torch.Tensor  # [B, max_blocks], padded with block 0
    seq_lens: torch.Tensor  # [B] keys each sequence attends to (its new tokens included)
    query_start_loc: torch.Tensor  # [B + 1] first token of each sequence in the flat batch
    decode_seqs: torch.Tensor  # [Bd] sequences with one new token
    prefill_seqs: torch.Tensor  # [Bp] sequences with several new tokens
    query_lens: tuple[int, ...]  # host copies: backends plan launches without a sync
    context_lens: tuple[int, ...]
    block_size: int
    plan: Any = field(default=None, compare=False, repr=False)  # the backend's, once per step

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.context_lens)

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
        meta, _ = cls.build_with(query_lens, context_lens, block_tables, block_size, device, [])
        return meta

    @classmethod
    def build_with(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str,
        extra: list[list[int]],
    ) -> tuple[AttentionMetadata, list[torch.Tensor]]:
        """`build`, plus `extra` integer lists (token ids, rows to sample) sent in the same
        copy; returns the metadata and those lists as int64 tensors on `device`."""
        device = torch.device(device)
        num_seqs = len(query_lens)
        max_blocks = max(len(bt) for bt in block_tables)
        q_lens = torch.tensor(query_lens, dtype=torch.long)
        ctx = torch.tensor(context_lens, dtype=torch.long)
        start = ctx - q_lens
        seq_idx = torch.repeat_interleave(torch.arange(num_seqs), q_lens)
        qsl = torch.zeros(num_seqs + 1, dtype=torch.long)
        torch.cumsum(q_lens, 0, out=qsl[1:])
        positions = start[seq_idx] + torch.arange(int(qsl[-1])) - qsl[seq_idx]
        bt = torch.tensor([row + [0] * (max_blocks - len(row)) for row in block_tables], dtype=torch.long)
        slots = bt[seq_idx, positions // block_size] * block_size + positions % block_size
        decode = [b for b, n in enumerate(query_lens) if n == 1]
        prefill = [b for b, n in enumerate(query_lens) if n != 1]
        parts = [positions, slots, bt.flatten(), ctx, qsl, torch.tensor(decode, dtype=torch.long)]
        parts += [torch.tensor(prefill, dtype=torch.long)]
        parts += [torch.tensor(x, dtype=torch.long) for x in extra]
        sizes = [p.numel() for p in parts]
        padded = [torch.cat([p, p.new_zeros(-n % ALIGN_ELEMS)]) for p, n in zip(parts, sizes, strict=True)]
        flat = _to_device(torch.cat(padded), device)
        views = [v[:n] for v, n in zip(flat.split([p.numel() for p in padded]), sizes, strict=True)]
        meta = cls(
            positions=views[0],
            slot_mapping=views[1],
            block_tables=views[2].view(num_seqs, max_blocks),
            seq_lens=views[3],
            query_start_loc=views[4],
            decode_seqs=views[5],
            prefill_seqs=views[6],
            query_lens=tuple(query_lens),
            context_lens=tuple(context_lens),
            block_size=block_size,
        )
        return meta, views[7:]


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One copy; from pinned memory and asynchronous on CUDA (the caching host allocator keeps
    the pinned buffer until the copy has run)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
