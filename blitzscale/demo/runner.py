"""One demo run: start the cluster, replay the workload while showing the instances live,
then summarize and write the report."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from blitzscale.client import replay
from blitzscale.client.record import RequestRecord, write_records
from blitzscale.client.report import write_report
from blitzscale.client.summary import Summary, summarize
from blitzscale.client.traces import TraceRequest
from blitzscale.serve.background import BackgroundService
from blitzscale.serve.config import ServeConfig


@dataclass
class RunResult:
    policy: str
    summary: Summary
    records: list[RequestRecord]
    samples: list[tuple[float, int]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    report: Path | None = None
    live: tuple[int, int, int] = (0, 0, 0)  # requests, layers and relays of live scaling


def run_policy(
    cfg: ServeConfig,
    requests: list[TraceRequest],
    out: Path,
    console: Console,
    slo_from: RunResult | None = None,
) -> RunResult:
    """`slo_from`: judge SLOs by an earlier run's thresholds, so policies are compared alike."""
    policy = cfg.policy.name
    with console.status(f"[{policy}] starting {cfg.cluster.num_workers} CPU workers with {cfg.model.name}"):
        svc = BackgroundService(cfg).__enter__()
    try:
        return _replay_live(svc, policy, requests, out, console, slo_from)
    finally:
        with console.status(f"[{policy}] stopping the cluster"):
            svc.__exit__()


def _replay_live(
    svc: BackgroundService,
    policy: str,
    requests: list[TraceRequest],
    out: Path,
    console: Console,
    slo_from: RunResult | None,
) -> RunResult:
    router, scaler = svc.service.router, svc.service.scaler
    assert router is not None and scaler is not None
    events_before = len(scaler.events)
    records: list[RequestRecord] = []
    config = replay.ReplayConfig(url=svc.url, model=svc.cfg.model.name, show_progress=False, timeout_s=300)
    worker = threading.Thread(target=lambda: records.extend(replay.run(requests, config)), daemon=True)
    start = time.monotonic()
    samples: list[tuple[float, int]] = []
    worker.start()
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while worker.is_alive():
            now = time.monotonic() - start
            serving = sum(1 for i in router.instances.values() if i.accepts is not None)
            samples.append((now, serving))
            live.update(_view(policy, now, len(requests), router, scaler.events[events_before:], start))
            worker.join(timeout=0.25)
        now = time.monotonic() - start
        samples.append((now, sum(1 for i in router.instances.values() if i.accepts is not None)))
        live.update(_view(policy, now, len(requests), router, scaler.events[events_before:], start))
    events = [{**e, "time": e["time"] - start} for e in scaler.events[events_before:]]
    slo = slo_from.summary.slo if slo_from is not None else None
    summary = summarize(
        records,
        slo_ttft_s=slo.ttft_s if slo else None,
        slo_tbt_s=slo.tbt_s if slo else None,
        instance_samples=samples,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "requests.jsonl", records)
    (out / "summary.json").write_text(json.dumps(summary.to_json(), indent=2))
    report = write_report(out, records, summary, samples, events)
    live = (router.live.requests_total, router.live.layers_total, router.live.relays_total)
    return RunResult(policy, summary, records, samples, events, report, live)


def _view(
    policy: str, now: float, total: int, router: Any, events: list[dict[str, Any]], start: float
) -> Group:
    inst = Table(title=f"[{policy}] t={now:5.1f}s  queue={len(router.queue)}  in flight={len(router.reqs)}")
    for col in ("instance", "state", "running", "KV blocks used"):
        inst.add_column(col)
    for i in sorted(router.instances.values(), key=lambda x: x.id):
        s = i.stats
        inst.add_row(
            str(i.id),
            i.state.value,
            str(s.num_running if s else 0),
            f"{s.used_blocks}/{s.total_blocks}" if s else "-",
        )
    ev = Table(title="scale events")
    for col in ("t (s)", "direction", "path", "ranks", "from", "seconds", "MB"):
        ev.add_column(col)
    for e in events[-8:]:
        ev.add_row(
            f"{e['time'] - start:5.1f}",
            e["direction"],
            e["path"],
            str(e["ranks"]),
            str(e["sources"] or "-"),
            f"{e['seconds']:.2f}",
            f"{e['bytes'] / 1e6:.0f}",
        )
    return Group(inst, ev)
