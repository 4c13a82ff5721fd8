"""Fused pointwise kernels for the GPU path (Triton; imported on CUDA only).

- `add_rms_norm`: residual add and RMSNorm in one pass (rounded where the reference rounds:
  the sum to the activation dtype, then the normalised row, then the weight product);
- `silu_mul`: SiLU(gate) * up straight from the fused gate_up projection;
- `rotary`: rotary embedding of q and k in place, reading cos/sin by position (the Triton
  attention backend fuses this with its cache store instead);
- `quantize_tokens`: an FP8 model's activations, e4m3 with one fp32 scale a row (dynamic
  per-token), for `torch._scaled_mm` (model/linear.py); the same arithmetic as the torch
  reference `quantize_tokens_torch` (IEEE divisions, round to nearest).
Each rounds to the activation dtype where the eager torch ops round (logits stay close to
transformers', which runs those ops).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from blitzscale.model.attention.triton_kernels import rope_pair
from blitzscale.model.quant import FP8_MAX, MIN_SCALE
from blitzscale.model.rope import RotaryEmbedding


@triton.jit
def _rms_norm(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, stride_x, stride_r, eps,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * N + cols, x, mask=m)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / N
    y = (xf * libdevice.rsqrt(var + eps)).to(x.dtype)  # CUDA's rsqrtf, as torch.rsqrt
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    tl.store(out_ptr + row * N + cols, (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype), mask=m)


@triton.jit
def _silu_mul(gu_ptr, out_ptr, stride_gu, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + N + cols, mask=m, other=0.0).to(tl.float32)
    # x / (1 + exp(-x)) with CUDA's expf and an IEEE division, rounded: F.silu's own formula
    act = libdevice.div_rn(g, 1.0 + libdevice.exp(-g)).to(out_ptr.dtype.element_ty).to(tl.float32)
    out = act * u
    tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rotary(
    q_ptr, k_ptr, pos_ptr, cos_ptr, sin_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_c,
    NUM_Q: tl.constexpr, NUM_K: tl.constexpr, HALF: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    dm = d < HALF
    cos = tl.load(cos_ptr + pos * stride_c + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(sin_ptr + pos * stride_c + d, mask=dm, other=0.0).to(tl.float32)[None, :]
    hq = tl.arange(0, BLOCK_Q)[:, None]
    mq = (hq < NUM_Q) & dm[None, :]
    p = q_ptr + t * stride_qt + hq * stride_qh + d[None, :]
    o1, o2 = rope_pair(tl.load(p, mask=mq, other=0.0), tl.load(p + HALF, mask=mq, other=0.0), cos, sin)
    tl.store(p, o1, mask=mq)
    tl.store(p + HALF, o2, mask=mq)
    hk = tl.arange(0, BLOCK_K)[:, None]
    mk = (hk < NUM_K) & dm[None, :]
    p = k_ptr + t * stride_kt + hk * stride_kh + d[None, :]
    o1, o2 = rope_pair(tl.load(p, mask=mk, other=0.0), tl.load(p + HALF, mask=mk, other=0.0), cos, sin)
    tl.store(p, o1, mask=mk)
    tl.store(p + HALF, o2, mask=mk)


@triton.jit
def _quantize_rows(x_ptr, q_ptr, s_ptr, stride_x, K, fp8_max, min_scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    # amax * (1 / fp8_max), the reciprocal rounded once: torch's `tensor / scalar` on CUDA
    # (the reference, quantize_tokens_torch) multiplies by the scalar's reciprocal
    scale = tl.maximum(tl.max(amax, 0) * libdevice.div_rn(1.0, fp8_max), min_scale)
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        m = cols < K
        x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(libdevice.div_rn(x, scale), -fp8_max), fp8_max)
        tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=m)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [M, K] -> (e4m3 [M, K], fp32 scales [M, 1]), one program a row, on the
    device (no host sync: usable inside a CUDA graph)."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        _quantize_rows[(m,)](x, q, scale, x.stride(0), k, FP8_MAX, MIN_SCALE, BLOCK=1024, num_warps=4)
    return q, scale


class TritonOps:
    """The fused kernels behind the `Ops` interface (model/ops.py)."""

    name = "triton"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._norm(x, None, weight, eps)[0]

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, res = self._norm(x, residual, weight, eps)
        assert res is not None
        return out, res

    def _norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        n, h = x.shape
        out = torch.empty((n, h), dtype=x.dtype, device=x.device)
        res_out = torch.empty_like(out) if residual is not None else None
        if n:
            r = residual if residual is not None else x
            _rms_norm[(n,)](
                x, r, weight, out, res_out if res_out is not None else out, x.stride(0), r.stride(0),
                eps, N=h, BLOCK=triton.next_power_of_2(h), HAS_RES=residual is not None,
                num_warps=8 if h >= 2048 else 4,
            )  # fmt: skip
        return out, res_out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        n, two = gate_up.shape
        half = two // 2
        out = torch.empty((n, half), dtype=gate_up.dtype, device=gate_up.device)
        block = 1024
        if n:
            _silu_mul[(n, triton.cdiv(half, block))](gate_up, out, gate_up.stride(0), half, BLOCK=block)
        return out

    def rotary_tables(self, rope: RotaryEmbedding, positions: torch.Tensor) -> Any:
        return rope, positions

    def rotary(self, q: torch.Tensor, k: torch.Tensor, tables: Any) -> tuple[torch.Tensor, torch.Tensor]:
        rope, positions = tables
        n, nq, d = q.shape
        nk = k.shape[1]
        half = d // 2
        if n:
            _rotary[(n,)](
                q, k, positions, rope.cos, rope.sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                rope.cos.stride(0), NUM_Q=nq, NUM_K=nk, HALF=half, BLOCK_Q=triton.next_power_of_2(nq),
                BLOCK_K=triton.next_power_of_2(nk), BLOCK_HALF=triton.next_power_of_2(half),
            )  # fmt: skip
        return q, k
