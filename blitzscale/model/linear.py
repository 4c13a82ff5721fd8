"""The model's linear layers (q/k/v, o, gate/up, down) behind one small interface.

`Linear` is the interface: `linear(x, weight, scale, bias)`, where `scale` is the weight's
per-output-channel fp32 scales (None for an unquantized model). The implementations:

- `DenseLinear`: `F.linear`, the unquantized model everywhere;
- `DequantLinear`: an fp8 model where no FP8 matmul runs (CPU, GPUs before sm_89): the
  weight is dequantized to the activation dtype for each matmul (`q * scale[row]`, the
  exact product in fp32), so the stored bytes stay FP8 (what transfers and the host copy
  move; a live target's segments land in place) and the result is a plain matmul with
  the dequantized weights: on CPU tokens equal transformers' on dequantized weights;
- `ScaledMMLinear`: an fp8 model on Hopper (sm_89+): activations quantized per token
  (one fp32 scale a row, on the device: no host sync, static shapes, so it runs inside
  the decode CUDA graphs) and `torch._scaled_mm` with rowwise scaling (a [M, 1] and b
  [1, N] fp32 scales) on the fp8 weight as stored (`w.t()` is the column-major operand);
  decode steps through model/fp8_matmul.py instead: one token by a GEMV of FP8 weights
  widened in registers times bf16 activations, 2-64 tokens by cuBLAS's FP8 GEMM with the
  scales applied after (at these sizes the rowwise kernel reads the weights slowly).

Where a linear `takes_quantized` a step's rows, the model hands it `QuantRows` (quantized by
the norm and SiLU kernels that produce them, model/ops.py) and may take its product
`Unscaled` (`raw`): the kernel that reads the product applies the scales. A step of 2-64
rows of Llama-3-8B loses six small kernels a layer that way (docs/benchmarks.md).

`select_linear` picks one by device, activation dtype and the model's quantization, as
`select_ops` picks the pointwise ops (model/ops.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from blitzscale.model.fp8_values import QuantRows, Unscaled
from blitzscale.model.quant import FP8_MAX, MIN_SCALE

FP8 = torch.float8_e4m3fn
# Steps of more than W8A8_MAX_ROWS rows (prefill) take `torch._scaled_mm` with rowwise
# scales and fast accumulation: Hopper's tensor cores sum the FP8 products without
# promoting the partial sums to fp32 every few K steps (vLLM's CUTLASS FP8 kernels for
# prefill-sized steps run so). On an H100 Llama-3-8B's linears at 2,048 rows took 0.659 ms
# against 0.731 (bf16 1.199), a 2,048-token prefill 34.9 ms against 36.8; the largest error
# against the fp32 product of the same FP8 values went from 0.25% of the largest output to
# 0.6-1.2% (down_proj, K = 14,336), row cosines 0.999994 and up
# (docs/results/fp8_fast_accum.py, docs/benchmarks.md).
PREFILL_FAST_ACCUM = True


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel e4m3 quantization of a [N, K] weight: (q [N, K] fp8, scale [N]
    fp32) with w ~= q * scale[:, None]; each row's largest magnitude maps to FP8_MAX."""
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / FP8_MAX).clamp(min=MIN_SCALE)
    q = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q * scale[:, None], computed in fp32, in `dtype`."""
    return (q.float() * scale.float()[:, None]).to(dtype)


def quantize_tokens_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization of activations [M, K]: (q [M, K] fp8, scale [M, 1]
    fp32), with torch ops (the reference for the Triton kernel; no host sync)."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Linear(Protocol):
    name: str  # "dense" | "dequant" | "scaled_mm"

    def takes_quantized(self, rows: int) -> bool:
        """Whether steps of `rows` tokens quantize their activations per token: the model
        then hands `QuantRows` (quantized inside its norm and SiLU kernels) and may ask for
        `Unscaled` products (`raw`), whose scales those kernels apply."""
        ...

    def __call__(
        self,
        x: torch.Tensor | QuantRows,
        weight: torch.Tensor,
        scale: torch.Tensor | None,
        bias: torch.Tensor | None = None,
        raw: bool = False,
    ) -> torch.Tensor | Unscaled: ...


class DenseLinear:
    name = "dense"

    def takes_quantized(self, rows: int) -> bool:
        return False

    def __call__(
        self,
        x: torch.Tensor | QuantRows,
        weight: torch.Tensor,
        scale: torch.Tensor | None,
        bias: torch.Tensor | None = None,
        raw: bool = False,
    ) -> torch.Tensor | Unscaled:
        assert isinstance(x, torch.Tensor), "an unquantized linear takes activations as they are"
        return F.linear(x, weight, bias)


class DequantLinear:
    name = "dequant"

    def takes_quantized(self, rows: int) -> bool:
        return False

    def __call__(
        self,
        x: torch.Tensor | QuantRows,
        weight: torch.Tensor,
        scale: torch.Tensor | None,
        bias: torch.Tensor | None = None,
        raw: bool = False,
    ) -> torch.Tensor | Unscaled:
        assert scale is not None, "a quantized weight comes with its scales"
        assert isinstance(x, torch.Tensor), "a dequantizing linear takes activations as they are"
        return F.linear(x, dequantize_rows(weight, scale, x.dtype), bias)


@dataclass(frozen=True)
class FewRows:
    """Matmuls for steps of few tokens: steps of up to `matmul_rows` rows go, where
    `supports(x, weight)` says so, through the weight-only `matmul(x, weight, scale)` (bf16
    activations); steps of up to `quantized_rows` rows that it does not take, quantized per
    token, through `quantized(xq, weight)`, which gives the product unscaled (`apply_scales`
    applies the per-token and per-channel scales)."""

    matmul_rows: int
    supports: Callable[[torch.Tensor, torch.Tensor], bool]
    matmul: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    quantized_rows: int
    quantized: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    apply_scales: Callable[[Unscaled], torch.Tensor]


class ScaledMMLinear:
    """FP8 x FP8 -> activation dtype through `torch._scaled_mm` (rowwise scales); a step of
    few tokens (a decode step) through `few_rows` instead where given (model/fp8_matmul.py:
    FP8 weights times bf16 activations, at the weights' read rate)."""

    name = "scaled_mm"

    def __init__(
        self,
        quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
        few_rows: FewRows | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self.quantize = quantize or quantize_tokens_torch
        self.few_rows = few_rows
        self.dtype = dtype  # the activations' (and so the products') dtype

    def takes_quantized(self, rows: int) -> bool:
        return self.few_rows is None or rows > self.few_rows.matmul_rows

    def __call__(
        self,
        x: torch.Tensor | QuantRows,
        weight: torch.Tensor,
        scale: torch.Tensor | None,
        bias: torch.Tensor | None = None,
        raw: bool = False,
    ) -> torch.Tensor | Unscaled:
        """`raw`: the product may come back `Unscaled` (no bias then)."""
        assert scale is not None, "a quantized weight comes with its scales"
        n = weight.shape[0]
        rows = x.q.shape[0] if isinstance(x, QuantRows) else x.shape[0]
        if rows == 0:
            return torch.empty((0, n), dtype=self.dtype, device=weight.device)
        few = self.few_rows
        if isinstance(x, torch.Tensor):
            if few is not None and few.supports(x, weight):
                out = few.matmul(x, weight, scale)
                return out if bias is None else out + bias
            x = QuantRows(*self.quantize(x.contiguous()))
        if few is not None and rows <= few.quantized_rows:
            product = Unscaled(few.quantized(x.q, weight), x.s, scale)
            if raw and bias is None:
                return product
            out = few.apply_scales(product)
        else:
            out = torch._scaled_mm(
                x.q,
                weight.t(),
                scale_a=x.s,
                scale_b=scale.view(1, n),
                out_dtype=self.dtype,
                use_fast_accum=PREFILL_FAST_ACCUM,
            )
        return out if bias is None else out + bias


def fp8_matmul_supported(device: torch.device) -> bool:
    """Whether `torch._scaled_mm` runs FP8 with rowwise scales here (CUDA sm_89 and later)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


LINEARS = ("auto", "dense", "dequant", "scaled_mm")


def select_linear(device: torch.device, dtype: torch.dtype, quant: str, name: str = "auto") -> Linear:
    """`name`: "auto" (dense for unquantized models; for fp8, `_scaled_mm` where the device
    runs FP8 matmuls and the model is bf16 (rowwise scaling gives bf16 only), else
    dequantize), or one of LINEARS by name (tests)."""
    if name not in LINEARS:
        raise ValueError(f"unknown linear {name!r}; use one of {', '.join(LINEARS)}")
    if quant == "none":
        if name not in ("auto", "dense"):
            raise ValueError(f"linear {name!r} needs a quantized model")
        return DenseLinear()
    if name == "dense":
        raise ValueError(f"linear {name!r} cannot run a {quant} model (its weights are {quant})")
    if name == "dequant" or (
        name == "auto" and not (fp8_matmul_supported(device) and dtype == torch.bfloat16)
    ):
        return DequantLinear()
    if device.type == "cuda":
        from blitzscale.model import fp8_matmul
        from blitzscale.model.triton_ops import quantize_tokens

        one = fp8_matmul.unit_scale(device)
        return ScaledMMLinear(
            quantize_tokens,
            FewRows(
                fp8_matmul.MAX_ROWS,
                fp8_matmul.supports,
                fp8_matmul.w8a16_matmul,
                fp8_matmul.W8A8_MAX_ROWS,
                lambda xq, w: fp8_matmul.w8a8_unscaled(xq, w, one),
                lambda u: fp8_matmul.apply_scales(u.out, u.xs, u.ws),
            ),
        )
    return ScaledMMLinear(dtype=dtype)
