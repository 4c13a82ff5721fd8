"""Where a simulated run's GPU time goes: GPU-seconds by instance state (the run's 1 s
samples of instances by state, times the model's GPUs an instance), blitz against
fixed-half sized from blitz's peak, on one Gamma draw of the shipped Azure slice. The
breakdown behind docs/benchmarks.md's GPU-time row (24B TP2 on paper-a, seed 0).

Run (repo root): `.venv/bin/python docs/results/sim_gpu_time_by_state.py [--preset paper-a]
[--model mistral-24b] [--seed 0]`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blitzscale.batch.traces import TraceSpec, load_requests
from blitzscale.sim.config import load_model, load_preset
from blitzscale.sim.runner import SimResult, SimSetup, fixed_counts, simulate

SLICE = Path(__file__).resolve().parents[2] / "blitzscale" / "data" / "azure_code_2023_slice.csv"


def by_state(res: SimResult, gpus_per_instance: int) -> dict[str, float]:
    """GPU-seconds per state; INACTIVE instances hold no GPU and are left out."""
    out: Counter[str] = Counter()
    for (t0, states), (t1, _) in zip(res.states, res.states[1:], strict=False):
        for state, n in states.items():
            if state != "inactive":
                out[state] += n * (t1 - t0) * gpus_per_instance
    return {k: round(v, 1) for k, v in out.most_common()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="paper-a")
    p.add_argument("--model", default="mistral-24b")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    model = load_model(a.model)
    setup = SimSetup(preset=load_preset(a.preset), model=model)
    requests = load_requests(TraceSpec(path="demo", format="azure", cv=2.0, seed=a.seed, file=SLICE))
    blitz = simulate(setup, requests, "blitz")
    half = simulate(replace(setup, fixed=fixed_counts(blitz.peak, "fixed-half")), requests, "fixed-half")
    print(
        json.dumps(
            {
                name: {
                    "gpu_seconds": round(r.gpu_seconds, 1),
                    "peak_instances": list(r.peak),
                    "span_s": round(r.states[-1][0], 1),
                    "by_state_gpu_s": by_state(r, model.tp),
                }
                for name, r in (("blitz", blitz), ("fixed-half", half))
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
