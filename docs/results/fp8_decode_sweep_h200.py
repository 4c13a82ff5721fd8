"""FP8 decode kernels swept on one H200 (issue 32): the one-row GEMV's strips and warps,
and the tensor-core kernel with the weights as the dot's first operand, at 1-64 rows,
against bf16 `F.linear`, each linear of Llama-3-8B with eight copies cycled (no weight
served from the 50 MB L2); the best settings checked against fp32 products, and SiLU * up
fused into the down GEMV against the separate kernel. The candidates:
docs/results/fp8_decode_candidates.py. Writes $OUT/fp8_decode_sweep_h200.json (the one
beside this script: device `nvidia-h200`, 2026-12-05).

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_decode_sweep_h200.py`.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "results"))
import fp8_decode_candidates as cand  # noqa: E402

from blitzscale.model import fp8_matmul  # noqa: E402
from blitzscale.model.triton_ops import TritonOps, quantize_tokens  # noqa: E402

silu_mul = TritonOps().silu_mul

OUT = Path(os.environ.get("OUT", "/tmp"))
SHAPES, COPIES = cand.SHAPES, cand.COPIES
SWEEP = cand.SweepLog()
SMS, T0, res, log = SWEEP.sms, SWEEP.t0, SWEEP.res, SWEEP.log


W8, W16 = cand.sweep_weights()
MS = (1, 8, 16, 32, 64)
X = cand.sweep_inputs(MS)
XG = {m: torch.randn(m, 2 * 14336, device="cuda", dtype=torch.bfloat16) for m in MS}


per_call = cand.per_call


def shape_times(kernel, m) -> dict:
    """kernel(x, q, s) per shape at m rows -> ms per call, and the layer sum."""
    out = {}
    for s in SHAPES:
        x = X[m][s]
        out[s] = round(per_call(lambda i, s=s, x=x: kernel(x, *W8[s][i])), 4)
    out["layer"] = round(sum(out[s] for s in SHAPES), 4)
    return out


bf16 = {}
for m in MS:
    d = {}
    for s in SHAPES:
        x = X[m][s]
        d[s] = round(per_call(lambda i, s=s, x=x: F.linear(x, W16[s][i])), 4)
    d["layer"] = round(sum(d[s] for s in SHAPES), 4)
    bf16[m] = d
res["bf16"] = bf16
log(bf16=bf16)


def scaled_mm(x, q, s):
    xq, xs = quantize_tokens(x)
    return torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=s.view(1, -1), out_dtype=x.dtype)


res["scaled_mm"] = {m: shape_times(scaled_mm, m) for m in (16, 32, 64)}
log(scaled_mm=res["scaled_mm"])
res["module_now"] = {
    m: shape_times(fp8_matmul.w8a16_matmul, m) for m in (1,)
}  # (the JSON: 1, 8, 16 rows of the kernels then)
log(module_now=res["module_now"])


def record(kind, cfg, m, times):
    row = {
        "kind": kind,
        "cfg": cfg,
        "m": m,
        "ms": times,
        "over_bf16": round(times["layer"] / bf16[m]["layer"], 3),
    }
    res["rows"].append(row)
    log(**row)


# GEMV at one row
for bn, bk, warps, acc2d, stages in itertools.product((4, 8, 16), (512, 1024), (4, 8), (0, 1), (1, 3)):
    cfg = dict(bn=bn, bk=bk, warps=warps, acc2d=acc2d, stages=stages)
    try:
        record("gemv", cfg, 1, shape_times(lambda x, q, s, cfg=cfg: cand.run_gemv(x, q, s, cfg), 1))
    except Exception as e:
        log(kind="gemv", cfg=cfg, error=str(e)[:150])
    if time.time() - T0 > 250:
        break

# tensor cores, weights as the first operand
for bm, bn, bk, warps, stages in itertools.product((16, 64), (64, 128, 256), (128, 256), (4, 8), (3, 4)):
    for pps in (0, 1, 2):
        cfg = dict(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, pps=pps)
        for m in (1, 8, 16) if bm == 16 else (64,):
            try:
                record("tc", cfg, m, shape_times(lambda x, q, s, cfg=cfg: cand.run_tc(x, q, s, cfg, SMS), m))
            except Exception as e:
                log(kind="tc", cfg=cfg, m=m, error=str(e)[:150])
                break
    if time.time() - T0 > 470:
        break


def best(kind, m):
    rows = [r for r in res["rows"] if r["kind"] == kind and r["m"] == m]
    return min(rows, key=lambda r: r["ms"]["layer"]) if rows else None


res["best"] = {f"{k}_{m}": best(k, m) for k, m in (("gemv", 1), ("tc", 1), ("tc", 8), ("tc", 16), ("tc", 64))}
# bm=32 at m=32 with the best bm=64 setting
b64 = res["best"]["tc_64"]
if b64:
    cfg = dict(b64["cfg"], bm=32)
    record("tc", cfg, 32, shape_times(lambda x, q, s: cand.run_tc(x, q, s, cfg, SMS), 32))
    cfg = dict(b64["cfg"])
    record("tc", cfg, 32, shape_times(lambda x, q, s: cand.run_tc(x, q, s, cfg, SMS), 32))
# correctness of the best, and the fused silu*up into down
chk = {}
for key, r in res["best"].items():
    if not r:
        continue
    m = r["m"]
    for s in SHAPES:
        q, sc = W8[s][0]
        x = X[m][s]
        ref = x.float() @ (q.float() * sc[:, None]).t()
        got = (
            cand.run_gemv(x, q, sc, r["cfg"]) if r["kind"] == "gemv" else cand.run_tc(x, q, sc, r["cfg"], SMS)
        ).float()
        chk[f"{key}_{s}"] = round(((got - ref).abs().max() / ref.abs().max()).item(), 5)
    q, sc = W8["down"][0]
    xg = XG[m]
    fused = (
        cand.run_gemv(xg, q, sc, r["cfg"], act=True)
        if r["kind"] == "gemv"
        else cand.run_tc(xg, q, sc, r["cfg"], SMS, act=True)
    )
    plain_in = silu_mul(xg)
    plain = (
        cand.run_gemv(plain_in, q, sc, r["cfg"])
        if r["kind"] == "gemv"
        else cand.run_tc(plain_in, q, sc, r["cfg"], SMS)
    )
    chk[f"{key}_act_equal"] = bool(torch.equal(fused, plain))
    if r["kind"] == "gemv":
        t_f = per_call(lambda i, xg=xg, r=r: cand.run_gemv(xg, *W8["down"][i], r["cfg"], act=True))
        t_p = per_call(lambda i, xg=xg, r=r: cand.run_gemv(silu_mul(xg), *W8["down"][i], r["cfg"]))
    else:
        t_f = per_call(lambda i, xg=xg, r=r: cand.run_tc(xg, *W8["down"][i], r["cfg"], SMS, act=True))
        t_p = per_call(lambda i, xg=xg, r=r: cand.run_tc(silu_mul(xg), *W8["down"][i], r["cfg"], SMS))
    chk[f"{key}_down_fused_ms"] = round(t_f, 4)
    chk[f"{key}_down_silu_then_ms"] = round(t_p, 4)
res["check"] = chk
log(check=chk)
(OUT / "fp8_decode_sweep_h200.json").write_text(json.dumps(res, indent=1))
