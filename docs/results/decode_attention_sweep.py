"""The decode attention kernel's launch settings, swept on Llama-3-8B's heads.

Why: at batch 64 and context 512 an H100's decode step spends 1.71 ms of 5.91 (FP8) or 8.01
(bf16) in attention (docs/results/fp8_step_kernels.py): 53 us a layer for 134 MB of keys and
values, 2.5 TB/s where the HBM gives ~3. The kernel's settings (`DecodeTiles` in
model/attention/triton_backend.py: keys a loop iteration, warps, pipeline stages, and how
far the keys are split) were set on an H200 at small batches. This times `decode_attention`
(the backend's own launch) over a grid of them at the batches and contexts a serving GPU
sees, each layer's cache a copy of its own so no launch reads the L2 (a CUDA graph cycling
the copies), checks each setting's output against the default's and the default's against
SDPA over the gathered keys, and measures in the same run the rate a plain read of HBM
gets (`torch.sum` over 2 GiB) as the reference.

Run (GPU machine, repo root): `OUT=. python3 docs/results/decode_attention_sweep.py`;
writes $OUT/decode_attention_sweep_<gpu>.json and prints each shape's best settings.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from blitzscale.model.attention import AttentionMetadata  # noqa: E402
from blitzscale.model.attention import triton_backend as tb  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16  # Llama-3-8B; the serve engine's block size
SHAPES = [(16, 2048), (64, 512), (64, 2048), (128, 1024), (256, 512), (256, 2048)]
BLOCK_N = (32, 64, 128)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3, 4)
SPLITS = (0, 1, 2, 4, 8)  # 0: the waves rule (DecodeTiles.waves)
CACHE_BYTES = 1 << 30  # at least this much cache cycled (an H100's L2 is 50 MB)
REPLAYS = 10


def kv_bytes(batch: int, ctx: int) -> int:
    return batch * ctx * KV_HEADS * HEAD_DIM * 2 * 2


def read_rate(device: torch.device) -> float:
    """GB/s of `torch.sum` over 2 GiB of bf16 (the reference: a plain read of HBM)."""
    x = torch.ones(1 << 30, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        x.sum()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        x.sum()
    end.record()
    torch.cuda.synchronize()
    rate = 20 * x.numel() * 2 / (start.elapsed_time(end) / 1e3) / 1e9
    del x
    return rate


class Case:
    """One shape's caches (a copy a layer), block tables scattered over them, and q."""

    def __init__(self, batch: int, ctx: int, device: torch.device) -> None:
        g = torch.Generator(device="cpu").manual_seed(batch * 7919 + ctx)
        self.batch, self.ctx = batch, ctx
        per_seq = -(-ctx // PAGE)
        blocks = batch * per_seq + 1
        self.copies = max(2, min(16, -(-CACHE_BYTES // kv_bytes(batch, ctx))))
        shape = (blocks, PAGE, KV_HEADS, HEAD_DIM)
        bf16 = torch.bfloat16
        self.caches = [
            (torch.randn(shape, device=device, dtype=bf16), torch.randn(shape, device=device, dtype=bf16))
            for _ in range(self.copies)
        ]
        order = torch.randperm(blocks - 1, generator=g) + 1
        tables = [order[b * per_seq : (b + 1) * per_seq].tolist() for b in range(batch)]
        self.meta = AttentionMetadata.build([1] * batch, [ctx] * batch, tables, PAGE, device)
        self.tables = torch.tensor(tables, device=device)
        self.q = torch.randn(batch, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
        self.out = torch.empty_like(self.q)
        self.scale = HEAD_DIM**-0.5

    def run(self, tiles: tb.DecodeTiles, copy: int = 0) -> None:
        k, v = self.caches[copy]
        tb.decode_attention(
            self.q, k, v, self.meta, self.out, self.scale * tb.K.LOG2E, self.batch, self.ctx, tiles
        )

    def reference(self) -> torch.Tensor:
        """SDPA over each sequence's gathered keys and values (copy 0)."""
        k, v = self.caches[0]
        outs = []
        for b in range(self.batch):
            kk = k[self.tables[b]].reshape(-1, KV_HEADS, HEAD_DIM)[: self.ctx]
            vv = v[self.tables[b]].reshape(-1, KV_HEADS, HEAD_DIM)[: self.ctx]
            o = F.scaled_dot_product_attention(
                self.q[b][None, :, None].float(), kk.transpose(0, 1)[None].float(),
                vv.transpose(0, 1)[None].float(), scale=self.scale, enable_gqa=True,
            )  # fmt: skip
            outs.append(o[0, :, 0])
        return torch.stack(outs)

    def time_us(self, tiles: tb.DecodeTiles) -> float:
        """Microseconds a launch, from a CUDA graph that runs every copy once."""
        for c in range(self.copies):
            self.run(tiles, c)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in range(self.copies):
                self.run(tiles, c)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return 1e3 * start.elapsed_time(end) / (REPLAYS * self.copies)


def main() -> None:
    device = torch.device("cuda")
    name = torch.cuda.get_device_name()
    res: dict = {
        "device": name,
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "read_gb_s": round(read_rate(device), 1),
        "default": tb.DECODE_TILES.__dict__,
        "shapes": [],
    }
    print(json.dumps({k: res[k] for k in ("device", "sms", "read_gb_s")}), flush=True)
    for batch, ctx in SHAPES:
        case = Case(batch, ctx, device)
        case.run(tb.DECODE_TILES)
        want = case.out.float().clone()
        ref_err = (want - case.reference()).abs().max().item()
        rows = []
        for bn, w, st, sp in itertools.product(BLOCK_N, WARPS, STAGES, SPLITS):
            tiles = tb.DecodeTiles(block_n=bn, warps=w, stages=st, splits=sp)
            try:
                case.run(tiles)
                err = (case.out.float() - want).abs().max().item()
                us = case.time_us(tiles)
            except Exception as e:  # a setting over the SM's shared memory: Triton refuses it
                rows.append({"tiles": [bn, w, st, sp], "error": type(e).__name__})
                continue
            rows.append({"tiles": [bn, w, st, sp], "us": round(us, 2), "err": err,
                         "splits": tiles.num_splits(batch, KV_HEADS, ctx, res["sms"])})  # fmt: skip
        default_us = case.time_us(tb.DECODE_TILES)
        ok = [r for r in rows if "us" in r and r["err"] < 0.02]
        best = sorted(ok, key=lambda r: r["us"])[:5]
        gb = kv_bytes(batch, ctx) / 1e9
        shape = {
            "batch": batch, "ctx": ctx, "kv_gb": round(gb, 4), "copies": case.copies,
            "default_us": round(default_us, 2), "default_gb_s": round(gb / default_us * 1e6, 1),
            "default_vs_sdpa_max_err": ref_err, "best": best,
            "best_gb_s": round(gb / best[0]["us"] * 1e6, 1) if best else None, "rows": rows,
        }  # fmt: skip
        res["shapes"].append(shape)
        print(json.dumps({k: v for k, v in shape.items() if k != "rows"}), flush=True)
        del case
        torch.cuda.empty_cache()
    tag = name.split()[-1].lower().replace(" ", "_")
    (OUT / f"decode_attention_sweep_{tag}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
