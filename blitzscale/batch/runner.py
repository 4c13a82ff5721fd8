"""Running a plan: each run on its own live cluster, one after another.

The executor is a parameter so the loop (checkpointing, failures, resume, SLO references) is
tested without starting clusters; `live_executor` is the real one. A run fails when its
executor raises or when every request failed; either way the error goes to its status.json
and the batch goes on, because one broken configuration should not cost the other runs.
SLOs are judged against the first successful run of each (model, trace), as the demo does,
so attainment compares like with like across policies and knobs.
"""

from __future__ import annotations

import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from blitzscale.batch import store
from blitzscale.batch.outcome import RunOutcome, read_outcome
from blitzscale.batch.plan import BatchPlan, RunSpec
from blitzscale.batch.plot import write_comparison_png
from blitzscale.batch.report import write_comparison_csv
from blitzscale.client.summary import Summary
from blitzscale.demo.result import RunResult
from blitzscale.errors import InvalidRequestError
from blitzscale.serve.events import events_json

Execute = Callable[[RunSpec, Path, Summary | None], RunResult]
"""(run, its folder, the SLO reference's summary or None) -> the replay's result."""
Log = Callable[[str], None]


def write_plan(plan: BatchPlan, out: Path) -> None:
    """Every run's config files and a batch.json of planned runs: what --dry-run leaves."""
    for run in plan.runs:
        store.write_run_files(run, out / run.run_id)
    store.write_batch_json(out, plan, {})


def run_batch(
    plan: BatchPlan,
    out: Path,
    execute: Execute,
    resume: Path | None = None,
    log: Log = lambda _: None,
) -> list[RunOutcome]:
    """Run every run not already done in `resume` (an earlier batch folder, may be `out`),
    then write comparison.csv and comparison.png. Returns the outcomes in plan order."""
    if resume is not None and not (resume / store.BATCH_FILE).is_file():
        raise InvalidRequestError(f"--resume {str(resume)!r}: not a batch folder (no {store.BATCH_FILE})")
    done = store.done_runs(resume) if resume is not None else {}
    if resume is None and (foreign := store.foreign_runs(out, plan)):
        raise InvalidRequestError(
            f"--out {out} holds another batch ({len(foreign)} runs this template does not have, "
            f"e.g. {foreign[0]}): give another --out, or remove the folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    # what is already on disk, so batch.json stays right if this batch is interrupted
    statuses = {r.run_id: s for r in plan.runs if (s := store.read_status(out / r.run_id))}
    references: dict[Any, Summary] = {}
    outcomes: list[RunOutcome] = []
    for i, run in enumerate(plan.runs, start=1):
        run_dir = out / run.run_id
        prior = done.get(run.params_hash)
        if prior is not None:
            statuses[run.run_id] = _adopt(run, prior, run_dir)
            log(f"[{i}/{len(plan.runs)}] {run.run_id}: done earlier, skipped")
        else:
            log(f"[{i}/{len(plan.runs)}] {run.run_id}: running {run.num_requests} requests")
            statuses[run.run_id] = _run_one(run, run_dir, execute, references.get(run.slo_group))
            log(f"[{i}/{len(plan.runs)}] {run.run_id}: {_said(statuses[run.run_id])}")
        outcome = read_outcome(run, run_dir)
        if outcome.is_done and outcome.summary is not None:
            references.setdefault(run.slo_group, outcome.summary)
        outcomes.append(outcome)
        store.write_batch_json(out, plan, statuses)
    write_comparison_csv(plan, outcomes, out / "comparison.csv")
    write_comparison_png(outcomes, out / "comparison.png")
    return outcomes


def _adopt(run: RunSpec, prior: Path, run_dir: Path) -> dict[str, Any]:
    old = store.read_status(prior)
    store.adopt(prior, run_dir)
    # same parameters (same hash), but the readable id may be new; config.toml stays as it ran
    store.write_run_table(run, run_dir)
    extra = {k: v for k, v in old.items() if k not in ("status", "run_id", "params_hash", "resumed_from")}
    return store.write_status(run_dir, run, store.DONE, **extra, resumed_from=str(prior))


def _run_one(run: RunSpec, run_dir: Path, execute: Execute, reference: Summary | None) -> dict[str, Any]:
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a retry starts clean: no stale plots or errors of the last try
    store.write_run_files(run, run_dir)
    started = time.time()
    store.write_status(run_dir, run, store.RUNNING, started=started)
    try:
        result = execute(run, run_dir, reference)
    except Exception as e:
        (run_dir / "error.txt").write_text(traceback.format_exc())
        error = _one_line(f"{type(e).__name__}: {e}")
        return store.write_status(run_dir, run, store.FAILED, error=error, seconds=time.time() - started)
    summary = result.summary
    store.write_summary(run_dir, summary, events_json(result.events))
    counts = {
        "num_requests": summary.num_requests,
        "num_ok": summary.num_ok,
        "seconds": time.time() - started,
    }
    if summary.num_ok == 0:
        errors = [r.error for r in result.records if r.error]
        error = f"all {summary.num_requests} requests failed" + (f"; first: {errors[0]}" if errors else "")
        return store.write_status(run_dir, run, store.FAILED, error=_one_line(error), **counts)
    return store.write_status(run_dir, run, store.DONE, **counts)


def _one_line(text: str, limit: int = 300) -> str:
    """Errors go into tables and one-line logs; the traceback is in error.txt."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _said(status: dict[str, Any]) -> str:
    if status["status"] == store.DONE:
        return f"done in {status['seconds']:.0f} s ({status['num_ok']}/{status['num_requests']} ok)"
    return f"FAILED: {status.get('error')}"


def live_executor(console: Console) -> Execute:
    """Runs on a real local cluster through the demo's `run_policy` (live view on `console`)."""
    from blitzscale.batch.traces import load_requests
    from blitzscale.demo.runner import run_policy

    def execute(run: RunSpec, run_dir: Path, reference: Summary | None) -> RunResult:
        slo_from = RunResult("reference", reference, []) if reference is not None else None
        return run_policy(run.cfg, load_requests(run.trace), run_dir, console, slo_from=slo_from)

    return execute
