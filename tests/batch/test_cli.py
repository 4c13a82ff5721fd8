"""`blitzscale batch` from the command line: --dry-run starts nothing, bad input exits 2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from blitzscale.batch import runner
from blitzscale.cli import batch
from blitzscale.errors import InvalidRequestError
from tests.batch.conftest import TRACE_CSV, FakeExecutor, write

TEMPLATE = """
[experiment]
name = "cli"
policies = ["blitz", "sllm"]
traces = [{ path = "trace.csv", format = "processed" }]
[router]
mode = ["pd", "colocated"]
"""


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="blitzscale")
    batch.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def setup(tmp_path: Path, text: str = TEMPLATE) -> Path:
    write(tmp_path / "trace.csv", TRACE_CSV)
    return write(tmp_path / "batch.toml", text)


def test_dry_run_writes_configs_and_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cluster(*_: object) -> None:
        raise AssertionError("a dry run must not start anything")

    monkeypatch.setattr(runner, "live_executor", no_cluster)
    out = tmp_path / "out"
    args = parse(["batch", str(setup(tmp_path)), "--dry-run", "--out", str(out)])
    assert args.func(args) == 0
    listed = json.loads((out / "batch.json").read_text())["runs"]
    assert len(listed) == 4 and {r["status"] for r in listed} == {"planned"}
    assert all((out / r["id"] / "config.toml").is_file() for r in listed)
    assert not any((out / r["id"] / "status.json").exists() for r in listed)


def test_run_reports_failures_in_its_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "live_executor", lambda console: FakeExecutor(fail_on=("sllm_mode-pd",)))
    out = tmp_path / "out"
    args = parse(["batch", str(setup(tmp_path)), "--out", str(out)])
    assert args.func(args) == 1
    assert sorted(json.loads((out / "batch.json").read_text())["runs"][i]["status"] for i in range(4)) == [
        "done",
        "done",
        "done",
        "failed",
    ]
    args = parse(["batch", str(setup(tmp_path)), "--resume", str(out)])  # --out defaults to DIR
    monkeypatch.setattr(runner, "live_executor", lambda console: FakeExecutor())
    assert args.func(args) == 0


def test_bad_template_fails_before_anything_runs(tmp_path: Path) -> None:
    args = parse(
        ["batch", str(setup(tmp_path, TEMPLATE.replace('"sllm"', '"slm"'))), "--out", str(tmp_path / "o")]
    )
    with pytest.raises(InvalidRequestError, match="'slm'"):
        args.func(args)
    assert not (tmp_path / "o").exists()


def test_a_live_run_that_serve_would_refuse_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A live run is a serve: pd mode's two first instances on one worker is refused (a dry
    run too), as is --resume of a folder that does not exist (it was created)."""
    one = setup(tmp_path, TEMPLATE + "[cluster]\nnum_workers = 1\n")
    args = parse(["batch", str(one), "--dry-run", "--out", str(tmp_path / "o")])
    with pytest.raises(
        InvalidRequestError, match=r"run blitz_mode-pd_\w+: mode 'pd' starts 2 instances .* 1 workers"
    ):
        args.func(args)
    args = parse(["batch", str(setup(tmp_path)), "--dry-run", "--resume", str(tmp_path / "nowhere")])
    with pytest.raises(InvalidRequestError, match=r"--resume .*nowhere: not a batch folder"):
        args.func(args)
    assert not (tmp_path / "o").exists() and not (tmp_path / "nowhere").exists()


def test_the_shipped_example_expands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = Path(__file__).parents[2] / "configs" / "batch.example.toml"
    args = parse(["batch", str(example), "--dry-run", "--out", str(tmp_path / "ex")])
    assert args.func(args) == 0
    assert len(json.loads((tmp_path / "ex" / "batch.json").read_text())["runs"]) == 4


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (Path(__file__).parents[2] / "configs").glob("batch.*.toml"))
)
def test_every_shipped_template_expands(name: str) -> None:
    """Each batch template in configs/ loads (its sections, keys, policies and models
    checked) and reads its traces, so the commands in their headers run from a fresh clone."""
    from blitzscale.batch.plan import expand
    from blitzscale.batch.template import load_template

    path = Path(__file__).parents[2] / "configs" / name
    plan = expand(load_template(path))
    assert plan.runs and all(run.num_requests > 0 for run in plan.runs)  # (each trace was read)


def test_ctrl_c_during_a_simulated_batch_says_how_to_go_on_and_prints_no_traceback(tmp_path: Path) -> None:
    """Ctrl-C while a simulated run is under way: exit 130, one line naming the folder and
    the command that resumes it, and none of the interrupted simulation's noise (a
    KeyboardInterrupt traceback, tasks destroyed pending, "Event loop is closed"; whether
    any task is pending depends on where the signal lands: tests/sim/test_clock_and_profile.py
    interrupts one with tasks pending for certain)."""
    import signal
    import subprocess
    import sys
    import threading

    out = tmp_path / "b"
    argv = ["batch", "configs/batch.sim.example.toml", "--simulate", "paper-a", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "blitzscale.cli.main", *argv],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # as from a terminal: Ctrl-C's default action (a pytest-xdist worker ignores SIGINT,
        # and a child started from it would inherit that, as from a shell's background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    in_a_run = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "running" in line and "[2/" in line:  # (the second run's simulation has begun)
                in_a_run.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert in_a_run.wait(300), "".join(lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
        reader.join(60)
        text = "".join(lines)
        assert "interrupted: the runs done are in" in text and f"--resume {out}" in text.replace("\n", ""), (
            text
        )
        for noise in ("Traceback", "Task was destroyed", "Event loop is closed", "never retrieved"):
            assert noise not in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
