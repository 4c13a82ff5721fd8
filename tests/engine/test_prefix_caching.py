"""Automatic prefix caching: the same greedy tokens as transformers, with blocks shared.

Real SmolLM2-135M-Instruct in fp32, chat prompts sharing a long system prompt (the case
prefix caching is for). Later requests take the earlier ones' cached blocks and compute
only the rest, through chunked prefill and preemption; the KV books (shared blocks and
their holders) are checked after every step; seeded sampling gives the same tokens with
the cache as without.
"""

from __future__ import annotations

from typing import Any

import pytest

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.errors import InvalidRequestError
from tests.conftest import hf_greedy

MAX_NEW = 12
SYSTEM = (
    "You are a careful assistant for a team of platform engineers. Answer briefly, name the "
    "command or setting that matters, and say when you are not sure. Keep every answer under "
    "fifty words and never invent a flag that does not exist."
)
QUESTIONS = ("What is a KV cache?", "Why batch requests?", "What does a router do?", "What is a GPU?")
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer: Any) -> list[list[int]]:
    out = []
    for q in QUESTIONS:
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        out.append(list(smollm2_tokenizer.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]))
    return out


@pytest.fixture(scope="module")
def reference(smollm2_hf: Any, prompts: list[list[int]]) -> list[list[int]]:
    return hf_greedy(smollm2_hf, prompts, MAX_NEW)


def _run(engine: LLMEngine, waves: list[list[list[int]]], params: SamplingParams = GREEDY) -> list[list[int]]:
    """Each wave's prompts added together once the wave before has finished; tokens in
    prompt order. The KV books are checked after every step."""
    out: dict[str, list[int]] = {}
    order = []
    for wave in waves:
        order += [engine.add_request(p, params) for p in wave]
        while engine.has_unfinished():
            for o in engine.step():
                if o.finished:
                    out[o.request_id] = o.token_ids
            engine.check_integrity()
    assert engine.pool.num_used_blocks == 0
    return [out[rid] for rid in order]


def test_later_requests_share_the_system_prompt_and_tokens_equal_transformers(
    smollm2_weights: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    shared = min(len(p) for p in prompts)
    assert sum(len(p) for p in prompts) > 4 * 48 and shared > 48  # a long common prefix
    engine = LLMEngine(smollm2_weights, None, EngineConfig(block_size=16, num_kv_blocks=256))
    got = _run(engine, [prompts[:1], prompts[1:]])
    assert got == reference
    s = engine.scheduler
    common = next(i for i in range(shared) if len({p[i] for p in prompts}) > 1)  # tokens all share
    assert s.prefix_hits >= 3 * (common // 16 * 16) > 0
    assert s.prefix_queries == sum(len(p) for p in prompts)
    assert engine.pool.num_cached_blocks > 0


def test_the_same_prompt_again_computes_only_its_last_token_block(
    smollm2_weights: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    engine = LLMEngine(smollm2_weights, None, EngineConfig(block_size=16, num_kv_blocks=256))
    p = prompts[0]
    assert _run(engine, [[p], [p]]) == [reference[0], reference[0]]
    # the second time: every full block short of the last token's came from the cache
    assert engine.scheduler.prefix_hits == (len(p) - 1) // 16 * 16


def test_chunked_prefill_and_preemption_with_shared_blocks_keep_the_tokens(
    smollm2_weights: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    # 24-token chunks; a KV cache too small for all four at once: preemptions, cached
    # blocks evicted and shared ones kept while held
    cfg = EngineConfig(block_size=8, num_kv_blocks=40, max_num_batched_tokens=24, max_num_seqs=4)
    engine = LLMEngine(smollm2_weights, None, cfg)
    assert _run(engine, [prompts[:1], prompts[1:]]) == reference
    assert engine.scheduler.prefix_hits > 0


def test_seeded_sampling_gives_the_same_tokens_with_and_without_the_cache(
    smollm2_weights: Any, prompts: list[list[int]]
) -> None:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.9, top_p=0.95, seed=11, ignore_eos=True)
    runs = []
    for on in (True, False):
        engine = LLMEngine(
            smollm2_weights, None, EngineConfig(block_size=16, num_kv_blocks=256, prefix_caching=on)
        )
        runs.append(_run(engine, [prompts[:1], prompts[1:]], params))
        assert (engine.scheduler.prefix_hits > 0) == on
    assert runs[0] == runs[1]


def test_reset_forgets_the_cache(smollm2_weights: Any, prompts: list[list[int]]) -> None:
    engine = LLMEngine(smollm2_weights, None, EngineConfig(block_size=16, num_kv_blocks=256))
    _run(engine, [prompts[:1]])
    assert engine.reset_prefix_cache() > 0
    _run(engine, [prompts[1:2]])
    assert engine.scheduler.prefix_hits == 0


def test_hot_prefixes_shipped_to_a_new_engine_are_hit_there_and_tokens_equal_transformers(
    smollm2_weights: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """Hot prefixes travelling with the weights, engine to engine (the workers move the
    packed blocks over their KV link, worker/prefix_ship.py): the source's reused system
    prompt lands in a fresh engine's cache, whose very first requests compute only what
    follows it, with transformers' tokens."""
    cfg = EngineConfig(block_size=16, num_kv_blocks=256)
    src = LLMEngine(smollm2_weights, None, cfg)
    _run(src, [prompts[:1], prompts[1:2]])  # the second request reuses the first's system prompt
    hot = src.handoffs.hot_prefixes(64)
    common = next(i for i in range(len(prompts[0])) if len({p[i] for p in prompts}) > 1)
    assert len(hot) == common // 16 > 0 and all(h.hits >= 1 for h in hot)
    dst = LLMEngine(smollm2_weights, None, cfg)
    ids = dst.handoffs.reserve_prefixes(len(hot))
    dst.check_integrity()  # (the books hold the reserved blocks while they are on the wire)
    dst.handoffs.blocks_in(ids, src.handoffs.blocks_out([h.block for h in hot]))
    assert dst.handoffs.commit_prefixes(ids, [(h.hash, h.parent, h.hits) for h in hot]) == len(hot)
    dst.check_integrity()
    assert dst.pool.num_used_blocks == 0 and dst.pool.num_cached_blocks == len(hot)
    assert _run(dst, [prompts[2:]]) == reference[2:]  # its first requests, together
    assert dst.scheduler.prefix_hits == 2 * len(hot) * 16
    cold = LLMEngine(smollm2_weights, None, cfg)  # an empty start: the first wave computes all
    assert _run(cold, [prompts[2:]]) == reference[2:] and cold.scheduler.prefix_hits == 0
    # Room: only empty blocks are taken (a new instance's own cache is not evicted for them)
    n = dst.pool.num_empty_blocks
    with pytest.raises(InvalidRequestError, match=f"no room for {n + 1} prefix blocks: {n} empty"):
        dst.handoffs.reserve_prefixes(n + 1)
    off = LLMEngine(
        smollm2_weights, None, EngineConfig(block_size=16, num_kv_blocks=64, prefix_caching=False)
    )
    assert off.handoffs.hot_prefixes(8) == []
    with pytest.raises(InvalidRequestError, match="caches no prefixes"):
        off.handoffs.reserve_prefixes(1)
