"""Summary numbers on hand-made records, checked against values worked out by hand."""

from pathlib import Path

import pytest

from blitzscale.client.record import RequestRecord, read_records, write_records
from blitzscale.client.summary import Percentiles, gpu_seconds, percentiles, slo_thresholds, summarize


def ok(index: int, send_s: float, ttft_s: float, tbts_s: tuple[float, ...], e2e_s: float) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_s=send_s,
        send_s=send_s,
        input_tokens=100,
        requested_output_tokens=len(tbts_s) + 1,
        output_tokens=len(tbts_s) + 1,
        status="ok",
        ttft_s=ttft_s,
        tbts_s=tbts_s,
        e2e_s=e2e_s,
    )


RECORDS = [
    ok(0, 0.0, 0.1, (0.01, 0.03), 0.2),  # 3 tokens, mean TBT 0.02, ends at 0.2
    ok(1, 1.0, 0.3, (0.02,), 0.4),  # 2 tokens, mean TBT 0.02, ends at 1.4
    ok(2, 2.0, 0.2, (), 0.2),  # 1 token: no TBT, ends at 2.2
    RequestRecord(3, 3.0, 3.0, 100, 5, 0, "error", error="HTTP 500: boom"),
]


def test_percentiles_interpolate_linearly() -> None:
    assert percentiles([0.1, 0.3, 0.2]) == Percentiles(
        mean=pytest.approx(0.2), p50=pytest.approx(0.2), p90=pytest.approx(0.28), p99=pytest.approx(0.298)
    )
    assert percentiles([]) == Percentiles(None, None, None, None)


def test_summary_with_default_slo_five_times_the_mean() -> None:
    s = summarize(RECORDS)
    assert (s.num_requests, s.num_ok, s.num_errors) == (4, 3, 1)
    assert s.ttft_s == percentiles([0.1, 0.3, 0.2])
    assert s.tbt_s.mean == pytest.approx(0.02)  # pooled gaps 0.01, 0.03, 0.02
    assert s.tbt_s.p90 == pytest.approx(0.028)
    assert s.slo.ttft_s == pytest.approx(1.0)  # 5 x mean TTFT 0.2
    assert s.slo.tbt_s == pytest.approx(0.1)  # 5 x mean of per-request mean TBTs (0.02, 0.02)
    assert (s.slo.ttft_rule, s.slo.tbt_rule) == ("5x mean", "5x mean")
    assert s.slo_attainment == 0.75  # every success meets it; the failure is a miss
    assert s.span_s == pytest.approx(2.2)  # first send 0.0 to last completion 2.2
    assert s.requests_per_s == pytest.approx(3 / 2.2)
    assert s.output_tokens_per_s == pytest.approx(6 / 2.2)
    assert s.gpu_seconds is None


def test_summary_with_given_slo() -> None:
    s = summarize(RECORDS, slo_ttft_s=0.25, slo_tbt_s=0.015)
    # 0: TBT 0.02 > 0.015 miss; 1: TTFT 0.3 > 0.25 miss; 2: TTFT ok, no TBT -> meets; 3: failed.
    assert s.slo_attainment == 0.25
    assert (s.slo.ttft_rule, s.slo.tbt_rule) == ("given", "given")


def test_one_slo_given_the_other_defaults() -> None:
    slo = slo_thresholds(RECORDS, ttft_s=0.5)
    assert (slo.ttft_s, slo.ttft_rule) == (0.5, "given")
    assert (slo.tbt_s, slo.tbt_rule) == (pytest.approx(0.1), "5x mean")


def test_gpu_seconds_is_a_step_integral() -> None:
    samples = [(10.0, 3), (0.0, 1), (15.0, 2), (20.0, 2)]  # unsorted on purpose
    assert gpu_seconds(samples) == 1 * 10 + 3 * 5 + 2 * 5
    assert gpu_seconds(samples, gpus_per_instance=4) == 140
    assert summarize(RECORDS, instance_samples=samples).gpu_seconds == 35


def test_empty_run() -> None:
    s = summarize([])
    assert (s.num_requests, s.slo_attainment, s.span_s, s.requests_per_s) == (0, None, 0.0, 0.0)


def test_records_round_trip_through_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    write_records(path, RECORDS)
    assert read_records(path) == RECORDS
    first = path.read_text().splitlines()[0]
    assert '"tbt_max_s": 0.03' in first and '"tbt_mean_s": 0.02' in first
