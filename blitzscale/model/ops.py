"""The model's pointwise operations behind one small interface.

`Ops` is the interface; `TorchOps` is the reference (and the CPU path: the same ops in the
same order as always, so CPU tokens stay bit-identical); `select_ops` swaps in fused Triton
kernels for bf16/fp16 on CUDA (blitzscale.model.triton_ops, imported only then).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

from blitzscale.model.fp8_values import QuantRows, Unscaled, scaled
from blitzscale.model.linear import quantize_tokens_torch
from blitzscale.model.rope import RotaryEmbedding, apply_rotary


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


class Ops(Protocol):
    """The pointwise operations of a layer, as the model calls them."""

    name: str  # "torch" | "triton"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(residual + x), residual + x)."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor: ...

    def add_rms_norm_quant(
        self, x: torch.Tensor | Unscaled | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[QuantRows, torch.Tensor]:
        """An FP8 linear's input: `add_rms_norm` (`rms_norm` of the residual where x is None;
        an `Unscaled` x gets its scales first), quantized per token."""
        ...

    def silu_mul_quant(self, gate_up: torch.Tensor | Unscaled) -> QuantRows:
        """`silu_mul` of the (scaled) product, quantized per token."""
        ...

    def rotary_tables(self, rope: RotaryEmbedding, positions: torch.Tensor) -> Any:
        """Whatever `rotary` needs, made once per step."""
        ...

    def rotary(self, q: torch.Tensor, k: torch.Tensor, tables: Any) -> tuple[torch.Tensor, torch.Tensor]: ...


class TorchOps:
    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(residual + x), residual + x)."""
        residual = residual + x
        return rms_norm(residual, weight, eps), residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def add_rms_norm_quant(
        self, x: torch.Tensor | Unscaled | None, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[QuantRows, torch.Tensor]:
        if x is None:
            out = rms_norm(residual, weight, eps)
        else:
            out, residual = self.add_rms_norm(scaled(x), residual, weight, eps)
        return QuantRows(*quantize_tokens_torch(out)), residual

    def silu_mul_quant(self, gate_up: torch.Tensor | Unscaled) -> QuantRows:
        return QuantRows(*quantize_tokens_torch(self.silu_mul(scaled(gate_up))))

    def rotary_tables(self, rope: RotaryEmbedding, positions: torch.Tensor) -> Any:
        """Whatever `rotary` needs, made once per step."""
        return rope.tables(positions)

    def rotary(self, q: torch.Tensor, k: torch.Tensor, tables: Any) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = tables
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def select_ops(device: torch.device, dtype: torch.dtype, name: str = "auto") -> Ops:
    from blitzscale.model.attention import uses_triton

    if name == "torch" or (name == "auto" and not uses_triton(device, dtype)):
        return TorchOps()
    from blitzscale.model.triton_ops import TritonOps

    return TritonOps()
