"""The table and the figure of `configs/batch.sim.slo_band.toml`'s runs: per model, trace,
band and policy, TTFT p99 and SLO attainment as means over the seeds (spread in brackets),
GPU-seconds; a PNG of p99 and attainment, typed band against the band from the SLO.

    blitzscale batch configs/batch.sim.slo_band.toml --simulate paper-a --out runs/sim-slo-band
    .venv/bin/python docs/results/sim_slo_band_plot.py runs/sim-slo-band/comparison.csv \
        docs/results/sim_slo_band
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

POLICIES = ("blitz", "blitz-nolive", "sllm", "fixed")
BANDS = {"0.7": "typed 0.5/0.7", "0": "from SLO"}


def main(csv_path: str, out_dir: str) -> None:
    groups: dict[tuple[str, str, str, str], list[dict[str, str]]] = defaultdict(list)
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        trace = "azure slice, gamma cv2" if "gamma" in r["trace"] else "mooncake slice"
        groups[(r["model"].split(":")[-1], trace, r["planner.prefill_upper"], r["policy"])].append(r)
    cases = sorted({(m, t) for m, t, _, _ in groups})
    lines = ["| model | trace | band | " + " | ".join(POLICIES) + " |", "|---" * (3 + len(POLICIES)) + "|"]
    fig, axes = plt.subplots(2, len(cases), figsize=(4 * len(cases), 6), squeeze=False)
    for col, (model, trace) in enumerate(cases):
        for band, label in BANDS.items():
            cells = []
            for pol in POLICIES:
                rs = groups[(model, trace, band, pol)]
                p99 = [float(r["ttft_p99_ms"]) for r in rs]
                att = [100 * float(r["slo_attainment"]) for r in rs]
                gpu = statistics.mean(float(r["instance_seconds"]) for r in rs)
                spread = f" ({min(p99):,.0f}-{max(p99):,.0f})" if len(rs) > 1 else ""
                cells.append(
                    f"{statistics.mean(p99):,.0f}{spread} ms, {statistics.mean(att):.1f}%, {gpu:,.0f} GPU-s"
                )
            lines.append(f"| {model} | {trace} | {label} | " + " | ".join(cells) + " |")
        for row, (key, name) in enumerate(
            (("ttft_p99_ms", "TTFT p99 (ms)"), ("slo_attainment", "SLO attainment"))
        ):
            ax = axes[row][col]
            for i, (band, label) in enumerate(BANDS.items()):
                vals = [
                    statistics.mean(float(r[key]) for r in groups[(model, trace, band, pol)])
                    for pol in POLICIES
                ]
                ax.bar([x + 0.4 * i for x in range(len(POLICIES))], vals, width=0.4, label=label)
            ax.set_xticks([x + 0.2 for x in range(len(POLICIES))], POLICIES, fontsize=8)
            ax.set_ylabel(name)
            if row == 0:
                ax.set_title(f"{model}\n{trace}", fontsize=9)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(out_dir) / "sim_slo_band.png", dpi=90)
    print("\n".join(lines))


if __name__ == "__main__":
    main(*sys.argv[1:3])
