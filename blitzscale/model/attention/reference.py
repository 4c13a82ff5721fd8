"""The reference backend: PyTorch SDPA over keys gathered through the block tables.

The CPU path, and the yardstick the GPU kernels are tested against. Its plan is linear in
the step: the decode rows form one batched SDPA call whose key mask is [Bd, 1, 1, keys];
each prefill chunk is one call over its own blocks only, causal without a mask when it has
no cached prefix, else with a [chunk, keys] mask made for that call and dropped after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from blitzscale.model.attention.base import AttentionBackend
from blitzscale.model.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class _Decode:
    tokens: torch.Tensor  # [Bd] flat token index of each decode row
    block_tables: torch.Tensor  # [Bd, nb] trimmed to the longest decode sequence's blocks
    key_mask: torch.Tensor  # [Bd, 1, 1, nb * block_size]


@dataclass(frozen=True)
class _Prefill:
    first: int  # its tokens are [first, first + num_new) in the flat batch
    num_new: int
    num_keys: int
    blocks: torch.Tensor  # [ceil(num_keys / block_size)]


@dataclass(frozen=True)
class _Plan:
    decode: _Decode | None
    prefills: list[_Prefill]


class ReferenceBackend(AttentionBackend):
    name = "reference"

    def make_plan(self, meta: AttentionMetadata) -> _Plan:
        bs = meta.block_size
        dec = [b for b, n in enumerate(meta.query_lens) if n == 1]
        first = [0]
        for n in meta.query_lens:
            first.append(first[-1] + n)
        decode = None
        if dec:
            nb = -(-max(meta.context_lens[b] for b in dec) // bs)
            idx = meta.decode_seqs
            keys = torch.arange(nb * bs, device=idx.device)
            decode = _Decode(
                tokens=meta.query_start_loc[idx],
                block_tables=meta.block_tables[idx, :nb],
                key_mask=(keys[None, :] < meta.seq_lens[idx][:, None])[:, None, None, :],
            )
        prefills = []
        for b, n in enumerate(meta.query_lens):
            if n != 1:
                keys = meta.context_lens[b]
                prefills.append(_Prefill(first[b], n, keys, meta.block_tables[b, : -(-keys // bs)]))
        return _Plan(decode, prefills)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rotary: Any = None,
        out: torch.Tensor | None = None,
        scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        assert rotary is None and scales is None, "the reference backend fuses neither rotary nor scales"
        plan = self.prepare(meta)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, meta.slot_mapping, v)
        if plan.decode is not None and not plan.prefills:
            decoded = _decode(q, k_cache, v_cache, plan.decode, scale)
            return decoded if out is None else out.copy_(decoded)
        out = torch.empty_like(q) if out is None else out
        if plan.decode is not None:
            out[plan.decode.tokens] = _decode(q[plan.decode.tokens], k_cache, v_cache, plan.decode, scale)
        for p in plan.prefills:
            rows = slice(p.first, p.first + p.num_new)
            out[rows] = _prefill(q[rows], k_cache, v_cache, p, scale)
        return out


def _decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, d: _Decode, scale: float
) -> torch.Tensor:
    """q [Bd, heads, dim] -> [Bd, heads, dim]."""
    k = k_cache[d.block_tables].flatten(1, 2).transpose(1, 2)  # [Bd, kvh, S, dim]
    v = v_cache[d.block_tables].flatten(1, 2).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q[:, :, None, :], k, v, attn_mask=d.key_mask, scale=scale, enable_gqa=True
    )
    return out[:, :, 0, :]


def _prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, p: _Prefill, scale: float
) -> torch.Tensor:
    """One chunk's queries [n, heads, dim] over its sequence's first `num_keys` keys."""
    k = k_cache[p.blocks].flatten(0, 1)[: p.num_keys].transpose(0, 1)[None]  # [1, kvh, S, dim]
    v = v_cache[p.blocks].flatten(0, 1)[: p.num_keys].transpose(0, 1)[None]
    qh = q.transpose(0, 1)[None]  # [1, heads, n, dim]
    prefix = p.num_keys - p.num_new
    if prefix == 0:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        q_pos = prefix + torch.arange(p.num_new, device=q.device)
        mask = torch.arange(p.num_keys, device=q.device)[None, :] <= q_pos[:, None]
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)
