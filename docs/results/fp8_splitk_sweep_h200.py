"""Scratch measurement (issue 32): the FP8 weight-only kernel with split-K
(model/fp8_matmul.py) over programs per SM, strip width, warps and stages; each linear
shape of Llama-3-8B (and its TP2 shards) replayed 20 times from a CUDA graph (as in a decode
step), against bf16 `F.linear` the same way, at 1 and 16 rows; then the best setting in the
module, checked against a dequantized matmul, and `bench engine --dtype fp8` run with it.
Prints JSON.

The JSON beside it (`fp8_splitk_sweep_h200.json`) came from this script with two more
variants since removed from the module for giving nothing: the GEMV split along K
(`programs_per_sm` 2 and 4 in its "gemv" rows) and an e4m3-to-bf16 widening by moving bits
(`bits: true` in its "dot" rows). Its "bench_engine" ran with the setting its last lines
chose (the GEMV at the dot's split): the GEMV unsplit, as the module has it now, is faster.

Run (GPU machine, repo root): `python3 docs/results/fp8_splitk_sweep_h200.py`.

It ran against model/fp8_matmul.py as of commit 105fd10; the split-K tensor-core kernel and its constants
are gone since (2-64 row steps take cuBLAS's FP8 GEMM: fp8_decode_paths_h200.py). To run
it again:
`git worktree add /tmp/fp8-105fd10 105fd10` and run it there.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blitzscale.bench.limits import graph_replay_ms
from blitzscale.model import fp8_matmul
from blitzscale.model.linear import quantize_rows

SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "tp2_qkv": (3072, 4096),
    "tp2_o": (4096, 2048),
    "tp2_down": (4096, 7168),
}
LAYER = ("qkv", "o", "gate_up", "down")  # one Llama-3-8B layer's four linears
REPS = 20


def graphed_ms(fn) -> float:  # type: ignore[no-untyped-def]
    return graph_replay_ms(fn, REPS)


def setting(**kw: object) -> None:
    for key, value in kw.items():
        setattr(fp8_matmul, key.upper(), value)


def measure(row: dict, rows: int) -> bool:
    """Times of every shape at `rows` rows into `row`; False if Triton could not build it."""
    try:
        gemv = rows <= fp8_matmul.GEMV_ROWS
        row["split"] = {
            name: 1 if gemv else fp8_matmul.split_for(n, k, out["sms"]) for name, (n, k) in SHAPES.items()
        }
        row["ms"] = {
            name: round(graphed_ms(lambda w=w, x=xs[rows][name]: fp8_matmul.w8a16_matmul(x, *w[0])), 4)
            for name, w in weights.items()
        }
    except Exception as e:  # (a shape Triton cannot build: noted, skipped)
        row["error"] = str(e)[:200]
        return False
    row["layer_ms"] = round(sum(row["ms"][s] for s in LAYER), 4)
    row["layer_over_bf16"] = round(row["layer_ms"] / out["bf16_layer_ms"][str(rows)], 3)
    row["weight_TBps"] = {
        name: round(n * k / (row["ms"][name] * 1e-3) / 1e12, 2) for name, (n, k) in SHAPES.items()
    }
    return True


torch.manual_seed(0)
weights = {}
for name, (n, k) in SHAPES.items():
    weights[name] = (
        quantize_rows(torch.randn(n, k, device="cuda") * 0.02),
        torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
    )
xs = {
    m: {name: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}
    for m in (1, 16)
}
out: dict = {
    "device": torch.cuda.get_device_name(),
    "sms": torch.cuda.get_device_properties(0).multi_processor_count,
}
out["bf16_ms"] = {
    str(m): {
        name: round(graphed_ms(lambda w=w, x=xs[m][name]: F.linear(x, w[1])), 4)
        for name, w in weights.items()
    }
    for m in (1, 16)
}
out["bf16_layer_ms"] = {m: round(sum(out["bf16_ms"][m][s] for s in LAYER), 4) for m in out["bf16_ms"]}
out["gemv"], out["dot"] = [], []
best_gemv = best_dot = None
for bn, bk, warps in itertools.product((8, 16, 32), (256, 512, 1024), (4, 8)):
    setting(gemv_rows=1, gemv_block_n=bn, gemv_block_k=bk, gemv_warps=warps)
    row: dict = {"block_n": bn, "block_k": bk, "warps": warps}
    out["gemv"].append(row)
    if measure(row, 1) and (best_gemv is None or row["layer_ms"] < best_gemv["layer_ms"]):
        best_gemv = row
for pps, bn, stages in itertools.product((0, 2, 4), (32, 64), (3,)):
    setting(gemv_rows=0, programs_per_sm=pps, block_n=bn, num_stages=stages)
    row = {"programs_per_sm": pps, "block_n": bn, "stages": stages}
    out["dot"].append(row)
    if measure(row, 16) and (best_dot is None or row["layer_ms"] < best_dot["layer_ms"]):
        best_dot = row
out["best_gemv"], out["best_dot"] = best_gemv, best_dot
assert best_gemv is not None and best_dot is not None
# (the best of each, together)
setting(
    programs_per_sm=best_dot["programs_per_sm"],
    block_n=best_dot["block_n"],
    num_stages=best_dot["stages"],
    gemv_rows=1,
    gemv_block_n=best_gemv["block_n"],
    gemv_block_k=best_gemv["block_k"],
    gemv_warps=best_gemv["warps"],
)
row = {"chosen": True}
measure(row, 1)
out["gemv_at_dot_programs_per_sm"] = row
# correctness of the chosen setting: against the dequantized weights in fp32
errs = {}
for (name, ((q, s), _)), rows in itertools.product(weights.items(), (1, 16)):
    x = xs[rows][name]
    ref = x.float() @ (q.float() * s[:, None]).t()
    got = fp8_matmul.w8a16_matmul(x, q, s).float()
    errs[f"{name}_{rows}"] = round(((got - ref).abs().max() / ref.abs().max()).item(), 5)
    assert torch.equal(fp8_matmul.w8a16_matmul(x, q, s), fp8_matmul.w8a16_matmul(x, q, s)), (
        "not deterministic"
    )
out["max_rel_err_vs_dequantized"] = errs
from blitzscale.bench.engine_bench import EngineBenchConfig, run_engine_bench  # noqa: E402

cfg = EngineBenchConfig(
    model="random:llama3-8b",
    device="cuda",
    batch_sizes=(1, 16, 64),
    context_lens=(512,),
    decode_steps=16,
    prefill_len=2048,
    dtype="fp8",
)
r = run_engine_bench(cfg)
out["bench_engine"] = {k: r[k] for k in ("fp8_logits_vs_dense_dequantized", "dense", "fp8", "fp8_over_dense")}
print(json.dumps(out, indent=1))
