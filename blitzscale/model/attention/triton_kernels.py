"""Triton kernels over the paged KV cache (imported on CUDA only).

Cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim]; a key's slot is
block_table[seq, pos // block_size] * block_size + pos % block_size, looked up per key, so
tiles need not line up with blocks and any block size works.

- `store_kv`: the step's new keys and values into their slots (slot -1: skipped, for the
  padded rows of a CUDA graph); `rotary_store` does the same and applies the rotary
  embedding to q (in place) and k on the way, one launch instead of two.
- `decode_split` + `decode_merge`: one query token per sequence (flash-decoding). A program
  takes one sequence, one KV head with all its query heads (GQA packed into the rows of the
  dot product) and one split of the keys; the merge combines the splits by log-sum-exp.
- `prefill`: variable-length query chunks, causal over cached prefix plus the chunk itself,
  one program per (query tile, head, sequence).
"""

from __future__ import annotations

import triton
import triton.language as tl

from blitzscale.model import pdl

LOG2E = 1.4426950408889634
# Integer arguments that change from step to step (the block table's width, the decode
# splits): Triton would compile a variant for each of value 1, a multiple of 16 and any
# other, 0.2-0.5 s each, in the middle of serving. Not specialized, one variant serves all.
# (The metadata's tensors are 16-byte aligned, model/attention/metadata.py, for the same
# reason: Triton specializes pointers on that alignment.)
VARYING_INTS = ["stride_bt", "num_splits"]


@triton.jit
def store_kv(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
    NUM_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, BLOCK_KV)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    m = (h < NUM_KV) & (d < HEAD_DIM) & (slot >= 0)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=m)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=m)
    tl.store(kc_ptr + slot * stride_cs + h * stride_ch + d, k, mask=m)
    tl.store(vc_ptr + slot * stride_cs + h * stride_ch + d, v, mask=m)


@triton.jit
def rope_pair(a, b, c, s):
    """(a*c - b*s, b*c + a*s), rounded after each product and sum as the eager torch ops
    (and transformers) round them."""
    dt = a.dtype
    a, b = a.to(tl.float32), b.to(tl.float32)
    ac = (a * c).to(dt).to(tl.float32)
    bs = (b * s).to(dt).to(tl.float32)
    bc = (b * c).to(dt).to(tl.float32)
    as_ = (a * s).to(dt).to(tl.float32)
    return (ac - bs).to(dt), (bc + as_).to(dt)


@triton.jit
def _with_scales(x, xs, ws_ptr, cols, mask, SCALED: tl.constexpr):
    """x, or with SCALED an FP8 product's entries at `cols` of its row with their scales
    applied (x * xs * ws[cols] in fp32, rounded once: `fp8_values.scaled`'s arithmetic)."""
    if SCALED:
        x = (x.to(tl.float32) * xs * tl.load(ws_ptr + cols, mask=mask, other=0.0)).to(x.dtype)
    return x


