"""Per-call device time of the FP8 decode step's pieces, one layer of Llama-3-8B (issue 32),
to say where a W8A8 step of a few rows spends what a GEMV step does not: the FP8 GEMMs
(cuBLAS, unit scales), the per-token quantization, the scale pass, and the norm and SiLU
kernels with and without the quantization fused in. Each timed from
a CUDA graph replay (model/fp8_matmul.py, model/triton_ops.py; weights cycled over 8 copies).

Run on the GPU machine: `OUT=. python3 docs/results/fp8_fused_ops.py` (writes
fp8_fused_ops_<gpu>.json there and prints it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_decode_candidates import COPIES, SHAPES, per_call, sweep_weights

from blitzscale.bench.limits import graph_replay_ms
from blitzscale.model import fp8_matmul
from blitzscale.model.fp8_values import Unscaled
from blitzscale.model.triton_ops import TritonOps, quantize_tokens

ops = TritonOps()
H, INTER = 4096, 14336


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    return round(graph_replay_ms(fn, reps=50), 5)


def one_size(m: int, w8: dict, w16: dict, one: torch.Tensor) -> dict:
    """Every piece's ms for a step of `m` rows."""
    r: dict = {}
    x = {s: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for s, (n, k) in SHAPES.items()}
    xq = {s: quantize_tokens(v) for s, v in x.items()}
    r["bf16_linear"] = {
        s: round(per_call(lambda i, s=s: torch.nn.functional.linear(x[s], w16[s][i])), 5) for s in SHAPES
    }
    gemv, w8a8 = fp8_matmul.w8a16_matmul, fp8_matmul.w8a8_unscaled
    if m == 1:
        r["gemv"] = {s: round(per_call(lambda i, s=s: gemv(x[s], *w8[s][i])), 5) for s in SHAPES}
    r["w8a8_unscaled"] = {
        s: round(per_call(lambda i, s=s: w8a8(xq[s][0], w8[s][i][0], one)), 5) for s in SHAPES
    }
    res = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
    nw = torch.randn(H, device="cuda").bfloat16()
    o_raw = Unscaled(torch.randn(m, H, device="cuda").bfloat16(), xq["o"][1], w8["o"][0][1])
    gu = torch.randn(m, 2 * INTER, device="cuda", dtype=torch.bfloat16)
    gu_raw = Unscaled(gu.clone(), xq["gate_up"][1], w8["gate_up"][0][1])
    qkv_out = torch.randn(m, 6144, device="cuda", dtype=torch.bfloat16)
    r["quantize_tokens_4096"] = timed(lambda: quantize_tokens(res))
    r["quantize_tokens_14336"] = timed(lambda: quantize_tokens(gu[:, :INTER]))
    r["apply_scales_qkv"] = timed(lambda: fp8_matmul.apply_scales(qkv_out, xq["qkv"][1], w8["qkv"][0][1]))
    r["apply_scales_gate_up"] = timed(lambda: fp8_matmul.apply_scales(gu_raw.out, gu_raw.xs, gu_raw.ws))
    r["add_rms_norm"] = timed(lambda: ops.add_rms_norm(res, res, nw, 1e-5))
    r["add_rms_norm_quant_unscaled"] = timed(lambda: ops.add_rms_norm_quant(o_raw, res, nw, 1e-5))
    r["silu_mul"] = timed(lambda: ops.silu_mul(gu))
    r["silu_mul_quant_unscaled"] = timed(lambda: ops.silu_mul_quant(gu_raw))
    return r


def main() -> None:
    w8, w16 = sweep_weights()
    one = fp8_matmul.unit_scale(torch.device("cuda"))
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copies": COPIES}
    out["rows"] = {}
    for m in (1, 2, 8, 64):
        out["rows"][str(m)] = r = one_size(m, w8, w16, one)
        print(m, json.dumps(r), flush=True)
    name = "fp8_fused_ops_" + torch.cuda.get_device_name().split()[1].lower() + ".json"
    Path(os.environ.get("OUT", "."), name).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
