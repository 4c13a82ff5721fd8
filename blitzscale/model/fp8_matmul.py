"""FP8 weights times bf16 activations for steps of few tokens (Triton; imported on CUDA only).

A decode step multiplies a handful of rows by every weight: it is bound by reading the
weights, and FP8 should halve that. `torch._scaled_mm` does not get there at few rows (on
an H200 its rowwise kernel read Llama-3-8B's weights at 0.5-1.8 TB/s where bf16's GEMM read
them at 1.2-3.3 TB/s, `docs/results/fp8_gemm_shapes_h200.json`), and it needs the
activations quantized first (one more launch per linear). Here each program streams a
strip of FP8 weight rows, widens them to bf16 in registers (exact: every e4m3 value is a
bf16 value), multiplies on the tensor cores with fp32 accumulation and applies the
per-channel scales at the end. The activations stay bf16: the arithmetic of the CPU path
(model/linear.py `DequantLinear`), with the scale applied once after the sum.
"""

from __future__ import annotations

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


@triton.jit(do_not_specialize=["M", "stride_x", "stride_o"])
def _w8a16(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_x, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    xp = x_ptr + rm[:, None].to(tl.int64) * stride_x + rk[None, :]
    # [BLOCK_N, BLOCK_K]: each row's bytes contiguous, so the loads are wide (a [K, N] tile
    # of this row-major weight loaded byte by byte: 1 TB/s)
    wp = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):  # (K is a multiple of BLOCK_K: `supports`)
        x = tl.load(xp, mask=m_ok[:, None], other=0.0)
        w = tl.load(wp, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(w.to(tl.bfloat16)), acc)
        xp += BLOCK_K
        wp += BLOCK_K
    s = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    out = acc * s[None, :]
    op = out_ptr + rm[:, None].to(tl.int64) * stride_o + rn[None, :]
    tl.store(op, out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this kernel takes `x` [M, K] times `weight` [N, K] (FP8): few rows, bf16, and
    K a multiple of BLOCK_K (every Llama shape, TP shards included)."""
    return (
        0 < x.shape[0] <= MAX_ROWS
        and x.dtype == torch.bfloat16
        and weight.shape[1] % BLOCK_K == 0
        and weight.is_contiguous()
    )


def w8a16_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 times (weight [N, K] e4m3 * scale [N] fp32)^T -> [M, N] bf16 (M <=
    MAX_ROWS). One program shape, compiled by the first CUDA graph capture (M is not
    specialized), so no step compiles while serving."""
    m, k = x.shape
    n = weight.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(m, 16))
    _w8a16[grid](
        x, weight, scale, out, m, n, k, x.stride(0), out.stride(0),
        BLOCK_M=16, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return out
