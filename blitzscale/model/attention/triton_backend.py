"""The GPU backend: Triton kernels reading the paged cache through the block tables.

No dense mask and no gathered copy of any sequence's keys. A step's decode rows go to the
split-key decode kernel, its prefill chunks (any lengths, with or without a cached prefix)
to the varlen prefill kernel: two launches for a mixed step, whatever its shape. A step
whose chunks are all whole prompts uses SDPA's causal flash kernel on the fresh q/k/v
instead (one call per prompt: no mask, nothing gathered), never through cuDNN: its
attention builds an execution plan for each new prompt length (35-75 ms on an H200, the
first time each length is seen), which stalled every mixed step of a serving loop whose
prompts differ in length; FlashAttention has no per-shape set-up. The plan
holds only host integers (counts, grid sizes), so a step on a CUDA graph's static metadata
launches the same kernels with the same arguments at every replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from blitzscale.model.attention import triton_kernels as K
from blitzscale.model.attention.base import AttentionBackend
from blitzscale.model.attention.metadata import AttentionMetadata

MAX_SPLITS = 32
MERGE_BLOCK_S = triton.next_power_of_2(MAX_SPLITS)  # one merge kernel for any number of splits
# (the best of 48 tile settings on an H200 for 8B's heads, a 512-token chunk after 0 or 1536
# cached tokens: docs/results/prefill_kernel_sweep_h200.py; 3 stages 5-9% under 2)
PREFILL_BLOCK_M = 64
PREFILL_BLOCK_N = 64
PREFILL_STAGES = 3
# SDPA's kernels for whole prompts, FlashAttention first; no cuDNN (a plan per shape)
FRESH_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclass(frozen=True)
class _Plan:
    num_decode: int
    max_decode_len: int
    num_prefill: int
    max_prefill_q: int
    fresh: tuple[tuple[int, int], ...] | None  # (first token, length) when no chunk has a prefix


@dataclass(frozen=True)
class DecodeTiles:
    """How the decode kernel is launched: `block_n` keys a loop iteration, `warps` and
    `stages` (Triton's software pipelining), and `waves`: the keys are split until the
    programs fill this many waves over the SMs (`splits` fixes the split count instead)."""

    block_n: int = 64
    warps: int = 4
    stages: int = 2
    waves: int = 2
    splits: int = 0

    def num_splits(self, num_decode: int, num_kv_heads: int, max_len: int, num_sms: int) -> int:
        """Enough programs for `waves` waves over the GPU, but no split shorter than one key
        tile."""
        want = self.splits or -(-self.waves * num_sms // max(1, num_decode * num_kv_heads))
        return max(1, min(MAX_SPLITS, want, -(-max_len // self.block_n)))


DECODE_TILES = DecodeTiles()


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    out: torch.Tensor,
    qk_scale: float,
    num_decode: int,
    max_len: int,
    tiles: DecodeTiles | None = None,
) -> None:
    """The decode rows' attention into `out` (their `num_decode` sequences, the longest
    `max_len` keys): `decode_split`, then `decode_merge` where the keys were split.
    `tiles`: DECODE_TILES unless given."""
    tiles = tiles or DECODE_TILES
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv = k_cache.shape[2]
    block_d = triton.next_power_of_2(head_dim)
    splits = tiles.num_splits(num_decode, num_kv, max_len, _num_sms(q.device.index or 0))
    direct = splits == 1
    rows = num_decode * num_heads * splits
    mid_o = out if direct else torch.empty(rows, block_d, dtype=torch.float32, device=q.device)
    mid_lse = out if direct else torch.empty(rows, dtype=torch.float32, device=q.device)
    bt = meta.block_tables
    group = num_heads // num_kv
    K.decode_split[(num_decode, num_kv, splits)](
        q, k_cache, v_cache, bt, meta.seq_lens, meta.query_start_loc, meta.decode_seqs,
        mid_o, mid_lse, q.stride(0), q.stride(1), k_cache.stride(1), k_cache.stride(2),
        bt.stride(0), out.stride(0), out.stride(1), qk_scale, splits,
        PAGE=k_cache.shape[1], NUM_HEADS=num_heads, GROUP=group, HEAD_DIM=head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d, BLOCK_N=tiles.block_n,
        DIRECT=direct, num_warps=tiles.warps, num_stages=tiles.stages,
    )  # fmt: skip
    if not direct:
        K.decode_merge[(num_decode, num_heads)](
            mid_o, mid_lse, out, meta.query_start_loc, meta.decode_seqs,
            out.stride(0), out.stride(1), splits,
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=block_d,
            BLOCK_S=MERGE_BLOCK_S, num_warps=4,
        )  # fmt: skip


class TritonBackend(AttentionBackend):
    name = "triton"
    fuses_rotary = True  # takes TritonOps' rotary tables: (RotaryEmbedding, positions)
    # Steps whose prefill chunks all start a sequence (no cached prefix) attend them with
    # SDPA's flash kernel ("sdpa", measured faster) or the paged prefill kernel ("triton").
    fresh_prefill = "sdpa"

    def make_plan(self, meta: AttentionMetadata) -> _Plan:
        dec = [c for n, c in zip(meta.query_lens, meta.context_lens, strict=True) if n == 1]
        pre = [n for n in meta.query_lens if n != 1]
        fresh, first = [], 0
        for n, c in zip(meta.query_lens, meta.context_lens, strict=True):
            if n != 1:
                fresh.append((first, n) if n == c else None)
            first += n
        sdpa = self.fresh_prefill == "sdpa" and None not in fresh
        whole = tuple(x for x in fresh if x is not None) if sdpa else None
        return _Plan(len(dec), max(dec, default=0), len(pre), max(pre, default=0), whole)

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
        plan = self.prepare(meta)
        num_tokens, num_heads, head_dim = q.shape
        num_kv = k.shape[1]
        block_d = triton.next_power_of_2(head_dim)
        if rotary is None:
            assert scales is None, "an unscaled qkv product needs the rotary kernel, which applies its scales"
            K.store_kv[(num_tokens,)](
                k, v, k_cache, v_cache, meta.slot_mapping,
                k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.stride(1), k_cache.stride(2),
                NUM_KV=num_kv, HEAD_DIM=head_dim, BLOCK_KV=triton.next_power_of_2(num_kv), BLOCK_D=block_d,
            )  # fmt: skip
        else:
            rope, positions = rotary
            half = head_dim // 2
            xs, ws = scales if scales is not None else (positions, positions)  # (unread)
            K.rotary_store[(num_tokens,)](
                q, k, v, k_cache, v_cache, meta.slot_mapping, positions, rope.cos, rope.sin, xs, ws,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                k_cache.stride(1), k_cache.stride(2), rope.cos.stride(0),
                NUM_Q=num_heads, NUM_KV=num_kv, HEAD_DIM=head_dim, HALF=half,
                BLOCK_Q=triton.next_power_of_2(num_heads), BLOCK_KV=triton.next_power_of_2(num_kv),
                BLOCK_HALF=triton.next_power_of_2(half), BLOCK_D=block_d, SCALED=scales is not None,
            )  # fmt: skip
        if out is None:
            out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
        qk_scale = scale * K.LOG2E
        group = num_heads // num_kv
        page = k_cache.shape[1]
        bt = meta.block_tables
        if plan.num_decode:
            decode_attention(q, k_cache, v_cache, meta, out, qk_scale, plan.num_decode, plan.max_decode_len)
        if plan.fresh is not None:  # whole prompts: SDPA's flash kernel on this step's q, k, v
            with sdpa_kernel(FRESH_SDPA, set_priority=True):
                for first, n in plan.fresh:
                    rows = slice(first, first + n)
                    qh, kh, vh = (x[rows].transpose(0, 1)[None] for x in (q, k, v))
                    o = F.scaled_dot_product_attention(
                        qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True
                    )
                    out[rows] = o[0].transpose(0, 1)
        elif plan.num_prefill:
            grid = (triton.cdiv(plan.max_prefill_q, PREFILL_BLOCK_M), num_heads, plan.num_prefill)
            K.prefill[grid](
                q, k_cache, v_cache, out, bt, meta.seq_lens, meta.query_start_loc, meta.prefill_seqs,
                q.stride(0), q.stride(1), out.stride(0), out.stride(1),
                k_cache.stride(1), k_cache.stride(2), bt.stride(0), qk_scale,
                PAGE=page, GROUP=group, HEAD_DIM=head_dim,
                BLOCK_M=PREFILL_BLOCK_M, BLOCK_N=PREFILL_BLOCK_N, BLOCK_D=block_d,
                num_warps=4, num_stages=PREFILL_STAGES,
            )  # fmt: skip
        return out
