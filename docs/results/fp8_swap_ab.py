"""Issue 32, batch 64: can an FP8 GEMM of 2-64 rows read Llama-3-8B's weights faster than
cuBLAS's (the product's `w8a8_unscaled`)? At 64 rows on an H100 it read gate_up at 2.49
TB/s against 2.78 at one row and 3.13 for a plain read (fp8_fused_ops_h100.json): the
tile it picks for 64 rows leaves HBM idle. Candidates, each over the four linears with
every copy of each weight in turn (no L2 reuse; fp8_decode_candidates.py):

- `cublas`: `torch._scaled_mm(xq, w.t())`, unit scales (the product);
- `cublas_swap`: the same product transposed, `_scaled_mm(w, xq.t())` -> [N, M] (the
  weights as the GEMM's M side, the step's rows as its N: small-M kernels pad M to a tile,
  small-N ones need not), alone and with the copy back to [M, N];
- `tri_swap`: a Triton kernel computing out^T tiles, `w [BN, BK] @ xq^T [BK, M]` on the
  tensor cores (FP8 x FP8, fp32 sums), split along K where N gives too few tiles to fill
  the GPU (split > 1: fp32 atomic adds into a zeroed buffer, the zeroing timed with it).

Every candidate's output is checked against cuBLAS's (max error over max). Prints one JSON
line a result; writes fp8_swap_ab_<gpu>.json under $OUT.
Run on the GPU machine: `OUT=. python3 docs/results/fp8_swap_ab.py`.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_decode_candidates import SHAPES, SweepLog, layer_ms, per_call, sweep_inputs, sweep_weights

from blitzscale.model import fp8_matmul
from blitzscale.model.triton_ops import quantize_tokens

ROWS = (16, 64)  # cuBLAS takes the swapped product only where the rows are a multiple of 16
TRITON_ROWS = (64,)  # the Triton sweep's step sizes (batch 64 is the target it is for)


@triton.jit
def tri_swap(
    x_ptr, w_ptr, out_ptr, M, N, K, k_len,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, ATOMIC: tl.constexpr,
):  # fmt: skip
    """out[M, N] (+)= x[M, K] @ w[N, K]^T over K slice `program_id(1)` of length k_len,
    computed as w_tile @ x_tile^T (the weights on the MMA's M side)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_k * k_len
    wp = w_ptr + rn[:, None].to(tl.int64) * K + (k0 + rk)[None, :]
    xp = x_ptr + rm[:, None] * K + (k0 + rk)[None, :]
    n_ok = rn < N
    m_ok = rm < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in range(0, k_len, BLOCK_K):
        w = tl.load(wp, mask=n_ok[:, None], other=0.0)
        x = tl.load(xp, mask=m_ok[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(x), acc)
        wp += BLOCK_K
        xp += BLOCK_K
    op = out_ptr + rm[None, :] * N + rn[:, None]
    ok = n_ok[:, None] & m_ok[None, :]
    if ATOMIC:
        tl.atomic_add(op, acc, mask=ok, sem="relaxed")
    else:
        tl.store(op, acc.to(out_ptr.dtype.element_ty), mask=ok)


def run_tri(xq: torch.Tensor, w: torch.Tensor, cfg: dict) -> torch.Tensor:
    m, k = xq.shape
    n = w.shape[0]
    split = cfg["split"]
    bm = max(16, triton.next_power_of_2(m))
    if split == 1:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=xq.device)
    else:
        out = torch.zeros((m, n), dtype=torch.float32, device=xq.device)
    tri_swap[(triton.cdiv(n, cfg["bn"]), split)](
        xq, w, out, m, n, k, k // split,
        BLOCK_N=cfg["bn"], BLOCK_K=cfg["bk"], BLOCK_M=bm, ATOMIC=split > 1,
        num_warps=cfg["warps"], num_stages=cfg["stages"],
    )  # fmt: skip
    return out


def err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return round(((a.float() - ref.float()).abs().max() / ref.float().abs().max()).item(), 5)


def one_size(m: int, x: dict, w8: dict, w16: dict, one: torch.Tensor, sw: SweepLog) -> None:
    """Every candidate at `m` rows, into sw.res."""
    res = sw.res
    xq = {s: quantize_tokens(x[s])[0] for s in SHAPES}
    ref = {s: fp8_matmul.w8a8_unscaled(xq[s], w8[s][0][0], one) for s in SHAPES}
    res["bf16"][m] = layer_ms(lambda s, i: F.linear(x[s], w16[s][i]))
    res["cublas"][m] = layer_ms(lambda s, i: fp8_matmul.w8a8_unscaled(xq[s], w8[s][i][0], one))

    def swap(s: str, i: int) -> torch.Tensor:
        w = w8[s][i][0]
        return torch._scaled_mm(w, xq[s].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    res["cublas_swap"][m] = layer_ms(swap)
    res["cublas_swap_copy"][m] = layer_ms(lambda s, i: swap(s, i).t().contiguous())
    res["cublas_swap_err"][m] = {s: err(swap(s, 0).t(), ref[s]) for s in SHAPES}
    sw.log(m=m, bf16=res["bf16"][m], cublas=res["cublas"][m], swap=res["cublas_swap"][m],
           swap_copy=res["cublas_swap_copy"][m], swap_err=res["cublas_swap_err"][m])  # fmt: skip
    if m not in TRITON_ROWS:
        return
    best: dict = {}  # Triton: the best setting per shape
    for bn, bk, stages, warps, split in itertools.product((64, 128), (128, 256), (4,), (4,), (1, 2, 4)):
        cfg = {"bn": bn, "bk": bk, "stages": stages, "warps": warps, "split": split}
        for s, (_, k) in SHAPES.items():
            if k % (split * bk):
                continue
            try:
                e = err(run_tri(xq[s], w8[s][0][0], cfg), ref[s])
                if e > 0.01:
                    sw.log(m=m, shape=s, cfg=cfg, bad_err=e)
                    continue
                t = round(per_call(lambda i, s=s, cfg=cfg: run_tri(xq[s], w8[s][i][0], cfg)), 4)
            except Exception as exc:  # a setting the compiler refuses
                sw.log(m=m, shape=s, cfg=cfg, failed=str(exc)[:200])
                continue
            if s not in best or t < best[s]["ms"]:
                best[s] = {"ms": t, "cfg": cfg, "err": e}
    best["layer"] = round(sum(best[s]["ms"] for s in SHAPES if s in best), 4)
    res["tri"][m] = best
    sw.log(m=m, tri_best=best)


def main() -> None:
    sw = SweepLog()
    w8, w16 = sweep_weights()
    xs = sweep_inputs(ROWS)
    one = fp8_matmul.unit_scale(torch.device("cuda"))
    sw.res["torch"], sw.res["triton"] = torch.__version__, triton.__version__
    for key in ("bf16", "cublas", "cublas_swap", "cublas_swap_copy", "cublas_swap_err", "tri"):
        sw.res[key] = {}
    for m in ROWS:
        one_size(m, xs[m], w8, w16, one, sw)
    name = "fp8_swap_ab_" + torch.cuda.get_device_name().split()[1].lower() + ".json"
    Path(os.environ.get("OUT", "."), name).write_text(json.dumps(sw.res, indent=1))


if __name__ == "__main__":
    main()
