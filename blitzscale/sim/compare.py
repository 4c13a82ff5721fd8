"""Several policies over one trace: each run's records, summary and report, and a
comparison across them (what `blitzscale simulate` writes)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from blitzscale.client.record import RequestRecord, write_records
from blitzscale.client.report import write_report
from blitzscale.client.summary import summarize
from blitzscale.client.traces import TraceRequest
from blitzscale.serve.events import events_json
from blitzscale.sim.runner import SimSetup, sim_report_info, simulate, sized_fixed


def run_policies(
    setup: SimSetup,
    trace: list[TraceRequest],
    policies: list[str],
    out: Path,
    slo: tuple[float, float],
    show_progress: bool,
    trace_models: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Every policy over the same trace; fixed-* are sized from blitz's peak (run first).
    `trace_models`: each request's model (several models on the pool)."""
    order = sorted(policies, key=lambda p: p != "blitz")
    needs_blitz = any(p.startswith("fixed") for p in policies) and "blitz" not in policies
    if needs_blitz:
        order.insert(0, "blitz")
    span = max(t.arrival_s for t in trace)
    rows, peak = [], (1, 1)
    with Progress(disable=not show_progress, transient=True) as bar:
        for policy in order:
            task = bar.add_task(f"simulating {policy}", total=span)
            s = sized_fixed(setup, peak, policy) if policy.startswith("fixed") else setup
            res = simulate(
                s,
                trace,
                policy,
                progress=lambda t, task=task: bar.update(task, completed=t),
                trace_models=trace_models,
            )
            if policy == "blitz":
                peak = res.peak
            if policy not in policies:
                continue
            summary = replace(summarize(res.records, slo[0], slo[1]), gpu_seconds=res.gpu_seconds)
            folder = out / policy
            folder.mkdir(parents=True, exist_ok=True)
            write_records(folder / "requests.jsonl", res.records)
            body = {
                **summary.to_json(),
                "sim_wall_s": round(res.sim_wall_s, 2),
                "scale_events": len(res.events),
            }
            (folder / "summary.json").write_text(json.dumps(body, indent=2) + "\n")
            info = sim_report_info(policy, res.states)
            write_report(folder, res.records, summary, res.samples, events_json(res.events), info)
            rows.append(
                {
                    "policy": policy,
                    "requests": summary.num_requests,
                    "ok": summary.num_ok,
                    "ttft_mean_s": summary.ttft_s.mean,
                    "ttft_p99_s": summary.ttft_s.p99,
                    "tbt_p99_s": summary.tbt_s.p99,
                    "slo_attainment": summary.slo_attainment,
                    "gpu_seconds": round(res.gpu_seconds, 1),
                    "scale_ups": sum(1 for e in res.events if e.is_up),
                    "disk_loads": sum(1 for e in res.events if e.is_up and e.path == "disk"),
                    "chain_joins": res.chain_joins,
                    "peak_instances": list(res.peak),
                    "models_per_rank": setup.resident_per_rank,
                    "prompt_tokens_computed": sum(r.input_tokens for r in res.records) - res.prefix_hits,
                    "prefix_hit_rate": round(res.prefix_hits / max(res.prefix_queries, 1), 4),
                    "prefix_routed": res.prefix_routed,
                    "prefix_shipped_blocks": res.prefix_shipped,
                    "relays": res.relays,
                    "live_moves": res.moves,
                    **split_stats(res.split_solve_s, res.split_fallbacks),
                    **tail_parts(res.records).columns(),
                    "sim_wall_s": round(res.sim_wall_s, 2),
                    "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
            )
    return rows


def split_stats(solve_s: Sequence[float], fallbacks: int) -> dict[str, Any]:
    """The planned live split's solves (live_split = "ilp"): how many, how long, how many
    fell back to greedy."""
    if not solve_s:
        return {"split_solves": 0}
    ms = sorted(1000 * s for s in solve_s)
    return {
        "split_solves": len(ms),
        "split_solve_ms_p50": round(ms[len(ms) // 2], 2),
        "split_solve_ms_p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
        "split_solve_ms_max": round(ms[-1], 2),
        "split_fallbacks": fallbacks,
    }


@dataclass(frozen=True)
class TailParts:
    """Where the slowest 1% of requests' time to first token went: the means, in ms, over
    the requests from the rank where the run's p99 TTFT falls (`TtftParts`: queue is the
    router's and the instance's together, `router_queue_ms` the router's share), and their
    mean prompt length."""

    requests: int
    input_tokens: float
    queue_ms: float
    router_queue_ms: float
    load_ms: float
    relay_ms: float
    compute_ms: float

    def columns(self) -> dict[str, float]:
        return {
            "tail_requests": self.requests,
            "tail_input_tokens": round(self.input_tokens, 1),
            "tail_queue_ms": round(self.queue_ms, 1),
            "tail_router_queue_ms": round(self.router_queue_ms, 1),
            "tail_load_ms": round(self.load_ms, 1),
            "tail_relay_ms": round(self.relay_ms, 1),
            "tail_compute_ms": round(self.compute_ms, 1),
        }


def tail_parts(records: Sequence[RequestRecord], q: float = 99.0) -> TailParts:
    """`TailParts` of the records from the rank where their `q`th TTFT percentile falls."""
    done = sorted((r for r in records if r.ttft_s is not None), key=lambda r: r.ttft_s or 0.0)
    if not done:
        return TailParts(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    # (from the lower of the two ranks numpy's percentile interpolates between)
    tail = done[min(len(done) - 1, int(q / 100 * (len(done) - 1))) :]
    parts = [r.ttft_parts for r in tail if r.ttft_parts is not None]
    n = max(len(parts), 1)

    def ms(total: float) -> float:
        return 1000 * total / n

    return TailParts(
        len(tail),
        sum(r.input_tokens for r in tail) / len(tail),
        ms(sum(p.router_queue_s + p.engine_queue_s for p in parts)),
        ms(sum(p.router_queue_s for p in parts)),
        ms(sum(p.load_wait_s for p in parts)),
        ms(sum(p.relay_s for p in parts)),
        ms(sum(p.compute_s for p in parts)),
    )
