"""What a batch directory holds. Everything a later batch needs to resume is on disk:

    OUT/batch.json               the runs, their parameters and statuses
    OUT/comparison.csv, .png     the comparison over all runs
    OUT/<run-id>/config.toml     the run's full ServeConfig (`blitzscale serve --config` takes it)
    OUT/<run-id>/run.toml        [run]: id, parameter hash, model, policy, trace, knobs
    OUT/<run-id>/status.json     planned | running | done | failed, with the error if any
    OUT/<run-id>/summary.json    done runs: the replay's summary (SLOs, percentiles), plus
                 events.json, requests.jsonl, report.html and plots; failed runs: error.txt

The run table has its own file so that config.toml stays a plain, loadable cluster config.
A run interrupted by Ctrl-C stays "running", which a resumed batch treats like "failed".
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from blitzscale.batch.plan import BatchPlan, RunSpec
from blitzscale.client.summary import Percentiles, Slo, Summary

BATCH_FILE = "batch.json"
CONFIG_FILE = "config.toml"
RUN_FILE = "run.toml"
STATUS_FILE = "status.json"
SUMMARY_FILE = "summary.json"
EVENTS_FILE = "events.json"
DONE, FAILED, RUNNING, PLANNED = "done", "failed", "running", "planned"


def write_run_files(run: RunSpec, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(run.cfg.to_toml())
    write_run_table(run, run_dir)


def write_run_table(run: RunSpec, run_dir: Path) -> None:
    (run_dir / RUN_FILE).write_text(run_toml(run))


def run_toml(run: RunSpec) -> str:
    lines = ["[run]", f"id = {_toml(run.run_id)}", f"params_hash = {_toml(run.params_hash)}"]
    lines += [f"model = {_toml(run.model)}", f"policy = {_toml(run.policy)}"]
    lines += [f"num_requests = {run.num_requests}", "", "[run.trace]"]
    lines += [f"{k} = {_toml(v)}" for k, v in run.trace.params().items()]
    lines += ["", "[run.settings]"] + [f"{_toml(k)} = {_toml(v)}" for k, v in run.settings]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    """A TOML scalar: JSON's string escapes are valid in TOML basic strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def write_status(run_dir: Path, run: RunSpec, status: str, **extra: Any) -> dict[str, Any]:
    body = {"status": status, "run_id": run.run_id, "params_hash": run.params_hash, **extra}
    _write_json(run_dir / STATUS_FILE, body)
    return body


def read_status(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def foreign_runs(out: Path, plan: BatchPlan) -> list[str]:
    """Run ids an earlier batch left in `out` (its batch.json) that `plan` does not have:
    another template's runs, which this batch's results would sit beside."""
    index = out / BATCH_FILE
    if not index.is_file():
        return []
    try:
        earlier = [r["id"] for r in json.loads(index.read_text()).get("runs", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []  # (not one of ours: nothing of it is read)
    mine = {r.run_id for r in plan.runs}
    return [rid for rid in earlier if rid not in mine]


def done_runs(batch_dir: Path) -> dict[str, Path]:
    """params_hash -> folder of each run that finished in an earlier batch."""
    found: dict[str, Path] = {}
    for status_file in sorted(batch_dir.glob(f"*/{STATUS_FILE}")):
        status = read_status(status_file.parent)
        if status.get("status") == DONE and (status_file.parent / SUMMARY_FILE).is_file():
            found[str(status.get("params_hash"))] = status_file.parent
    return found


def adopt(src: Path, dst: Path) -> None:
    """Bring a finished run's folder to where this batch keeps it (same folder: nothing)."""
    if src.resolve() == dst.resolve():
        return
    if dst.exists():
        shutil.rmtree(dst)
    if src.parent.resolve() == dst.parent.resolve():
        src.rename(dst)  # same batch, new readable id: keep one copy
    else:
        shutil.copytree(src, dst)


def write_summary(run_dir: Path, summary: Summary, events: list[dict[str, Any]]) -> None:
    _write_json(run_dir / SUMMARY_FILE, summary.to_json())
    _write_json(run_dir / EVENTS_FILE, events)


def read_summary(run_dir: Path) -> Summary | None:
    try:
        d = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return Summary(
        **{k: v for k, v in d.items() if k not in ("ttft_s", "tbt_s", "slo")},
        ttft_s=Percentiles(**d["ttft_s"]),
        tbt_s=Percentiles(**d["tbt_s"]),
        slo=Slo(**d["slo"]),
    )


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads((run_dir / EVENTS_FILE).read_text()))
    except (OSError, ValueError):
        return []


def write_batch_json(out: Path, plan: BatchPlan, statuses: dict[str, dict[str, Any]]) -> None:
    """The index of the batch, rewritten after every run so an interrupted batch has one."""
    runs = []
    for run in plan.runs:
        status = statuses.get(run.run_id, {"status": PLANNED})
        runs.append(
            {
                "id": run.run_id,
                "status": status["status"],
                "error": status.get("error"),
                "resumed_from": status.get("resumed_from"),
                "varied": plan.varied_values(run),
                "params": run.params(),
            }
        )
    body = {"name": plan.name, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "varied": plan.varied}
    _write_json(out / BATCH_FILE, body | {"runs": runs})


def _write_json(path: Path, body: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2, default=str))
    tmp.replace(path)  # a crash mid-write leaves the old file, never half of one
