"""Penalties, logit_bias, min_tokens and logprobs against transformers on the same weights.

The reference is transformers' own SmolLM2 (fp32, its own GGUF reader) decoding greedily
through its own `generate` loop with its own logits processors: repetition penalty
(`RepetitionPenaltyLogitsProcessor`), logit bias (`SequenceBiasLogitsProcessor` with
one-token sequences), min_tokens (`MinNewTokensLengthLogitsProcessor`). transformers has no
frequency / presence penalty, so the reference processor for those is OpenAI's documented
formula, written here, run inside transformers' loop. Every case also checks that the knob
changed the greedy output (a test that cannot fail would pass with the knob ignored).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from blitzscale.engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams
from blitzscale.engine.overlap import PENDING

MAX_NEW = 20
PROMPTS = ("The quick brown fox", "1, 2, 3, 4,", "Once upon a time, in a land far away, there lived a")


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's frequency and presence penalties over the generated tokens only."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        counts = torch.zeros_like(scores)
        out = input_ids[:, self.prompt_len :]
        counts.scatter_add_(1, out, torch.ones_like(out, dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


def hf_processors(params: SamplingParams, prompt_len: int, eos: int) -> LogitsProcessorList:
    """transformers' processors for `params`, in the order our sampler applies them."""
    procs: list[LogitsProcessor] = []
    if params.min_tokens:
        procs.append(MinNewTokensLengthLogitsProcessor(prompt_len, params.min_tokens, eos))
    if params.logit_bias:
        procs.append(SequenceBiasLogitsProcessor({(t,): b for t, b in params.logit_bias}))
    if params.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.frequency_penalty or params.presence_penalty:
        procs.append(OpenAIPenalties(prompt_len, params.frequency_penalty, params.presence_penalty))
    return LogitsProcessorList(procs)


def hf_generate(
    hf: Any, prompt: list[int], params: SamplingParams, eos: int
) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens (up to and including EOS) and its raw logits per step."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        gen = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=params.max_tokens,
            min_new_tokens=None,
            logits_processor=hf_processors(params, len(prompt), eos),
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    return gen.sequences[0, len(prompt) :].tolist(), torch.cat(gen.logits)


@pytest.fixture(scope="module")
def engine(smollm2_weights: Any, smollm2_tokenizer: Any) -> LLMEngine:
    cfg = EngineConfig(block_size=16, num_kv_blocks=128, max_num_batched_tokens=512, max_num_seqs=8)
    return LLMEngine(smollm2_weights, smollm2_tokenizer, cfg)


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer: Any) -> list[list[int]]:
    return [smollm2_tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def eos(engine: LLMEngine) -> int:
    (e,) = engine.outputs.eos_token_ids
    return e


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
    outs = engine.generate(prompts, params)  # the prompts in one batch
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    return outs


GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0)
CASES = {
    "repetition": SamplingParams(max_tokens=MAX_NEW, temperature=0, repetition_penalty=1.6),
    "frequency": SamplingParams(max_tokens=MAX_NEW, temperature=0, frequency_penalty=1.5),
    "presence": SamplingParams(max_tokens=MAX_NEW, temperature=0, presence_penalty=1.8),
    "all-penalties": SamplingParams(
        max_tokens=MAX_NEW,
        temperature=0,
        repetition_penalty=1.3,
        frequency_penalty=0.7,
        presence_penalty=-0.5,
    ),
    # 28 is "," in SmolLM2: banned, and " the" (260) pushed up
    "logit_bias": SamplingParams(max_tokens=MAX_NEW, temperature=0, logit_bias=((28, -100.0), (260, 6.0))),
}


