"""Sampling and output processing: seeds, top-k / top-p, stop strings, lengths, streaming.

Engine-level tests run the real SmolLM2 (real text, multi-byte characters); the sampler and
the output processor also get unit tests with crafted logits and token sequences.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
import torch

from blitzscale.engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams
from blitzscale.engine.output import OutputProcessor
from blitzscale.engine.request import Request, RequestStatus
from blitzscale.engine.sampler import sample

STORY = "Once upon a time, in a land far away, there lived a"
EMOJI = "Reply with three emoji."
JAPANESE = "Say 'good morning' in Japanese and Chinese."


def chat(tok: Any, text: str) -> list[int]:
    return list(
        tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)["input_ids"]
    )


@pytest.fixture(scope="module")
def engine(smollm2_weights: Any, smollm2_tokenizer: Any) -> LLMEngine:
    cfg = EngineConfig(block_size=16, num_kv_blocks=128, max_num_batched_tokens=512, max_num_seqs=8)
    return LLMEngine(smollm2_weights, smollm2_tokenizer, cfg)


def run_one(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> RequestOutput:
    (out,) = engine.generate([prompt], params)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    return out


# --- seeds -------------------------------------------------------------------------------


def test_same_seed_same_tokens_different_seeds_differ(engine: LLMEngine, smollm2_tokenizer: Any) -> None:
    prompt = smollm2_tokenizer.encode(STORY)
    runs = {
        seed: [run_one(engine, prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=seed)).token_ids]
        for seed in (1, 2, 3)
    }
    runs[1].append(run_one(engine, prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=1)).token_ids)
    assert runs[1][0] == runs[1][1]
    assert len({tuple(r[0]) for r in runs.values()}) == 3, "three seeds at temperature 1 gave repeats"


def test_seeded_request_is_unaffected_by_its_batch(engine: LLMEngine, smollm2_tokenizer: Any) -> None:
    prompt = smollm2_tokenizer.encode(STORY)
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=5)
    alone = run_one(engine, prompt, params).token_ids
    rid = engine.add_request(prompt, params)
    others = [
        engine.add_request(
            smollm2_tokenizer.encode("def fibonacci(n):"), SamplingParams(max_tokens=20, seed=11)
        ),
        engine.add_request(chat(smollm2_tokenizer, EMOJI), SamplingParams(max_tokens=8, seed=6)),
    ]
    final: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert set(final) == {rid, *others}
    assert final[rid].token_ids == alone


# --- top-k / top-p -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        pytest.param(SamplingParams(max_tokens=16, temperature=1.0, top_k=1), id="top_k=1"),
        pytest.param(SamplingParams(max_tokens=16, temperature=0.7, top_k=1, seed=3), id="top_k=1-seeded"),
        pytest.param(SamplingParams(max_tokens=16, temperature=1.0, top_p=1e-6, seed=3), id="top_p=1e-6"),
        pytest.param(SamplingParams(max_tokens=16, temperature=1.5, top_k=1, top_p=0.5), id="top_k=1-top_p"),
    ],
)
def test_single_candidate_sampling_equals_greedy(
    params: SamplingParams, engine: LLMEngine, smollm2_tokenizer: Any
) -> None:
    prompt = smollm2_tokenizer.encode(STORY)
    greedy = run_one(engine, prompt, SamplingParams(max_tokens=16, temperature=0)).token_ids
    assert run_one(engine, prompt, params).token_ids == greedy


def test_sampler_top_k_keeps_only_the_k_best() -> None:
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 2.8, 0.5]]).repeat(400, 1)
    params = [SamplingParams(temperature=1.0, top_k=2)] * 400
    gens = [torch.Generator().manual_seed(i) for i in range(400)]
    picks = Counter(sample(logits, params, gens))
    assert set(picks) == {1, 2}


def test_sampler_top_p_keeps_the_smallest_nucleus() -> None:
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log()[None].repeat(1000, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(1000)]
    picks = Counter(sample(logits, [SamplingParams(temperature=1.0, top_p=0.7)] * 1000, gens))
    assert set(picks) == {1, 3}  # 0.5 + 0.3 reaches 0.7; 0.15 and 0.05 are cut
    assert 0.55 < picks[1] / 1000 < 0.70  # renormalised: 0.5 / 0.8 = 0.625


def test_sampler_min_p_cuts_below_a_share_of_the_best_after_temperature() -> None:
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log()[None].repeat(1000, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(1000)]
    picks = Counter(sample(logits, [SamplingParams(temperature=1.0, min_p=0.5)] * 1000, gens))
    assert set(picks) == {1, 3}  # 0.3 >= 0.5 x 0.5; 0.15 and 0.05 are below
    assert 0.55 < picks[1] / 1000 < 0.70  # renormalised: 0.5 / 0.8 = 0.625
    # at temperature 2 the probabilities go as their square roots: 0.15 is then 0.55 of the
    # best (kept), 0.05 still 0.32 (cut); min_p before the temperature would cut 0.15
    gens = [torch.Generator().manual_seed(i) for i in range(1000)]
    warm = Counter(sample(logits, [SamplingParams(temperature=2.0, min_p=0.5)] * 1000, gens))
    assert set(warm) == {1, 2, 3}
    gens = [torch.Generator().manual_seed(i) for i in range(1000)]
    off = Counter(sample(logits, [SamplingParams(temperature=1.0, min_p=0.0)] * 1000, gens))
    assert set(off) == {0, 1, 2, 3}


def test_sampler_follows_the_distribution_and_temperature() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log()[None].repeat(2000, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(2000)]
    picks = Counter(sample(logits, [SamplingParams(temperature=1.0)] * 2000, gens))
    for tok, p in enumerate(probs.tolist()):
        assert abs(picks[tok] / 2000 - p) < 0.04
    gens = [torch.Generator().manual_seed(i) for i in range(2000)]
    cold = Counter(sample(logits, [SamplingParams(temperature=0.25)] * 2000, gens))
    assert cold[0] / 2000 > 0.9  # p^(1/0.25): 0.6^4 / (0.6^4 + 0.3^4 + 0.1^4) ~ 0.94


def test_sampler_mixed_batch_greedy_rows_take_argmax() -> None:
    logits = torch.tensor([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0], [0.1, 0.2, 0.3]])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=1), SamplingParams()]
    gens = [None, None, torch.Generator().manual_seed(0)]
    out = sample(logits, params, gens)
    assert out[:2] == [1, 0]
    assert out[2] in (0, 1, 2)
    again = sample(logits, params, [None, None, torch.Generator().manual_seed(0)])
    assert again[2] == out[2]


# --- stop conditions ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def story(engine: LLMEngine, smollm2_tokenizer: Any) -> tuple[list[int], list[int], str]:
    """The story prompt, its greedy continuation (no early eos) and that text."""
    prompt = smollm2_tokenizer.encode(STORY)
    out = run_one(engine, prompt, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    return prompt, out.token_ids, out.text


def stop_across_a_token_boundary(tok: Any, tokens: list[int], text: str) -> tuple[str, int]:
    """A 5-character stop string that starts 2 characters before a token boundary, occurs
    first there, and completes in the token after the boundary; and that boundary token."""
    for i in range(len(tokens) // 2, len(tokens) - 2):
        b = len(tok.decode(tokens[:i], skip_special_tokens=True))
        stop = text[b - 2 : b + 3]
        after = len(tok.decode(tokens[: i + 1], skip_special_tokens=True))
        if len(stop) == 5 and text.find(stop) == b - 2 and after >= b + 3 and stop.strip() == stop:
            return stop, i
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_string_truncates_text_and_finishes_with_stop(
    engine: LLMEngine, smollm2_tokenizer: Any, story: tuple
) -> None:
    prompt, tokens, text = story
    stop, i = stop_across_a_token_boundary(smollm2_tokenizer, tokens, text)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=("never-occurs", stop))
    out = run_one(engine, prompt, params)
    assert out.finish_reason == "stop"
    assert out.text == text[: text.find(stop)]
    assert stop not in out.text
    assert out.token_ids == tokens[: i + 1]  # stopped at the token that completed the string


def test_stream_with_stop_string_never_leaks_the_stop(
    engine: LLMEngine, smollm2_tokenizer: Any, story: tuple
) -> None:
    prompt, tokens, text = story
    stop, _ = stop_across_a_token_boundary(smollm2_tokenizer, tokens, text)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=(stop,))
    outs = list(engine.stream(prompt, params))
    assert "".join(o.text_delta for o in outs) == outs[-1].text == text[: text.find(stop)]
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]


def test_max_tokens_finishes_with_length(engine: LLMEngine, smollm2_tokenizer: Any, story: tuple) -> None:
    prompt, tokens, _ = story
    for n in (1, 7):
        out = run_one(engine, prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
        assert out.finish_reason == "length"
        assert out.token_ids == tokens[:n]
        assert out.text == smollm2_tokenizer.decode(tokens[:n])


def test_stop_token_id_finishes_with_stop(engine: LLMEngine, story: tuple) -> None:
    prompt, tokens, _ = story
    target = tokens[5]
    first = tokens.index(target)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=(target,))
    out = run_one(engine, prompt, params)
    assert out.finish_reason == "stop"
    assert out.token_ids == tokens[: first + 1]


def test_eos_finishes_with_stop_unless_ignored(engine: LLMEngine, smollm2_tokenizer: Any) -> None:
    prompt = chat(smollm2_tokenizer, "What is the capital of France?")
    out = run_one(engine, prompt, SamplingParams(max_tokens=32, temperature=0))
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == smollm2_tokenizer.eos_token_id
    assert "Paris" in out.text and "<|im_end|>" not in out.text
    ignored = run_one(engine, prompt, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 32
    assert ignored.token_ids[: len(out.token_ids)] == out.token_ids


def test_stop_token_text_does_not_depend_on_unrelated_stop_strings(engine: LLMEngine, story: tuple) -> None:
    """A request ended by a stop token id reports the same text whether or not it also had
    a stop string that never matched."""
    prompt, tokens, _ = story
    stop_id = tokens[5]
    base = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=(stop_id,))
    plain = run_one(engine, prompt, base)
    with_stop = run_one(engine, prompt, dataclasses.replace(base, stop=("never-occurs",)))
    assert plain.token_ids == with_stop.token_ids
    assert plain.text == with_stop.text


# --- streaming ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt_text", "params"),
    [
        pytest.param(STORY, SamplingParams(max_tokens=24, temperature=0), id="story-greedy"),
        pytest.param(EMOJI, SamplingParams(max_tokens=31, temperature=0), id="emoji-greedy"),
        pytest.param(JAPANESE, SamplingParams(max_tokens=31, temperature=1.0, seed=3), id="japanese-seeded"),
    ],
)
def test_stream_deltas_concatenate_to_the_final_text(
    prompt_text: str, params: SamplingParams, engine: LLMEngine, smollm2_tokenizer: Any
) -> None:
    prompt = (
        smollm2_tokenizer.encode(prompt_text)
        if prompt_text == STORY
        else chat(smollm2_tokenizer, prompt_text)
    )
    outs = list(engine.stream(prompt, params))
    final = outs[-1]
    assert final.finished and all(not o.finished for o in outs[:-1])
    assert "".join(o.text_delta for o in outs) == final.text
    assert [t for o in outs for t in o.new_token_ids] == final.token_ids
    assert final.text == smollm2_tokenizer.decode(final.token_ids, skip_special_tokens=True)
    for o in outs:
        assert final.text.startswith(o.text)
    for o in outs[:-1]:
        assert "\ufffd" not in o.text_delta, "half a character was streamed"
    assert final.text == run_one(engine, prompt, params).text  # streaming changes nothing


@pytest.mark.parametrize("stop", [(), ("日本",), ("🙂 c",)])
def test_output_processor_holds_back_partial_characters(smollm2_tokenizer: Any, stop: tuple) -> None:
    """Byte-level tokens that split emoji and CJK characters: no delta shows half a
    character, deltas add up to the decoded text, and stop strings cut it."""
    text = "Hi 🙂 café 日本語 𝔘 done"
    ids = smollm2_tokenizer.encode(text)
    proc = OutputProcessor(smollm2_tokenizer, {smollm2_tokenizer.eos_token_id}, max_model_len=1000)
    req = Request("r", [1], SamplingParams(max_tokens=len(ids), stop=stop))
    deltas = []
    for t in ids:
        req.token_ids.append(t)
        reason = proc.check_stop(req)
        if reason is not None:
            req.status, req.finish_reason = RequestStatus.FINISHED, reason
        out = proc.make_output(req)
        assert "\ufffd" not in out.text_delta
        deltas.append(out.text_delta)
        if out.finished:
            break
    want = text[: text.find(stop[0])] if stop else text
    assert out.finished and out.finish_reason == ("stop" if stop else "length")
    assert "".join(deltas) == out.text == want
