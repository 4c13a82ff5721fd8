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


def test_each_model_gets_its_own_slice_twice_with_idle_time_between() -> None:
    from blitzscale.demo.workload import model_slices

    requests = Workload().requests()
    names = ["model-a", "model-b", "model-c"]
    by_model = model_slices(requests, names)
    assert list(by_model) == names
    span = max(r.arrival_s for r in requests)
    width = span / 3
    firsts = [rs[: len(rs) // 2] for rs in by_model.values()]
    # the three first rounds are the trace itself, cut in three consecutive slices
    assert [r for rs in firsts for r in rs] == requests
    for k, rs in enumerate(firsts):
        assert rs and all(k * width <= r.arrival_s <= (k + 1) * width for r in rs)
    for rs in by_model.values():  # the second round is the same slice, later
        half = len(rs) // 2
        assert [r.input_tokens for r in rs[half:]] == [r.input_tokens for r in rs[:half]]
        gap = rs[half].arrival_s - rs[half - 1].arrival_s
        assert gap > width  # idle for at least another model's slice: time to go to zero


def test_the_multi_model_demo_config_serves_each_name_within_one_host_budget() -> None:
    from blitzscale.cli.demo import demo_config

    cfg = demo_config("smollm2-135m", "sllm", 3, models=3, keep_alive_s=8.0, host_memory_bytes=600_000_000)
    assert [m.name for m in cfg.served_models()] == ["model-a", "model-b", "model-c"]
    assert {m.spec for m in cfg.served_models()} == {"smollm2-135m"}
    assert all(m.keep_alive_s == 8.0 for m in cfg.served_models())
    assert cfg.cluster.host_memory_bytes == 600_000_000
    assert demo_config("smollm2-135m", "blitz", 3).models == ()  # one model: the demo as before


def test_the_demo_paces_its_workers_and_scales_the_planner_with_them() -> None:
    from blitzscale.cli.demo import demo_config

    cfg = demo_config("smollm2-135m", "blitz", 3, pace="reference", slowdown=3.0)
    assert cfg.engine.pace == "reference"
    assert cfg.planner.tokens_prefilled_per_sec == 200.0  # one quiet core's 600, a third as fast
    assert demo_config("smollm2-135m", "blitz", 3).engine.pace == "off"


def test_a_bad_demo_pace_is_named_before_any_worker_starts() -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "blitzscale.cli.main", "demo", "--pace", "reference:slow"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "--pace: [engine] pace = 'reference:slow'" in r.stderr and "Traceback" not in r.stderr
