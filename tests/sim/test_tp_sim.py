"""Tensor-parallel instances on the simulator: profiles derived from TP=1 ones (sim/tp.py),
instances of tp aligned ranks loaded shard to shard, GPU time counted on every shard."""

from __future__ import annotations

import pytest

from blitzscale.client.traces import load_trace, transform
from blitzscale.model.layout import build_layout
from blitzscale.sim import tp
from blitzscale.sim.config import load_model, load_preset
from blitzscale.sim.runner import SimSetup, simulate


def test_derived_tp_profiles_follow_the_shapes() -> None:
    preset = load_preset("paper-a")
    one = preset.profile("mistral-24b")  # measured on an H200, derived to an A800
    two = preset.instance_profile(load_model("mistral-24b"))
    cfg = tp.shape("mistral-24b")
    assert two.weight_bytes == build_layout(cfg, 2, 2, 0).nbytes < one.weight_bytes
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    for b, c in ((1, 512), (64, 2048)):
        # less than one GPU's step, more than half of it: replicated embedding and head,
        # the all-reduces, and the fixed cost of a step do not split
        assert one.decode_s(b, c) / 2 < two.decode_s(b, c) < one.decode_s(b, c)
    assert one.prefill_s(2048) / 2 < two.prefill_s(2048) < one.prefill_s(2048)
    # over PCIe (paper-b) the all-reduces cost more than over NVLink
    pcie = load_preset("paper-b").instance_profile(load_model("mistral-24b"))
    assert pcie.decode_s(64, 2048) > two.decode_s(64, 2048)
    # 72B: scaled from 24B, it does not fit one 80 GB GPU but a shard of TP4 does
    four = preset.instance_profile(load_model("qwen2.5-72b"))
    assert tp.weight_bytes(tp.shape("qwen2.5-72b")) > preset.memory_bytes > four.weight_bytes
    assert four.kv_tokens > 100_000 and four.decode_s(1, 512) > two.decode_s(1, 512)


@pytest.fixture(scope="module")
def tp_setup() -> tuple[SimSetup, list]:
    from importlib.resources import as_file, files

    with as_file(files("blitzscale.data") / "azure_code_2023_slice.csv") as path:
        trace = transform(load_trace(path, "azure"), duration=300.0)
    return SimSetup(preset=load_preset("paper-a"), model=load_model("mistral-24b")), trace


def test_tp2_instances_scale_on_aligned_rank_pairs(tp_setup: tuple[SimSetup, list]) -> None:
    setup, trace = tp_setup
    res = simulate(setup, trace, "blitz")
    assert all(r.is_ok for r in res.records) and len(res.records) == len(trace)
    ups = [e for e in res.events if e.direction == "up"]
    assert len(ups) >= 3  # the first prefill and decode instances, and a scale-up
    for e in ups:
        ranks = e.ranks
        assert len(ranks) % 2 == 0 and all(ranks[i] % 2 == 0 and ranks[i + 1] == ranks[i] + 1
                                           for i in range(0, len(ranks), 2)), e  # fmt: skip
        if e.path == "network":
            assert len(e.sources) % 2 == 0, e  # whole source instances, shard to shard
    # GPU time counts both shards: at least two GPUs for each instance-second served
    instance_s = sum((t1 - t0) * n for (t0, n), (t1, _) in zip(res.samples, res.samples[1:], strict=False))
    assert res.gpu_seconds >= 2 * instance_s * 0.99


@pytest.mark.parametrize("policy", ["sllm", "allcache"])
def test_tp2_instances_load_from_host_copies_of_their_shards(
    tp_setup: tuple[SimSetup, list], policy: str
) -> None:
    setup, trace = tp_setup
    res = simulate(setup, trace, policy)
    assert all(r.is_ok for r in res.records) and len(res.records) == len(trace)
    hosts = [e for e in res.events if e.direction == "up" and e.path == "host"]
    assert hosts, res.events  # (allcache: every scale-up; sllm: a hit in the host's cache)
    for e in hosts:
        ranks = e.ranks
        assert len(ranks) % 2 == 0 and ranks[0] % 2 == 0, e


def test_live_tp2_targets_relay_tasks_to_their_partner(tp_setup: tuple[SimSetup, list]) -> None:
    """ZigZag on the simulator: a live target hands tasks to its idle partner, which runs
    their remaining layers; every request still completes."""
    setup, trace = tp_setup
    live, nolive = simulate(setup, trace, "blitz"), simulate(setup, trace, "blitz-nolive")
    assert all(r.is_ok for r in live.records) and len(live.records) == len(trace)
    assert live.relays > 0 and nolive.relays == 0
