"""The FP8 GEMV with and without programmatic dependent launch, in the engine's decode
step (issue 32, session 32).

Why: at batch 1 an H200 step of Llama-3-8B in FP8 took 0.66x bf16's where its four GEMVs
alone read the layer at 0.62x (docs/results/fp8_gemv_bits.py): qkv and o (25 and 17 MB)
read at 2.2-2.4 TB/s, the rest of their time the launch and the first loads. Launched with
PDL (model/pdl.py) a GEMV reads its first weight strip while the norm, attention merge or
SiLU before it still runs. Builds bf16 and FP8 engines of the same random Llama-3-8B
weights (FP8 once with `GEMV_PDL` off, once on), twice in turn, and times their decode
steps at context 512 (the step's CUDA graph alone, and the engine's step), and profiles
the batch-1 graph of each FP8 engine (kernels' sum, span and gaps).

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_pdl.py`; writes
$OUT/fp8_pdl_<gpu>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "results"))

from fp8_step_kernels import graph_kernels  # noqa: E402

from blitzscale.bench import engine_bench as eb  # noqa: E402
from blitzscale.bench.engine_bench import EngineBenchConfig  # noqa: E402
from blitzscale.model import fp8_matmul  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
BATCHES = (1, 2, 64)


def main() -> None:
    device = torch.device("cuda")
    cfg = EngineBenchConfig(model="random:llama3-8b", device="cuda", batch_sizes=BATCHES, context_lens=(512,))
    fp8, dense = eb.fp8_and_dequantized(cfg.model, device, torch.bfloat16)
    res: dict = {"device": torch.cuda.get_device_name(), "context": 512, "runs": []}
    for rep in range(2):
        for label, weights, pdl in (("bf16", dense, False), ("fp8", fp8, False), ("fp8_pdl", fp8, True)):
            fp8_matmul.GEMV_PDL = pdl
            engine = eb._engine(weights, cfg, max(BATCHES))
            row: dict = {"label": label, "rep": rep, "graph_ms": {}, "step_ms": {}}
            for b in BATCHES:
                graph: list[float] = []
                row["step_ms"][b] = round(eb._decode_ms(engine, cfg, b, 512, device, 32, graph), 4)
                row["graph_ms"][b] = round(graph[0], 4) if graph else None
            if label != "bf16" and rep == 0:
                row["kernels_b1"] = graph_kernels(engine, 1, cfg, device)
            print(json.dumps(row), flush=True)
            res["runs"].append(row)
            del engine
            eb._free(device)
    fp8_matmul.GEMV_PDL = True
    best = {
        label: {b: min(r["graph_ms"][b] for r in res["runs"] if r["label"] == label) for b in BATCHES}
        for label in ("bf16", "fp8", "fp8_pdl")
    }
    res["best_graph_ms"] = best
    res["over_bf16"] = {
        label: {b: round(best[label][b] / best["bf16"][b], 3) for b in BATCHES}
        for label in ("fp8", "fp8_pdl")
    }
    print(json.dumps({"over_bf16": res["over_bf16"]}))
    card = "h100" if "H100" in res["device"] else "h200"
    (OUT / f"fp8_pdl_{card}.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
