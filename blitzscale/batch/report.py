"""The numbers that end a batch: one row per run, as a rich table and as comparison.csv.

A row comes from the run's folder (summary.json, events.json), not from memory, so runs
done by an earlier batch and runs done now are compared the same way.
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.table import Table

from blitzscale.batch.outcome import RunOutcome
from blitzscale.batch.plan import BatchPlan

SCALE_PATHS = ("network", "host", "disk")


@dataclass(frozen=True)
class Row:
    """One run's comparison numbers; latencies in ms, None when the run has none."""

    run_id: str
    policy: str
    status: str
    num_ok: int | None
    num_requests: int | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tbt_p99_ms: float | None
    slo_ttft_ms: float | None
    slo_tbt_ms: float | None
    slo_attainment: float | None
    instance_seconds: float | None
    scale_ups: dict[str, int]
    error: str | None


def row_of(outcome: RunOutcome) -> Row:
    s = outcome.summary
    ups = Counter(str(e.get("path")) for e in outcome.events if e.get("direction") == "up")
    return Row(
        run_id=outcome.run.run_id,
        policy=outcome.run.policy,
        status=outcome.status,
        num_ok=s.num_ok if s else None,
        num_requests=s.num_requests if s else None,
        ttft_p50_ms=_ms(s.ttft_s.p50) if s else None,
        ttft_p99_ms=_ms(s.ttft_s.p99) if s else None,
        tbt_p99_ms=_ms(s.tbt_s.p99) if s else None,
        slo_ttft_ms=_ms(s.slo.ttft_s) if s else None,
        slo_tbt_ms=_ms(s.slo.tbt_s) if s else None,
        slo_attainment=s.slo_attainment if s else None,
        instance_seconds=s.gpu_seconds if s else None,
        scale_ups=dict(ups),
        error=outcome.error,
    )


def scale_paths(rows: list[Row]) -> list[str]:
    """The usual paths first, then any other path a run reported."""
    extra = sorted({p for r in rows for p in r.scale_ups} - set(SCALE_PATHS))
    return [*SCALE_PATHS, *extra]


def plan_table(plan: BatchPlan) -> Table:
    """What --dry-run shows: each run's id and what sets it apart."""
    t = Table(title=f"batch {plan.name!r}: {len(plan.runs)} runs")
    t.add_column("#", justify="right")
    t.add_column("run", overflow="fold")
    t.add_column("requests", justify="right")
    for col in plan.varied:
        t.add_column(col, overflow="fold")
    for i, run in enumerate(plan.runs, start=1):
        t.add_row(str(i), run.run_id, str(run.num_requests), *plan.varied_values(run).values())
    return t


def comparison_table(
    plan: BatchPlan, outcomes: list[RunOutcome], slo: str = "SLO judged as the first good run of its trace"
) -> Table:
    """A run is named by its number in `plan_table` and by what sets it apart (its varied
    values): whole ids would not fit a terminal. Headers wrap; values keep their width."""
    rows = [row_of(o) for o in outcomes]
    paths = [p for p in scale_paths(rows) if any(r.scale_ups.get(p) for r in rows)] or ["network"]
    names = ["#", *[n.rsplit(".", 1)[-1] for n in plan.varied]]
    numbers = ["ok", "TTFT p50", "TTFT p99", "TBT p99", "SLO", "inst-s", *[f"ups {p}" for p in paths]]
    cells = [_cells(i, o, r, plan, paths) for i, (o, r) in enumerate(zip(outcomes, rows, strict=True))]
    t = Table(title=f"batch {plan.name!r}: latencies in ms, {slo}")
    t.box = box.SIMPLE_HEAD
    for j, col in enumerate([*names, *numbers]):
        width = max((len(row[j]) for row in cells), default=1)
        is_number = j >= len(names) or col == "#"
        t.add_column(col, justify="right" if is_number else "left", min_width=width, overflow="fold")
    for row in cells:
        t.add_row(*row)
    return t


def _cells(i: int, outcome: RunOutcome, r: Row, plan: BatchPlan, paths: list[str]) -> list[str]:
    head = [str(i + 1), *plan.varied_values(outcome.run).values()]
    if r.status != "done":
        return [*head, r.status, *["-"] * (5 + len(paths))]
    return [
        *head,
        f"{r.num_ok}/{r.num_requests}",
        _fmt(r.ttft_p50_ms, ".0f"),
        _fmt(r.ttft_p99_ms, ".0f"),
        _fmt(r.tbt_p99_ms, ".0f"),
        _fmt(r.slo_attainment, ".0%"),
        _fmt(r.instance_seconds, ".1f"),
        *[str(r.scale_ups.get(p, 0)) for p in paths],
    ]


def write_comparison_csv(plan: BatchPlan, outcomes: list[RunOutcome], path: Path) -> None:
    rows = [row_of(o) for o in outcomes]
    paths = scale_paths(rows)
    header = ["run_id", "status", *plan.varied, "num_ok", "num_requests", "ttft_p50_ms", "ttft_p99_ms"]
    header += ["tbt_p99_ms", "slo_ttft_ms", "slo_tbt_ms", "slo_attainment", "instance_seconds"]
    header += [f"scale_ups_{p}" for p in paths] + ["error"]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for outcome, r in zip(outcomes, rows, strict=True):
            writer.writerow(
                [r.run_id, r.status, *plan.varied_values(outcome.run).values()]
                + [r.num_ok, r.num_requests, *_round(r.ttft_p50_ms, r.ttft_p99_ms, r.tbt_p99_ms)]
                + [
                    *_round(r.slo_ttft_ms, r.slo_tbt_ms),
                    *_round(r.slo_attainment, r.instance_seconds, digits=4),
                ]
                + [r.scale_ups.get(p, 0) if r.status == "done" else None for p in paths]
                + [r.error]
            )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _round(*values: float | None, digits: int = 2) -> list[float | None]:
    return [None if v is None else round(v, digits) for v in values]


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)
