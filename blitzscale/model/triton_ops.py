"""Fused pointwise kernels for the GPU path (Triton; imported on CUDA only).

- `add_rms_norm`: residual add and RMSNorm in one pass (rounded where the reference rounds:
  the sum to the activation dtype, then the normalised row, then the weight product);
- `silu_mul`: SiLU(gate) * up straight from the fused gate_up projection;
- `rotary`: rotary embedding of q and k in place, reading cos/sin by position (the Triton
  attention backend fuses this with its cache store instead);
- `quantize_tokens`: an FP8 model's activations, e4m3 with one fp32 scale a row (dynamic
  per-token), for `torch._scaled_mm` (model/linear.py); the same arithmetic as the torch
  reference `quantize_tokens_torch` (IEEE divisions, round to nearest);
- `add_rms_norm_quant`, `silu_mul_quant`: the norm and the SiLU with that quantization of
  their output fused in, reading an FP8 product `Unscaled` (its per-token and per-channel
  scales applied as it is read): the same bits as the torch ops one after another
  (`TorchOps`, the reference).
Each rounds to the activation dtype where the eager torch ops round (logits stay close to
transformers', which runs those ops).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from blitzscale.model import pdl
from blitzscale.model.attention.triton_kernels import rope_pair
from blitzscale.model.fp8_values import QuantRows, Unscaled
from blitzscale.model.quant import FP8_MAX, MIN_SCALE
from blitzscale.model.rope import RotaryEmbedding

SILU_BLOCK = 1024  # columns of a row per program in `silu_mul` and `silu_mul_quant`


@triton.jit
def _quantize_block(x, scale, fp8_max, dtype: tl.constexpr):
    """fp32 values / their row's scale, clamped to e4m3's range, rounded to nearest."""
    q = tl.minimum(tl.maximum(libdevice.div_rn(x, scale), -fp8_max), fp8_max)
    return q.to(dtype, fp_downcast_rounding="rtne")


@triton.jit
def _row_scale(amax, fp8_max, min_scale):
    # amax * (1 / fp8_max), the reciprocal rounded once: torch's `tensor / scalar` on CUDA
    # (the reference, quantize_tokens_torch) multiplies by the scalar's reciprocal
    return tl.maximum(amax * libdevice.div_rn(1.0, fp8_max), min_scale)


@triton.jit
def _rms_norm(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, xs_ptr, ws_ptr, s_ptr, stride_x, stride_r, eps,
    fp8_max, min_scale,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr, SCALED: tl.constexpr,
    QUANT: tl.constexpr,
):  # fmt: skip
    """out = rms_norm(x [+ residual]) * w. SCALED: x is an FP8 product without its scales
    (x * xs[row] * ws[col], rounded, first); QUANT: out is e4m3, its row's scale in s.
    The linear after it may start at once (model/pdl.py)."""
    pdl.let_dependents_launch()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0)
    if SCALED:
        ws = tl.load(ws_ptr + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) * tl.load(xs_ptr + row) * ws).to(x.dtype)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=m, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * N + cols, x, mask=m)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, 0) / N
    y = (xf * libdevice.rsqrt(var + eps)).to(x.dtype)  # CUDA's rsqrtf, as torch.rsqrt
    w = tl.load(w_ptr + cols, mask=m, other=0.0)
    y = (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype)
    if QUANT:
        yf = y.to(tl.float32)
        scale = _row_scale(tl.max(tl.abs(yf), 0), fp8_max, min_scale)
        tl.store(s_ptr + row, scale)
        q = _quantize_block(yf, scale, fp8_max, out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * N + cols, q, mask=m)
    else:
        tl.store(out_ptr + row * N + cols, y, mask=m)


@triton.jit
def _silu_mul_cols(gu_ptr, xs_ptr, ws_ptr, row, stride_gu, N, cols, SCALED: tl.constexpr):
    """SiLU(gate) * up at `cols` of a row, rounded to the activation dtype, as fp32; SCALED:
    gate_up is an FP8 product without its scales (applied and rounded first)."""
    m = cols < N
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=m, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + N + cols, mask=m, other=0.0)
    if SCALED:
        xs = tl.load(xs_ptr + row)
        g = (g.to(tl.float32) * xs * tl.load(ws_ptr + cols, mask=m, other=0.0)).to(g.dtype)
        u = (u.to(tl.float32) * xs * tl.load(ws_ptr + N + cols, mask=m, other=0.0)).to(u.dtype)
    gf = g.to(tl.float32)
    # x / (1 + exp(-x)) with CUDA's expf and an IEEE division, rounded: F.silu's own formula
    act = libdevice.div_rn(gf, 1.0 + libdevice.exp(-gf)).to(g.dtype).to(tl.float32)
    return (act * u.to(tl.float32)).to(g.dtype).to(tl.float32)


@triton.jit
def _silu_mul(gu_ptr, out_ptr, stride_gu, N, BLOCK: tl.constexpr):
    pdl.let_dependents_launch()  # down_proj's GEMV may start (model/pdl.py)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    out = _silu_mul_cols(gu_ptr, gu_ptr, gu_ptr, row, stride_gu, N, cols, False)
    tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=cols < N)


@triton.jit
def _silu_mul_part(
    gu_ptr, xs_ptr, ws_ptr, act_ptr, amax_ptr, stride_gu, N, NUM_BLOCKS, BLOCK: tl.constexpr,
    SCALED: tl.constexpr,
):  # fmt: skip
    """`silu_mul_quant`'s first half: a block of a row's SiLU(gate) * up, stored, and the
    block's largest magnitude (a row's scale needs all of them: `_quantize_part`)."""
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    act = _silu_mul_cols(gu_ptr, xs_ptr, ws_ptr, row, stride_gu, N, cols, SCALED)
    tl.store(act_ptr + row * N + cols, act.to(act_ptr.dtype.element_ty), mask=cols < N)
    tl.store(amax_ptr + row * NUM_BLOCKS + block, tl.max(tl.abs(act), 0))


@triton.jit
def _quantize_part(
    x_ptr, amax_ptr, q_ptr, s_ptr, N, NUM_BLOCKS, fp8_max, min_scale, BLOCK: tl.constexpr,
    PARTS: tl.constexpr,
):  # fmt: skip
    """A block of a row quantized with the row's scale, from its blocks' largest magnitudes."""
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    parts = tl.arange(0, PARTS)
    amax = tl.load(amax_ptr + row * NUM_BLOCKS + parts, mask=parts < NUM_BLOCKS, other=0.0)
    scale = _row_scale(tl.max(amax, 0), fp8_max, min_scale)
    if block == 0:
        tl.store(s_ptr + row, scale)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(q_ptr + row * N + cols, _quantize_block(x, scale, fp8_max, q_ptr.dtype.element_ty), mask=m)


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
    scale = _row_scale(tl.max(amax, 0), fp8_max, min_scale)
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        cols = k0 + tl.arange(0, BLOCK)
        m = cols < K
        x = tl.load(x_ptr + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(q_ptr + row * K + cols, _quantize_block(x, scale, fp8_max, q_ptr.dtype.element_ty), mask=m)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [M, K] -> (e4m3 [M, K], fp32 scales [M, 1]), one program a row, on the
    device (no host sync: usable inside a CUDA graph)."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block = min(triton.next_power_of_2(k), 4096)  # a hidden row in one load
        _quantize_rows[(m,)](
            x, q, scale, x.stride(0), k, FP8_MAX, MIN_SCALE, BLOCK=block, num_warps=8 if block >= 2048 else 4
        )  # fmt: skip
    return q, scale


class TritonOps:
    """The fused kernels behind the `Ops` interface (model/ops.py)."""

    name = "triton"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._norm(x, None, weight, eps)[0]

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, res, _ = self._norm(x, residual, weight, eps)
        assert res is not None
        return out, res

    def add_rms_norm_quant(
        self, x: torch.Tensor | Unscaled | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[QuantRows, torch.Tensor]:
        if x is None:
            q, _, s = self._norm(residual, None, weight, eps, quant=True)
            assert s is not None
            return QuantRows(q, s), residual
        q, res, s = self._norm(x, residual, weight, eps, quant=True)
        assert res is not None and s is not None
        return QuantRows(q, s), res

    def _norm(
        self,
        x: torch.Tensor | Unscaled,
        residual: torch.Tensor | None,
        weight: torch.Tensor,
        eps: float,
        quant: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(the normed rows (e4m3 where `quant`), the residual sum, the rows' scales)."""
        unscaled = x if isinstance(x, Unscaled) else None
        x = x.out if isinstance(x, Unscaled) else x
        n, h = x.shape
        out = torch.empty((n, h), dtype=torch.float8_e4m3fn if quant else x.dtype, device=x.device)
        res_out = torch.empty_like(x) if residual is not None else None
        scales = torch.empty((n, 1), dtype=torch.float32, device=x.device) if quant else None
        if n:
            r = residual if residual is not None else x
            xs, ws = (unscaled.xs, unscaled.ws) if unscaled is not None else (x, x)
            _rms_norm[(n,)](
                x, r, weight, out, res_out if res_out is not None else out, xs, ws,
                scales if scales is not None else x, x.stride(0), r.stride(0), eps, FP8_MAX, MIN_SCALE,
                N=h, BLOCK=triton.next_power_of_2(h), HAS_RES=residual is not None,
                SCALED=unscaled is not None, QUANT=quant, num_warps=8 if h >= 2048 else 4,
            )  # fmt: skip
        return out, res_out, scales

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        n, two = gate_up.shape
        half = two // 2
        out = torch.empty((n, half), dtype=gate_up.dtype, device=gate_up.device)
        if n:
            _silu_mul[(n, triton.cdiv(half, SILU_BLOCK))](
                gate_up, out, gate_up.stride(0), half, BLOCK=SILU_BLOCK
            )
        return out

    def silu_mul_quant(self, gate_up: torch.Tensor | Unscaled) -> QuantRows:
        """Two kernels, each over every block of every row (one program a row, looping over
        14,336 columns twice, took 61 us on an H100 where these take a few)."""
        gu = gate_up.out if isinstance(gate_up, Unscaled) else gate_up
        xs, ws = (gate_up.xs, gate_up.ws) if isinstance(gate_up, Unscaled) else (gu, gu)
        n, two = gu.shape
        half = two // 2
        q = torch.empty((n, half), dtype=torch.float8_e4m3fn, device=gu.device)
        scales = torch.empty((n, 1), dtype=torch.float32, device=gu.device)
        if n:
            blocks = triton.cdiv(half, SILU_BLOCK)
            act = torch.empty((n, half), dtype=gu.dtype, device=gu.device)
            amax = torch.empty((n, blocks), dtype=torch.float32, device=gu.device)
            _silu_mul_part[(n, blocks)](
                gu, xs, ws, act, amax, gu.stride(0), half, blocks, BLOCK=SILU_BLOCK,
                SCALED=isinstance(gate_up, Unscaled),
            )  # fmt: skip
            _quantize_part[(n, blocks)](
                act, amax, q, scales, half, blocks, FP8_MAX, MIN_SCALE, BLOCK=SILU_BLOCK,
                PARTS=triton.next_power_of_2(blocks),
            )  # fmt: skip
        return QuantRows(q, scales)

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
