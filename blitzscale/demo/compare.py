"""The side-by-side table that ends the demo."""

from __future__ import annotations

from collections import Counter

from rich.table import Table

from blitzscale.demo.runner import RunResult


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def comparison_table(results: list[RunResult]) -> Table:
    t = Table(title="policies side by side (same requests, same SLOs)")
    t.add_column("")
    for r in results:
        t.add_column(r.policy, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("requests ok", [f"{r.summary.num_ok}/{r.summary.num_requests}" for r in results]),
        ("TTFT p50 (ms)", [_ms(r.summary.ttft_s.p50) for r in results]),
        ("TTFT p90 (ms)", [_ms(r.summary.ttft_s.p90) for r in results]),
        ("TTFT p99 (ms)", [_ms(r.summary.ttft_s.p99) for r in results]),
        ("TBT p99 (ms)", [_ms(r.summary.tbt_s.p99) for r in results]),
        ("SLO attainment", [_pct(r.summary.slo_attainment) for r in results]),
        ("instance-seconds", [_num(r.summary.gpu_seconds) for r in results]),
    ]
    for path in ("network", "host", "disk"):
        rows.append(
            (f"scale-ups via {path}", [str(Counter(e["path"] for e in _ups(r))[path]) for r in results])
        )
    rows.append(("mean load time (s)", [_mean([e["seconds"] for e in _ups(r)]) for r in results]))
    rows.append(("live: requests / layers / relays", [" / ".join(map(str, r.live)) for r in results]))
    for name, values in rows:
        t.add_row(name, *values)
    return t


def _ups(r: RunResult) -> list[dict]:
    return [e for e in r.events if e["direction"] == "up"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _mean(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.2f}" if xs else "-"
