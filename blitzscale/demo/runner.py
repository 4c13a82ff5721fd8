"""One demo run: start the cluster, replay the workload while showing the instances live,
then summarize and write the report."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from blitzscale.client import replay
from blitzscale.client.record import RequestRecord, write_records
from blitzscale.client.report import ReportInfo, write_report
from blitzscale.client.summary import summarize
from blitzscale.client.traces import TraceRequest
from blitzscale.demo.result import Paced, RunResult
from blitzscale.serve.background import BackgroundService
from blitzscale.serve.config import ServeConfig
from blitzscale.serve.events import ScaleEvent, events_json

PLAIN_EVERY_S = 5.0  # progress lines when the console is not a terminal (a pipe, a file)


def run_policy(
    cfg: ServeConfig,
    requests: list[TraceRequest],
    out: Path,
    console: Console,
    slo_from: RunResult | None = None,
    slo: tuple[float, float] | None = None,
    by_model: dict[str, list[TraceRequest]] | None = None,
) -> RunResult:
    """`slo`: fixed (TTFT, TBT) thresholds in seconds; else `slo_from`: judge SLOs by an
    earlier run's thresholds, so policies are compared alike; else the 5x-mean rule.
    `by_model`: each model's own requests, sent side by side (`requests` is then unused)."""
    policy = cfg.policy.name
    names = ", ".join(m.name for m in cfg.served_models())
    kind = "GPU" if cfg.cluster.device == "cuda" else "CPU"
    load = os.getloadavg()[0]
    starting = (
        f"{policy}: starting {cfg.cluster.num_workers} {kind} workers with {names} (machine load {load:.2f})"
    )
    if console.is_terminal:
        with console.status(escape(starting)):
            svc = BackgroundService(cfg).__enter__()
    else:
        console.print(starting, markup=False, highlight=False, soft_wrap=True)
        svc = BackgroundService(cfg).__enter__()
    try:
        if slo is None and slo_from is not None:
            slo = (slo_from.summary.slo.ttft_s, slo_from.summary.slo.tbt_s)  # type: ignore[assignment]
        return _replay_live(svc, policy, requests, out, console, slo, by_model)
    finally:
        console.print(f"{policy}: stopping the cluster", markup=False, highlight=False, soft_wrap=True)
        svc.__exit__()


