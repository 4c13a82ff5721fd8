"""A worker's cost probe (worker/costprobe.py): timed steps of an idle engine become a
Profile of the served model's shape, kept per shape, device and engine limits."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch

from blitzscale.checkpoint.presets import PRESETS
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.errors import BlitzScaleError
from blitzscale.kvcache.cache import KVCache
from blitzscale.messages import ProfileMsg
from blitzscale.model.weights import ModelWeights, layout_of
from blitzscale.worker import costprobe
from blitzscale.worker.cost_report import cost_report
from blitzscale.worker.standby import Standby

CONFIG = PRESETS["tiny-llama3"]
ENGINE = EngineConfig(block_size=16).for_device("cpu")


def test_a_probe_of_a_scratch_engine_is_a_profile_of_the_model() -> None:
    cpu = torch.device("cpu")
    points = costprobe.probe_points(cpu, ENGINE)
    assert points.prefill_tokens == (16, 128, 256) and points.decode_batch == (1, 4)
    engine = costprobe.scratch_engine(CONFIG, torch.float32, cpu, ENGINE, points)
    p = costprobe.measure(engine, points, "tiny")
    assert engine.is_idle  # what it ran is gone
    engine.check_integrity()
    assert (p.name, p.num_layers, p.weight_bytes) == (
        "tiny",
        CONFIG.num_layers,
        engine.model.weights.layout.nbytes,
    )
    assert p.device.startswith("cpu") and p.prefill_tokens == points.prefill_tokens
    assert all(ms > 0 for ms in p.prefill_ms) and all(ms > 0 for row in p.decode_ms for ms in row)
    assert p.prefill_rate() > 0 and p.kv_bytes_per_token > 0
    assert points.mixed == (128, 4, 32) and p.mixed_extra_ms >= 0  # (a mixed step was measured)


def test_points_fit_what_the_engine_holds() -> None:
    """A small KV cache or context drops the batches and prompts it could not hold at once
    (they would queue, and the step timed would not be the one named)."""
    cuda_points = costprobe.probe_points(torch.device("cuda"), EngineConfig().for_device("cuda"))
    assert cuda_points.prefill_tokens[-1] == 8192 and cuda_points.decode_batch[-1] == 256
    small = costprobe.scratch_engine(
        CONFIG, torch.float32, torch.device("cpu"), ENGINE, costprobe.ProbePoints((16,), (1,), (32,), 1)
    )
    fitted = costprobe.fit(cuda_points, small)
    room = small.pool.num_blocks * small.config.block_size
    assert max(fitted.prefill_tokens) < room
    assert all(b * max(fitted.decode_context) <= room for b in fitted.decode_batch)


def test_a_short_context_keeps_the_largest_batch_within_it() -> None:
    """max_model_len 512 with a GPU's points (a batch of 256, context up to 512): the batch
    decodes through its prompts' prefill steps too, so its context must leave room for
    them, or rows end by length while timed (seen on an H200 as "shrank to 109")."""
    cuda_engine = EngineConfig(max_model_len=512).for_device("cuda")
    points = costprobe.probe_points(torch.device("cuda"), cuda_engine)
    weights = ModelWeights.empty(CONFIG, torch.float32, "cpu")
    weights.readiness.mark_all_ready()
    engine = LLMEngine(weights, None, cuda_engine)  # (its own max_model_len: 512)
    fitted = costprobe.fit(points, engine)
    b, step = max(fitted.decode_batch), cuda_engine.max_num_batched_tokens
    assert b == 256
    for c in fitted.decode_context:
        assert c + fitted.decoding_tokens(b, c, step) + 2 <= engine.max_model_len, (c, fitted)


def test_the_cache_keeps_a_profile_per_shape_device_and_engine_limits(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    key = costprobe.cache_key(CONFIG, torch.float32, cpu, ENGINE)
    assert key == costprobe.cache_key(CONFIG, torch.float32, cpu, ENGINE)
    assert key != costprobe.cache_key(CONFIG, torch.bfloat16, cpu, ENGINE)
    other = EngineConfig(block_size=16, max_num_seqs=8).for_device("cpu")
    assert key != costprobe.cache_key(CONFIG, torch.float32, cpu, other)
    assert key != costprobe.cache_key(CONFIG, torch.float32, cpu, ENGINE, tp=2)  # (a shard's)
    assert costprobe.cached_profile(tmp_path, key) is None
    points = costprobe.ProbePoints((16, 32), (1, 2), (16,), 1)
    p = costprobe.measure(costprobe.scratch_engine(CONFIG, torch.float32, cpu, ENGINE, points), points, "t")
    costprobe.save_profile(tmp_path, key, p)
    assert costprobe.cached_profile(tmp_path, key) == p
    (tmp_path / f"{key}.json").write_text("{not json")
    assert costprobe.cached_profile(tmp_path, key) is None  # broken: measured again, not trusted


def test_a_busy_engine_is_not_probed() -> None:
    points = costprobe.ProbePoints((16,), (1,), (16,), 1)
    engine = costprobe.scratch_engine(CONFIG, torch.float32, torch.device("cpu"), ENGINE, points)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="idle engine"):
        costprobe.measure(engine, points, "t")


def test_blitzscale_profile_measures_through_the_probe() -> None:
    """`blitzscale profile` (bench/profile.py) is the probe at the points asked for."""
    from blitzscale.bench.profile import ProfileConfig, measure_profile

    cfg = ProfileConfig(
        model="random:tiny-llama3",
        prefill_tokens=(16, 64),
        decode_batch=(1, 3),
        decode_context=(24, 48),
        steps=3,
    )
    lines: list[str] = []
    p = measure_profile(cfg, log=lines.append)
    assert p.name == "tiny-llama3-cpu" and "blitzscale profile --model random:tiny-llama3" in p.note
    assert (p.prefill_tokens, p.decode_batch, p.decode_context) == ((16, 64), (1, 3), (24, 48))
    assert len(p.decode_ms) == 2 and all(len(row) == 2 and min(row) > 0 for row in p.decode_ms)
    assert len(lines) == 2 + 4  # a line per point
    assert p.device_memory_bytes > p.weight_bytes  # weights and 8192 tokens of KV
    assert p.kv_tokens == 8192


def test_decode_times_never_fall_with_more_context_or_batch() -> None:
    """A noisy point (a step that paid a one-off cost) must not make a larger step look
    cheaper: the profile would extrapolate that falling slope past its last context."""
    from blitzscale.worker.costprobe import monotone

    ms = monotone([[0.005, 0.0052], [0.0112, 0.0082], [0.010, 0.009]])
    assert ms == ((5.0, 5.2), (11.2, 11.2), (11.2, 11.2))
    assert monotone([[0.001]]) == ((1.0,),)


def test_decode_batches_stay_whole_while_timed() -> None:
    """Prompts that take several steps to prefill: the first requests decode through those
    steps, and must still be decoding when the batch is timed (on an H200 the rows that had
    finished made a batch of 256 at context 512 look 20% cheaper than it is)."""
    small_steps = EngineConfig(block_size=16, max_num_batched_tokens=32).for_device("cpu")
    points = costprobe.ProbePoints((16,), (6,), (32,), 1)  # 6 x 32 tokens: 7 steps of prefill
    assert points.decoding_tokens(6, 32, 32) == points.decode_tokens + 7
    engine = costprobe.scratch_engine(CONFIG, torch.float32, torch.device("cpu"), small_steps, points)
    p = costprobe.measure(engine, points, "t")  # raises if a row finished while timed
    assert p.decode_batch == (6,) and engine.is_idle


def test_a_rank_leading_no_instance_group_refuses_to_measure_a_tp_instance() -> None:
    """A tp=2 cost model is one shard's, timed across the instance group the asked rank
    leads; a rank in no such group says so (before building anything)."""
    msg = ProfileMsg(op_id=1, model="tiny", source="random:tiny-llama3", engine=ENGINE, tp=2)
    standby = Standby(None, torch.device("cpu"), torch.float32, lambda: None)
    shape = cost_report(
        msgspec.structs.replace(msg, measure=False), torch.device("cpu"), torch.float32, standby, 4
    )
    assert shape.weight_bytes == layout_of(CONFIG, torch.float32, 2).nbytes  # one shard's sizes
    assert shape.kv_bytes_per_token == KVCache.bytes_per_block(CONFIG, 1, torch.float32, 2)
    with pytest.raises(BlitzScaleError, match="rank 4 cannot measure a tp=2 instance: it leads no"):
        cost_report(msg, torch.device("cpu"), torch.float32, standby, 4)