@triton.jit
def rotary_store(
    q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, pos_ptr, cos_ptr, sin_ptr, xs_ptr, ws_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch, stride_c,
    NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_D: tl.constexpr,
    SCALED: tl.constexpr,
):  # fmt: skip
    """SCALED: q, k and v are the columns of an FP8 qkv product without its scales (per
    token xs [T, 1], per column ws [q + 2 kv]); each is scaled as it is read, and v is
    written back scaled (a prefill's attention reads it there)."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    xs = tl.load(xs_ptr + t) if SCALED else 1.0
    d = tl.arange(0, BLOCK_HALF)
    dm = d < HALF
    c = tl.load(cos_ptr + pos * stride_c + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + pos * stride_c + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    hq = tl.arange(0, BLOCK_Q)[:, None]
    mq = (hq < NUM_Q) & dm[None, :]
    p = q_ptr + t * stride_qt + hq * stride_qh + d[None, :]
    col = hq * HEAD_DIM + d[None, :]
    a = _with_scales(tl.load(p, mask=mq, other=0.0), xs, ws_ptr, col, mq, SCALED)
    b = _with_scales(tl.load(p + HALF, mask=mq, other=0.0), xs, ws_ptr, col + HALF, mq, SCALED)
    o1, o2 = rope_pair(a, b, c, s)
    tl.store(p, o1, mask=mq)
    tl.store(p + HALF, o2, mask=mq)
    hk = tl.arange(0, BLOCK_KV)[:, None]
    mk = (hk < NUM_KV) & dm[None, :] & (slot >= 0)
    p = k_ptr + t * stride_kt + hk * stride_kh + d[None, :]
    col = (NUM_Q + hk) * HEAD_DIM + d[None, :]
    a = _with_scales(tl.load(p, mask=mk, other=0.0), xs, ws_ptr, col, mk, SCALED)
    b = _with_scales(tl.load(p + HALF, mask=mk, other=0.0), xs, ws_ptr, col + HALF, mk, SCALED)
    o1, o2 = rope_pair(a, b, c, s)
    tl.store(p, o1, mask=mk)  # k rotated in place too (SDPA prefill reads it)
    tl.store(p + HALF, o2, mask=mk)
    dst = kc_ptr + slot * stride_cs + hk * stride_ch + d[None, :]
    tl.store(dst, o1, mask=mk)
    tl.store(dst + HALF, o2, mask=mk)
    dd = tl.arange(0, BLOCK_D)[None, :]
    mv = (hk < NUM_KV) & (dd < HEAD_DIM) & (slot >= 0)
    pv = v_ptr + t * stride_vt + hk * stride_vh + dd
    v = _with_scales(tl.load(pv, mask=mv), xs, ws_ptr, (NUM_Q + NUM_KV + hk) * HEAD_DIM + dd, mv, SCALED)
    if SCALED:
        tl.store(pv, v, mask=mv)
    tl.store(vc_ptr + slot * stride_cs + hk * stride_ch + dd, v, mask=mv)


@triton.jit(do_not_specialize=VARYING_INTS)
def decode_split(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, seqs_ptr, mid_o_ptr, mid_lse_ptr,
    stride_qt, stride_qh, stride_cs, stride_ch, stride_bt, stride_ot, stride_oh, qk_scale, num_splits,
    PAGE: tl.constexpr, NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr,
):  # fmt: skip
    """With DIRECT (one split) the result goes straight to the output (mid_o_ptr is it,
    mid_lse_ptr unused): no merge launch. o_proj's GEMV may start at once (model/pdl.py)."""
    pdl.let_dependents_launch()
    i = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(seqs_ptr + i)
    tok = tl.load(qsl_ptr + seq).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    hmask = offs_h < GROUP
    dmask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_h
    q = tl.load(
        q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=hmask[:, None] & dmask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        n = start + offs_n
        nmask = n < hi
        blk = tl.load(bt_row + n // PAGE, mask=nmask, other=0).to(tl.int64)
        slot = blk * PAGE + n % PAGE
        off = slot[:, None] * stride_cs + kvh * stride_ch + offs_d[None, :]
        kvmask = nmask[:, None] & dmask[None, :]
        k = tl.load(kc_ptr + off, mask=kvmask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + off, mask=kvmask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    if DIRECT:
        dst = mid_o_ptr + tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(dst, out.to(mid_o_ptr.dtype.element_ty), mask=hmask[:, None] & dmask[None, :])
    else:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        row = (i * NUM_HEADS + heads) * num_splits + split
        tl.store(mid_o_ptr + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=hmask[:, None])
        tl.store(mid_lse_ptr + row, lse, mask=hmask)


@triton.jit(do_not_specialize=VARYING_INTS)
def decode_merge(
    mid_o_ptr, mid_lse_ptr, out_ptr, qsl_ptr, seqs_ptr, stride_ot, stride_oh, num_splits,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    pdl.let_dependents_launch()  # o_proj's GEMV may start (model/pdl.py)
    i = tl.program_id(0)
    h = tl.program_id(1)
    seq = tl.load(seqs_ptr + i)
    tok = tl.load(qsl_ptr + seq).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    smask = offs_s < num_splits
    row = (i * NUM_HEADS + h) * num_splits + offs_s
    lse = tl.load(mid_lse_ptr + row, mask=smask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    o = tl.load(mid_o_ptr + row[:, None] * BLOCK_D + offs_d[None, :], mask=smask[:, None], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    tl.store(
        out_ptr + tok * stride_ot + h * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


@triton.jit(do_not_specialize=VARYING_INTS)
def prefill(
    q_ptr, kc_ptr, vc_ptr, out_ptr, bt_ptr, seq_lens_ptr, qsl_ptr, seqs_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cs, stride_ch, stride_bt, qk_scale,
    PAGE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    mt = tl.program_id(0)
    h = tl.program_id(1)
    seq = tl.load(seqs_ptr + tl.program_id(2))
    q_start = tl.load(qsl_ptr + seq)
    q_len = (tl.load(qsl_ptr + seq + 1) - q_start).to(tl.int32)
    if mt * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    prefix = seq_len - q_len
    kvh = h // GROUP
    offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mmask = offs_m < q_len
    dmask = offs_d < HEAD_DIM
    q_pos = prefix + offs_m
    toks = q_start.to(tl.int64) + offs_m
    q = tl.load(
        q_ptr + toks[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=mmask[:, None] & dmask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    hi = tl.minimum(seq_len, prefix + (mt + 1) * BLOCK_M)
    for start in range(0, hi, BLOCK_N):
        n = start + offs_n
        nmask = n < hi
        blk = tl.load(bt_row + n // PAGE, mask=nmask, other=0).to(tl.int64)
        slot = blk * PAGE + n % PAGE
        off = slot[:, None] * stride_cs + kvh * stride_ch + offs_d[None, :]
        kvmask = nmask[:, None] & dmask[None, :]
        k = tl.load(kc_ptr + off, mask=kvmask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where((n[None, :] <= q_pos[:, None]) & nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + off, mask=kvmask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        out_ptr + toks[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=mmask[:, None] & dmask[None, :],
    )
