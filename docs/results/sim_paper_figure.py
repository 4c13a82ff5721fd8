"""One figure of the paper's end-to-end comparison from a simulated batch
(`configs/batch.sim.paper*.toml`): per model and trace, each policy's TTFT p99 and SLO
attainment (means over the Gamma seeds, spread in brackets) and GPU-seconds, and the ratios
the paper reports, ours beside the paper's. Writes `table.md`, `figure.png` and
`figure.json` into the output folder and prints the table.

    blitzscale batch configs/batch.sim.paper.toml --simulate paper-a --out runs/paper-a
    .venv/bin/python docs/results/sim_paper_figure.py runs/paper-a docs/results/paper_a
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from blitzscale.client.record import read_records
from blitzscale.sim.compare import TailParts, tail_parts

POLICIES = ("blitz", "blitz-nolive", "network", "sllm", "allcache", "fixed-peak", "fixed-half")
# The paper's headline numbers (BlitzScale, OSDI'25, section 8: real traces on its clusters):
# tail TTFT 47-75% below ServerlessLLM's (75.5% on BurstGPT), 21% below AllCache's on
# BurstGPT, and the SLO attainment of peak provisioning (DistServe "full") with 49-50% less
# GPU time.
PAPER = {
    "p99 blitz / sllm": "0.25-0.53",
    "p99 blitz / allcache": "0.79 (BurstGPT)",
    "GPU-s blitz / fixed-peak": "0.50-0.51",
    "SLO blitz - fixed-peak (points)": "~0",
}


def _stat(rows: list[dict[str, str]], key: str, scale: float = 1.0) -> tuple[float, float, float]:
    vals = [scale * float(r[key]) for r in rows]
    return statistics.mean(vals), min(vals), max(vals)


def _trace_label(trace: dict[str, object]) -> str:
    """A run's trace as the tables name it (its seeds averaged together)."""
    path = str(trace["path"])
    if "cv" in trace:
        return f"azure slice, gamma cv{float(trace['cv']):g}"  # type: ignore[arg-type]
    if "mooncake" in path:
        return "mooncake slice"
    name = "azure code, whole hour" if path.endswith("azure_code_2023.csv") else Path(path).name
    rate = float(trace.get("rate_scale", 1.0))  # type: ignore[arg-type]
    return name if rate == 1.0 else f"{name} x{rate:g}"


BREAKDOWN = ("blitz", "blitz-nolive", "sllm")  # the policies whose tails are broken down
PARTS = ("input_tokens", "queue_ms", "router_queue_ms", "load_ms", "relay_ms", "compute_ms")


def _tail(batch_dir: Path, runs: list[dict[str, str]]) -> dict[str, float]:
    """The tail's parts (`TailParts`: the slowest 1%), means over runs; with the runs' mean
    TBT p99 and their scale-ups from disk against all loads (host and disk)."""
    tails: list[TailParts] = [
        tail_parts(read_records(batch_dir / r["run_id"] / "requests.jsonl")) for r in runs
    ]
    out = {k: statistics.mean(getattr(t, k) for t in tails) for k in PARTS}
    out["tbt_p99_ms"] = statistics.mean(float(r["tbt_p99_ms"]) for r in runs)
    out["disk_loads"] = sum(int(r.get("scale_ups_disk") or 0) for r in runs)
    out["host_or_disk_loads"] = out["disk_loads"] + sum(int(r.get("scale_ups_host") or 0) for r in runs)
    return out


