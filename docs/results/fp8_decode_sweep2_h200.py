"""FP8 decode paths swept on one H200 (issue 32), second run: per-token quantization,
`torch._scaled_mm` rowwise and tensorwise (cuBLAS), the GEMV's wider strips, the Triton
FP8 x FP8 kernel; bf16 `F.linear` in the same run, eight copies of each linear cycled.
Writes $OUT/fp8_decode_sweep2_h200.json.

The JSON beside it (device `nvidia-h200`, 2026-12-05) came from an earlier form of this
script, which also timed the quantization and both `_scaled_mm` forms alone (the rows
`quantize_tokens`, `scaled_mm_rowwise_only`, `scaled_mm_tensorwise_only`, under `if
TIMED_ALONE`), the GEMV at 2 and 8 warps and 2,048-byte strips, and the unswapped kernel
(its `w8a16_unswapped` rows; that kernel left model/fp8_matmul.py since, and its loop here);
its Triton FP8 x FP8 rows are all errors: the kernel was launched with a torch dtype for
its `DOT` parameter (fixed in fp8_decode_candidates.py; that kernel has not run since).

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_decode_sweep2_h200.py`.
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

from blitzscale.model.triton_ops import quantize_tokens  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
SHAPES, COPIES = cand.SHAPES, cand.COPIES
SWEEP = cand.SweepLog()
SMS, T0, res, log = SWEEP.sms, SWEEP.t0, SWEEP.res, SWEEP.log


W8, W16 = cand.sweep_weights()
MS = (1, 16, 64)
X = cand.sweep_inputs(MS)
XQ = {m: {s: quantize_tokens(X[m][s]) for s in SHAPES} for m in MS}


per_call = cand.per_call


def times(fn, m) -> dict:
    """fn(m, shape, copy) per shape -> ms per call, and the layer sum."""
    out = {s: round(per_call(lambda i, s=s: fn(m, s, i)), 4) for s in SHAPES}
    out["layer"] = round(sum(out[s] for s in SHAPES), 4)
    return out


bf16 = {m: times(lambda m, s, i: F.linear(X[m][s], W16[s][i]), m) for m in MS}
res["bf16"] = bf16
log(bf16=bf16)


def record(kind, cfg, m, t):
    row = {"kind": kind, "cfg": cfg, "m": m, "ms": t, "over_bf16": round(t["layer"] / bf16[m]["layer"], 3)}
    res["rows"].append(row)
    log(**row)


one = torch.ones((), device="cuda")
TIMED_ALONE = False  # (the first run timed these; see the docstring)
for m in MS if TIMED_ALONE else ():
    record("quantize_tokens", {}, m, times(lambda m, s, i: quantize_tokens(X[m][s]), m))
    record(
        "scaled_mm_rowwise_only",
        {},
        m,
        times(
            lambda m, s, i: torch._scaled_mm(
                XQ[m][s][0],
                W8[s][i][0].t(),
                scale_a=XQ[m][s][1],
                scale_b=W8[s][i][1].view(1, -1),
                out_dtype=torch.bfloat16,
            ),
            m,
        ),
    )
    record(
        "scaled_mm_tensorwise_only",
        {},
        m,
        times(
            lambda m, s, i: torch._scaled_mm(
                XQ[m][s][0], W8[s][i][0].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
            ),
            m,
        ),
    )

# GEMV refinements at one row
for bn, bk, warps in itertools.product((8,), (512, 1024), (4,)):
    cfg = dict(bn=bn, bk=bk, warps=warps, acc2d=1, stages=1)
    try:
        record("gemv", cfg, 1, times(lambda m, s, i, cfg=cfg: cand.run_gemv(X[1][s], *W8[s][i], cfg), 1))
    except Exception as e:
        log(kind="gemv", cfg=cfg, error=str(e)[:150])

# Triton FP8 x FP8
for m in MS:
    record(
        "tensorwise_epilogue",
        {},
        m,
        times(lambda m, s, i: cand.tensorwise(XQ[m][s][0], XQ[m][s][1].view(-1), *W8[s][i], one), m),
    )
    record(
        "tensorwise_quant_epilogue",
        {},
        m,
        times(
            lambda m, s, i: cand.tensorwise(
                *(lambda q: (q[0], q[1].view(-1)))(quantize_tokens(X[m][s])), *W8[s][i], one
            ),
            m,
        ),
    )
for m in (16, 64):
    q, sc = W8["gate_up"][0]
    xq, xs = XQ[m]["gate_up"]
    ref = torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=sc.view(1, -1), out_dtype=torch.bfloat16).float()
    got = cand.tensorwise(xq, xs.view(-1), q, sc, one).float()
    res.setdefault("check", {})[f"tensorwise_vs_rowwise_{m}"] = round(
        ((got - ref).abs().max() / ref.abs().max()).item(), 5
    )
for bm, bn, bk, warps, stages in itertools.product((16, 64), (64, 128, 256), (128, 256), (4, 8), (3, 4)):
    for pps in (0, 1, 2):
        cfg = dict(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, pps=pps)
        ok = True
        for m in (1, 16) if bm == 16 else (16, 64):
            try:
                record(
                    "w8a8",
                    cfg,
                    m,
                    times(
                        lambda m, s, i, cfg=cfg: cand.run_w8a8(
                            XQ[m][s][0], XQ[m][s][1].view(-1), *W8[s][i], cfg, SMS
                        ),
                        m,
                    ),
                )
            except Exception as e:
                log(kind="w8a8", cfg=cfg, m=m, error=str(e)[:150])
                ok = False
                break
        if not ok:
            break
    if time.time() - T0 > 190:
        break


def best(kind, m):
    rows = [r for r in res["rows"] if r["kind"] == kind and r["m"] == m]
    return min(rows, key=lambda r: r["ms"]["layer"]) if rows else None


res["best"] = {f"{k}_{m}": best(k, m) for k, m in (("gemv", 1), ("w8a8", 1), ("w8a8", 16), ("w8a8", 64))}
chk = res.get("check", {})
for key in ("w8a8_16", "w8a8_64"):
    r = res["best"][key]
    if not r:
        continue
    m = r["m"]
    for s in SHAPES:
        q, sc = W8[s][0]
        xq, xs = XQ[m][s]
        ref = (xq.float() * xs) @ (q.float() * sc[:, None]).t()
        got = cand.run_w8a8(xq, xs.view(-1), q, sc, r["cfg"], SMS).float()
        chk[f"{key}_{s}"] = round(((got - ref).abs().max() / ref.abs().max()).item(), 5)
res["check"] = chk
log(best={k: v and (v["cfg"], v["ms"]["layer"], v["over_bf16"]) for k, v in res["best"].items()}, check=chk)
(OUT / "fp8_decode_sweep2_h200.json").write_text(json.dumps(res, indent=1))
