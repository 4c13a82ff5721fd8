"""Weight-only FP8 on the tensor cores with the weights widened to fp16, not bf16 (issue
32, session 28, for the next device window): Llama-3-8B's four linears at 1, 8, 16 and 64
rows, eight copies of each cycled in a CUDA graph, beside bf16 `F.linear` and the product's
path for those rows (per-token quantization, cuBLAS's FP8 GEMM with unit scales, the scale
pass), in one run.

Why: sessions 14-24 found weight-only tensor-core kernels 1.3-4x slower than bf16 when the
e4m3 weights were widened to bf16 for the dot. Hopper has no e4m3 -> bf16 conversion (it
goes through fp16 and fp32: about two conversions an element), but converts e4m3 pairs to
fp16 pairs in one instruction; session 28's fp16 GEMV read 13% faster than the fp32 one
for that reason (fp8_gemv_f16_h200.py). On the tensor cores fp16 operands need no scaling
of the activations (products are exact and summed in fp32; |x| < 65,504 and e4m3's 448 are
both fp16 values), so a weight-only path would drop the per-token quantization and its
scale passes, which cost ~14 us a layer at 64 rows (docs/benchmarks.md, session 28).
The kernel is `tc` of fp8_decode_candidates.py (weights as the dot's first operand, split
along K), run with DOT = fp16 and, for reference, bf16.

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_tc_f16_h200.py`; writes
$OUT/fp8_tc_f16_h200.json. Not yet run on a GPU (written in session 28 after its device
time was spent; checked under TRITON_INTERPRET=1 on CPU for its arithmetic only).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "results"))
import fp8_decode_candidates as cand  # noqa: E402

from blitzscale.model import fp8_matmul  # noqa: E402
from blitzscale.model.triton_ops import quantize_tokens  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
SHAPES = cand.SHAPES
SWEEP = cand.SweepLog()
res, log, SMS, T0 = SWEEP.res, SWEEP.log, SWEEP.sms, SWEEP.t0
W8, W16 = cand.sweep_weights()
MS = (1, 8, 16, 64)
X = cand.sweep_inputs(MS)
one = fp8_matmul.unit_scale(torch.device("cuda"))


def times(fn, m) -> dict:  # type: ignore[no-untyped-def]
    return cand.layer_ms(lambda s, i: fn(m, s, i))


bf16 = {m: times(lambda m, s, i: F.linear(X[m][s], W16[s][i]), m) for m in MS}
res["bf16"] = bf16
log(bf16=bf16)


def record(kind, cfg, m, t):  # type: ignore[no-untyped-def]
    row = {"kind": kind, "cfg": cfg, "m": m, "ms": t, "over_bf16": round(t["layer"] / bf16[m]["layer"], 3)}
    res["rows"].append(row)
    log(**row)


def product(m, s, i):  # type: ignore[no-untyped-def]
    """What the product runs for these rows, quantization and scale pass included."""
    x = X[m][s]
    if fp8_matmul.supports(x, W8[s][i][0]):
        return fp8_matmul.w8a16_matmul(x, *W8[s][i])
    xq, xs = quantize_tokens(x)
    return fp8_matmul.w8a8_matmul(xq, xs, W8[s][i][0], W8[s][i][1], one)


for m in MS:
    record("product", {}, m, times(product, m))

DOTS = {"f16": tl.float16, "bf16": tl.bfloat16}
for (bm, bn, bk, warps, stages, pps), dot in itertools.product(
    itertools.product((16,), (64, 128), (128, 256), (4, 8), (3, 4), (1, 2)), ("f16", "bf16")
):
    if dot == "bf16" and (warps, stages) != (4, 3):
        continue  # (bf16: the reference at one setting a shape; swept in sessions 14-24)
    cfg = dict(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, pps=pps, dot=dot)
    for m in MS:
        try:
            record(
                "tc",
                cfg,
                m,
                times(
                    lambda m, s, i, cfg=cfg: cand.run_tc(X[m][s], *W8[s][i], cfg, SMS, dot=DOTS[cfg["dot"]]),
                    m,
                ),
            )
        except Exception as e:  # a setting Triton cannot compile: logged, the sweep goes on
            log(kind="tc", cfg=cfg, m=m, error=str(e)[:200])
            break
    if time.time() - T0 > 420:
        log(stopped="time")
        break


def best(m: int, dot: str):  # type: ignore[no-untyped-def]
    rows = [r for r in res["rows"] if r["kind"] == "tc" and r["m"] == m and r["cfg"]["dot"] == dot]
    return min(rows, key=lambda r: r["ms"]["layer"]) if rows else None


res["best_tc_f16"] = {str(m): best(m, "f16") for m in MS}
check = {}
for m in MS:
    b = res["best_tc_f16"][str(m)]
    if not b:
        continue
    for s in SHAPES:
        q, sc = W8[s][0]
        ref = X[m][s].float() @ (q.float() * sc[:, None]).t()  # activations as they are
        got = cand.run_tc(X[m][s], q, sc, b["cfg"], SMS, dot=tl.float16).float()
        check[f"{m}_{s}"] = round(float((got - ref).abs().max() / ref.abs().max()), 5)
res["check_tc_f16_vs_fp32"] = check
log(
    best={m: b and (b["cfg"], b["ms"]["layer"], b["over_bf16"]) for m, b in res["best_tc_f16"].items()},
    check=check,
)
(OUT / "fp8_tc_f16_h200.json").write_text(json.dumps(res, indent=1))
