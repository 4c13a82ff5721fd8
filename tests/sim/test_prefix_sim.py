"""Prefix caching in the simulator: the simulated engines run the engine's own scheduler
with its prefix cache, prompts are built as the replay client builds them (blocks shared
exactly where a Mooncake trace's `hash_ids` are), and the router routes by prefix as live."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from blitzscale.client.traces import TraceRequest, load_trace, transform
from blitzscale.serve.config import SERVE_ENGINE
from blitzscale.sim.config import load_model, load_preset
from blitzscale.sim.runner import SimSetup, simulate

SLICE = Path(__file__).parents[2] / "blitzscale" / "data" / "mooncake_synthetic_slice.jsonl"


def _setup(**kw: object) -> SimSetup:
    setup = SimSetup(preset=load_preset("paper-a"), model=load_model("llama3-8b"), mode="colocated")
    return replace(setup, **kw)  # type: ignore[arg-type]


def test_shared_hash_ids_hit_the_cache_and_unrelated_prompts_never_do() -> None:
    trace = transform(load_trace(SLICE, "mooncake"), duration=120, max_input=4096, max_output=64)
    assert sum(1 for r in trace if r.hash_ids) == len(trace) > 10
    on = simulate(_setup(), trace, "blitz")
    # (prompts run on a live target, still loading, or relayed are not looked up)
    assert 0.5 * sum(r.input_tokens for r in trace) < on.prefix_queries
    assert on.prefix_hits > 0.2 * on.prefix_queries  # the slice reuses most of its prefixes
    assert on.prefix_routed > 0
    off = simulate(_setup(engine=replace(SERVE_ENGINE, prefix_caching=False)), trace, "blitz")
    assert off.prefix_hits == off.prefix_queries == off.prefix_routed == 0
    assert len(on.records) == len(off.records) == len(trace)

    # the same lengths without hash ids: every prompt its own, nothing shared
    plain = [TraceRequest(r.arrival_s, r.input_tokens, r.output_tokens) for r in trace]
    alone = simulate(_setup(), plain, "blitz")
    assert alone.prefix_queries > 0 and alone.prefix_hits == 0 and alone.prefix_routed == 0


def test_routing_by_prefix_can_be_turned_off_and_then_routes_by_load_alone() -> None:
    trace = transform(load_trace(SLICE, "mooncake"), duration=120, max_input=4096, max_output=64)
    res = simulate(_setup(prefix_routing=False), trace, "blitz")
    assert res.prefix_routed == 0 and res.prefix_hits > 0  # (the cache still works)


def test_new_instances_get_hot_prefixes_with_their_weights_unless_the_share_is_zero() -> None:
    """Network scale-ups ship the source's most reused cached prefix blocks (the same books
    as the workers', over the simulated link), so the new instances hit them at once."""
    trace = transform(load_trace(SLICE, "mooncake"), duration=120, max_input=4096, max_output=64)
    on = simulate(_setup(), trace, "blitz")
    assert any(e.is_up and e.path == "network" for e in on.events)
    assert on.prefix_shipped > 0
    off = simulate(_setup(hot_prefix_share=0.0), trace, "blitz")
    assert off.prefix_shipped == 0 and off.prefix_hits > 0
    assert on.prefix_hits > off.prefix_hits  # (on this slice: 271k against 248k tokens)
    assert len(on.records) == len(off.records) == len(trace)


def test_in_pd_mode_hot_prefixes_come_from_a_prefill_instance() -> None:
    """In pd mode the weights come from decode instances, whose caches are only imported
    into (never hit); the hot prefixes come from the prefill instance whose cache was hit
    most (`Loads.prefix_source`): without that choice nothing was shipped at all."""
    trace = transform(load_trace(SLICE, "mooncake"), duration=120, max_input=4096, max_output=64)
    res = simulate(_setup(mode="pd"), trace, "blitz")
    assert any(e.is_up and e.path == "network" for e in res.events)
    assert res.prefix_shipped > 0
