"""Scratch measurement (issue 27): one pass of `F.linear` over all of SmolLM2's matrices
(fp32, one thread) for 1 to 256 rows, against `W @ x.T`, and the largest difference between
the two. Prints one JSON line. Run: `.venv/bin/python docs/results/cpu_linear_rows.py` from
the repo root on a quiet machine (median of 5 passes each)."""

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from blitzscale.checkpoint import load_weights, resolve_model
    from blitzscale.serve.model_cache import prepare_model

    torch.set_num_threads(1)
    w = load_weights(resolve_model(prepare_model("smollm2-135m")))
    mats = [m for i in range(len(w.layers)) for m in (lambda x: (x.qkv, x.o, x.gate_up, x.down))(w.layer(i))]
    mats.append(w.lm_head)
    flops_per_row = 2 * sum(m.numel() for m in mats)
    ways = {"linear": lambda x, m: F.linear(x, m), "w_xt": lambda x, m: torch.mm(m, x.t()).t()}
    rows = []
    for n in (1, 2, 3, 4, 8, 16, 32, 256):
        xs = {m.shape[1]: torch.randn(n, m.shape[1]) for m in mats}
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(5):
            for name, fn in ways.items():
                t = time.perf_counter()
                for m in mats:
                    fn(xs[m.shape[1]], m)
                times[name].append(time.perf_counter() - t)
        x = xs[mats[0].shape[1]]
        diff = (F.linear(x, mats[0]) - torch.mm(mats[0], x.t()).t()).abs().max().item()
        med = {k: sorted(v)[2] for k, v in times.items()}
        rows.append(
            {
                "rows": n,
                **{f"{k}_ms": round(v * 1e3, 1) for k, v in med.items()},
                "linear_gflops": round(flops_per_row * n / med["linear"] / 1e9, 1),
                "max_abs_diff": diff,
            }
        )
    print(json.dumps({"cpu": torch.backends.cpu.get_cpu_capability(), "passes": rows}))


if __name__ == "__main__":
    main()
