"""The side-by-side table that ends the demo."""

from __future__ import annotations

from collections import Counter

from rich.table import Table

from blitzscale.client.summary import summarize
from blitzscale.demo.result import RunResult
from blitzscale.serve.events import ScaleEvent


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def comparison_table(results: list[RunResult]) -> Table:
    slo = results[0].summary.slo if results else None
    judged = f"TTFT <= {_ms(slo.ttft_s)} ms, mean TBT <= {_ms(slo.tbt_s)} ms" if slo else ""
    t = Table(title=f"policies side by side (same requests; SLOs: {judged})")
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
        ("instance-seconds (CPU)", [_num(r.summary.gpu_seconds) for r in results]),
    ]
    for path in ("network", "host", "disk"):
        rows.append((f"scale-ups via {path}", [str(Counter(e.path for e in _ups(r))[path]) for r in results]))
    rows.append(("mean load time (s)", [_mean([e.seconds for e in _ups(r)]) for r in results]))
    rows.append(("live: requests / layers / relays", [" / ".join(map(str, r.live)) for r in results]))
    if any(r.paced[0] for r in results):
        rows.append(("paced steps (over reference)", [_paced(r) for r in results]))
        rows.append(("real compute / paced time", [_compute_share(r) for r in results]))
    for name, values in rows:
        t.add_row(name, *values)
    return t


def _ups(r: RunResult) -> list[ScaleEvent]:
    return [e for e in r.events if e.is_up]


def _paced(r: RunResult) -> str:
    steps, over = r.paced[0], r.paced[1]
    return f"{steps} ({over / steps:.0%})" if steps else "-"


def _compute_share(r: RunResult) -> str:
    return f"{r.paced[2] / r.paced[3]:.0%}" if r.paced[3] else "-"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _mean(xs: list[float]) -> str:
    return f"{sum(xs) / len(xs):.2f}" if xs else "-"


def verdict(results: list[RunResult]) -> str:
    """One line: how the first policy did against each other one, on tail TTFT and SLO
    attainment (the paper's headline figures)."""
    if len(results) < 2:
        return ""
    first = results[0]
    parts = []
    for other in results[1:]:
        a, b = first.summary.ttft_s.p99, other.summary.ttft_s.p99
        sa, sb = first.summary.slo_attainment, other.summary.slo_attainment
        if a is None or b is None or sa is None or sb is None:
            parts.append(f"{first.policy} vs {other.policy}: no comparison (a run had no successful request)")
            continue
        change = f"{(a - b) * 1000:+.0f} ms, {100 * (a - b) / b:+.0f}%"
        better = a < b and sa >= sb
        worse = a > b and sa <= sb
        word = "better" if better else "worse" if worse else "mixed"
        parts.append(
            f"{first.policy} vs {other.policy}: TTFT p99 {_ms(a)} vs {_ms(b)} ms ({change}), "
            f"SLO attainment {_pct(sa)} vs {_pct(sb)} ({100 * (sa - sb):+.0f} points): "
            f"{first.policy} is {word}"
        )
    return "verdict: " + "; ".join(parts)


OVERRUN_NOTE = 0.2  # a larger share of paced steps over their reference: the pacing did not hold


def overran(r: RunResult) -> float:
    """The share of a run's paced steps that took longer than their reference (0: none,
    or not paced)."""
    return r.paced[1] / r.paced[0] if r.paced[0] else 0.0


def pacing_held(r: RunResult) -> bool:
    return overran(r) <= OVERRUN_NOTE


def pacing_note(results: list[RunResult]) -> str:
    """A warning when many paced steps took longer than their reference: the machine was
    busier than the pacing leaves room for, so the instances shared its cores after all."""
    over = [f"{r.policy} {overran(r):.0%}" for r in results if not pacing_held(r)]
    if not over:
        return ""
    return (
        f"note: paced steps longer than their reference: {', '.join(over)} (over {OVERRUN_NOTE:.0%}): "
        "the machine was busier than the pacing leaves room for, so the instances shared its cores "
        "and the verdict says less; run it on a quieter machine, or pace slower (--pace reference:F)"
    )


def models_table(results: list[RunResult]) -> Table | None:
    """Several models: per model and policy, what its requests saw and how it was loaded
    (back from zero: from a host copy, over the network, or from disk)."""
    names = [n for n in (results[0].by_model if results else {})]
    if not names:
        return None
    t = Table(title="each model (its own slice of the trace, twice; idle in between)")
    t.add_column("model")
    t.add_column("")
    for r in results:
        t.add_column(r.policy, justify="right")
    for name in names:
        sums = [summarize(r.by_model.get(name, [])) for r in results]
        mine = [[e for e in r.events if e.model == name] for r in results]
        rows = [
            ("requests ok", [f"{s.num_ok}/{s.num_requests}" for s in sums]),
            ("TTFT p50 / p90 (ms)", [f"{_ms(s.ttft_s.p50)} / {_ms(s.ttft_s.p90)}" for s in sums]),
            ("releases", [str(sum(1 for e in ev if e.direction == "down")) for ev in mine]),
        ]
        for path in ("network", "host", "disk"):
            counts = [str(sum(1 for e in ev if e.is_up and e.path == path)) for ev in mine]
            rows.append((f"loads via {path}", counts))
        for k, (label, values) in enumerate(rows):
            t.add_row(name if k == 0 else "", label, *values)
    return t
