"""FP8 prefill: torch's rowwise `_scaled_mm` (CUTLASS; what steps of more than
W8A8_MAX_ROWS rows take) against cuBLAS's FP8 GEMM with unit scales and the scales applied
by the kernels that read the product (what decode steps of 2-64 rows take), on one GPU
(issue 32, session 31).

Why: a 2,048-token prefill of Llama-3-8B in FP8 takes 0.70-0.73x bf16's time, where the
tensor cores' FP8 rate is twice bf16's; at 1-64 rows cuBLAS's FP8 GEMM read the weights in
0.56x bf16's time and the rowwise kernel in 0.85-1.05x (session 24).

1. Each linear of Llama-3-8B at 512, 2,048 and 4,096 rows (eight copies cycled in a CUDA
   graph): bf16 `F.linear`, rowwise `_scaled_mm`, the unit-scale GEMM alone and with its
   scale pass.
2. The engine's 2,048-token prefill (bench engine's timing: the best of 3 to the first
   token), bf16 / FP8 as shipped / FP8 with every step of up to 8,192 rows on the unit-scale
   GEMM (fp8_matmul.W8A8_MAX_ROWS raised before the engine is built), three rounds
   interleaved.

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_prefill_paths.py`; writes
$OUT/fp8_prefill_paths.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "results"))
import fp8_decode_candidates as cand  # noqa: E402

from blitzscale.bench import engine_bench as eb  # noqa: E402
from blitzscale.model import fp8_matmul  # noqa: E402
from blitzscale.model.triton_ops import quantize_tokens  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
SWEEP = cand.SweepLog()
res, log = SWEEP.res, SWEEP.log
one = torch.ones((), device="cuda")


def linears(m: int, w8: dict, w16: dict) -> dict:
    """A layer's linears at `m` rows, each way (cand.layer_ms: eight copies cycled)."""
    x = {s: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for s, (n, k) in cand.SHAPES.items()}
    xq = {s: quantize_tokens(x[s]) for s in cand.SHAPES}

    def rowwise(s: str, i: int) -> torch.Tensor:
        q, sc = w8[s][i]
        return torch._scaled_mm(
            xq[s][0], q.t(), scale_a=xq[s][1], scale_b=sc.view(1, -1), out_dtype=torch.bfloat16
        )

    return {
        "bf16": cand.layer_ms(lambda s, i: F.linear(x[s], w16[s][i])),
        "rowwise": cand.layer_ms(rowwise),
        "unit": cand.layer_ms(lambda s, i: fp8_matmul.w8a8_unscaled(xq[s][0], w8[s][i][0], one)),
        "unit_and_scales": cand.layer_ms(
            lambda s, i: fp8_matmul.w8a8_matmul(xq[s][0], xq[s][1], *w8[s][i], one)
        ),
    }


# 1. the linears alone
weights8, weights16 = cand.sweep_weights()
res["linears"] = {}
for rows in (512, 2048, 4096):
    res["linears"][rows] = linears(rows, weights8, weights16)
    log(rows=rows, **{k: v["layer"] for k, v in res["linears"][rows].items()})
del weights8, weights16
torch.cuda.empty_cache()

# 2. the engine's prefill
cfg = eb.EngineBenchConfig(batch_sizes=(1,), context_lens=(512,), with_hf=False, dtype="fp8")
fp8, dense = eb.fp8_and_dequantized(cfg.model, torch.device("cuda"), torch.bfloat16)
engines = {"bf16": eb._engine(dense, cfg, 1), "fp8": eb._engine(fp8, cfg, 1)}
shipped = fp8_matmul.W8A8_MAX_ROWS
fp8_matmul.W8A8_MAX_ROWS = 8192
engines["fp8_unit"] = eb._engine(fp8, cfg, 1)
fp8_matmul.W8A8_MAX_ROWS = shipped
dev = torch.device("cuda")
times: dict[str, list[float]] = {k: [] for k in engines}
for _ in range(3):
    for name, engine in engines.items():
        times[name].append(round(eb._prefill_ms(engine, cfg, dev), 3))
    log(prefill_ms=times)
res["prefill_2048_ms"] = times
res["prefill_over_bf16"] = {k: round(min(v) / min(times["bf16"]), 3) for k, v in times.items() if k != "bf16"}
log(prefill_over_bf16=res["prefill_over_bf16"])
(OUT / "fp8_prefill_paths.json").write_text(json.dumps(res, indent=1))