def run_policy_paced(
    cfg: ServeConfig, requests: list[TraceRequest], out: Path, console: Console, reruns: int, **kw: Any
) -> tuple[RunResult, int]:
    """`run_policy`, run again (at most `reruns` times) while its workers' pacing did not
    hold: a run in which many paced steps took longer than their reference measured the
    machine's shared cores, not the device the workers act as. Returns the last run and how
    many were discarded."""
    from blitzscale.demo.compare import OVERRUN_NOTE, overran, pacing_held

    for attempt in range(reruns + 1):
        res = run_policy(cfg, requests, out, console, **kw)
        if pacing_held(res) or attempt == reruns:
            return res, attempt
        console.print(
            f"{res.policy}: {overran(res):.0%} of the paced steps took longer than their reference "
            f"(more than {OVERRUN_NOTE:.0%}: the machine was busier than the pacing leaves room for); "
            f"running {res.policy} again ({attempt + 1} of at most {reruns})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    raise AssertionError("unreachable")


def _replay_live(
    svc: BackgroundService,
    policy: str,
    requests: list[TraceRequest],
    out: Path,
    console: Console,
    slo: tuple[float, float] | None,
    by_model: dict[str, list[TraceRequest]] | None = None,
) -> RunResult:
    router, scaler = svc.service.router, svc.service.scaler
    assert router is not None and scaler is not None
    events_before = len(scaler.events)
    traces = by_model or {svc.cfg.served_models()[0].name: requests}
    per_model: dict[str, list[RequestRecord]] = {name: [] for name in traces}

    def send(name: str) -> None:
        no_tokenizer = router.served(name).tokenizer is None  # random weights: prompts as token ids
        config = replay.ReplayConfig(
            url=svc.url, model=name, show_progress=False, timeout_s=300, token_ids=no_tokenizer
        )
        per_model[name].extend(replay.run(traces[name], config))

    def send_all() -> None:  # every model's requests side by side, on their own clocks
        senders = [threading.Thread(target=send, args=(name,), daemon=True) for name in traces]
        for t in senders:
            t.start()
        for t in senders:
            t.join()

    worker = threading.Thread(target=send_all, daemon=True)
    total = sum(len(v) for v in traces.values())
    start = time.monotonic()
    samples: list[tuple[float, int]] = []
    states: list[tuple[float, dict[str, int]]] = []
    paced: dict[int, Paced] = {}  # by rank: its worker's counts so far (they only grow)

    def sample() -> float:
        now = time.monotonic() - start
        for i in router.instances.values():
            if (st := i.stats) is not None:
                seen = (st.paced_steps, st.paced_over, st.paced_real_s, st.paced_s)
                paced[i.id] = max(paced.get(i.id, seen), seen)
        samples.append((now, sum(1 for i in router.instances.values() if i.accepts is not None)))
        states.append((now, dict(Counter(i.state.value for i in router.instances.values()))))
        return now

    worker.start()
    if console.is_terminal:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while worker.is_alive():
                now = sample()
                live.update(_view(policy, now, total, router, scaler.events[events_before:], start))
                worker.join(timeout=0.25)
            now = sample()
            live.update(_view(policy, now, total, router, scaler.events[events_before:], start))
    else:  # one plain line every few seconds, so a log shows the run as it goes
        last = -PLAIN_EVERY_S
        while worker.is_alive():
            now = sample()
            if now - last >= PLAIN_EVERY_S:
                last = now
                line = _progress_line(policy, now, total, router, scaler.events[events_before:])
                console.print(line, markup=False, highlight=False, soft_wrap=True)
            worker.join(timeout=0.25)
        sample()
    records = [r for name in traces for r in per_model[name]]
    events = [e.shifted(start) for e in scaler.events[events_before:]]
    summary = summarize(
        records,
        slo_ttft_s=slo[0] if slo else None,
        slo_tbt_s=slo[1] if slo else None,
        instance_samples=samples,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / "requests.jsonl", records)
    (out / "summary.json").write_text(json.dumps(summary.to_json(), indent=2))
    info = ReportInfo(
        title="BlitzScale demo",
        policy=policy,
        instance_time="instance-seconds (CPU workers)",
        config_toml=svc.cfg.to_toml(),
        state_samples=states,
    )
    report = write_report(out, records, summary, samples, events_json(events), info)
    live = (router.live.requests_total, router.live.layers_total, router.live.relays_total)
    by = per_model if by_model else {}
    total: Paced = (
        sum(x[0] for x in paced.values()),
        sum(x[1] for x in paced.values()),
        sum(x[2] for x in paced.values()),
        sum(x[3] for x in paced.values()),
    )
    return RunResult(policy, summary, records, samples, events, report, live, by, total)


def _progress_line(policy: str, now: float, total: int, router: Any, events: list[ScaleEvent]) -> str:
    serving = sum(1 for i in router.instances.values() if i.accepts is not None)
    ups = sum(1 for e in events if e.is_up)
    return (
        f"{policy}: t={now:5.1f}s  {total} requests, in flight {len(router.reqs)}, "
        f"queue {len(router.queue)}, {serving} serving, {ups} scale-ups so far"
    )


def _view(policy: str, now: float, total: int, router: Any, events: list[ScaleEvent], start: float) -> Group:
    head = f"{policy}: t={now:5.1f}s  queue={len(router.queue)}  in flight={len(router.reqs)}"
    inst = Table(title=escape(head))
    for col in ("instance", "model", "state", "running", "KV blocks used"):
        inst.add_column(col)
    for i in sorted(router.instances.values(), key=lambda x: x.id):
        s = i.stats
        inst.add_row(
            str(i.id),
            i.model or "-",
            i.state.value,
            str(s.num_running if s else 0),
            f"{s.used_blocks}/{s.total_blocks}" if s else "-",
        )
    ev = Table(title="scale events")
    for col in ("t (s)", "model", "direction", "path", "ranks", "from", "seconds", "MB"):
        ev.add_column(col)
    for e in events[-8:]:
        ev.add_row(
            f"{e.time - start:5.1f}",
            e.model or "-",
            e.direction,
            e.path,
            _on_nodes(e.ranks, e.nodes),
            _on_nodes(e.sources, e.source_nodes) if e.sources else "-",
            f"{e.seconds:.2f}",
            f"{e.bytes / 1e6:.0f}",
        )
    return Group(inst, ev)


def _on_nodes(ranks: tuple[int, ...], nodes: tuple[str, ...]) -> str:
    """`[2, 3] @ 2cfc4611`: the ranks and, on a cluster of several nodes, theirs."""
    named = [n for n in nodes if n not in ("local", "?")]
    return f"{list(ranks)} @ {','.join(named)}" if named else str(list(ranks))
