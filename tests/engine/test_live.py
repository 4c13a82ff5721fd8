"""Live scaling inside the engine: a target serving while its weights arrive, and relays.

The weights' readiness counters are driven by hand here (one segment at a time, as a
transfer lands them), so every interleaving the live queue can meet is reproducible.
Outputs must be token-identical to an engine that had all its weights from the start.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.core.sampling import SamplingParams
from blitzscale.engine import EngineConfig, LLMEngine

CFG = EngineConfig(block_size=16, num_kv_blocks=64, max_num_batched_tokens=512, max_model_len=256)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * j) % 200 + 2 for j in range(n)] for i, n in enumerate((37, 5, 20, 64))]


@pytest.fixture(scope="module")
def full() -> Any:
    return load_weights(resolve_model("random:tiny-llama3"))


def partial_engine(full: Any) -> tuple[LLMEngine, Any]:
    """An engine over a copy of `full` whose segments have not arrived yet."""
    w = load_weights(resolve_model("random:tiny-llama3"))
    w.buffer.copy_(full.buffer)
    w.readiness.reset()
    e = LLMEngine(w, None, CFG)
    e.start_live()
    return e, w


def reference(full: Any, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    e = LLMEngine(full, None, CFG)
    return [o.token_ids for o in e.generate(prompts, params)]


def run_all(e: LLMEngine, ids: list[str], max_steps: int = 10_000) -> dict[str, list[int]]:
    final: dict[str, list[int]] = {}
    for _ in range(max_steps):
        for o in e.step():
            if o.finished:
                final[o.request_id] = o.token_ids
        if len(final) == len(ids):
            return final
    raise AssertionError(f"not finished: {set(ids) - set(final)}")


def test_live_target_runs_layers_as_they_land_and_matches_a_loaded_engine(full: Any) -> None:
    e, w = partial_engine(full)
    ids = [e.add_request(p, GREEDY, f"r{i}") for i, p in enumerate(PROMPTS)]
    num_seg = len(w.layout.segments)
    stages_seen = []
    for seg in range(num_seg):
        # Nothing past the landed segments can run, however often the engine steps.
        for _ in range(3):
            assert all(o.new_token_ids == [] for o in e.step())
        stages_seen.append(sorted({t.stage for t in e.live.tasks}))
        w.readiness.add(seg)
    assert stages_seen[0] == [0] and stages_seen[-1] == [num_seg - 1]  # all waited at the head
    assert e.live.layers_run == len(PROMPTS) * w.config.num_layers
    got = run_all(e, ids)
    assert [got[i] for i in ids] == reference(full, PROMPTS)
    assert e.live_drained
    e.end_live()
    assert e.pool.num_used_blocks == 0


def test_tasks_whose_next_layer_landed_go_first(full: Any) -> None:
    e, w = partial_engine(full)
    w.readiness.add(0)
    e.add_request(PROMPTS[0], GREEDY, "old")
    e.step()  # "old" is embedded and waits for layer 0
    e.add_request(PROMPTS[1], GREEDY, "new")
    e.step()  # "new" runs its embedding although it is not the head: its segment is there
    assert [(t.request.request_id, t.stage) for t in e.live.tasks] == [("old", 1), ("new", 1)]


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("hold", [False, True])
def test_relay_at_layer_k_then_source_finishes_identically(full: Any, k: int, hold: bool) -> None:
    target, w = partial_engine(full)
    for seg in range(1 + k):  # embedding and layers [0, k)
        w.readiness.add(seg)
    target.add_request(PROMPTS[0], GREEDY, "a", hold_kv=hold)
    target.add_request(PROMPTS[2], GREEDY, "b", hold_kv=hold)
    for _ in range(2 * (k + 2)):
        target.step()
    relayed = target.handoffs.relay_out()
    assert relayed is not None and relayed.request_id == "a" and relayed.handoff is not None
    assert relayed.handoff.layer == k and relayed.status.value == "relaying"
    hidden = relayed.handoff.hidden
    source = LLMEngine(full, None, CFG)
    source.handoffs.reserve_relay("a", PROMPTS[0], GREEDY, k, hold_kv=hold)
    if k:  # what the wire carries: hidden states and the KV of layers [0, k)
        source.handoffs.kv_in("a", target.handoffs.kv_out("a", (0, k)), (0, k))
    target.handoffs.relay_sent("a")
    assert target.request("a") is None and target.request_ids() == ["b"]  # its blocks went back
    source.handoffs.commit_relay("a", hidden)
    outs = source.step()
    assert outs[0].request_id == "a" and len(outs[0].new_token_ids) == 1
    if hold:  # PD mode: the first token, then the whole KV waits here to migrate
        assert outs[0].finish_reason == "migrate" and source.request("a").status.value == "held"
        want = reference(full, [PROMPTS[0]], SamplingParams(max_tokens=1, temperature=0.0))[0]
        assert outs[0].token_ids == want
        source.handoffs.release_held("a")
    else:
        assert run_all(source, ["a"]) == {"a": reference(full, [PROMPTS[0]])[0]}
    for seg in range(1 + k, len(w.layout.segments)):
        w.readiness.add(seg)
    got = run_all(target, ["b"])
    want_b = reference(full, [PROMPTS[2]], SamplingParams(max_tokens=1, temperature=0.0) if hold else GREEDY)
    assert got["b"] == want_b[0]
    if hold:
        target.handoffs.release_held("b")
    assert source.pool.num_used_blocks == 0 and target.pool.num_used_blocks == 0


def test_cancelled_relay_puts_the_task_back_where_it_stopped(full: Any) -> None:
    e, w = partial_engine(full)
    for seg in range(3):
        w.readiness.add(seg)
    e.add_request(PROMPTS[0], GREEDY, "a")
    for _ in range(5):
        e.step()
    r = e.handoffs.relay_out()
    assert r is not None and r.handoff is not None and r.handoff.layer == 2 and not e.live
    e.handoffs.relay_cancelled("a")
    assert [(t.request.request_id, t.stage) for t in e.live.tasks] == [("a", 3)]
    for seg in range(3, len(w.layout.segments)):
        w.readiness.add(seg)
    assert run_all(e, ["a"]) == {"a": reference(full, [PROMPTS[0]])[0]}


def test_abort_of_live_and_relayed_requests_frees_their_blocks(full: Any) -> None:
    e, w = partial_engine(full)
    w.readiness.add(0)
    e.add_request(PROMPTS[0], GREEDY, "a")
    e.add_request(PROMPTS[1], GREEDY, "b")
    e.step()
    assert e.abort("a") and e.abort("b")
    outs = e.step()
    assert {o.finish_reason for o in outs} == {"abort"}
    source = LLMEngine(full, None, CFG)
    source.handoffs.reserve_relay("c", PROMPTS[2], GREEDY, 1, hold_kv=False)
    assert not source.abort("c")  # KV still arriving: the serving loop aborts it on arrival
    source.handoffs.cancel_relay("c")
    assert e.pool.num_used_blocks == 0 and source.pool.num_used_blocks == 0


def test_seeded_sampling_is_the_same_live(full: Any) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=11)
    e, w = partial_engine(full)
    e.add_request(PROMPTS[3], params, "s")
    for seg in range(len(w.layout.segments)):
        w.readiness.add(seg)
        e.step()
    assert run_all(e, ["s"])["s"] == reference(full, [PROMPTS[3]], params)[0]
    assert torch.equal(w.buffer, full.buffer)
