"""Synthetic arrivals and trace shaping (scale, thin, cut, clamp)."""

import numpy as np
import pytest

from blitzscale.client.traces import TraceRequest, gamma_arrivals, transform, with_lengths


def trace(*times: float) -> list[TraceRequest]:
    return [TraceRequest(t, 100 + i, 10 + i) for i, t in enumerate(times)]


def test_gamma_arrivals_rate_cv_and_determinism() -> None:
    times = gamma_arrivals(rate=10.0, cv=2.0, duration_s=2000.0, seed=7)
    assert times == gamma_arrivals(rate=10.0, cv=2.0, duration_s=2000.0, seed=7)
    assert times[0] == 0.0
    assert all(0 <= t < 2000.0 for t in times)
    gaps = np.diff(times)
    assert np.mean(gaps) == pytest.approx(0.1, rel=0.05)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(2.0, rel=0.1)


def test_gamma_cv_zero_is_evenly_spaced() -> None:
    assert gamma_arrivals(rate=4.0, cv=0.0, duration_s=1.0) == [0.0, 0.25, 0.5, 0.75]


@pytest.mark.parametrize(("rate", "cv", "duration"), [(0, 1, 1), (1, -1, 1), (1, 1, 0)])
def test_gamma_rejects_bad_parameters(rate: float, cv: float, duration: float) -> None:
    with pytest.raises(ValueError):
        gamma_arrivals(rate, cv, duration)


def test_with_lengths_cycles_trace_lengths_or_uses_fixed_ones() -> None:
    lengths = trace(0.0, 1.0)
    assert with_lengths([0.0, 0.5, 0.9], lengths, 1, 1) == [
        TraceRequest(0.0, 100, 10),
        TraceRequest(0.5, 101, 11),
        TraceRequest(0.9, 100, 10),
    ]
    assert with_lengths([0.0, 2.0], [], 64, 8) == [TraceRequest(0.0, 64, 8), TraceRequest(2.0, 64, 8)]


def test_time_scale_divides_timestamps_then_duration_cuts_replay_time() -> None:
    out = transform(trace(0.0, 2.0, 4.0, 6.0), time_scale=2.0, duration=3.0)
    assert [r.arrival_s for r in out] == [0.0, 1.0, 2.0]


def test_rate_scale_below_one_keeps_an_even_fraction_and_the_timeline() -> None:
    requests = trace(*range(6))
    assert [r.arrival_s for r in transform(requests, rate_scale=0.5)] == [0, 2, 4]
    assert [r.arrival_s for r in transform(requests, rate_scale=1 / 3)] == [0, 3]
    assert len(transform(trace(*range(1000)), rate_scale=0.1)) == 100


def test_rate_scale_above_one_repeats_requests_at_their_time() -> None:
    assert [r.arrival_s for r in transform(trace(0, 1), rate_scale=2.0)] == [0, 0, 1, 1]
    assert [r.arrival_s for r in transform(trace(0, 1, 2, 3), rate_scale=1.5)] == [0, 0, 1, 2, 2, 3]


def test_clamps_lengths() -> None:
    out = transform([TraceRequest(0.0, 5000, 900), TraceRequest(1.0, 10, 5)], max_input=1024, max_output=64)
    assert out == [TraceRequest(0.0, 1024, 64), TraceRequest(1.0, 10, 5)]


@pytest.mark.parametrize(
    "kwargs",
    [{"time_scale": 0}, {"rate_scale": -1}, {"duration": 0}, {"max_input": 0}, {"max_output": 0}],
)
def test_transform_rejects_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        transform(trace(0.0), **kwargs)


def test_a_rate_scale_that_would_fill_the_memory_is_refused_before_it_does() -> None:
    with pytest.raises(ValueError, match=r"rate_scale 1e\+09 makes 2,000,000,000 requests of 2; at most"):
        transform(trace(0.0, 1.0), rate_scale=1e9)
