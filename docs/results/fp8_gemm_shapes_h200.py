"""Scratch measurement (issue 32): Llama-3-8B's four linear shapes on the GPU, bf16
`F.linear` against FP8 `torch._scaled_mm` with rowwise scales (activations already
quantized) and the per-token quantization kernel alone, at a few token counts. Times are
the median of 50 launches between CUDA events; prints one JSON object (also the weight
read rate, GB/s, the bound at small M)."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from blitzscale.model.linear import quantize_rows
from blitzscale.model.triton_ops import quantize_tokens

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
TOKENS = (1, 16, 64, 256, 2048)


def median_ms(fn, n: int = 50) -> float:  # type: ignore[no-untyped-def]
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[n // 2]


out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
for name, (n, k) in SHAPES.items():
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    q, s = quantize_rows(w)
    row = {}
    for m in TOKENS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = quantize_tokens(x)
        bf16 = median_ms(lambda x=x, w=w: F.linear(x, w))
        fp8 = median_ms(
            lambda xq=xq, xs=xs, q=q, s=s, n=n: torch._scaled_mm(
                xq, q.t(), scale_a=xs, scale_b=s.view(1, n), out_dtype=torch.bfloat16
            )
        )
        quant = median_ms(lambda x=x: quantize_tokens(x))
        row[str(m)] = {
            "bf16_ms": round(bf16, 4),
            "fp8_mm_ms": round(fp8, 4),
            "quantize_ms": round(quant, 4),
            "fp8_over_bf16": round((fp8 + quant) / bf16, 3),
            "bf16_weight_GBps": round(n * k * 2 / bf16 / 1e6),
            "fp8_weight_GBps": round(n * k / fp8 / 1e6),
        }
    out["shapes"][name] = row
print(json.dumps(out, indent=1))
