"""A tensor-parallel instance on CPU (gloo): shard 0's engine with the other shards following
(worker/tp.py), in processes of their own. Greedy tokens must equal the TP=1 engine's and
transformers' on the same weights, batched with chunked prefill and alone: the tiny shapes
of each family at TP=2, and the real SmolLM2-135M (9 heads, 3 KV heads) at TP=3."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.errors import CheckpointError
from tests.model.test_tiny_reference import hf_greedy, random_prompts
from tests.worker.tp_procs import live_shard_main, run_shards, shard_main

PRESETS = ("tiny-llama3", "tiny-mistral", "tiny-qwen2")
LENS = (1, 5, 17, 33, 70)
TOKENS = 12


def run_instance(
    tp: int, specs: list[str], prompts: dict[str, list[list[int]]], tokens: int
) -> dict[str, Any]:
    return run_shards(tp, shard_main, lambda r, port, out: (r, tp, port, specs, prompts, tokens, out))


def tp1_tokens(weights: Any, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    cfg = EngineConfig(block_size=16, num_kv_blocks=64, max_num_batched_tokens=24, max_num_seqs=8)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    engine = LLMEngine(weights, None, cfg)
    return [o.token_ids for o in engine.generate(prompts, params)]


def test_tp2_tokens_equal_tp1_and_transformers_for_each_family(tiny_weights, hf_twin) -> None:
    prompts = {f"random:{p}": random_prompts(512, LENS, seed=5) for p in PRESETS}
    got = run_instance(2, list(prompts), prompts, TOKENS)
    for preset in PRESETS:
        spec = f"random:{preset}"
        whole = tiny_weights(preset)
        hf = hf_twin(whole)
        expected = [hf_greedy(hf, p, TOKENS) for p in prompts[spec]]
        assert tp1_tokens(whole, prompts[spec], TOKENS) == expected, preset
        assert got[spec] == expected + expected[:2], preset  # batched, then two alone


def test_smollm2_tp3_tokens_equal_tp1(smollm2_weights, smollm2_tokenizer) -> None:
    texts = (
        "The quick brown fox",
        "def fibonacci(n):",
        "Once upon a time, in a land far away, there lived a",
    )
    from blitzscale.serve.model_cache import prepare_model

    # its three shards converted once (the GGUF parsed once, not by each shard process),
    # sliced as the GGUF's load slices them (tests/checkpoint/test_convert_roundtrip.py)
    spec = prepare_model("smollm2-135m", tp=3)
    prompts = {spec: [smollm2_tokenizer.encode(t) for t in texts]}
    got = run_instance(3, [spec], prompts, TOKENS)
    expected = tp1_tokens(smollm2_weights, prompts[spec], TOKENS)
    assert got[spec] == expected + expected[:2]


def test_live_tp2_leader_runs_a_segment_only_once_every_shard_has_it(tiny_weights, hf_twin) -> None:
    """Shard 0 holds all its weights, shard 1's arrive one segment every 0.2 s: the leader's
    live queue follows the slower shard (a layer run early would fail on shard 1, whose
    weights refuse an unready layer), and the tokens are those of the whole model."""
    spec, prompts = "random:tiny-llama3", random_prompts(512, (5, 17, 33), seed=7)
    got = run_shards(2, live_shard_main, lambda r, port, out: (r, port, spec, prompts, TOKENS, out))
    hf = hf_twin(tiny_weights("tiny-llama3"))
    assert got["tokens"] == [hf_greedy(hf, p, TOKENS) for p in prompts]
    prefixes = got["prefixes"]
    assert prefixes == sorted(prefixes) and prefixes[0] < 6 <= prefixes[-1], prefixes  # 4 layers + 2
    assert got["live_layers"] > 0  # layers ran while shard 1 was still loading


def test_random_shards_are_cut_from_the_tp1_model(tiny_weights) -> None:
    whole = tiny_weights("tiny-qwen2")
    parts = [load_weights(resolve_model("random:tiny-qwen2"), tp_size=2, tp_rank=k) for k in range(2)]
    assert torch.equal(torch.cat([p.layers[0].o for p in parts], dim=1), whole.layers[0].o)
    assert torch.equal(parts[1].embed, whole.embed)


@pytest.mark.parametrize("tp", [2, 4])
def test_smollm2_shards_that_do_not_divide_are_refused(tp: int) -> None:
    from blitzscale.checkpoint import load_config
    from blitzscale.model.layout import build_layout

    cfg = load_config(resolve_model("smollm2-135m"))
    with pytest.raises(CheckpointError, match=f"tp={tp} does not divide num_heads=9, num_kv_heads=3"):
        build_layout(cfg, 4, tp, 0)
