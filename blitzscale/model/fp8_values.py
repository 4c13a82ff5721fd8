"""The values an FP8 step passes between its kernels (a leaf module: model/linear.py,
model/ops.py and model/triton_ops.py all use them, and linear.py imports triton_ops).

- `QuantRows`: activations quantized per token, as a norm or SiLU kernel hands them to an
  FP8 linear;
- `Unscaled`: an FP8 product whose scales the kernel that reads it applies;
- `scaled`: a linear's output with its scales applied, whichever of the two it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantRows:
    """Activations quantized per token: e4m3 `q` [M, K] with fp32 scales `s` [M, 1]
    (x ~= q * s). What the fused norm and SiLU kernels hand an FP8 linear (model/ops.py)."""

    q: torch.Tensor
    s: torch.Tensor


@dataclass(frozen=True)
class Unscaled:
    """An FP8 product whose scales are not applied yet: `out` [M, N] (the unit-scale
    product, rounded once to the activation dtype), per-token `xs` [M, 1] and per-channel
    `ws` [N]; the value is round(out * xs * ws). The op that consumes it applies them."""

    out: torch.Tensor
    xs: torch.Tensor
    ws: torch.Tensor


def scaled(x: torch.Tensor | Unscaled) -> torch.Tensor:
    """The value of a linear's output, its scales applied (fp32 products, rounded once:
    the arithmetic of the fused kernels)."""
    if isinstance(x, torch.Tensor):
        return x
    return (x.out.float() * x.xs * x.ws).to(x.out.dtype)
