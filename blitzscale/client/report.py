"""Plots of a replay and one self-contained HTML page (PNGs inlined) to share a run as a file.

Figures are built on matplotlib's Agg canvas directly, never through pyplot, so making a
report needs no display and touches no global backend state. Times on the x axis are the
replay clock (`send_s`); instance samples and scale events must be on that clock too.
"""

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from blitzscale.client.record import RequestRecord
from blitzscale.client.summary import Summary, tbt_values

ScaleEvent = Mapping[str, Any]  # {"time": s, "direction": "up"|"down", "path": "nvlink"|...}

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
    scale_events: Sequence[ScaleEvent] | None = None,
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


def write_report(
    out_dir: Path,
    records: Sequence[RequestRecord],
    summary: Summary,
    instance_samples: Sequence[tuple[float, int]] | None = None,
    scale_events: Sequence[ScaleEvent] | None = None,
) -> Path:
    """Write ttft_over_time.png, ttft_cdf.png, tbt_cdf.png and report.html into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ttfts_ms = [r.ttft_s * 1000 for r in records if r.is_ok and r.ttft_s is not None]
    pngs = [
        plot_ttft_over_time(records, out_dir / "ttft_over_time.png", instance_samples, scale_events),
        plot_cdf(ttfts_ms, out_dir / "ttft_cdf.png", "TTFT"),
        plot_cdf([g * 1000 for g in tbt_values(records)], out_dir / "tbt_cdf.png", "TBT"),
    ]
    page = out_dir / "report.html"
    page.write_text(render_html(summary, {p.name: p.read_bytes() for p in pngs}), encoding="utf-8")
    return page


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


def render_html(summary: Summary, images: Mapping[str, bytes]) -> str:
    """One HTML page with no outside references: the table, then each PNG as a data: URI."""
    table = "\n".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(summary)
    )
    figures = "\n".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(data).decode("ascii")}"><figcaption>{html.escape(name)}</figcaption></figure>'
        for name, data in images.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>BlitzScale replay report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:2px 8px;text-align:left}}img{{max-width:100%}}</style>
</head><body>
<h1>BlitzScale replay report</h1>
<h2>Summary</h2>
<table>
{table}
</table>
<h2>Plots</h2>
{figures}
</body></html>
"""
