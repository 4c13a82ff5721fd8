"""One simulated run's scale-ups: when each ended (seconds from the trace's start), its
path, targets, sources and how long it took: the reading behind docs/benchmarks.md's
"Chains by link" (24B on paper-a) and why the network policies lose to host loads on
cluster B (8B on paper-b: every load from the one decode instance, queued behind the last).

Run (repo root): `.venv/bin/python docs/results/sim_scale_events.py [--preset paper-b]
[--model llama3-8b] [--policy blitz] [--trace FILE --format FMT] [--cv 2 --seed 0]`.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blitzscale.batch.traces import TraceSpec, load_requests
from blitzscale.sim.config import load_model, load_preset
from blitzscale.sim.runner import SimSetup, simulate

SLICE = Path(__file__).resolve().parents[2] / "blitzscale" / "data" / "azure_code_2023_slice.csv"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="paper-b")
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--policy", default="blitz")
    p.add_argument("--trace", default=str(SLICE))
    p.add_argument("--format", default="azure")
    p.add_argument("--cv", type=float, help="re-time with Gamma arrivals of this CV (as a batch trace)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    spec = TraceSpec(path=a.trace, format=a.format, cv=a.cv, seed=a.seed, file=Path(a.trace))
    setup = SimSetup(preset=load_preset(a.preset), model=load_model(a.model))
    res = simulate(setup, load_requests(spec), a.policy)
    ups = [
        {
            "ended_s": round(e.time, 3),
            "path": e.path,
            "targets": list(e.ranks),
            "sources": list(e.sources),
            "seconds": round(e.seconds, 3),
        }
        for e in res.events
        if e.is_up
    ]
    print(json.dumps({"preset": a.preset, "model": a.model, "policy": a.policy, "scale_ups": ups}, indent=1))


if __name__ == "__main__":
    main()
