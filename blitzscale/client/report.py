"""Plots of a replay and one self-contained HTML page (PNGs inlined) to share a run as a file.

Figures are built on matplotlib's Agg canvas directly, never through pyplot, so making a
report needs no display and touches no global backend state. Times on the x axis are the
replay clock (`send_s`); instance samples and scale events must be on that clock too.
"""

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from blitzscale.client.record import RequestRecord
from blitzscale.client.summary import Summary, tbt_values

EventJSON = Mapping[str, Any]  # a ScaleEvent's JSON (serve/events.py), or a server watch's

_DIRECTION_COLORS = {"up": "tab:green", "down": "tab:red"}
_PATH_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1)))


def _new_figure() -> tuple[Figure, Axes]:
    fig = Figure(figsize=(8, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def plot_ttft_over_time(
    records: Sequence[RequestRecord],
    path: Path,
    instance_samples: Sequence[tuple[float, int]] | None = None,
    scale_events: Sequence[EventJSON] | None = None,
) -> Path:
    """TTFT of each successful request at its send time; the instance count as a step line on
    a second y axis sharing the time axis, so latency spikes line up with scaling."""
    fig, ax = _new_figure()
    ok = [r for r in records if r.is_ok and r.ttft_s is not None]
    ax.scatter([r.send_s for r in ok], [r.ttft_s * 1000 for r in ok], s=6, label="TTFT")
    failed = [r.send_s for r in records if not r.is_ok]
    if failed:
        ax.scatter(failed, [0.0] * len(failed), s=12, marker="x", color="tab:red", label="failed")
    ax.set_xlabel("send time (s)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_ylim(0, 1.1 * max((r.ttft_s * 1000 for r in ok), default=1.0))
    handles, labels = ax.get_legend_handles_labels()
    if instance_samples:
        twin = ax.twinx()
        times, counts = zip(*sorted(instance_samples), strict=True)
        twin.step(times, counts, where="post", color="tab:orange", label="instances")
        twin.set_ylabel("instances")
        twin.set_ylim(bottom=0)
        twin.yaxis.set_major_locator(MaxNLocator(integer=True))
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    paths: list[str] = []  # line style by transfer path (nvlink, rdma, ssd...), colour by direction
    for event in scale_events or ():
        path_name = str(event.get("path", "?"))
        paths += [] if path_name in paths else [path_name]
        label = f"scale {event.get('direction', '?')} ({path_name})"
        color = _DIRECTION_COLORS.get(str(event.get("direction")), "tab:gray")
        style = _PATH_STYLES[paths.index(path_name) % len(_PATH_STYLES)]
        line = ax.axvline(float(event["time"]), color=color, linestyle=style, linewidth=1)
        if label not in labels:
            handles, labels = [*handles, line], [*labels, label]
    # Below the plot: inside it would hide the points or the instance line.
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4, fontsize="small")
    ax.set_title("TTFT over time")
    return _save(fig, path)


def plot_cdf(values_ms: Sequence[float], path: Path, name: str) -> Path:
    """Empirical CDF: the share of values <= x, where the tail that SLOs care about is visible."""
    fig, ax = _new_figure()
    if len(values_ms):
        xs = np.sort(np.asarray(values_ms, dtype=float))
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post")
    ax.set_xlabel(f"{name} (ms)")
    ax.set_ylabel("fraction of samples")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"CDF of {name}")
    return _save(fig, path)


StateSample = tuple[float, Mapping[str, int]]  # (time, instances by state)


@dataclass(frozen=True)
class ReportInfo:
    """What a report says about its run besides the numbers: whose run it was, what the
    instance time is counted in, and the configuration it ran with."""

    title: str = "BlitzScale replay report"
    policy: str = ""
    instance_time: str = "GPU-seconds"  # "instance-seconds" on CPU workers
    config_toml: str = ""
    state_samples: Sequence[StateSample] = ()


def plot_states(samples: Sequence[StateSample], path: Path) -> Path:
    """Instances over time, one step line per state (serving states and loading ones)."""
    fig, ax = _new_figure()
    times = [t for t, _ in samples]
    states = sorted({s for _, counts in samples for s, n in counts.items() if n})
    for state in states:
        ax.step(times, [counts.get(state, 0) for _, counts in samples], where="post", label=state)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("instances")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if states:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4, fontsize="small")
    ax.set_title("instances over time, by state")
    return _save(fig, path)


