"""The FP8 decode paths of model/fp8_matmul.py against bf16, per linear of Llama-3-8B, with
every weight read from HBM (issue 32).

A decode step's linears each read their weights once, and an H200's 50 MB L2 would hold the
smaller ones (o_proj 16.8 MB in FP8): replaying one copy over and over times the L2, not the
HBM. Here each linear has eight copies, cycled within one CUDA graph. At 1, 2, 4, 8, 16, 32
and 64 rows, per linear and per layer (the four linears), in ms:
- `bf16`: `F.linear` on bf16 weights (cuBLAS), the reference;
- `gemv`: the weight-only GEMV (FP8 weights widened in registers, bf16 activations), 1 row;
- `w8a8`: what `ScaledMMLinear` runs for 2..W8A8_MAX_ROWS rows: per-token quantization
  (Triton), cuBLAS's FP8 GEMM with unit scales, the scales applied after (`w8a8_matmul`);
- `rowwise`: the same quantization and `torch._scaled_mm` with rowwise scales (prefill's).
Prints JSON.

Run (GPU machine, repo root): `python3 docs/results/fp8_decode_paths_h200.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blitzscale.bench.limits import graph_replay_ms
from blitzscale.model import fp8_matmul
from blitzscale.model.linear import quantize_rows
from blitzscale.model.triton_ops import quantize_tokens

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
COPIES = 8  # of each linear: 8 x 16.8 MB for the smallest, past the 50 MB L2
ROWS = (1, 2, 4, 8, 16, 32, 64)


def _layer_ms(fn, xs: dict) -> dict:  # type: ignore[no-untyped-def]
    """fn(x, shape, copy) per linear, every copy in turn, ms per call; and the layer's sum."""
    t = {}
    for s in SHAPES:
        calls = graph_replay_ms(lambda s=s: [fn(xs[s], s, i) for i in range(COPIES)], reps=2)
        t[s] = round(calls / COPIES, 4)
    t["layer"] = round(sum(t[s] for s in SHAPES), 4)
    return t


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    w8 = {
        s: [quantize_rows(torch.randn(n, k, device=dev) * 0.02) for _ in range(COPIES)]
        for s, (n, k) in SHAPES.items()
    }
    w16 = {
        s: [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(COPIES)]
        for s, (n, k) in SHAPES.items()
    }
    one = fp8_matmul.unit_scale(torch.device(dev))

    def quantized(x, q, s):  # type: ignore[no-untyped-def]
        xq, xs = quantize_tokens(x)
        return fp8_matmul.w8a8_matmul(xq, xs, q, s, one)

    def rowwise(x, q, s):  # type: ignore[no-untyped-def]
        xq, xs = quantize_tokens(x)
        return torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=s.view(1, -1), out_dtype=torch.bfloat16)

    paths = {
        "bf16": lambda x, s, i: F.linear(x, w16[s][i]),
        "gemv": lambda x, s, i: fp8_matmul.w8a16_matmul(x, *w8[s][i]),
        "w8a8": lambda x, s, i: quantized(x, *w8[s][i]),
        "rowwise": lambda x, s, i: rowwise(x, *w8[s][i]),
    }
    out: dict = {
        "device": torch.cuda.get_device_name(),
        "copies": COPIES,
        "ms": {},
        "over_bf16": {},
        "w8a8_err": {},
    }
    for m in ROWS:
        xs = {s: torch.randn(m, k, device=dev, dtype=torch.bfloat16) for s, (_, k) in SHAPES.items()}
        row = {
            name: _layer_ms(fn, xs)
            for name, fn in paths.items()
            if name != "gemv" or m <= fp8_matmul.MAX_ROWS
        }
        out["ms"][m] = row
        out["over_bf16"][m] = {
            p: round(t["layer"] / row["bf16"]["layer"], 3) for p, t in row.items() if p != "bf16"
        }
        for name in SHAPES:  # the quantized path against the fp32 product of the same FP8 values
            q, s = w8[name][0]
            xq, xsc = quantize_tokens(xs[name])
            ref = (xq.float() * xsc) @ (q.float() * s[:, None]).t()
            err = (quantized(xs[name], q, s).float() - ref).abs().max() / ref.abs().max()
            out["w8a8_err"][f"{name}_{m}"] = round(float(err), 5)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
