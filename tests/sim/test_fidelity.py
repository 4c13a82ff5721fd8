"""The simulator against the system it models: one small configuration (two CPU workers,
SmolLM2, 90 s of the shipped Azure slice) run live through HTTP and simulated with the CPU
profile (`blitzscale bench fidelity`). On a quiet machine they agree within 15% on mean and
p99 TTFT and on the scale events (docs/benchmarks.md); here the profile is calibrated to the
machine's speed at the time and the bands leave room for load that changes during the run,
narrow enough to catch the 6-15x gap the simulator had before it modelled shared cores, one
thread per worker and mixed steps."""

from __future__ import annotations

import pytest

from blitzscale.bench.fidelity import FidelityConfig, run_fidelity

# Beside another test of the suite (parallel runs) the simulated TTFT came out 5x the live
# one at load 15: that load is not sampled by the calibration, which assumes it stays put.
pytestmark = pytest.mark.alone


def test_live_and_simulated_agree() -> None:
    """Calibrated: the profile is scaled to this machine's speed (timed in CPU time) and
    the trace sampled as much more densely, and the simulated cores carry the other work
    sampled on the machine during the live run, so a loaded machine slows both sides.
    Quiet 0.83x, beside three busy loops 0.46-2.0x; a machine twice the profile's speed
    gave 4.0x and no live scale-up before the speed was calibrated;
    under heavy load (load average 9 on the 2 cores) 0.09x uncalibrated, 0.84x calibrated,
    and up to 2.1-3.1x when other test suites' load came and went (docs/benchmarks.md).
    The band leaves room for that and still catches the old 6-15x gap."""
    res = run_fidelity(FidelityConfig(calibrate=True))
    live, sim = res["live"], res["sim"]
    assert live["ok"] == live["requests"] == sim["ok"] == live["requests"] > 20
    for key in ("ttft_mean_s", "ttft_p99_s"):
        ratio = sim[key] / live[key]
        assert 0.33 <= ratio <= 3.0, (key, res)
    assert abs(sim["scale_ups"] - live["scale_ups"]) <= 1, res
    assert live["scale_ups"] >= 1 and sim["scale_ups"] >= 1  # the burst does scale