@pytest.fixture(scope="module")
def plain(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    """The prompts' greedy tokens with no processor (once for every case)."""
    return [o.token_ids for o in run(engine, prompts, GREEDY)]


@pytest.mark.parametrize("case", list(CASES))
def test_processors_give_transformers_tokens(
    engine: LLMEngine, smollm2_hf: Any, prompts: list[list[int]], plain: list[list[int]], eos: int, case: str
) -> None:
    params = CASES[case]
    ours = [o.token_ids for o in run(engine, prompts, params)]
    assert ours != plain, f"{case} changed nothing: the test could not tell it was ignored"
    for prompt, got in zip(prompts, ours, strict=True):
        want, _ = hf_generate(smollm2_hf, prompt, params, eos)
        assert got == want


def test_min_tokens_holds_eos_back_like_transformers(
    engine: LLMEngine, smollm2_hf: Any, smollm2_tokenizer: Any, eos: int
) -> None:
    """A chat answer that ends with EOS early; with min_tokens it must go on past it."""
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = list(smollm2_tokenizer.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"])
    (short,) = run(engine, [prompt], SamplingParams(max_tokens=40, temperature=0))
    assert short.finish_reason == "stop" and len(short.token_ids) < 15, short
    params = SamplingParams(max_tokens=40, temperature=0, min_tokens=len(short.token_ids) + 5)
    (long,) = run(engine, [prompt], params)
    want, _ = hf_generate(smollm2_hf, prompt, params, eos)
    assert long.token_ids == want
    assert len(long.token_ids) >= params.min_tokens
    assert eos not in long.token_ids[: params.min_tokens]


def test_logprobs_are_transformers_log_softmax(
    engine: LLMEngine, smollm2_hf: Any, prompts: list[list[int]], eos: int
) -> None:
    """Raw logprobs (before penalties), as vLLM reports by default: the sampled token's and
    the top 5, from the same steps as a penalized greedy run."""
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=5, repetition_penalty=1.6)
    outs = [engine.stream(p, params) for p in prompts[:2]]
    for prompt, stream in zip(prompts[:2], outs, strict=True):
        seq = list(stream)
        tokens = [t for o in seq for t in o.new_token_ids]
        lps = [lp for o in seq for lp in o.logprobs]
        assert len(lps) == len(tokens) == params.max_tokens
        want_tokens, logits = hf_generate(smollm2_hf, prompt, params, eos)
        assert tokens == want_tokens
        ref = torch.log_softmax(logits.float(), dim=-1)
        for k, (tok, lp) in enumerate(zip(tokens, lps, strict=True)):
            assert lp.logprob == pytest.approx(ref[k, tok].item(), abs=2e-3)
            top_v, top_i = ref[k].topk(5)
            assert [t for t, _ in lp.top] == top_i.tolist()
            assert [v for _, v in lp.top] == pytest.approx(top_v.tolist(), abs=2e-3)


def test_seeded_penalized_sampling_is_reproducible_and_batch_independent(
    engine: LLMEngine, prompts: list[list[int]]
) -> None:
    params = SamplingParams(
        max_tokens=16, temperature=0.9, top_p=0.95, seed=3, frequency_penalty=0.5, logit_bias=((28, -5.0),)
    )
    alone = run(engine, [prompts[0]], params)[0].token_ids
    again = run(engine, [prompts[0]], params)[0].token_ids
    batched = run(engine, [prompts[0], prompts[1], prompts[2]], params)[0].token_ids
    assert alone == again == batched
    other = run(engine, [prompts[0]], SamplingParams(**{**params.__dict__, "seed": 4}))[0].token_ids
    assert other != alone


def test_processed_requests_never_overlap(
    smollm2_weights: Any, smollm2_tokenizer: Any, prompts: list[list[int]]
) -> None:
    """With overlap on, requests with processors or logprobs are read every step (their
    tokens are never pending) and give what they give without overlap; plain requests in
    the same engine still overlap before they join."""
    params = [
        SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0, repetition_penalty=1.5, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0, logprobs=2, ignore_eos=True),
    ]
    results = {}
    for mode in ("off", "on"):
        cfg = EngineConfig(block_size=16, num_kv_blocks=128, max_num_seqs=8, overlap=mode)
        e = LLMEngine(smollm2_weights, smollm2_tokenizer, cfg)
        e.add_request(prompts[0], params[0], "plain")
        outs: dict[str, list[RequestOutput]] = {}
        k = 0
        while e.has_unfinished() or k < 6:
            if k == 5:
                e.add_request(prompts[1], params[1], "penalized")
                e.add_request(prompts[2], params[2], "logprobs")
            for o in e.step():
                assert PENDING not in o.token_ids
                outs.setdefault(o.request_id, []).append(o)
            for rid in ("penalized", "logprobs"):
                r = e.request(rid)
                assert r is None or PENDING not in r.token_ids
            k += 1
        if mode == "on":
            assert e.overlap is not None and e.overlap.steps >= 3
        results[mode] = {
            rid: ([t for o in s for t in o.new_token_ids], [lp for o in s for lp in o.logprobs])
            for rid, s in outs.items()
        }
    assert results["on"] == results["off"]
    assert len(results["on"]["logprobs"][1]) == 12


def test_out_of_range_values_are_refused_by_name(engine: LLMEngine, prompts: list[list[int]]) -> None:
    from blitzscale.errors import InvalidRequestError

    bad = {
        "repetition_penalty": {"repetition_penalty": 0.0},
        "frequency_penalty": {"frequency_penalty": float("nan")},
        "presence_penalty": {"presence_penalty": float("inf")},
        "logit_bias": {"logit_bias": ((10**9, 1.0),)},
        "min_tokens": {"min_tokens": 20},
        "logprobs": {"logprobs": 21},
    }
    for name, kw in bad.items():
        with pytest.raises(InvalidRequestError, match=name):
            engine.validate(prompts[0], SamplingParams(max_tokens=10, **kw))
