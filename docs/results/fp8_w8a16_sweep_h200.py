"""Scratch measurement (issue 32): the FP8 weight-only kernel (model/fp8_matmul.py) over a
few block shapes, each linear shape of Llama-3-8B replayed 20 times from a CUDA graph (no
launch overhead, as in a decode step), against bf16 `F.linear` the same way; then the best
shape set in the module and `bench engine --dtype fp8` run with it. Prints JSON.

It ran against model/fp8_matmul.py as of commit 105fd10; the tensor-core weight-only kernel and its constants
are gone since (2-64 row steps take cuBLAS's FP8 GEMM: fp8_decode_paths_h200.py). To run
it again:
`git worktree add /tmp/fp8-105fd10 105fd10` and run it there.
"""

from __future__ import annotations

import itertools
import json

import torch
import torch.nn.functional as F

from blitzscale.bench.limits import graph_replay_ms
from blitzscale.model import fp8_matmul
from blitzscale.model.linear import quantize_rows

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
REPS = 20


def graphed_ms(fn) -> float:  # type: ignore[no-untyped-def]
    return graph_replay_ms(fn, REPS)


weights = {}
for name, (n, k) in SHAPES.items():
    weights[name] = (
        quantize_rows(torch.randn(n, k, device="cuda") * 0.02),
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
    )
out: dict = {"device": torch.cuda.get_device_name(), "bf16": {}, "configs": []}
for m in (1, 16):
    out["bf16"][str(m)] = {
        name: round(graphed_ms(lambda w=w, m=m, k=SHAPES[name][1]: F.linear(torch.ones(m, k, device="cuda",
                                dtype=torch.bfloat16), w[1])), 4)
        for name, w in weights.items()
    }  # fmt: skip
best = None
for bn, bk, warps, stages in itertools.product((16, 32, 64), (256,), (4, 8), (3, 5)):
    fp8_matmul.BLOCK_N, fp8_matmul.BLOCK_K, fp8_matmul.NUM_WARPS, fp8_matmul.NUM_STAGES = (
        bn,
        bk,
        warps,
        stages,
    )
    row: dict = {"block_n": bn, "block_k": bk, "warps": warps, "stages": stages}
    try:
        for m in (1, 16):
            x = {
                name: torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                for name, (n, k) in SHAPES.items()
            }
            row[str(m)] = {
                name: round(
                    graphed_ms(lambda w=w, xx=x[name]: fp8_matmul.w8a16_matmul(xx, w[0][0], w[0][1])), 4
                )
                for name, w in weights.items()
            }
    except Exception as e:  # (a shape Triton cannot build: noted, skipped)
        row["error"] = str(e)[:200]
        out["configs"].append(row)
        continue
    row["total_ms"] = round(sum(row["1"].values()) + sum(row["16"].values()), 4)
    out["configs"].append(row)
    if best is None or row["total_ms"] < best["total_ms"]:
        best = row
out["best"] = best
out["bf16_total_ms"] = round(sum(out["bf16"]["1"].values()) + sum(out["bf16"]["16"].values()), 4)
if best is not None:
    fp8_matmul.BLOCK_N, fp8_matmul.BLOCK_K = best["block_n"], best["block_k"]
    fp8_matmul.NUM_WARPS, fp8_matmul.NUM_STAGES = best["warps"], best["stages"]
    from blitzscale.bench.engine_bench import EngineBenchConfig, run_engine_bench

    cfg = EngineBenchConfig(
        model="random:llama3-8b", device="cuda", batch_sizes=(1, 16, 64), context_lens=(512,),
        decode_steps=16, prefill_len=2048, dtype="fp8",
    )  # fmt: skip
    r = run_engine_bench(cfg)
    out["bench_engine"] = {
        k: r[k] for k in ("fp8_logits_vs_dense_dequantized", "dense", "fp8", "fp8_over_dense")
    }
print(json.dumps(out, indent=1))
