"""The demo's shipped trace slice loads from the installed package and is shaped for CPUs."""

from __future__ import annotations

from blitzscale.demo.workload import Workload


def test_shipped_azure_slice_is_thinned_and_clamped() -> None:
    full = Workload(rate_scale=1.0, max_input=10**6, max_output=10**6).requests()
    assert len(full) == 657  # the 657 rows of the slice, unchanged
    demo = Workload().requests()
    assert 30 <= len(demo) <= 60
    assert max(r.input_tokens for r in demo) <= 192 and max(r.output_tokens for r in demo) <= 24
    arrivals = [r.arrival_s for r in demo]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 30  # a burst, then a tail
