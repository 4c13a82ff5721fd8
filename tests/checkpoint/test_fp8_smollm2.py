"""The real SmolLM2-135M in FP8 on CPU: what quantization keeps and what it costs.

Our FP8 model (e4m3 linears, one scale per output channel; CPU dequantizes each weight for
its matmul) must give the greedy tokens transformers gives on the dequantized weights,
quantized here independently of our code (amax / 448 per row, round to nearest e4m3), fp32
on both sides; and its perplexity on a fixed text (tests/data/eval_text.txt, written for
this test) must stay within 3% of the unquantized model's.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from blitzscale.checkpoint.pack import hf_state_dict, pack_into
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.kvcache import KVCache
from blitzscale.model import LlamaModel
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.weights import ModelWeights
from tests.conftest import build_hf_twin, hf_greedy

TEXT = Path(__file__).resolve().parents[1] / "data" / "eval_text.txt"
MAX_NEW = 16
PROMPTS = ("The quick brown fox", "def fibonacci(n):", "Once upon a time, in a land far away, there lived a")
LINEAR_SUFFIXES = tuple(f"{n}_proj.weight" for n in ("q", "k", "v", "o", "gate", "up", "down"))


def fake_quant(w: torch.Tensor) -> torch.Tensor:
    """dequant(quant(w)) written out here: per row, scale = amax / 448, e4m3 round to nearest."""
    scale = w.abs().amax(dim=1, keepdim=True) / 448.0
    return (w / scale).to(torch.float8_e4m3fn).float() * scale


@pytest.fixture(scope="module")
def fp8_weights(smollm2_weights: Any) -> ModelWeights:
    """SmolLM2 quantized to FP8 from our fp32 load (what `convert --dtype fp8` stores)."""
    w = ModelWeights.empty(replace(smollm2_weights.config, quant="fp8"), torch.float32)
    pack_into(w, hf_state_dict(smollm2_weights).__getitem__)
    return w


@pytest.fixture(scope="module")
def hf_dequantized(smollm2_weights: Any) -> Any:
    """transformers' Llama on SmolLM2's weights with every linear replaced by fake_quant(w)."""
    sd = {
        k: fake_quant(v) if k.endswith(LINEAR_SUFFIXES) else v
        for k, v in hf_state_dict(smollm2_weights).items()
    }
    dense = ModelWeights.empty(smollm2_weights.config, torch.float32)
    pack_into(dense, sd.__getitem__)
    return build_hf_twin(dense)


def test_fp8_weights_are_the_independent_quantization(
    fp8_weights: ModelWeights, smollm2_weights: Any
) -> None:
    ours = hf_state_dict(fp8_weights, dequantize=True)
    ref = hf_state_dict(smollm2_weights)
    name = "model.layers.3.mlp.down_proj.weight"
    assert torch.equal(ours[name], fake_quant(ref[name]))
    assert not torch.equal(ours[name], ref[name])  # (quantization did change it)
    assert fp8_weights.layers[3].down.dtype == torch.float8_e4m3fn
    # the layer segments take about a quarter of fp32's (fp8 bytes; norms and scales fp32)
    ratio = fp8_weights.layout.layer(0).numel / smollm2_weights.layout.layer(0).numel
    assert 0.25 <= ratio < 0.27, ratio


def test_greedy_tokens_equal_transformers_on_the_dequantized_weights(
    fp8_weights: ModelWeights, hf_dequantized: Any, smollm2_tokenizer: Any
) -> None:
    prompts = [smollm2_tokenizer.encode(p) for p in PROMPTS]
    reference = hf_greedy(hf_dequantized, prompts, MAX_NEW)
    assert all(len(r) >= 4 for r in reference)
    cfg = EngineConfig(block_size=16, num_kv_blocks=64, max_num_batched_tokens=256, max_num_seqs=4)
    engine = LLMEngine(fp8_weights, smollm2_tokenizer, cfg)
    assert engine.model.linear.name == "dequant"
    outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0))
    assert [o.token_ids for o in outs] == reference


@torch.inference_mode()
def perplexity(weights: Any, ids: list[int]) -> float:
    """exp(mean NLL of each next token) over one prompt, through our model."""
    block = 16
    blocks = -(-len(ids) // block)
    model = LlamaModel(weights, max_positions=len(ids) + 1)
    kv = KVCache(weights.config, blocks, block, torch.float32, "cpu")
    meta = AttentionMetadata.build([len(ids)], [len(ids)], [list(range(blocks))], block, "cpu")
    logits = model.forward(torch.tensor(ids), meta, kv)
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:]))
    return math.exp(float(nll))


def test_perplexity_within_three_percent(
    fp8_weights: ModelWeights, smollm2_weights: Any, smollm2_tokenizer: Any
) -> None:
    ids = smollm2_tokenizer.encode(TEXT.read_text())
    assert 300 <= len(ids) <= 1024, len(ids)
    dense, fp8 = perplexity(smollm2_weights, ids), perplexity(fp8_weights, ids)
    assert 1.5 < dense < 60, dense  # a real model on real text
    assert abs(fp8 - dense) / dense <= 0.03, (dense, fp8)
    assert fp8 != dense
