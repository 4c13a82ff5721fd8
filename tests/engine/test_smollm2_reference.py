"""Greedy tokens of the real SmolLM2-135M-Instruct equal transformers' own generation.

The reference loads the same GGUF file through transformers' own GGUF reader and runs its
own Llama implementation (`generate`, one prompt at a time, no padding); fp32 on both sides.
Our engine must produce the same ids for each prompt alone, for all prompts in one batch of
mixed lengths, and with chunked prefill (a token budget smaller than the longest prompt).
"""

from __future__ import annotations

from typing import Any

import pytest

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from tests.conftest import hf_greedy

MAX_NEW = 24
PLAIN = (
    "The quick brown fox",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a",
)
CHAT = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
)


def encode_prompts(tok: Any) -> list[list[int]]:
    plain = [tok.encode(p) for p in PLAIN]
    chat = [
        list(
            tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True)["input_ids"]
        )
        for c in CHAT
    ]
    return plain + chat


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer: Any) -> list[list[int]]:
    ps = encode_prompts(smollm2_tokenizer)
    assert len({len(p) for p in ps}) == len(ps), "prompt lengths should all differ"
    return ps


@pytest.fixture(scope="module")
def reference(smollm2_hf: Any, prompts: list[list[int]]) -> list[list[int]]:
    return hf_greedy(smollm2_hf, prompts, MAX_NEW)


def test_reference_is_meaningful(reference: list[list[int]], smollm2_tokenizer: Any) -> None:
    """Guard against a vacuous comparison (empty or degenerate reference outputs)."""
    assert all(len(r) >= 4 for r in reference)
    assert "Paris" in smollm2_tokenizer.decode(reference[len(PLAIN)])


@pytest.mark.parametrize(
    "budget", [pytest.param(2048, id="whole-prompts"), pytest.param(16, id="chunked-prefill")]
)
def test_batched_greedy_matches_transformers(
    budget: int, smollm2_weights: Any, smollm2_tokenizer: Any, prompts: list, reference: list
) -> None:
    cfg = EngineConfig(block_size=16, num_kv_blocks=128, max_num_batched_tokens=budget, max_num_seqs=16)
    engine = LLMEngine(smollm2_weights, smollm2_tokenizer, cfg)
    outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    for out, ref in zip(outs, reference, strict=True):
        assert out.token_ids == ref
        assert out.finish_reason == ("stop" if len(ref) < MAX_NEW else "length")
        assert out.text == smollm2_tokenizer.decode(ref, skip_special_tokens=True)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
    assert not engine.has_unfinished()


def test_each_prompt_alone_matches_transformers(
    smollm2_weights: Any, smollm2_tokenizer: Any, prompts: list, reference: list
) -> None:
    cfg = EngineConfig(block_size=16, num_kv_blocks=64, max_num_batched_tokens=256, max_num_seqs=4)
    engine = LLMEngine(smollm2_weights, smollm2_tokenizer, cfg)
    for prompt, ref in zip(prompts, reference, strict=True):
        (out,) = engine.generate([prompt], SamplingParams(max_tokens=MAX_NEW, temperature=0))
        assert out.token_ids == ref
