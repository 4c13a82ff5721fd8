"""FP8 weights times bf16 activations for steps of few tokens (Triton; imported on CUDA only).

A decode step multiplies a handful of rows by every weight: it is bound by reading the
weights, and FP8 should halve that. `torch._scaled_mm` does not get there at few rows (on
an H200 its rowwise kernel read Llama-3-8B's weights at 0.5-1.8 TB/s where bf16's GEMM read
them at 1.2-3.3 TB/s, `docs/results/fp8_gemm_shapes_h200.json`), and it needs the
activations quantized first (one more launch per linear). Here each program streams a
strip of FP8 weight rows, widens them to bf16 in registers (exact: every e4m3 value is a
bf16 value), multiplies on the tensor cores with fp32 accumulation and applies the
per-channel scales at the end. The activations stay bf16: the arithmetic of the CPU path
(model/linear.py `DequantLinear`), with the scale applied once after the sum. A single
row (batch-1 decode) skips the tensor cores: a GEMV on the CUDA cores reads faster there.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

MAX_ROWS = 16  # steps of up to this many tokens take this kernel; more go to _scaled_mm
# (64 rows with 16 channels a program re-read the activations from L2 for every strip:
# 3.2x bf16's decode step at batch 64, where _scaled_mm is at par)
BLOCK_N = 32  # output channels a program computes (swept: 16-64, docs/results/fp8_w8a16_sweep_h200.json)
BLOCK_K = 256  # weight bytes per row and iteration
NUM_WARPS = 4
NUM_STAGES = 3
# Split-K: a linear with few strips of output channels (Llama-3-8B's down_proj: 128 strips
# of 32 over K = 14336) kept one program per SM streaming a long row, at 0.9 TB/s. Each
# strip's K is cut into as many slices as bring the programs to this many per SM; each
# slice writes its fp32 sums, and a second kernel adds them in order and casts (no atomics:
# the same step gives the same bits every time).
# (swept 0-8 in docs/results/fp8_splitk_sweep_h200.json: 2 took 16 rows from 1.77x bf16's
# time for a layer's four linears to 1.50x)
PROGRAMS_PER_SM = 2
MAX_SPLIT = 16
# One row (batch-1 decode): no tensor cores; each program multiplies its strip of widened
# weights by the row on the CUDA cores and sums along K once at the end (no split: it only
# slowed this kernel down). Swept: 16 x 1024 with 4 warps read at 2.5-2.7 TB/s, a layer's
# four linears in 0.73x bf16's time, where the tensor-core kernel took 1.27x.
GEMV_BLOCK_N = 16
GEMV_BLOCK_K = 1024
GEMV_WARPS = 4
GEMV_ROWS = 1  # steps of up to this many rows take the GEMV (0: none)


@triton.jit(do_not_specialize=["M", "stride_x", "stride_o"])
def _w8a16(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_x, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    k_len = K // SPLIT_K  # (a multiple of BLOCK_K: `split_for`)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_k * k_len + tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    xp = x_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :]
    # [BLOCK_N, BLOCK_K]: each row's bytes contiguous, so the loads are wide (a [K, N] tile
    # of this row-major weight loaded byte by byte: 1 TB/s)
    wp = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, k_len, BLOCK_K):
        x = tl.load(xp, mask=m_ok[:, None], other=0.0)
        w = tl.load(wp, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(w.to(tl.bfloat16)), acc)
        xp += BLOCK_K
        wp += BLOCK_K
    s = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    out = acc * s[None, :]
    # (split: slice pid_k's fp32 sums, at [pid_k, M, N] of the partials)
    op = out_ptr + pid_k * M * N + rm[:, None].to(tl.int64) * stride_o + rn[None, :]
    tl.store(op, out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["stride_x"])
def _w8a16_gemv(
    x_ptr, w_ptr, s_ptr, out_ptr, N, K, stride_x, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    xp = x_ptr + row * stride_x + rk
    wp = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        x = tl.load(xp).to(tl.float32)
        w = tl.load(wp, mask=n_ok[:, None], other=0.0).to(tl.float32)
        acc += w * x[None, :]
        xp += BLOCK_K
        wp += BLOCK_K
    s = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    out = tl.sum(acc, axis=1) * s
    tl.store(out_ptr + row * N + rn, out.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit(do_not_specialize=["total"])
def _add_slices(part_ptr, out_ptr, total, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    acc = tl.load(part_ptr + i, mask=ok, other=0.0)
    for j in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + j * total + i, mask=ok, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=ok)


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this kernel takes `x` [M, K] times `weight` [N, K] (FP8): few rows, bf16, and
    K a multiple of BLOCK_K (every Llama shape, TP shards included)."""
    return (
        0 < x.shape[0] <= MAX_ROWS
        and x.dtype == torch.bfloat16
        and weight.shape[1] % BLOCK_K == 0
        and weight.is_contiguous()
    )


@functools.cache
def _sms(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_for(n: int, k: int, sms: int) -> int:
    """How many slices each strip's K is cut into: the fewest that bring the programs to
    PROGRAMS_PER_SM per SM, each slice a whole number of BLOCK_K (at most MAX_SPLIT)."""
    strips = -(-n // BLOCK_N)
    blocks = k // BLOCK_K
    want = -(-PROGRAMS_PER_SM * sms // strips)
    split = 1
    for d in range(1, min(MAX_SPLIT, blocks) + 1):
        if blocks % d == 0:
            split = d
            if d >= want:
                break
    return split


def w8a16_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 times (weight [N, K] e4m3 * scale [N] fp32)^T -> [M, N] bf16 (M <=
    MAX_ROWS). One program shape per linear, compiled by the first CUDA graph capture (M is
    not specialized), so no step compiles while serving."""
    m, k = x.shape
    n = weight.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m <= GEMV_ROWS and k % GEMV_BLOCK_K == 0:
        _w8a16_gemv[(triton.cdiv(n, GEMV_BLOCK_N), m)](
            x, weight, scale, out, n, k, x.stride(0),
            BLOCK_N=GEMV_BLOCK_N, BLOCK_K=GEMV_BLOCK_K, num_warps=GEMV_WARPS,
        )  # fmt: skip
        return out
    split = split_for(n, k, _sms(x.device.index or 0))
    part = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    _w8a16[(triton.cdiv(n, BLOCK_N), split, triton.cdiv(m, 16))](
        x, weight, scale, part, m, n, k, x.stride(0), n,
        BLOCK_M=16, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, SPLIT_K=split,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    if split > 1:
        _add_slices[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLIT_K=split, BLOCK=1024)
    return out
