"""The table of `configs/batch.sim.live_split.toml`'s runs: per model and trace, blitz with
the greedy live split against blitz with the integer program (control/live_split.py), and
blitz-nolive for reference: TTFT p50 / p99 and SLO attainment as means over the seeds
(spread in brackets), GPU-seconds, relays, and the program's solve times (wall, on the
machine that ran the batch). Prints markdown; writes the figures as JSON.

    blitzscale batch configs/batch.sim.live_split.toml --simulate paper-a --out runs/sim-live-split
    .venv/bin/python docs/results/sim_live_split_table.py runs/sim-live-split \
        docs/results/sim_live_split.json
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

CASES = (("blitz", "greedy"), ("blitz", "ilp"), ("blitz-nolive", "greedy"))


def _mean(rows: list[dict[str, str]], key: str, scale: float = 1.0) -> dict[str, float]:
    vals = [scale * float(r[key]) for r in rows]
    return {"mean": round(statistics.mean(vals), 2), "min": round(min(vals), 2), "max": round(max(vals), 2)}


def main(batch_dir: str, out_json: str) -> None:
    root = Path(batch_dir)
    with open(root / "comparison.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "done"]
    groups: dict[tuple[str, str, str, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        trace = "azure slice, gamma cv2" if "gamma" in r["trace"] else "mooncake slice"
        groups[(r["model"].split(":")[-1], trace, r["policy"], r["router.live_split"])].append(r)
    out: list[dict[str, object]] = []
    lines = [
        "| model | trace | run | TTFT p50 ms | TTFT p99 ms | SLO % | GPU-s | relays "
        "| solves: n, p50 / p99 / max ms, fallbacks |",
        "|---" * 9 + "|",
    ]
    for model, trace in sorted({(m, t) for m, t, _, _ in groups}):
        for policy, split in CASES:
            rs = groups.get((model, trace, policy, split), [])
            if not rs:
                continue
            files = [root / r["run_id"] / "live_split.json" for r in rs]
            solves = [json.loads(p.read_text()) for p in files if p.is_file()]
            row = {
                "model": model,
                "trace": trace,
                "policy": policy,
                "live_split": split,
                "runs": len(rs),
                "ttft_p50_ms": _mean(rs, "ttft_p50_ms"),
                "ttft_p99_ms": _mean(rs, "ttft_p99_ms"),
                "slo_attainment_pct": _mean(rs, "slo_attainment", 100.0),
                "gpu_seconds": _mean(rs, "instance_seconds"),
                "solves": solves,
            }
            out.append(row)
            p50, p99, att = row["ttft_p50_ms"], row["ttft_p99_ms"], row["slo_attainment_pct"]
            relays = sum(s.get("relays", 0) for s in solves)
            if any("split_solves" in s and s["split_solves"] for s in solves):
                solves = [s for s in solves if s.get("split_solves")]
                n = sum(s["split_solves"] for s in solves)
                worst = max(s["split_solve_ms_p99"] for s in solves)
                top = max(s["split_solve_ms_max"] for s in solves)
                med = statistics.median(s["split_solve_ms_p50"] for s in solves)
                falls = sum(s["split_fallbacks"] for s in solves)
                solve = f"{n}, {med:.1f} / {worst:.1f} / {top:.1f}, {falls}"
            else:
                solve = "-"
            lines.append(
                f"| {model} | {trace} | {policy} {split if policy == 'blitz' else ''} "
                f"| {p50['mean']:,.0f} | {p99['mean']:,.0f} ({p99['min']:,.0f}-{p99['max']:,.0f}) "
                f"| {att['mean']:.1f} ({att['min']:.1f}-{att['max']:.1f}) "
                f"| {row['gpu_seconds']['mean']:,.0f} | {relays or '-'} | {solve} |"
            )
    print("\n".join(lines))
    Path(out_json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