def write_report(
    out_dir: Path,
    records: Sequence[RequestRecord],
    summary: Summary,
    instance_samples: Sequence[tuple[float, int]] | None = None,
    scale_events: Sequence[EventJSON] | None = None,
    info: ReportInfo | None = None,
) -> Path:
    """Write ttft_over_time.png, ttft_cdf.png, tbt_cdf.png (instances_by_state.png when
    `info` has state samples) and report.html into out_dir."""
    info = info or ReportInfo()
    out_dir.mkdir(parents=True, exist_ok=True)
    ttfts_ms = [r.ttft_s * 1000 for r in records if r.is_ok and r.ttft_s is not None]
    pngs = [
        plot_ttft_over_time(records, out_dir / "ttft_over_time.png", instance_samples, scale_events),
        plot_cdf(ttfts_ms, out_dir / "ttft_cdf.png", "TTFT"),
        plot_cdf([g * 1000 for g in tbt_values(records)], out_dir / "tbt_cdf.png", "TBT"),
    ]
    if info.state_samples:
        pngs.append(plot_states(info.state_samples, out_dir / "instances_by_state.png"))
    page = out_dir / "report.html"
    images = {p.name: p.read_bytes() for p in pngs}
    page.write_text(render_html(summary, images, list(scale_events or ()), info), encoding="utf-8")
    return page


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def key_rows(summary: Summary, info: ReportInfo) -> list[tuple[str, str]]:
    """The figures the console shows, with their units."""
    s, slo = summary, summary.slo
    pct = "-" if s.slo_attainment is None else f"{100 * s.slo_attainment:.1f}%"
    return [
        ("requests (ok / sent)", f"{s.num_ok} / {s.num_requests}"),
        ("TTFT mean / p50 / p90 / p99 (ms)", " / ".join(_ms(x) for x in astuple(s.ttft_s))),
        ("TBT mean / p50 / p90 / p99 (ms)", " / ".join(_ms(x) for x in astuple(s.tbt_s))),
        (
            "SLO: TTFT / TBT (ms)",
            f"{_ms(slo.ttft_s)} ({slo.ttft_rule}) / {_ms(slo.tbt_s)} ({slo.tbt_rule})",
        ),
        ("SLO attainment", pct),
        (info.instance_time, "-" if s.gpu_seconds is None else f"{s.gpu_seconds:.1f}"),
        ("span (s)", f"{s.span_s:.1f}"),
        ("throughput (requests/s, output tokens/s)", f"{s.requests_per_s:.2f}, {s.output_tokens_per_s:.1f}"),
    ]


def event_rows(events: Sequence[EventJSON]) -> list[list[str]]:
    """One row per scale event: when, direction, path, ranks, sources, duration, MB."""
    rows = []
    for e in events:
        rows.append(
            [
                f"{float(e.get('time', 0.0)):.2f}",
                str(e.get("direction", "")),
                str(e.get("path", "")),
                " ".join(map(str, e.get("ranks", []))),
                " ".join(map(str, e.get("sources", []))) or "-",
                f"{float(e.get('seconds', 0.0)):.3f}",
                f"{float(e.get('bytes', 0)) / 1e6:.0f}",
            ]
        )
    return rows


def summary_rows(summary: Summary) -> list[tuple[str, str]]:
    """The summary flattened to (dotted key, printable value) rows, in field order."""
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        elif isinstance(value, float):
            rows.append((prefix, f"{value:.4g}"))
        else:
            rows.append((prefix, "-" if value is None else str(value)))

    walk("", summary.to_json())
    return rows


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "\n".join(  # the first cell names the row
        f"<tr><th>{html.escape(row[0])}</th>"
        + "".join(f"<td>{html.escape(c)}</td>" for c in row[1:])
        + "</tr>"
        for row in rows
    )
    return f"<table>\n<tr>{th}</tr>\n{body}\n</table>"


def render_html(
    summary: Summary,
    images: Mapping[str, bytes],
    events: Sequence[EventJSON] = (),
    info: ReportInfo | None = None,
) -> str:
    """One HTML page with no outside references: key figures with units, the scale events,
    every summary field (seconds), the plots (PNG data: URIs) and the configuration."""
    info = info or ReportInfo()
    title = f"{info.title}: {info.policy}" if info.policy else info.title
    keys = _table(("", "value"), key_rows(summary, info))
    head = ("time (s)", "direction", "path", "ranks", "from", "duration (s)", "MB")
    ev = _table(head, event_rows(events)) if events else "<p>none</p>"
    full = _table(("field (seconds where a time)", "value"), summary_rows(summary))
    figures = "\n".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(data).decode("ascii")}"><figcaption>{html.escape(name)}</figcaption></figure>'
        for name, data in images.items()
    )
    config = f"<h2>Configuration</h2>\n<pre>{html.escape(info.config_toml)}</pre>" if info.config_toml else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:2px 8px;text-align:left}}img{{max-width:100%}}</style>
</head><body>
<h1>{html.escape(title)}</h1>
<h2>Key figures</h2>
{keys}
<h2>Scale events</h2>
{ev}
<h2>Plots</h2>
{figures}
<h2>Every summary field</h2>
{full}
{config}
</body></html>
"""
