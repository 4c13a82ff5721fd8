"""`silu_mul_quant` (model/triton_ops.py) by rows: two kernels over every block of every
row against one program a row, on one GPU (issue 32, session 31).

Why: under the profiler an FP8 2,048-token prefill of Llama-3-8B spent 1.94 ms in
`_silu_mul_part` and 1.09 in `_quantize_part` (H100, docs/results/fp8_prefill_kernels_h100_s31.json)
where bf16's `_silu_mul` took 1.84: the two-kernel form stores the bf16 activations and reads
them back. With many rows one program a row has every SM busy and needs neither. Prints
and writes ms for each form (Llama-3-8B's gate_up product, unscaled, replayed from a CUDA
graph) and the smallest row count from which one program a row is the faster, in rows per
SM (what `SILU_ROW_PROGRAMS_PER_SM` is set from).

Run (GPU machine, repo root): `OUT=. python3 docs/results/fp8_silu_rows.py`; writes
$OUT/fp8_silu_rows.json.

Result (H100, session 32, `fp8_silu_rows_h100_s32.json`): one program a row was slower at
every row count, 16 to 4,096 (4,096 rows: 0.215 ms against 0.194), so the kernel was not
kept. It ran against commit 7ac445d (branch fp8-silu-rows, `_silu_mul_quant_row` and the
`row_from` argument of `silu_mul_quant`); to run it again, `git worktree add /tmp/silu
7ac445d` and run it there.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from blitzscale.bench.limits import graph_replay_ms  # noqa: E402
from blitzscale.model.fp8_values import Unscaled  # noqa: E402
from blitzscale.model.triton_ops import TritonOps  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
INTER = 14336
ops = TritonOps()
sms = torch.cuda.get_device_properties(0).multi_processor_count
res: dict = {"device": torch.cuda.get_device_name(), "sms": sms, "rows": {}}
for rows in (16, 64, 128, sms, 2 * sms, 4 * sms, 1024, 2048, 4096):
    gu = torch.randn(rows, 2 * INTER, device="cuda", dtype=torch.bfloat16) * 30
    u = Unscaled(gu, torch.rand(rows, 1, device="cuda") * 0.01, torch.rand(2 * INTER, device="cuda") * 0.01)
    two = graph_replay_ms(lambda u=u: ops.silu_mul_quant(u, row_from=1 << 30), reps=10)
    one = graph_replay_ms(lambda u=u: ops.silu_mul_quant(u, row_from=0), reps=10)
    res["rows"][rows] = {"two_kernels_ms": round(two, 4), "row_programs_ms": round(one, 4)}
    print(json.dumps({rows: res["rows"][rows]}), flush=True)
faster = [r for r, t in res["rows"].items() if t["row_programs_ms"] < t["two_kernels_ms"]]
res["row_programs_faster_from_rows_per_sm"] = round(min(faster) / sms, 2) if faster else None
print(json.dumps({"faster_from_rows_per_sm": res["row_programs_faster_from_rows_per_sm"]}))
(OUT / "fp8_silu_rows.json").write_text(json.dumps(res, indent=1))
