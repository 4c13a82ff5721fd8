"""The batch loop with a fake executor: failures are recorded and do not stop the batch,
resume skips what is done and retries what is not, SLOs come from one reference per trace."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from blitzscale.batch import store
from blitzscale.batch.runner import run_batch
from blitzscale.errors import InvalidRequestError
from tests.batch.conftest import FakeExecutor, plan_of

TEMPLATE = """
[experiment]
name = "runner"
policies = ["blitz", "sllm", "allcache"]
traces = [{ path = "trace.csv", format = "processed" }]
[planner]
scale_down_idle_s = [0.5, 2.0]
"""


def statuses(out: Path) -> dict[str, str]:
    return {r["id"]: r["status"] for r in json.loads((out / "batch.json").read_text())["runs"]}


def test_every_run_is_recorded_with_its_outputs(tmp_path: Path, fake: FakeExecutor) -> None:
    plan = plan_of(tmp_path, TEMPLATE)
    out = tmp_path / "out"
    outcomes = run_batch(plan, out, fake)
    assert fake.ran == [r.run_id for r in plan.runs]
    assert [o.status for o in outcomes] == ["done"] * 6
    for run in plan.runs:
        status = json.loads((out / run.run_id / "status.json").read_text())
        assert status["status"] == "done" and status["num_ok"] == 4
        assert json.loads((out / run.run_id / "summary.json").read_text())["num_ok"] == 4
    assert set(statuses(out).values()) == {"done"}
    with (out / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["run_id"] for r in rows] == [r.run_id for r in plan.runs]
    sllm = next(r for r in rows if r["policy"] == "sllm")
    assert float(sllm["ttft_p99_ms"]) == pytest.approx(200) and sllm["scale_ups_network"] == "1"
    assert (out / "comparison.png").read_bytes()[:4] == b"\x89PNG"


def test_slo_reference_is_the_first_successful_run_of_each_trace(tmp_path: Path) -> None:
    fake = FakeExecutor(fail_on=("blitz_scale-down-idle-s-0.5",))
    plan = plan_of(tmp_path, TEMPLATE)
    outcomes = run_batch(plan, tmp_path / "out", fake)
    assert fake.calls[0][1] is None and fake.calls[1][1] is None  # the first run failed: no reference yet
    reference = outcomes[1].summary
    assert reference is not None
    assert all(ref == reference for _, ref in fake.calls[2:])
    for o in outcomes[2:]:
        assert o.summary is not None and o.summary.slo.ttft_s == reference.slo.ttft_s
        assert o.summary.slo.ttft_rule == "given"


def test_a_failing_run_is_recorded_and_the_batch_goes_on(tmp_path: Path) -> None:
    fake = FakeExecutor(fail_on=("sllm",), all_fail_on=("allcache_scale-down-idle-s-2",))
    plan = plan_of(tmp_path, TEMPLATE)
    out = tmp_path / "out"
    outcomes = run_batch(plan, out, fake)
    assert len(fake.calls) == 6  # nothing stopped the batch
    by_id = {o.run.run_id: o for o in outcomes}
    for run in plan.runs:
        status = json.loads((out / run.run_id / "status.json").read_text())
        if run.policy == "sllm":
            assert status["status"] == "failed"
            assert status["error"] == "RuntimeError: cluster of sllm did not start"
            assert "Traceback" in (out / run.run_id / "error.txt").read_text()
        elif run.policy == "allcache" and run.cfg.planner.scale_down_idle_s == 2.0:
            assert status["status"] == "failed"
            assert status["error"].startswith("all 4 requests failed; first: connection refused")
        else:
            assert status["status"] == "done"
        assert by_id[run.run_id].status == status["status"]
    assert list(statuses(out).values()).count("failed") == 3


def test_resume_skips_done_runs_and_retries_failed_ones(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, TEMPLATE)
    out = tmp_path / "out"
    run_batch(plan, out, FakeExecutor(fail_on=("sllm",)))
    retry = FakeExecutor()
    outcomes = run_batch(plan, out, retry, resume=out)
    assert retry.ran == [r.run_id for r in plan.runs if r.policy == "sllm"]
    assert all(o.is_done for o in outcomes)
    assert [o.resumed for o in outcomes] == [r.policy != "sllm" for r in plan.runs]
    assert not any((out / r.run_id / "error.txt").exists() for r in plan.runs)  # retries start clean
    # a third pass has nothing left to do
    idle = FakeExecutor()
    run_batch(plan, out, idle, resume=out)
    assert idle.ran == []


def test_an_interrupted_run_is_retried(tmp_path: Path, fake: FakeExecutor) -> None:
    plan = plan_of(tmp_path, TEMPLATE)
    out = tmp_path / "out"
    run_batch(plan, out, fake)
    first = plan.runs[0]
    store.write_status(out / first.run_id, first, store.RUNNING)  # as Ctrl-C mid-run leaves it
    again = FakeExecutor()
    run_batch(plan, out, again, resume=out)
    assert again.ran == [first.run_id]


def test_resume_into_a_new_folder_copies_done_runs_and_extends_the_sweep(tmp_path: Path) -> None:
    old = tmp_path / "old"
    run_batch(plan_of(tmp_path, TEMPLATE), old, FakeExecutor())
    bigger = plan_of(tmp_path, TEMPLATE.replace("[0.5, 2.0]", "[0.5, 2.0, 4.0]"))
    fake = FakeExecutor()
    new = tmp_path / "new"
    run_batch(bigger, new, fake, resume=old)
    assert sorted(fake.ran) == sorted(r.run_id for r in bigger.runs if r.cfg.planner.scale_down_idle_s == 4.0)
    assert set(statuses(new).values()) == {"done"} and len(statuses(new)) == 9
    kept = next(r for r in bigger.runs if r.cfg.planner.scale_down_idle_s == 0.5)
    assert (new / kept.run_id / "summary.json").is_file() and (old / kept.run_id).is_dir()


def test_resume_from_a_folder_that_is_no_batch_is_refused(tmp_path: Path, fake: FakeExecutor) -> None:
    plan = plan_of(tmp_path, TEMPLATE)
    with pytest.raises(InvalidRequestError, match="nowhere"):
        run_batch(plan, tmp_path / "out", fake, resume=tmp_path / "nowhere")
    assert fake.calls == []


def test_resume_finds_done_runs_by_hash_when_their_readable_id_changed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = plan_of(tmp_path, TEMPLATE + "[cluster]\nnum_workers = 3\n")
    run_batch(before, out, FakeExecutor())
    after = plan_of(tmp_path, TEMPLATE + "[cluster]\nnum_workers = [3]\n")  # a list: its value joins the id
    assert {r.run_id for r in after.runs}.isdisjoint(r.run_id for r in before.runs)
    fake = FakeExecutor()
    outcomes = run_batch(after, out, fake, resume=out)
    assert fake.ran == [] and all(o.is_done and o.resumed for o in outcomes)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(r.run_id for r in after.runs)


def test_an_out_folder_of_another_batch_is_refused_and_the_same_batch_runs_again(
    tmp_path: Path, fake: FakeExecutor
) -> None:
    """Results of two templates would mix in one folder (another template's runs left
    beside this one's): refused, naming one; the same template again runs into it."""
    out = tmp_path / "out"
    run_batch(plan_of(tmp_path, TEMPLATE), out, fake)
    fewer = plan_of(tmp_path, TEMPLATE.replace('"blitz", "sllm", "allcache"', '"fixed"'))
    with pytest.raises(
        InvalidRequestError, match=r"holds another batch \(6 runs this template does not have, e.g. "
    ):
        run_batch(fewer, out, fake)
    again = run_batch(plan_of(tmp_path, TEMPLATE), out, fake)
    assert [o.status for o in again] == ["done"] * 6
