"""The simulator's virtual clock and its step-time profiles."""

from __future__ import annotations

import asyncio
import time

import pytest

from blitzscale import clock
from blitzscale.control.costmodel import Profile, ProfileError, load_profile
from blitzscale.sim.clock import SimulationStalled, run


def test_virtual_time_jumps_to_the_next_event_and_timeouts_run_on_it() -> None:
    async def main() -> tuple[float, float, float]:
        ev = asyncio.Event()

        async def later() -> None:
            await asyncio.sleep(3600)  # an hour of simulated time
            ev.set()

        task = asyncio.create_task(later())
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(60):
                await ev.wait()
        at_timeout = clock.now()
        await ev.wait()
        at_set = clock.now()
        await task
        for _ in range(1000):
            await asyncio.sleep(0.01)
        return at_timeout, at_set, clock.now()

    wall = time.perf_counter()
    at_timeout, at_set, end = run(main())
    assert at_timeout == pytest.approx(60)
    assert at_set == pytest.approx(3600)
    assert end == pytest.approx(3610)
    assert time.perf_counter() - wall < 60  # (simulated hours, not real ones: generous on a busy machine)


def test_a_simulation_that_can_never_go_on_says_so() -> None:
    async def stuck() -> None:
        await asyncio.Event().wait()  # nothing will ever set it, and nothing is scheduled

    with pytest.raises(SimulationStalled):
        run(stuck())


def _tiny(**kw: object) -> Profile:
    base = dict(
        name="t",
        device="test",
        weight_bytes=1000,
        kv_bytes_per_token=10,
        device_memory_bytes=2000,
        prefill_tokens=(100, 200),
        prefill_ms=(10.0, 20.0),
        decode_batch=(1, 4),
        decode_context=(100, 300),
        decode_ms=((5.0, 7.0), (8.0, 12.0)),
    )
    base.update(kw)
    return Profile(**base)  # type: ignore[arg-type]


def test_profiles_interpolate_and_extend_beyond_their_points() -> None:
    p = _tiny()
    assert p.prefill_s(150) == pytest.approx(0.015)
    assert p.prefill_s(400) == pytest.approx(0.040)  # the last slope goes on
    assert p.decode_s(1, 200) == pytest.approx(0.006)
    assert p.decode_s(4, 100) == pytest.approx(0.008)
    assert p.decode_s(2, 100) == pytest.approx(0.006)
    assert p.decode_s(0, 100) == 0.0
    assert p.kv_tokens == 90  # (2000 - 1000) * 0.9 / 10
    d = p.derive("t2", "faster", bandwidth_factor=2.0, flops_factor=4.0, memory_bytes=3000)
    assert d.decode_s(1, 100) == pytest.approx(0.0025) and d.prefill_s(100) == pytest.approx(0.0025)
    assert d.derived_from == {"profile": "t", "device": "test", "bandwidth_factor": 2.0, "flops_factor": 4.0}
    assert Profile.from_json(d.to_json()) == d


def test_bad_profiles_are_refused_by_name() -> None:
    with pytest.raises(ProfileError, match="increasing"):
        _tiny(prefill_tokens=(200, 100))
    with pytest.raises(ProfileError, match=r"\[batch\]\[context\]"):
        _tiny(decode_ms=((5.0,), (8.0,)))
    with pytest.raises(ProfileError, match="no memory for KV"):
        _tiny(device_memory_bytes=1000)
    with pytest.raises(ProfileError, match=r"shipped: .*llama3-8b-h200"):
        load_profile("no-such-profile")


def test_shipped_profiles_load_and_the_derived_ones_say_from_what() -> None:
    h200 = load_profile("llama3-8b-h200")
    a800 = load_profile("llama3-8b-a800")
    assert not h200.derived_from and a800.derived_from["profile"] == "llama3-8b-h200"
    assert a800.decode_s(8, 512) > h200.decode_s(8, 512)


def test_an_interrupted_run_unwinds_its_tasks_and_reports_nothing_twice(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C inside a simulation (a task's KeyboardInterrupt) ends `run` with it, after
    the tasks still pending are cancelled and unwound: none is destroyed pending, none
    schedules its cleanup on the closed loop, and the interrupted task's exception is not
    logged (the command reports the interrupt once). Each used to print a traceback."""
    import asyncio
    import gc

    from blitzscale.sim import clock as sim_clock

    unwound: list[str] = []

    async def waits(q: asyncio.Queue[int]) -> None:
        try:
            await q.get()
        finally:
            unwound.append("waiter")

    async def interrupted() -> None:
        await asyncio.sleep(1.0)
        raise KeyboardInterrupt

    async def main() -> None:
        q: asyncio.Queue[int] = asyncio.Queue()
        keep = [asyncio.create_task(waits(q)) for _ in range(3)]
        keep.append(asyncio.create_task(interrupted()))
        await asyncio.sleep(100.0)

    with pytest.raises(KeyboardInterrupt):
        sim_clock.run(main())
    gc.collect()
    assert unwound == ["waiter"] * 3
    said = capfd.readouterr().err + "".join(r.getMessage() for r in caplog.records)
    for noise in ("Task was destroyed", "Event loop is closed", "never retrieved"):
        assert noise not in said, said
