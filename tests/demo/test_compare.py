"""The demo's last lines: the verdict with the margins it judges by, and a note when the
workers' pacing did not hold (the machine was busier than it leaves room for)."""

from __future__ import annotations

from blitzscale.client.summary import Percentiles, Slo, Summary
from blitzscale.demo.compare import comparison_table, pacing_note, verdict
from blitzscale.demo.result import RunResult


def _run(policy: str, p99: float, attainment: float, paced: tuple[int, int, float, float]) -> RunResult:
    summary = Summary(
        num_requests=10,
        num_ok=10,
        num_errors=0,
        ttft_s=Percentiles(1.0, 1.0, 2.0, p99),
        tbt_s=Percentiles(0.5, 0.5, 1.0, 1.5),
        slo=Slo(6.0, 3.0, "given", "given"),
        slo_attainment=attainment,
        span_s=60.0,
        requests_per_s=0.2,
        output_tokens_per_s=2.0,
    )
    return RunResult(policy, summary, [], paced=paced)


def test_the_verdict_prints_both_policies_figures_and_their_differences() -> None:
    blitz = _run("blitz", 5.0, 1.0, (300, 30, 60.0, 200.0))
    sllm = _run("sllm", 10.0, 0.57, (250, 25, 50.0, 180.0))
    line = verdict([blitz, sllm])
    assert line == (
        "verdict: blitz vs sllm: TTFT p99 5000 vs 10000 ms (-5000 ms, -50%), "
        "SLO attainment 100% vs 57% (+43 points): blitz is better"
    )
    assert "worse" in verdict([sllm, blitz])
    assert "mixed" in verdict([_run("blitz", 5.0, 0.5, (0, 0, 0.0, 0.0)), sllm])
    assert comparison_table([blitz, sllm]).row_count > 10  # (with the paced rows)


def test_a_note_when_many_paced_steps_ran_over_their_reference() -> None:
    held = [_run("blitz", 5.0, 1.0, (300, 30, 60.0, 200.0)), _run("sllm", 9.0, 0.6, (200, 20, 1.0, 2.0))]
    assert pacing_note(held) == ""
    busy = [held[0], _run("sllm", 9.0, 0.6, (200, 90, 1.0, 2.0))]
    note = pacing_note(busy)
    assert "sllm 45%" in note and "blitz" not in note
    assert pacing_note([_run("blitz", 5.0, 1.0, (0, 0, 0.0, 0.0))]) == ""  # not paced


def test_a_run_whose_pacing_did_not_hold_is_run_again(monkeypatch) -> None:
    from rich.console import Console

    from blitzscale.demo import runner

    runs = iter([(200, 90, 1.0, 2.0), (200, 10, 1.0, 2.0), (200, 90, 1.0, 2.0)])
    monkeypatch.setattr(runner, "run_policy", lambda *a, **k: _run("blitz", 5.0, 1.0, next(runs)))
    quiet = Console(file=None, quiet=True)
    res, discarded = runner.run_policy_paced(None, [], None, quiet, reruns=2)  # type: ignore[arg-type]
    assert discarded == 1 and res.paced[1] == 10  # the second run held
    runs = iter([(200, 90, 1.0, 2.0), (200, 80, 1.0, 2.0)])
    res, discarded = runner.run_policy_paced(None, [], None, quiet, reruns=1)  # type: ignore[arg-type]
    assert discarded == 1 and res.paced[1] == 80  # out of reruns: the last one, with its note
