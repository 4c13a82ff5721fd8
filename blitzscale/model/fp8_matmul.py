"""FP8 linears for decode steps (Triton and cuBLAS; imported on CUDA only).

A decode step multiplies a handful of rows by every weight: it is bound by reading the
weights, and FP8 should halve that. Two paths, chosen by the step's rows (model/linear.py
`ScaledMMLinear`):

- one row (batch-1 decode): `w8a16_matmul`, a GEMV on the CUDA cores; each program widens
  a strip of FP8 weight rows to fp32 in registers (exact: every e4m3 value is one), multiplies
  by the bf16 row and sums along K once at the end; the per-channel scales after. The
  activations stay bf16: the arithmetic of the CPU path (`DequantLinear`).
- 2..W8A8_MAX_ROWS rows: the activations quantized per token (as for prefill; inside the
  norm and SiLU kernels, model/triton_ops.py), then `w8a8_unscaled`: cuBLAS's FP8 GEMM with
  unit tensor scales. The per-token and per-channel scales are applied by whoever reads the
  product: the next norm or SiLU kernel (o, gate_up, down), or `apply_scales` (qkv; a
  tensor-parallel shard's partial sums before their all-reduce). `torch._scaled_mm` with
  rowwise scales (a CUTLASS kernel) read the weights at bf16's time or slower at these
  sizes; the weight-only tensor-core kernel that took 2..16 rows before (FP8 widened to bf16
  for the dot, split along K) took 1.45x bf16's time (docs/results/fp8_decode_paths_h200.py,
  docs/benchmarks.md).

Every timing behind the choices here read each weight from HBM: eight copies of each linear
cycled, so none is served from the H200's 50 MB L2 (sweeps that replayed one copy favoured
shapes that the L2 flattered).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 1  # steps of this many tokens take the GEMV
W8A8_MAX_ROWS = 64  # steps of up to this many that it does not take: `w8a8_matmul`; more
# (prefill): rowwise `_scaled_mm`
# The GEMV's strip: 8 output channels x 1024 weight bytes per iteration, 4 warps. A layer's
# four linears of Llama-3-8B in 0.076 ms, 0.658x bf16's (16 x 1024: 0.728x; 2048 bytes:
# 0.71-0.81x; 2 warps: 0.69x).
GEMV_BLOCK_N = 8
GEMV_BLOCK_K = 1024
GEMV_WARPS = 4


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


@triton.jit(do_not_specialize=["total", "n"])
def _scale_out(o_ptr, xs_ptr, ws_ptr, total, n, BLOCK: tl.constexpr):
    """o[m, n] *= xs[m] * ws[n] in place (o: the unit-scale FP8 product, rounded once)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    o = tl.load(o_ptr + i, mask=ok, other=0.0).to(tl.float32)
    xs = tl.load(xs_ptr + i // n, mask=ok, other=0.0)
    ws = tl.load(ws_ptr + i % n, mask=ok, other=0.0)
    tl.store(o_ptr + i, (o * xs * ws).to(o_ptr.dtype.element_ty), mask=ok)


def unit_scale(device: torch.device) -> torch.Tensor:
    """The fp32 1.0 on `device` that `w8a8_matmul` passes as cuBLAS's tensor scales (made
    once, outside any CUDA graph capture)."""
    return torch.ones((), dtype=torch.float32, device=device)


def w8a8_unscaled(xq: torch.Tensor, weight: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """xq [M, K] e4m3 times weight [N, K] e4m3 transposed, unscaled -> [M, N] bf16, for
    decode steps of a few dozen rows: `torch._scaled_mm` with tensor scales of 1 (cuBLAS's
    FP8 GEMM: on an H200 it read Llama-3-8B's weights at 0.56-0.57x bf16's time at 1-64
    rows, where its rowwise-scaled kernel took 0.85-1.05x). The per-token and per-channel
    scales are for whoever reads the product: `apply_scales`, or a fused norm or SiLU
    kernel (model/triton_ops.py)."""
    return torch._scaled_mm(xq, weight.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def apply_scales(out: torch.Tensor, xs: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """out[m, n] * xs[m] * ws[n] in fp32, rounded once, in place; returns `out`."""
    m, n = out.shape
    if m:
        _scale_out[(triton.cdiv(m * n, 1024),)](out, xs, ws, m * n, n, BLOCK=1024)
    return out


def w8a8_matmul(
    xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, one: torch.Tensor
) -> torch.Tensor:
    """xq [M, K] e4m3 (per-token scales xs [M, 1]) times (weight [N, K] e4m3 * scale [N])^T
    -> [M, N] bf16: `w8a8_unscaled`, then its scales in one pass."""
    return apply_scales(w8a8_unscaled(xq, weight, one), xs, scale)


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the GEMV takes `x` [M, K] times `weight` [N, K] (FP8): one row, bf16, K a
    multiple of GEMV_BLOCK_K (Llama-3-8B's and Mistral-24B's linears, TP shards included;
    Qwen2.5-72B's down_proj, K = 29,568, goes the quantized way)."""
    return (
        0 < x.shape[0] <= MAX_ROWS
        and x.dtype == torch.bfloat16
        and weight.shape[1] % GEMV_BLOCK_K == 0
        and weight.is_contiguous()
    )


def w8a16_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] bf16 times (weight [N, K] e4m3 * scale [N] fp32)^T -> [M, N] bf16 (M <=
    MAX_ROWS: one program row per row of x). Compiled by the first CUDA graph capture, so
    no step compiles while serving."""
    m, k = x.shape
    n = weight.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _w8a16_gemv[(triton.cdiv(n, GEMV_BLOCK_N), m)](
        x, weight, scale, out, n, k, x.stride(0),
        BLOCK_N=GEMV_BLOCK_N, BLOCK_K=GEMV_BLOCK_K, num_warps=GEMV_WARPS,
    )  # fmt: skip
    return out
