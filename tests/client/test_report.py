"""Plots and the self-contained HTML page."""

from pathlib import Path

from blitzscale.client.record import RequestRecord
from blitzscale.client.report import render_html, summary_rows, write_report
from blitzscale.client.summary import summarize

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

RECORDS = [
    RequestRecord(0, 0.0, 0.0, 10, 3, 3, "ok", ttft_s=0.1, tbts_s=(0.01, 0.02), e2e_s=0.2),
    RequestRecord(1, 1.0, 1.0, 10, 3, 3, "ok", ttft_s=0.4, tbts_s=(0.03, 0.01), e2e_s=0.5),
    RequestRecord(2, 2.0, 2.0, 10, 3, 0, "error", error="timeout after 1 s"),
]


def test_report_with_instances_and_scale_events(tmp_path: Path) -> None:
    samples = [(0.0, 1), (1.5, 2), (3.0, 2)]
    events = [
        {"time": 1.4, "direction": "up", "path": "nvlink"},
        {"time": 2.5, "direction": "down", "path": "-"},
    ]
    page = write_report(tmp_path, RECORDS, summarize(RECORDS, instance_samples=samples), samples, events)
    for name in ("ttft_over_time.png", "ttft_cdf.png", "tbt_cdf.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
    html = page.read_text()
    assert html.count('src="data:image/png;base64,') == 3
    assert "http://" not in html and "https://" not in html  # nothing fetched from outside
    assert "<th>gpu_seconds</th><td>4.5</td>" in html


def test_report_of_a_run_where_everything_failed(tmp_path: Path) -> None:
    failed = [RECORDS[2]]
    write_report(tmp_path, failed, summarize(failed))
    assert (tmp_path / "tbt_cdf.png").read_bytes().startswith(PNG_MAGIC)


def test_summary_table_flattens_and_escapes() -> None:
    rows = dict(summary_rows(summarize(RECORDS)))
    assert rows["num_requests"] == "3" and rows["ttft_s.p50"] == "0.25" and rows["gpu_seconds"] == "-"
    assert "&lt;b&gt;" in render_html(summarize(RECORDS), {"<b>.png": b"x"})


def test_report_names_the_run_gives_units_events_config_and_states(tmp_path: Path) -> None:
    from blitzscale.client.report import ReportInfo

    events = [
        {"time": 1.4, "direction": "up", "path": "network", "ranks": [1], "sources": [0], "seconds": 0.25,
         "bytes": 538e6},
    ]  # fmt: skip
    states = [(0.0, {"colocated": 1}), (1.4, {"colocated": 1, "loading": 1}), (1.7, {"colocated": 2})]
    info = ReportInfo(
        title="BlitzScale demo",
        policy="blitz",
        instance_time="instance-seconds (CPU workers)",
        config_toml='[policy]\nname = "blitz"',
        state_samples=states,
    )
    summary = summarize(RECORDS, 0.3, 0.05, instance_samples=[(0.0, 1), (3.0, 2)])
    html = write_report(tmp_path, RECORDS, summary, [(0.0, 1), (3.0, 2)], events, info).read_text()
    assert "<title>BlitzScale demo: blitz</title>" in html and "<h1>BlitzScale demo: blitz</h1>" in html
    assert "<th>TTFT mean / p50 / p90 / p99 (ms)</th><td>250 / 250 / 370 / 397</td>" in html
    assert "<th>SLO: TTFT / TBT (ms)</th><td>300 (given) / 50 (given)</td>" in html
    assert "<th>instance-seconds (CPU workers)</th>" in html
    assert "gpu" not in html.split("Every summary")[0].lower()
    # the scale event: when, direction, path, ranks, source, duration, MB
    row = "<tr><th>1.40</th><td>up</td><td>network</td><td>1</td><td>0</td><td>0.250</td><td>538</td></tr>"
    assert row in html
    assert "<pre>[policy]\nname = &quot;blitz&quot;</pre>" in html
    assert (tmp_path / "instances_by_state.png").read_bytes().startswith(PNG_MAGIC)
    assert html.count('src="data:image/png;base64,') == 4
