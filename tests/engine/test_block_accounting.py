"""KV block accounting under load: no leaks, preemption happens and changes no output.

A thousand random requests (random prompt lengths, max_tokens, stop token ids, greedy and
seeded sampling) go through a tiny model with a pool too small for them, with random aborts
of waiting and running requests. Invariants are checked after every step; at the end every
block is free and no request is left.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from blitzscale.engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams

EOS = 1  # the tiny presets' eos id


def count_preemptions(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Wrap the engine's scheduler so every preemption it reports is counted."""
    total = [0]
    schedule = engine.scheduler.schedule

    def counting_schedule():
        out = schedule()
        total[0] += out.num_preempted
        return out

    monkeypatch.setattr(engine.scheduler, "schedule", counting_schedule)
    return lambda: total[0]


def check_invariants(engine: LLMEngine) -> None:
    pool, sched = engine.pool, engine.scheduler
    owned = [b for r in sched.running for b in r.block_ids]
    assert len(owned) == len(set(owned)), "a block is owned by two requests"
    assert len(owned) == pool.num_used_blocks, "used blocks that no running request owns"
    assert pool.num_used_blocks + pool.num_free_blocks == pool.num_blocks
    assert all(0 <= b < pool.num_blocks for b in owned)
    for r in sched.waiting:
        assert not r.block_ids, f"waiting request {r.request_id} holds blocks"
    for r in sched.running:
        # exactly the blocks its computed tokens need: nothing over-allocated
        assert len(r.block_ids) == pool.blocks_for_tokens(r.num_computed_tokens), r.request_id
    assert len(sched.running) <= engine.config.max_num_seqs
    live = {r.request_id for r in sched.running} | {r.request_id for r in sched.waiting}
    assert live <= set(engine.request_ids())


def test_thousand_random_requests_leak_no_blocks(tiny_weights, monkeypatch) -> None:
    weights = tiny_weights("tiny-mistral")
    vocab = weights.config.vocab_size
    cfg = EngineConfig(block_size=8, num_kv_blocks=12, max_num_batched_tokens=32, max_num_seqs=8)
    engine = LLMEngine(weights, None, cfg)
    preemptions = count_preemptions(engine, monkeypatch)
    rng = random.Random(1234)

    total = 1000
    params: dict[str, SamplingParams] = {}
    live: set[str] = set()
    aborted: set[str] = set()
    finals: dict[str, RequestOutput] = {}
    steps = 0
    while len(params) < total or engine.has_unfinished():
        while len(params) < total and len(live) < 12 and rng.random() < 0.6:
            p = SamplingParams(
                max_tokens=rng.randint(1, 24),
                temperature=rng.choice([0.0, 0.0, 1.0]),
                seed=rng.randrange(1 << 30),
                stop_token_ids=tuple(rng.sample(range(2, vocab), rng.choice([0, 4, 30]))),
                ignore_eos=rng.random() < 0.5,
            )
            prompt = [rng.randrange(2, vocab) for _ in range(rng.randint(1, 40))]
            rid = engine.add_request(prompt, p)
            params[rid] = p
            live.add(rid)
        if live and rng.random() < 0.05:
            rid = rng.choice(sorted(live))
            assert engine.abort(rid)
            assert not engine.abort(rid), "a second abort of the same request must be a no-op"
            aborted.add(rid)
        for out in engine.step():
            assert out.request_id not in finals, "output after the final one"
            if out.finished:
                finals[out.request_id] = out
                live.discard(out.request_id)
        check_invariants(engine)
        steps += 1
        assert steps < 50_000, "engine stopped making progress"

    assert set(finals) == set(params)
    assert {rid for rid, o in finals.items() if o.finish_reason == "abort"} == aborted
    for rid, out in finals.items():
        p = params[rid]
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else {EOS})
        assert len(out.token_ids) <= p.max_tokens
        assert not stops & set(out.token_ids[:-1]), "kept generating after a stop token"
        if out.finish_reason == "length":
            assert len(out.token_ids) == p.max_tokens
        elif out.finish_reason == "stop":
            assert out.token_ids[-1] in stops
        else:
            assert out.finish_reason == "abort"
    reasons = {o.finish_reason for o in finals.values()}
    assert reasons == {"stop", "length", "abort"}, "the workload should exercise every finish"

    assert preemptions() > 0, "the pool was meant to be small enough to force preemption"
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    assert engine.pool.num_used_blocks == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert not engine.request_ids() and not engine.has_unfinished() and engine.is_idle
    assert engine.step() == []


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_preemption_does_not_change_outputs(temperature: float, tiny_weights, monkeypatch) -> None:
    """Greedy (and seeded sampling: each request draws from its own generator) give the
    same tokens whether or not requests were preempted and recomputed on the way."""
    weights = tiny_weights("tiny-llama3")
    rng = random.Random(7)
    prompts = [[rng.randrange(2, 512) for _ in range(rng.randint(3, 30))] for _ in range(10)]
    params = SamplingParams(max_tokens=20, temperature=temperature, seed=99, ignore_eos=True)

    roomy = LLMEngine(weights, None, EngineConfig(block_size=8, num_kv_blocks=128, max_num_seqs=16))
    roomy_preemptions = count_preemptions(roomy, monkeypatch)
    want = [o.token_ids for o in roomy.generate(prompts, params)]
    assert roomy_preemptions() == 0

    tight = LLMEngine(
        weights,
        None,
        EngineConfig(block_size=8, num_kv_blocks=8, max_num_batched_tokens=24, max_num_seqs=16),
    )
    tight_preemptions = count_preemptions(tight, monkeypatch)
    got = [o.token_ids for o in tight.generate(prompts, params)]
    assert tight_preemptions() > 0
    assert got == want
    assert tight.pool.num_free_blocks == tight.pool.num_blocks


def test_check_integrity_finds_a_leak_and_a_block_with_two_owners(tiny_weights) -> None:
    from blitzscale.errors import KVIntegrityError

    engine = LLMEngine(tiny_weights("tiny-llama3"), None, EngineConfig(block_size=4, num_kv_blocks=32))
    a = engine.add_request(list(range(1, 20)), SamplingParams(max_tokens=8, temperature=0))
    engine.add_request(list(range(1, 12)), SamplingParams(max_tokens=8, temperature=0))
    engine.step()
    engine.check_integrity()  # a healthy engine mid-flight
    leaked = engine.pool.allocate(1)  # blocks nobody owns
    with pytest.raises(KVIntegrityError, match="leaked"):
        engine.check_integrity()
    engine.pool.free(leaked)
    reqs = [engine.request(rid) for rid in engine.request_ids()]
    reqs[1].block_ids.append(reqs[0].block_ids[0])  # one block, two owners
    with pytest.raises(KVIntegrityError, match="2 holders, the pool counts 1"):
        engine.check_integrity()
    reqs[1].block_ids.pop()
    engine.abort(a)
    while engine.has_unfinished():
        engine.step()
    engine.check_integrity()
    assert engine.pool.num_used_blocks == 0
