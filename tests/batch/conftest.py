"""Helpers for batch tests: templates written to tmp folders, canned replay results, and a
fake executor that records what it was asked to run instead of starting a cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from blitzscale.batch.plan import BatchPlan, RunSpec, expand
from blitzscale.batch.template import load_template
from blitzscale.client.record import RequestRecord
from blitzscale.client.summary import Summary, summarize
from blitzscale.demo.result import RunResult
from blitzscale.serve.events import ScaleEvent

TRACE_CSV = "timestamp_ms,prefill,decode\n0,10,4\n500,20,4\n1000,30,4\n1500,40,4\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def plan_of(tmp_path: Path, text: str) -> BatchPlan:
    """The plan of a template text; a small processed trace lies next to it as trace.csv."""
    write(tmp_path / "trace.csv", TRACE_CSV)
    return expand(load_template(write(tmp_path / "t.toml", text)))


def records(ok: bool = True, ttft_s: float = 0.1, n: int = 4) -> list[RequestRecord]:
    if not ok:
        return [
            RequestRecord(i, i * 0.5, i * 0.5, 10, 4, 0, "error", error="connection refused")
            for i in range(n)
        ]
    return [
        RequestRecord(
            i, i * 0.5, i * 0.5, 10, 4, 4, "ok", ttft_s=ttft_s, tbts_s=(0.02,) * 3, e2e_s=ttft_s + 0.06
        )
        for i in range(n)
    ]


def result(policy: str, ok: bool = True, ttft_s: float = 0.1, ref: Summary | None = None) -> RunResult:
    recs = records(ok, ttft_s)
    summary = summarize(
        recs,
        slo_ttft_s=ref.slo.ttft_s if ref else None,
        slo_tbt_s=ref.slo.tbt_s if ref else None,
        instance_samples=[(0.0, 1), (1.0, 2), (2.0, 2)],
    )
    events = [
        ScaleEvent(
            model="m",
            time=0.5,
            direction="up",
            path="network",
            ranks=(1,),
            sources=(0,),
            seconds=0.1,
            bytes=1000,
            nodes=("local",),
            source_nodes=("local",),
        )
    ]
    return RunResult(policy, summary, recs, [(0.0, 1), (2.0, 2)], events if ok else [])


@dataclass
class FakeExecutor:
    """Canned results; runs whose id contains a word of `fail_on` raise, of `all_fail_on`
    return only failed requests. `calls` keeps (run id, the SLO reference passed)."""

    fail_on: tuple[str, ...] = ()
    all_fail_on: tuple[str, ...] = ()
    calls: list[tuple[str, Summary | None]] = field(default_factory=list)

    def __call__(self, run: RunSpec, run_dir: Path, reference: Summary | None) -> RunResult:
        self.calls.append((run.run_id, reference))
        assert (run_dir / "config.toml").is_file()  # configs are written before a run starts
        if any(word in run.run_id for word in self.fail_on):
            raise RuntimeError(f"cluster of {run.policy} did not start")
        ok = not any(word in run.run_id for word in self.all_fail_on)
        return result(run.policy, ok=ok, ttft_s=0.2 if run.policy == "sllm" else 0.1, ref=reference)

    @property
    def ran(self) -> list[str]:
        return [run_id for run_id, _ in self.calls]


@pytest.fixture
def fake() -> FakeExecutor:
    return FakeExecutor()


def by_policy(plan: BatchPlan) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for run in plan.runs:
        out.setdefault(run.policy, []).append(run)
    return out
