"""`bench serve`'s mixes on the simulator (bench/serve_sim.py): one simulated GPU behind
serve's default control plane, in virtual time, against a live run's figures."""

from __future__ import annotations

import dataclasses

import pytest

from blitzscale.bench.mixes import Mix
from blitzscale.bench.serve_sim import against_live, simulate_mixes
from blitzscale.control.costmodel import load_profile
from blitzscale.errors import InvalidRequestError

H200 = load_profile("llama3-8b-h200")
MIX = Mix(streams=(8,), prompt_len=256, max_tokens=32, window_s=4.0, warmup_s=1.0, burst=16,
          burst_len=1024, single_len=1024, single_runs=2, stream_tokens=16)  # fmt: skip


def test_the_mixes_take_what_the_cost_model_says() -> None:
    out = simulate_mixes(H200, MIX)
    single = out["single"]
    # one prompt alone: its prefill step (plus the router's and links' small latencies)
    assert single.ttft_s == pytest.approx(H200.prefill_s(1024), rel=0.15)
    assert single.token_interval_s == pytest.approx(H200.decode_s(1, 256 + 8), rel=0.15)
    burst = out["burst"]
    assert (burst.refused, burst.errors) == (0, 0)  # 16k prompt tokens: well within the queue's wait
    whole = H200.prefill_s(16 * 1024) if 16 * 1024 <= 8192 else 2 * H200.prefill_s(8192)
    assert whole * 0.8 <= burst.last_answer_s <= whole * 1.5
    loop = out["closed_8"]
    assert loop.errors == 0 and loop.requests_done > 0
    # 8 streams decoding at batch 8 (prefills aside): at most one token per stream a step
    assert 0 < loop.output_tokens_per_s <= 8 / H200.decode_s(8, 256)


def test_against_a_live_run_gives_ratios_per_mix() -> None:
    sim = simulate_mixes(H200, MIX)
    live = {
        "model": "random:llama3-8b",
        "mix": dataclasses.asdict(MIX),
        "server": {"profile": H200.to_json()},
        "closed_8": {"served": {**dataclasses.asdict(sim["closed_8"]), "output_tokens_per_s": 100.0}},
    }
    out = against_live(live)
    want = round(sim["closed_8"].output_tokens_per_s / 100, 3)
    assert out["closed_8"]["ratio"]["output_tokens_per_s"] == want
    assert "ratio" not in out["burst"] and out["burst"]["simulated"]["requests"] == 16


def test_a_live_run_without_a_cost_model_needs_one_given() -> None:
    with pytest.raises(InvalidRequestError, match="--profile"):
        against_live({"mix": dataclasses.asdict(MIX), "server": {"profile": None}})
