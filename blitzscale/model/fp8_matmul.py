"""FP8 linears for decode steps (Triton and cuBLAS; imported on CUDA only).

A decode step multiplies a handful of rows by every weight: it is bound by reading the
weights, and FP8 should halve that. Two paths, chosen by the step's rows (model/linear.py
`ScaledMMLinear`):

- one row (batch-1 decode): `w8a16_matmul`, a GEMV on the CUDA cores; each program reads
  a strip of FP8 weight rows as int32 words of four, widens each byte to fp32 by moving its
  bits (exact: every e4m3 value is an fp32 one; `e4m3_byte_as_f32`), multiplies by the bf16
  row and sums along K once at the end; the per-channel scales after. The activations stay
  bf16: the arithmetic of the CPU path (`DequantLinear`).
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

from blitzscale.model import pdl

MAX_ROWS = 1  # steps of this many tokens take the GEMV
W8A8_MAX_ROWS = 64  # steps of up to this many that it does not take: `w8a8_matmul`; more
# (prefill): rowwise `_scaled_mm`
# The GEMV's strip: 8 output channels x 512 words (2,048 weights) per iteration, 4 warps,
# or 256 words where K / 4 is not a multiple of 512 (a TP2 shard of down_proj, Mistral-24B);
# K must be a multiple of 4 * GEMV_MIN_BLOCK_W. On an H100, Llama-3-8B's four linears in
# 0.0858 ms against 0.0926 for the converting GEMV (8 x 1,024 weights; 256 words: 0.0927),
# docs/results/fp8_gemv_bits_h100_s31.json.
GEMV_BLOCK_N = 8
GEMV_BLOCK_W = 512
GEMV_MIN_BLOCK_W = 256
GEMV_WARPS = 4
# Launch the GEMV with programmatic dependent launch where the GPU has it (model/pdl.py):
# its programs read their first weight strip while the kernel before (a norm, the
# attention's merge, the SiLU) still runs, and wait for it only to read the row.
GEMV_PDL = True
E4M3_BITS = tl.constexpr(-2014314496)  # 0x87F00000 as int32: a float32's sign and its bits 20-26
TWO_60 = tl.constexpr(1.152921504606847e18)  # 2^60


@triton.jit
def e4m3_byte_as_f32(word, SHIFT: tl.constexpr):
    """Byte (24 - SHIFT) / 8 of each int32 `word`, an e4m3 value, as float32 times 2^-120:
    shifted to the top the byte's sign is the word's, and an arithmetic shift by 4 puts its
    exponent and mantissa at float32's bits 20-26 (float32's exponent field is 8 bits where
    e4m3's is 4, hence 2^-120; e4m3 subnormals land on float32 subnormals, which Triton's
    arithmetic keeps). Two shifts and an AND on the integer units, where converting takes
    two conversions (e4m3 pair to fp16 pair, fp16 to fp32) at 16 a clock an SM: the bound
    of the converting GEMV (docs/results/fp8_gemv_bits.py)."""
    t = word << SHIFT if SHIFT else word
    return ((t >> 4) & E4M3_BITS).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_strip(acc, word, xp):
    """acc + the strip's products: `word` the strip's int32 words of four weights, `xp` the
    row's entries at the first weight of each word (scaled by 2^60 as they are read)."""
    x0 = tl.load(xp).to(tl.float32) * TWO_60
    x1 = tl.load(xp + 1).to(tl.float32) * TWO_60
    x2 = tl.load(xp + 2).to(tl.float32) * TWO_60
    x3 = tl.load(xp + 3).to(tl.float32) * TWO_60
    acc += e4m3_byte_as_f32(word, 24) * x0[None, :]
    acc += e4m3_byte_as_f32(word, 16) * x1[None, :]
    acc += e4m3_byte_as_f32(word, 8) * x2[None, :]
    acc += e4m3_byte_as_f32(word, 0) * x3[None, :]
    return acc


@triton.jit(do_not_specialize=["stride_x"])
def _w8a16_gemv(
    x_ptr, w_ptr, s_ptr, out_ptr, N, KW, stride_x, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """out[row] = x[row] @ (w * s)^T for w_ptr the [N, K] e4m3 weight viewed as int32
    [N, KW = K / 4] (little-endian: byte j of a word is column 4 * word + j). The row is
    multiplied by 2^60 and the sum by 2^60 * s, so each product is the fp32 GEMV's times
    2^-60 (powers of two: exact) and stays a normal float down to |w x| of 2^-66. (A row
    entry past 2^68, 3e20, would overflow; a bf16 activation of a working model is
    nowhere near.) PDL: launched with programmatic dependent launch; the first strip is
    read before waiting for the kernel that writes x (each next strip at the end of an
    iteration, so the loop is the same loads in the same order)."""
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, BLOCK_W)
    n_ok = rn < N
    xp = x_ptr + row * stride_x + rw * 4
    wp = w_ptr + rn[:, None].to(tl.int64) * KW + rw[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
    if PDL:
        word = tl.load(wp, mask=n_ok[:, None], other=0)
        pdl.wait_for_previous()
        for k0 in range(0, KW, BLOCK_W):
            acc = _gemv_strip(acc, word, xp)
            xp += BLOCK_W * 4
            wp += BLOCK_W
            word = tl.load(wp, mask=n_ok[:, None] & (k0 + BLOCK_W < KW), other=0)
    else:
        for _ in range(0, KW, BLOCK_W):
            acc = _gemv_strip(acc, tl.load(wp, mask=n_ok[:, None], other=0), xp)
            xp += BLOCK_W * 4
            wp += BLOCK_W
    s = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
    out = tl.sum(acc, axis=1) * TWO_60 * s
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
    multiple of 4 * GEMV_MIN_BLOCK_W weights (Llama-3-8B's and Mistral-24B's
    linears, TP shards included; Qwen2.5-72B's down_proj, K = 29,568, goes the quantized
    way)."""
    return (
        0 < x.shape[0] <= MAX_ROWS
        and x.dtype == torch.bfloat16
        and weight.shape[1] % (4 * GEMV_MIN_BLOCK_W) == 0
        and weight.is_contiguous()
    )


def w8a16_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block_n: int = GEMV_BLOCK_N,
    block_w: int | None = None,
    warps: int = GEMV_WARPS,
    launch_pdl: bool | None = None,
) -> torch.Tensor:
    """x [M, K] bf16 times (weight [N, K] e4m3 * scale [N] fp32)^T -> [M, N] bf16 (M <=
    MAX_ROWS: one program row per row of x; the strip's shape is the sweep's to vary,
    block_w by default GEMV_BLOCK_W words where they divide K / 4, else GEMV_MIN_BLOCK_W).
    `launch_pdl`: programmatic dependent launch (default: GEMV_PDL where the GPU has it).
    Compiled by the first CUDA graph capture, so no step compiles while serving."""
    m, k = x.shape
    n = weight.shape[0]
    if block_w is None:
        block_w = GEMV_BLOCK_W if (k // 4) % GEMV_BLOCK_W == 0 else GEMV_MIN_BLOCK_W
    x = x if x.stride(1) == 1 else x.contiguous()
    if launch_pdl is None:
        launch_pdl = GEMV_PDL and pdl.supported(x.device)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _w8a16_gemv[(triton.cdiv(n, block_n), m)](
        x, weight.view(torch.int32), scale, out, n, k // 4, x.stride(0),
        BLOCK_N=block_n, BLOCK_W=block_w, PDL=launch_pdl, num_warps=warps, launch_pdl=launch_pdl,
    )  # fmt: skip
    return out
