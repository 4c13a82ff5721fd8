"""The three tiny random architectures against transformers' own implementation.

Llama with llama3 RoPE scaling (original context 64, so long prompts cross the scaled band),
Mistral, and Qwen2 with q/k/v biases and tied embeddings. Same weights on both sides; logits
must agree to fp32 rounding, through a paged cache with scattered blocks, batched sequences of
mixed lengths and chunked prefill, and the engine's greedy tokens must equal transformers'.
"""

from __future__ import annotations

import random

import pytest
import torch

from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.kvcache import KVCache
from blitzscale.model import LlamaModel
from blitzscale.model.attention import AttentionMetadata

PRESETS = ("tiny-llama3", "tiny-mistral", "tiny-qwen2")
BLOCK = 16
ATOL = 1e-4
PROMPT_LENS = (1, 5, 16, 17, 33, 70)


def random_prompts(vocab: int, lens: tuple[int, ...], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in lens]


@torch.no_grad()
def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def hf_greedy(hf: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding by full recomputation: no cache, nothing shared with our code."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@torch.inference_mode()
def paged_logits(model: LlamaModel, seqs: list[list[int]], chunk: int, seed: int = 0) -> list[torch.Tensor]:
    """Every token's logits, all sequences batched each step, `chunk` new tokens per sequence
    per step, KV in blocks handed out in a shuffled order (no two sequences' blocks adjacent)."""
    cfg = model.config
    need = sum(-(-len(s) // BLOCK) for s in seqs)
    free = list(range(need + 3))
    random.Random(seed).shuffle(free)
    kv = KVCache(cfg, need + 3, BLOCK, torch.float32, "cpu")
    tables: list[list[int]] = [[] for _ in seqs]
    done = [0] * len(seqs)
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    while any(d < len(s) for d, s in zip(done, seqs, strict=True)):
        active = [b for b, s in enumerate(seqs) if done[b] < len(s)]
        ids, q_lens, ctx_lens = [], [], []
        for b in active:
            n = min(chunk, len(seqs[b]) - done[b])
            ids += seqs[b][done[b] : done[b] + n]
            q_lens.append(n)
            ctx_lens.append(done[b] + n)
            while len(tables[b]) * BLOCK < done[b] + n:
                tables[b].append(free.pop())
        meta = AttentionMetadata.build(q_lens, ctx_lens, [tables[b] for b in active], BLOCK, "cpu")
        logits = model.forward(torch.tensor(ids), meta, kv)
        for b, part in zip(active, logits.split(q_lens), strict=True):
            out[b].append(part)
            done[b] += part.shape[0]
    return [torch.cat(parts) for parts in out]


@pytest.mark.parametrize("preset", PRESETS)
def test_config_round_trips_through_transformers(preset: str, tiny_weights) -> None:
    import transformers

    from blitzscale.model.config import ModelConfig

    cfg = tiny_weights(preset).config
    hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf())
    assert ModelConfig.from_hf(hf_cfg.to_dict()) == cfg


@pytest.mark.parametrize("preset", PRESETS)
def test_prefill_logits_match_transformers(preset: str, tiny_weights, hf_twin) -> None:
    weights = tiny_weights(preset)
    hf = hf_twin(weights)
    (ids,) = random_prompts(weights.config.vocab_size, (100,), seed=1)
    ours = paged_logits(LlamaModel(weights), [ids], chunk=len(ids))[0]
    ref = hf_logits(hf, ids)
    assert ours.shape == ref.shape == (100, weights.config.vocab_size)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("chunk", [1, 7, 16])
@pytest.mark.parametrize("preset", PRESETS)
def test_batched_chunked_paged_logits_match_transformers(
    preset: str, chunk: int, tiny_weights, hf_twin
) -> None:
    """Mixed lengths (block-aligned and not) batched; chunk=1 is token-by-token decoding."""
    weights = tiny_weights(preset)
    hf = hf_twin(weights)
    seqs = random_prompts(weights.config.vocab_size, PROMPT_LENS, seed=2)
    ours = paged_logits(LlamaModel(weights), seqs, chunk=chunk, seed=chunk)
    for ids, got in zip(seqs, ours, strict=True):
        torch.testing.assert_close(got, hf_logits(hf, ids), atol=ATOL, rtol=0)


@pytest.mark.parametrize("preset", PRESETS)
def test_engine_greedy_tokens_match_transformers(preset: str, tiny_weights, hf_twin) -> None:
    weights = tiny_weights(preset)
    hf = hf_twin(weights)
    prompts = random_prompts(weights.config.vocab_size, PROMPT_LENS, seed=3)
    expected = [hf_greedy(hf, p, 16) for p in prompts]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    cfg = EngineConfig(block_size=BLOCK, num_kv_blocks=64, max_num_batched_tokens=24, max_num_seqs=8)

    engine = LLMEngine(weights, None, cfg)
    together = engine.generate(prompts, params)
    assert [o.token_ids for o in together] == expected
    assert all(o.finish_reason == "length" for o in together)

    for prompt, exp in zip(prompts, expected, strict=True):
        (alone,) = engine.generate([prompt], params)
        assert alone.token_ids == exp
    assert engine.pool.num_free_blocks == engine.pool.num_blocks
