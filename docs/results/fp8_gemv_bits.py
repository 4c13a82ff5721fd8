"""The one-row FP8 GEMV widening e4m3 by moving bits instead of converting (issue 32,
session 31), on one GPU: Llama-3-8B's four linears, eight copies of each cycled in a CUDA
graph (every weight from HBM), bf16 `F.linear`, the session-24 GEMV and cuBLAS's FP8 GEMM
in the same run.

Why: the session-24 GEMV (8 x 1024 strips, 4 warps) widens each e4m3 weight to fp32 with
two conversions (an e4m3 pair to an fp16 pair, then fp16 to fp32), and conversions run at
16 a clock an SM: for gate_up (117 M weights) that alone is ~40 us on an H200, about what
the kernel takes (38.5 us), where the bytes need 24 us at HBM's rate. `gemv_bits`
(model/fp8_matmul.py `_w8a16_gemv` since this session; the strip's shape swept here)
reads int32 words of four weights and places each byte's bits
in a float32 with two shifts and an AND (`e4m3_byte_as_f32`), on the integer units.

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_gemv_bits.py`; writes
$OUT/fp8_gemv_bits.json.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "results"))
import fp8_decode_candidates as cand  # noqa: E402

from blitzscale.model import fp8_matmul  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
SHAPES = cand.SHAPES
SWEEP = cand.OneRowSweep()
res, log, record = SWEEP.res, SWEEP.log, SWEEP.record
W8, X, XQ, one = SWEEP.w8, SWEEP.x, SWEEP.xq, SWEEP.one
CVT = dict(bn=8, bk=1024, acc2d=1, stages=1, warps=4)  # session 24's GEMV, as it was


def gemv_kw(cfg: dict) -> dict:
    return dict(block_n=cfg["bn"], block_w=cfg["bw"], warps=cfg["warps"])


record("gemv_cvt", CVT, cand.layer_ms(lambda s, i: cand.run_gemv(X[s], *W8[s][i], CVT)))
record("gemv_product", {}, cand.layer_ms(lambda s, i: fp8_matmul.w8a16_matmul(X[s], *W8[s][i])))
record(
    "cublas_tensorwise_only",
    {},
    cand.layer_ms(lambda s, i: fp8_matmul.w8a8_unscaled(XQ[s][0], W8[s][i][0], one)),
)
configs = [dict(bn=bn, bw=bw, warps=w) for bn, bw, w in itertools.product((8, 16), (128, 256, 512), (4, 8))]
configs += [dict(bn=4, bw=bw, warps=w) for bw, w in itertools.product((256, 512), (2, 4))]
configs += [dict(bn=8, bw=1024, warps=4), dict(bn=8, bw=1024, warps=8), dict(bn=32, bw=128, warps=8)]
for cfg in configs:
    try:
        record(
            "gemv_bits",
            cfg,
            cand.layer_ms(lambda s, i, c=cfg: fp8_matmul.w8a16_matmul(X[s], *W8[s][i], **gemv_kw(c))),
        )
    except Exception as e:  # a shape Triton cannot compile: logged, the sweep goes on
        log(kind="gemv_bits", cfg=cfg, error=str(e)[:200])

# accuracy against the fp32 product of the same FP8 values (max error over max |ref|), with
# and without an outlier in the row; and every e4m3 byte, subnormals and signs included,
# must come out exactly (one-hot rows, unit scales)
rows = [r for r in res["rows"] if r["kind"] == "gemv_bits"]
best = min(rows, key=lambda r: r["ms"]["layer"])
res["best_gemv_bits"] = best
check = {}
for s in SHAPES:
    q, sc = W8[s][0]
    x = X[s].clone()
    for label in ("randn", "outlier"):
        if label == "outlier":
            x[0, 7] = 900.0
        ref = x.float() @ (q.float() * sc[:, None]).t()
        got = {
            "cvt": cand.run_gemv(x, q, sc, CVT),
            "bits": fp8_matmul.w8a16_matmul(x, q, sc, **gemv_kw(best["cfg"])),
        }
        check[f"{s}_{label}"] = {
            k: round(float((v.float() - ref).abs().max() / ref.abs().max()), 5) for k, v in got.items()
        }
every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
finite = every[~every.float().isnan()]
k = 4096
q = finite.repeat(k // finite.numel() + 1)[:k].repeat(8, 1).cuda().contiguous()
x = torch.eye(k, dtype=torch.bfloat16, device="cuda")[: finite.numel()]
out = torch.cat(
    [
        fp8_matmul.w8a16_matmul(x[i : i + 1], q, torch.ones(8, device="cuda"), **gemv_kw(best["cfg"]))
        for i in range(len(x))
    ]
)
want = q[0, : finite.numel()].float().to(torch.bfloat16)
check["every_e4m3_exact"] = bool(torch.equal(out[:, 0], want))
res["check"] = check
log(best=(best["cfg"], best["ms"]["layer"], best["over_bf16"]), check=check)
(OUT / "fp8_gemv_bits.json").write_text(json.dumps(res, indent=1))
