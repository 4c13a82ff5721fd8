"""Prompt logprobs (`SamplingParams.prompt_logprobs`): each prompt token's log-probability
given the tokens before it, and the most likely tokens there, against transformers' own
log-softmax over the same prompt on the same weights (SmolLM2, fp32); through every path that
computes prompt positions: chunked steps, a prompt whose prefix is cached, a live target's
head stage, a relayed prompt's finish on its source."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from blitzscale.core.outputs import RequestOutput, TokenLogprob
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from tests.engine.test_live import CFG as LIVE_CFG
from tests.engine.test_live import partial_engine

TEXT = (
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst "
    "of times, it was the age of wisdom, it was the age of foolishness."
)
TOP = 3


@pytest.fixture(scope="module")
def prompt(smollm2_tokenizer: Any) -> list[int]:
    ids = smollm2_tokenizer.encode(TEXT)
    assert len(ids) > 32  # three chunks of 16
    return ids


@pytest.fixture(scope="module")
def reference(smollm2_hf: Any, prompt: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every prompt position but the last."""
    with torch.no_grad():
        logits = smollm2_hf(torch.tensor([prompt])).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1)


def collect(engine: LLMEngine, ids: list[str], max_steps: int = 10_000) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {i: [] for i in ids}
    for _ in range(max_steps):
        if all(o and o[-1].finished for o in outs.values()):
            return outs
        for o in engine.step():
            outs[o.request_id].append(o)
    raise AssertionError(f"not finished after {max_steps} steps: {outs}")


def check(prompt: list[int], reference: torch.Tensor, got: tuple[TokenLogprob, ...], k: int = TOP) -> None:
    assert len(got) == len(prompt) - 1
    for pos, lp in enumerate(got):
        assert lp.logprob == pytest.approx(reference[pos, prompt[pos + 1]].item(), abs=2e-3), pos
        top_v, top_i = reference[pos].topk(k)
        assert [t for t, _ in lp.top] == top_i.tolist(), pos
        assert [v for _, v in lp.top] == pytest.approx(top_v.tolist(), abs=2e-3)


def test_chunked_prompt_logprobs_are_transformers_log_softmax(
    smollm2_weights: Any, smollm2_tokenizer: Any, prompt: list[int], reference: torch.Tensor
) -> None:
    """A prompt in chunks of 16 beside a request that asks for none (and decodes while the
    other's chunks run): every position's logprob and top tokens, in the first output only."""
    cfg = EngineConfig(block_size=16, num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=4)
    e = LLMEngine(smollm2_weights, smollm2_tokenizer, cfg)
    asks = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=TOP, logprobs=1)
    e.add_request(prompt[:5], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), "plain")
    e.add_request(prompt, asks, "asks")
    outs = collect(e, ["plain", "asks"])
    first, *rest = outs["asks"]
    assert first.new_token_ids and not any(o.prompt_logprobs for o in rest)
    check(prompt, reference, first.prompt_logprobs)
    assert not any(o.prompt_logprobs for o in outs["plain"])
    # the output: the same as asking for no prompt logprobs
    plain = LLMEngine(smollm2_weights, smollm2_tokenizer, cfg).generate(
        [prompt], SamplingParams(max_tokens=3, temperature=0)
    )
    assert plain[0].token_ids == outs["asks"][-1].token_ids
    assert e.pool.num_used_blocks == 0


def test_a_cached_prefix_does_not_stand_in_for_prompt_logprobs(
    smollm2_weights: Any, smollm2_tokenizer: Any, prompt: list[int], reference: torch.Tensor
) -> None:
    """The same prompt again with prefix caching on: a request that asks computes every
    position (no cached block taken), one that does not takes the cached blocks."""
    cfg = EngineConfig(
        block_size=16, num_kv_blocks=64, max_num_batched_tokens=512, max_num_seqs=4, prefix_caching=True
    )
    e = LLMEngine(smollm2_weights, smollm2_tokenizer, cfg)
    greedy = SamplingParams(max_tokens=2, temperature=0)
    e.generate([prompt], greedy)
    hits = e.scheduler.prefix_hits
    e.add_request(prompt, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=TOP), "asks")
    check(prompt, reference, collect(e, ["asks"])["asks"][0].prompt_logprobs)
    assert e.scheduler.prefix_hits == hits  # computed whole
    e.generate([prompt], greedy)
    assert e.scheduler.prefix_hits > hits  # the cache still serves the others


def test_zero_top_tokens_gives_each_prompt_tokens_logprob_alone(
    smollm2_weights: Any, smollm2_tokenizer: Any, prompt: list[int], reference: torch.Tensor
) -> None:
    e = LLMEngine(smollm2_weights, smollm2_tokenizer, EngineConfig(block_size=16, num_kv_blocks=64))
    e.add_request(prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0), "a")
    (out,) = collect(e, ["a"])["a"]
    check(prompt, reference, out.prompt_logprobs, k=0)
    assert all(lp.top == () for lp in out.prompt_logprobs)


@pytest.mark.parametrize("bad", [-1, 21])
def test_prompt_logprobs_out_of_range_are_refused_by_name(smollm2_weights: Any, bad: int) -> None:
    e = LLMEngine(smollm2_weights, None, EngineConfig(block_size=16, num_kv_blocks=16))
    with pytest.raises(Exception, match="prompt_logprobs must"):
        e.add_request([1, 2, 3], SamplingParams(max_tokens=1, prompt_logprobs=bad))


def test_live_and_relayed_prompts_give_the_loaded_engines_prompt_logprobs() -> None:
    """A live target computes a prompt layer by layer as weights land and its head stage
    gives the prompt logprobs; a prompt relayed after one layer gets them on its source.
    Both equal those of a fully loaded engine (random tiny Llama-3, fp32)."""
    from blitzscale.checkpoint import load_weights, resolve_model

    full = load_weights(resolve_model("random:tiny-llama3"))
    cfg = LIVE_CFG  # (partial_engine's)
    prompt = [(7 * j) % 200 + 2 for j in range(37)]
    params = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=2)
    loaded = LLMEngine(full, None, cfg)
    loaded.add_request(prompt, params, "ref")
    want = collect(loaded, ["ref"])["ref"][0].prompt_logprobs
    assert len(want) == len(prompt) - 1

    def same(got: tuple[TokenLogprob, ...]) -> None:
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]

    live, w = partial_engine(full)
    live.add_request(prompt, params, "live")
    outs = []
    for seg in range(len(w.layout.segments)):
        assert not outs  # (nothing before the head has landed)
        w.readiness.add(seg)
        outs += live.step()
    assert outs and outs[0].live_layers == w.config.num_layers  # every layer ran live
    same(outs[0].prompt_logprobs)

    target, w = partial_engine(full)
    for seg in range(2):  # the embedding and layer 0
        w.readiness.add(seg)
    target.add_request(prompt, params, "a")
    for _ in range(6):
        target.step()
    relayed = target.handoffs.relay_out()
    assert relayed is not None and relayed.handoff is not None and relayed.handoff.layer == 1
    source = LLMEngine(full, None, cfg)
    source.handoffs.reserve_relay("a", prompt, params, 1, hold_kv=True)  # (pd: the first token, then held)
    source.handoffs.kv_in("a", target.handoffs.kv_out("a", (0, 1)), (0, 1))
    target.handoffs.relay_sent("a")
    source.handoffs.commit_relay("a", relayed.handoff.hidden)
    (first,) = source.step()
    assert first.finish_reason == "migrate" and first.new_token_ids
    same(first.prompt_logprobs)
    source.handoffs.release_held("a")
    assert source.pool.num_used_blocks == 0
