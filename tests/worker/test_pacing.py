"""Pacing (worker/pacing.py): a step's shape -> its reference seconds, the reference device
chosen from the workers and the cores, and bad `[engine] pace` values named. Pure: nothing
here measures time."""

from __future__ import annotations

from pathlib import Path

import pytest

from blitzscale.control.costmodel import Profile, ProfileError, load_profile
from blitzscale.engine.work import StepWork
from blitzscale.errors import InvalidRequestError
from blitzscale.worker.pacing import (
    REFERENCE_OF,
    Pacer,
    reference_factor,
    reference_profile,
    resolve_pace,
    step_s,
    summary,
)

CPU = load_profile(REFERENCE_OF)


def test_a_pure_prefill_or_decode_step_takes_what_the_profile_gives() -> None:
    assert step_s(CPU, StepWork(prompt_tokens=512)) == pytest.approx(CPU.prefill_s(512))
    decode = StepWork(decode_contexts=[100, 156, 128, 128])
    assert step_s(CPU, decode) == pytest.approx(CPU.decode_s(4, 128))
    assert step_s(CPU, StepWork()) == 0.0


def test_a_mixed_step_counts_its_decode_rows_as_prompt_tokens_plus_their_attention() -> None:
    short = StepWork(prompt_tokens=128, decode_contexts=[64, 64])  # contexts under the first profiled
    assert step_s(CPU, short) == pytest.approx(CPU.prefill_s(130))
    long = StepWork(prompt_tokens=128, decode_contexts=[1024, 1024])
    extra = CPU.decode_s(2, 1024) - CPU.decode_s(2, 128)
    assert extra > 0
    assert step_s(CPU, long) == pytest.approx(CPU.prefill_s(130) + extra)


def test_a_mixed_step_adds_what_the_profile_measured_beyond_the_rule() -> None:
    """The probe's `mixed_extra_ms` (worker/costprobe.py): every step that prefills and
    decodes at once pays it; a pure prefill or decode step does not; it survives JSON."""
    from dataclasses import replace

    p = replace(CPU, mixed_extra_ms=7.5)
    mixed = StepWork(prompt_tokens=128, decode_contexts=[16, 16])
    assert step_s(p, mixed) == pytest.approx(step_s(CPU, mixed) + 0.0075)
    assert step_s(p, StepWork(prompt_tokens=128)) == step_s(CPU, StepWork(prompt_tokens=128))
    assert step_s(p, StepWork(decode_contexts=[16])) == step_s(CPU, StepWork(decode_contexts=[16]))
    assert Profile.from_json(p.to_json()) == p and CPU.mixed_extra_ms == 0.0
    with pytest.raises(ProfileError, match="mixed_extra_ms must be >= 0"):
        replace(CPU, mixed_extra_ms=-1.0)


def test_layer_ranges_cost_their_share_of_a_whole_prefill() -> None:
    n = CPU.num_layers
    one_layer = StepWork(partial=[(192, 1 / n)])
    assert step_s(CPU, one_layer) == pytest.approx(CPU.prefill_s(192) / n)
    both = StepWork(prompt_tokens=64, partial=[(192, 1 / n), (100, 0.5)])
    want = CPU.prefill_s(64) + CPU.prefill_s(192) / n + CPU.prefill_s(100) / 2
    assert step_s(CPU, both) == pytest.approx(want)


def test_the_reference_device_leaves_half_the_cores_free() -> None:
    assert reference_factor(3, cpus=2) == 3.0  # 3 workers busy at once need 1 of the 2 cores
    assert reference_factor(4, cpus=16) == 1.0  # never faster than the measured CPU
    assert reference_factor(6, cpus=4) == 3.0
    ref = reference_profile(3.0)
    assert ref.prefill_s(192) == pytest.approx(3 * CPU.prefill_s(192), rel=1e-3)
    assert ref.decode_s(16, 512) == pytest.approx(3 * CPU.decode_s(16, 512), rel=1e-3)
    assert "x3" in ref.name and ref.derived_from["profile"] == REFERENCE_OF


def test_pace_settings_resolve() -> None:
    assert resolve_pace("off", 3) is None
    auto = resolve_pace("reference", 3, cpus=2)
    assert auto is not None and auto.prefill_s(512) == pytest.approx(3 * CPU.prefill_s(512), rel=1e-3)
    fixed = resolve_pace("reference:2.5", 3, cpus=64)
    assert fixed is not None and fixed.decode_s(1, 128) == pytest.approx(2.5 * CPU.decode_s(1, 128), rel=1e-3)
    named = resolve_pace("llama3-8b-h200", 3)
    assert named is not None and named.name == load_profile("llama3-8b-h200").name


def test_a_profile_file_paces_too(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    reference_profile(4.0).save(path)
    p = resolve_pace(str(path), 3)
    assert p is not None and p.prefill_s(16) == pytest.approx(4 * CPU.prefill_s(16), rel=1e-3)


@pytest.mark.parametrize(
    "bad", ["nosuch-profile", "reference:0.5", "reference:abc", "reference:inf", "x.json"]
)
def test_a_bad_pace_setting_is_named(bad: str) -> None:
    with pytest.raises(InvalidRequestError, match=r"\[engine\] pace = " + repr(bad).replace(".", r"\.")):
        resolve_pace(bad, 3)


def test_the_pacer_sleeps_the_rest_of_the_reference_time_never_less_than_compute() -> None:
    pacer = Pacer()
    work = StepWork(prompt_tokens=512)
    ref = CPU.prefill_s(512)
    assert pacer.remainder_s(CPU, work, 0.25 * ref) == pytest.approx(0.75 * ref)
    assert pacer.remainder_s(CPU, work, 2 * ref) == 0.0  # slower than the reference: no sleep
    assert pacer.steps == 2 and pacer.over == 1
    assert pacer.paced_s == pytest.approx(3 * ref)  # (a step over its reference lasts its compute)
    assert pacer.real_s == pytest.approx(2.25 * ref)
    line = summary(pacer.steps, pacer.over, pacer.real_s, pacer.paced_s)
    assert line == "2 paced steps, real compute 75% of their time, 1 (50%) took longer than their reference"
    assert summary(0, 0, 0.0, 0.0) == "no paced step"
    assert pacer.remainder_s(CPU, StepWork(), 0.01) == 0.0 and pacer.steps == 2  # nothing timed: not counted


def test_the_engine_reports_each_steps_shape(tiny_weights) -> None:
    """What the pacer is given: a prefill step's prompt tokens, then decode rows with their
    contexts."""
    from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams

    e = LLMEngine(tiny_weights("tiny-llama3"), None, EngineConfig(block_size=4, num_kv_blocks=64))
    params = SamplingParams(max_tokens=3, temperature=0)
    e.add_request([1, 2, 3, 4, 5], params, request_id="a")
    e.add_request([6, 7, 8], params, request_id="b")
    e.step()
    assert (e.last_work.prompt_tokens, e.last_work.decode_contexts, e.last_work.partial) == (8, [], [])
    e.step()
    assert e.last_work.prompt_tokens == 0 and sorted(e.last_work.decode_contexts) == [4, 6]
    assert e.last_work.mean_context == 5.0 and e.last_work.decode_batch == 2
