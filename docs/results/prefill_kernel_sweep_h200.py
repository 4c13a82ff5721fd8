"""The paged prefill kernel (model/attention/triton_kernels.py `prefill`) over its tile
settings, for Llama-3-8B's heads (32 query, 8 KV, 128 wide, pages of 16): a 512-token chunk
after a 1536-token cached prefix, and a fresh 512-token prompt; against SDPA's flash kernel
on the same keys laid out contiguously (causal, lower-right aligned), which needs no block
table. Per layer, milliseconds (triton.testing.do_bench). Prints JSON.

    python3 docs/results/prefill_kernel_sweep_h200.py > docs/results/prefill_kernel_sweep_h200.json
"""

from __future__ import annotations

import itertools
import json

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from triton.testing import do_bench

from blitzscale.model.attention import triton_kernels as K

HEADS, KV, D, PAGE, Q = 32, 8, 128, 16, 512
dev = torch.device("cuda")
torch.manual_seed(0)
blocks = 4096
kc = torch.randn(blocks, PAGE, KV, D, dtype=torch.bfloat16, device=dev)
vc = torch.randn_like(kc)
q = torch.randn(Q, HEADS, D, dtype=torch.bfloat16, device=dev)
out = torch.empty_like(q)
table = torch.randperm(blocks, device=dev)[:128].view(1, 128)
qsl = torch.tensor([0, Q], device=dev)
seqs = torch.tensor([0], device=dev)
scale = D**-0.5 * K.LOG2E
out_json: dict = {"shape": {"heads": HEADS, "kv_heads": KV, "head_dim": D, "page": PAGE, "chunk": Q}}


def kernel_ms(keys: int, bm: int, bn: int, warps: int, stages: int) -> float:
    seq_lens = torch.tensor([keys], device=dev)

    def go() -> None:
        K.prefill[(triton.cdiv(Q, bm), HEADS, 1)](
            q, kc, vc, out, table, seq_lens, qsl, seqs,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            kc.stride(1), kc.stride(2), table.stride(0), scale,
            PAGE=PAGE, GROUP=HEADS // KV, HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=D,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip

    return do_bench(go, warmup=20, rep=100)


def flash_ms(keys: int) -> float:
    flat = table[0, : keys // PAGE]
    k = kc[flat].reshape(keys, KV, D).transpose(0, 1)[None]
    v = vc[flat].reshape(keys, KV, D).transpose(0, 1)[None]
    qh = q.transpose(0, 1)[None]
    bias = causal_lower_right(Q, keys)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        return do_bench(lambda: F.scaled_dot_product_attention(qh, k, v, attn_mask=bias, enable_gqa=True))


for keys in (2048, 512):
    rows = []
    for bm, bn, warps, stages in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)):
        try:
            ms = kernel_ms(keys, bm, bn, warps, stages)
        except Exception as err:  # (shared memory: some tiles do not fit)
            rows.append(
                {"block_m": bm, "block_n": bn, "warps": warps, "stages": stages, "error": str(err)[:80]}
            )
            continue
        rows.append({"block_m": bm, "block_n": bn, "warps": warps, "stages": stages, "ms": round(ms, 4)})
    ok = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])
    out_json[f"keys_{keys}"] = {
        "current_64_64_4_2": next(
            r["ms"] for r in rows if (r["block_m"], r["block_n"], r["warps"], r["stages"]) == (64, 64, 4, 2)
        ),
        "best": ok[:5],
        "sdpa_contiguous_ms": round(flash_ms(keys), 4),
        "all": rows,
    }
print(json.dumps(out_json, indent=1))
