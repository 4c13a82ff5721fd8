"""This machine's speed against the shipped CPU profile (bench/cpu_speed.py), as `bench
fidelity --calibrate` scales the profile by it."""

from __future__ import annotations

import pytest

from blitzscale.bench import cpu_speed
from blitzscale.control.costmodel import load_profile


def test_the_profile_scaled_by_the_speed_gives_the_steps_measured_here() -> None:
    shipped = load_profile("smollm2-135m-cpu")
    speed = cpu_speed.measure(shipped)
    assert speed.prefill > 0 and speed.decode > 0
    here = speed.apply(shipped)
    assert 1000 * here.prefill_s(cpu_speed.PROMPT) == pytest.approx(speed.prefill_ms, rel=0.01)
    assert 1000 * here.decode_s(1, cpu_speed.PROMPT) == pytest.approx(speed.decode_ms, rel=0.01)
    # the shape is the profile's: every point moves by the same factor
    big = shipped.prefill_tokens[-1]
    assert here.prefill_s(big) == pytest.approx(shipped.prefill_s(big) / speed.prefill, rel=1e-3)
    assert (here.weight_bytes, here.num_layers) == (shipped.weight_bytes, shipped.num_layers)
