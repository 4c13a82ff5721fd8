"""comparison.png: TTFT p99 of every run as a bar, runs of one policy side by side.

Drawn on matplotlib's Agg canvas directly (no pyplot), like the replay report, so a batch
on a headless machine needs no display and leaves no global backend state behind.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from blitzscale.batch.outcome import RunOutcome
from blitzscale.batch.report import row_of

_GAP = 0.8  # blank space between two policies' groups, in bar widths


def write_comparison_png(outcomes: list[RunOutcome], path: Path) -> Path:
    """Failed runs keep their slot with an "x" on the axis, so a gap is not mistaken for 0 ms."""
    policies = list(dict.fromkeys(o.run.policy for o in outcomes))
    fig = Figure(figsize=(max(6.0, 0.6 * len(outcomes) + 2), 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(policies))]
    number = {o.run.run_id: i for i, o in enumerate(outcomes, start=1)}  # as in the tables
    ticks: list[float] = []
    labels: list[str] = []
    x = 0.0
    for policy, color in zip(policies, colors, strict=True):
        group = [row_of(o) for o in outcomes if o.run.policy == policy]
        xs = [x + i for i in range(len(group))]
        heights = [r.ttft_p99_ms or 0.0 for r in group]
        ax.bar(xs, heights, width=0.8, color=color, label=policy)
        failed = [xi for xi, r in zip(xs, group, strict=True) if r.status != "done"]
        if failed:
            ax.scatter(failed, [0.0] * len(failed), marker="x", color="tab:red", zorder=3)
        ticks += xs
        labels += [f"#{number[r.run_id]} {_short(r.run_id, policy)}" for r in group]
        x += len(group) + _GAP
    ax.set_xticks(ticks, labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("TTFT p99 (ms)")
    ax.set_title("TTFT p99 per run, grouped by policy")
    if policies:
        ax.legend(title="policy")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _short(run_id: str, policy: str) -> str:
    """The id without the policy (the bar's colour says it) and without the hash."""
    slug = run_id.rsplit("_", 1)[0]
    prefix = policy.replace("_", "-") + "_"
    rest = slug[len(prefix) :] if slug.startswith(prefix) else slug
    return rest or policy
