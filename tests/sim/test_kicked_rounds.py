"""The scaler does not wait for its next round when something a waiting model needs just
happened (serve/scaler.py): a request for a model no instance serves, an idle instance told
to drain, and the end of every scale action each start a round at once. Simulated on one
GPU with two models taking turns and a planner round only every hour: without those kicks
a model's request would wait up to an hour (simulated time) for its swap."""

from __future__ import annotations

from dataclasses import replace

from blitzscale.client.traces import TraceRequest
from blitzscale.sim.config import load_model, load_preset
from blitzscale.sim.runner import SimSetup, simulate


def test_swaps_on_one_gpu_do_not_wait_for_planner_rounds() -> None:
    preset = load_preset("h200x2")
    one_gpu = replace(preset, topology=replace(preset.topology, gpus_per_node=1))
    setup = SimSetup(
        preset=one_gpu,
        model=load_model("llama3-8b"),
        mode="colocated",
        models=("a", "b"),
        keep_alive_s=30.0,  # (the idle model stays on the GPU: each turn is a straight swap)
        models_per_rank=1,  # (one model a GPU: two would both fit)
        planner_overrides={"interval_s": 3600.0},
    )
    names = ["a", "b", "a", "b", "a"]
    trace = [TraceRequest(arrival_s=10.0 * k, input_tokens=256, output_tokens=8) for k in range(len(names))]
    res = simulate(setup, trace, "blitz", trace_models=names)
    assert len(res.records) == len(trace) and all(r.is_ok for r in res.records)
    ups = [(e.model, e.path) for e in res.events if e.direction == "up" and e.time > 0]
    assert ups == [("b", "disk"), ("a", "host"), ("b", "host"), ("a", "host")], ups
    ttfts = [r.ttft_s or 0.0 for r in res.records]
    # b's first load reads 16 GB from disk (8 s); each later swap is a host copy of it
    # (0.3 s at the preset's PCIe rate) and a prefill; an hour's round would add ~3600 s
    assert ttfts[1] < 10.0 and all(t < 1.0 for t in ttfts[2:]), ttfts