def main(batch_dir: str, out_dir: str) -> None:
    with open(Path(batch_dir) / "comparison.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "done"]
    # (the CSV has a column only for what varies: a one-model batch's model is in batch.json)
    params = {r["id"]: r["params"] for r in json.loads((Path(batch_dir) / "batch.json").read_text())["runs"]}
    for r in rows:
        r.setdefault("model", params[r["run_id"]]["model"])
    groups: dict[tuple[str, str], dict[str, list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(r["model"].split(":")[-1], _trace_label(params[r["run_id"]]["trace"]))][r["policy"]].append(r)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        "| model | trace | " + " | ".join(POLICIES) + " |",
        "|---" * (2 + len(POLICIES)) + "|",
    ]
    ratios = [
        "| model | trace | " + " | ".join(f"{k} (paper: {v})" for k, v in PAPER.items()) + " |",
        "|---" * (2 + len(PAPER)) + "|",
    ]
    breakdown = [
        "| model | trace | policy | TTFT p99 (ms) | tail prompt tokens"
        " | queue (router's) | load wait | relay | compute | TBT p99 | loads from disk |",
        "|---" * 11 + "|",
    ]
    figures: list[dict[str, object]] = []
    cases = sorted(groups)
    fig, axes = plt.subplots(2, len(cases), figsize=(4.5 * len(cases), 6.5), squeeze=False)
    for col, case in enumerate(cases):
        by = groups[case]
        cells, stats = [], {}
        for pol in POLICIES:
            rs = by.get(pol, [])
            if not rs:
                cells.append("-")
                continue
            p99, att, gpu = (
                _stat(rs, "ttft_p99_ms"),
                _stat(rs, "slo_attainment", 100),
                _stat(rs, "instance_seconds"),
            )
            stats[pol] = {"ttft_p99_ms": p99, "slo_pct": att, "gpu_s": gpu, "runs": len(rs)}
            spread = f" ({p99[1]:,.0f}-{p99[2]:,.0f})" if len(rs) > 1 else ""
            cells.append(f"{p99[0]:,.0f}{spread} ms, {att[0]:.1f}%, {gpu[0]:,.0f} GPU-s")
        lines.append(f"| {case[0]} | {case[1]} | " + " | ".join(cells) + " |")

        def ratio(
            a: str, b: str, key: str, s: dict[str, dict[str, tuple[float, float, float]]] = stats
        ) -> str:
            return f"{s[a][key][0] / s[b][key][0]:.2f}" if a in s and b in s and s[b][key][0] else "-"

        diff = (
            f"{stats['blitz']['slo_pct'][0] - stats['fixed-peak']['slo_pct'][0]:+.1f}"
            if "blitz" in stats and "fixed-peak" in stats
            else "-"
        )
        ours = {
            "p99 blitz / sllm": ratio("blitz", "sllm", "ttft_p99_ms"),
            "p99 blitz / allcache": ratio("blitz", "allcache", "ttft_p99_ms"),
            "GPU-s blitz / fixed-peak": ratio("blitz", "fixed-peak", "gpu_s"),
            "SLO blitz - fixed-peak (points)": diff,
        }
        ratios.append(f"| {case[0]} | {case[1]} | " + " | ".join(ours.values()) + " |")
        tails = {pol: _tail(Path(batch_dir), by[pol]) for pol in BREAKDOWN if by.get(pol)}
        for pol, t in tails.items():
            q = f"{t['queue_ms']:,.0f} ({t['router_queue_ms']:,.0f})"
            parts = " | ".join([q, *(f"{t[k]:,.0f}" for k in PARTS[3:]), f"{t['tbt_p99_ms']:,.0f}"])
            parts += f" | {t['disk_loads']:.0f} of {t['host_or_disk_loads']:.0f}"
            p99 = stats[pol]["ttft_p99_ms"][0]
            breakdown.append(
                f"| {case[0]} | {case[1]} | {pol} | {p99:,.0f} | {t['input_tokens']:,.0f} | {parts} |"
            )
        figures.append(
            {
                "model": case[0],
                "trace": case[1],
                "policies": stats,
                "ratios": ours,
                "paper": PAPER,
                "tails": tails,
            }
        )
        for row, (key, name) in enumerate(
            (("ttft_p99_ms", "TTFT p99 (ms)"), ("slo_pct", "SLO attainment (%)"))
        ):
            ax = axes[row][col]
            pols = [p for p in POLICIES if p in stats]
            mean = [stats[p][key][0] for p in pols]
            err = [
                [m - stats[p][key][1] for p, m in zip(pols, mean, strict=True)],
                [stats[p][key][2] - m for p, m in zip(pols, mean, strict=True)],
            ]
            ax.bar(range(len(pols)), mean, yerr=err, color=["C0" if p == "blitz" else "C7" for p in pols])
            ax.set_xticks(range(len(pols)), pols, rotation=45, ha="right", fontsize=7)
            ax.set_ylabel(name)
            if row == 0:
                paper = PAPER["p99 blitz / sllm"]
                note = f"p99 blitz/sllm {ours['p99 blitz / sllm']} (paper {paper})"
                ax.set_title(f"{case[0]}, {case[1]}\n{note}", fontsize=8)
            else:
                paper = PAPER["GPU-s blitz / fixed-peak"]
                note = f"GPU-s blitz/fixed-peak {ours['GPU-s blitz / fixed-peak']} (paper {paper})"
                ax.set_title(note, fontsize=8)
    fig.suptitle(f"{Path(batch_dir).name}: simulated, means over seeds (bars: spread)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "figure.png", dpi=110)
    note = (
        "Tail breakdown: the slowest 1% of each run (from the rank its p99 TTFT falls at),"
        " mean ms of each part"
        " (queue: router and instance; load wait: for the instance that took it to load, or"
        " on a live target for its next layers;"
        " relay: hidden states to the partner; compute: the rest), means over seeds; TBT p99"
        " (ms, mean over seeds); loads from disk: the policy's scale-ups that read the SSD, of"
        " those from host memory or disk, all seeds."
    )
    table = (
        "\n".join(lines) + "\n\n" + "\n".join(ratios) + "\n\n" + note + "\n\n" + "\n".join(breakdown) + "\n"
    )
    (out / "table.md").write_text(table)
    (out / "figure.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(table)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
