"""Where a simulated request's time to first token went (`TtftParts`): the recorder's
arithmetic, the record's JSON, the tail's means, and a run on the paper's PCIe cluster whose
live targets make requests wait for layers and relay them."""

from __future__ import annotations

from dataclasses import astuple
from pathlib import Path

import pytest

from blitzscale.batch.traces import DEMO, TraceSpec, load_requests
from blitzscale.client.record import RequestRecord, TtftParts, read_records, write_records
from blitzscale.sim.compare import tail_parts
from blitzscale.sim.config import load_model, load_preset
from blitzscale.sim.recorder import Recorder
from blitzscale.sim.runner import SimSetup, simulate


def _total(p: TtftParts) -> float:
    return p.router_queue_s + p.engine_queue_s + p.load_wait_s + p.relay_s + p.compute_s


def test_the_recorder_splits_a_first_token_into_its_parts() -> None:
    rec = Recorder()
    # sent at 0; the instance that takes it came up at 0.6 and takes it at 0.8; its first
    # step at 1.0; 0.3 s waiting for layers; relayed from 1.5 to 1.7; first token at 2.5
    rec.reached("r", 0.8, up_at=0.6)
    rec.reached("r", 5.0, up_at=0.0)  # (a second instance later: the first one counts)
    rec.started("r", 1.0)
    rec.started("r", 1.2)
    rec.waited_for_layers("r", 0.3)
    rec.relay_began("r", 1.5)
    rec.relay_ended("r", 1.7)
    p = rec.ttft_parts("r", sent=0.0, ttft_s=2.5)
    assert p is not None
    assert astuple(p) == pytest.approx((0.2, 0.2, 0.9, 0.2, 1.0))
    assert rec.ttft_parts("unknown", 0.0, 1.0) is None
    rec.forget("r")
    assert rec.ttft_parts("r", 0.0, 2.5) is None


def test_a_wait_for_layers_before_the_first_step_is_load_not_queue() -> None:
    rec = Recorder()
    rec.reached("r", 1.0, up_at=0.0)  # on a live target from 1.0
    rec.waited_for_layers("r", 0.4)  # its first layer lands at 1.5 ...
    rec.started("r", 1.5)  # ... and runs
    rec.waited_for_layers("r", 0.2)  # a later layer
    p = rec.ttft_parts("r", sent=1.0, ttft_s=1.0)
    assert p is not None
    assert astuple(p) == pytest.approx((0.0, 0.1, 0.6, 0.0, 0.3))


def test_parts_survive_the_records_json(tmp_path: Path) -> None:
    parts = TtftParts(0.1, 0.0, 0.25, 0.05, 0.4)
    records = [
        RequestRecord(0, 0.0, 0.0, 10, 2, 2, "ok", ttft_s=0.8, ttft_parts=parts),
        RequestRecord(1, 1.0, 1.0, 10, 2, 2, "ok", ttft_s=0.2),
    ]
    write_records(tmp_path / "r.jsonl", records)
    assert read_records(tmp_path / "r.jsonl") == records


def test_the_tail_is_the_slowest_one_percent() -> None:
    def rec(i: int, ttft: float, tokens: int) -> RequestRecord:
        p = TtftParts(ttft / 2, 0.0, ttft / 4, 0.0, ttft / 4)
        return RequestRecord(i, 0.0, 0.0, tokens, 1, 1, "ok", ttft_s=ttft, ttft_parts=p)

    records = [rec(i, 0.1, 100) for i in range(199)] + [rec(199, 2.0, 8000), rec(200, 4.0, 6000)]
    t = tail_parts(records)
    assert t.requests == 3  # (the two slow ones and the one numpy's p99 interpolates from)
    assert t.input_tokens == pytest.approx((100 + 8000 + 6000) / 3)
    assert t.queue_ms == pytest.approx(1000 * (0.05 + 1.0 + 2.0) / 3)
    assert t.router_queue_ms == t.queue_ms  # (no instance queue here)
    assert t.load_ms == t.compute_ms == pytest.approx(1000 * (0.025 + 0.5 + 1.0) / 3)
    assert t.relay_ms == 0.0


@pytest.fixture(scope="module")
def paper_b_24b() -> tuple[SimSetup, list]:
    setup = SimSetup(preset=load_preset("paper-b"), model=load_model("mistral-24b"))
    return setup, load_requests(TraceSpec(path=DEMO, format="azure", cv=2.0, seed=0))


@pytest.mark.parametrize("policy", ["blitz", "blitz-nolive", "sllm"])
def test_every_first_token_is_its_parts(policy: str, paper_b_24b: tuple[SimSetup, list]) -> None:
    """24B TP2 on the PCIe cluster, the Azure slice in bursts: every request's parts add up
    to its TTFT; requests wait for instances that are loading under every scaling policy;
    only blitz's live targets relay."""
    setup, trace = paper_b_24b
    res = simulate(setup, trace, policy)
    parts = [r.ttft_parts for r in res.records]
    assert len(parts) == len(trace) and None not in parts
    for r, p in zip(res.records, parts, strict=True):
        assert p is not None and r.ttft_s is not None
        assert min(p.router_queue_s, p.engine_queue_s, p.load_wait_s, p.relay_s, p.compute_s) >= 0
        assert _total(p) == pytest.approx(r.ttft_s, abs=1e-9)
    assert any(p.load_wait_s > 0 for p in parts if p is not None)
    relayed = [p for p in parts if p is not None and p.relay_s > 0]
    assert bool(relayed) == (policy == "blitz")
