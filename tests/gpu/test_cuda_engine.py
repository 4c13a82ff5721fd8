"""The engine on a CUDA GPU: bf16 logits close to transformers', batching consistent, no leaks.

Run on a GPU machine with `make test-gpu`.
"""

from __future__ import annotations

import pytest
import torch

from blitzscale.bench.engine_bench import _hf_model
from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.kvcache.cache import KVCache
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.weights import ModelWeights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("preset", ["tiny-llama3", "tiny-mistral", "tiny-qwen2"])
@torch.inference_mode()
def test_bf16_logits_close_to_transformers(preset: str) -> None:
    weights = load_weights(resolve_model(f"random:{preset}"), dtype=torch.bfloat16, device="cuda")
    engine = LLMEngine(weights, None, EngineConfig(block_size=16, num_kv_blocks=64))
    hf = _hf_model(weights)
    ids = torch.randint(0, weights.config.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    kv = KVCache(weights.config, 4, 16, torch.bfloat16, "cuda")
    meta = AttentionMetadata.build([40], [40], [[2, 0, 3]], 16, "cuda")
    ours = engine.model.forward(ids.cuda(), meta, kv).float()
    ref = hf(ids[None].cuda()).logits[0].float()
    scale = ref.abs().max()
    assert (ours - ref).abs().max() <= 0.02 * scale
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.95


@torch.inference_mode()
def test_batched_greedy_equals_alone_fp32_and_frees_blocks() -> None:
    weights = load_weights(resolve_model("random:tiny-llama3"), dtype=torch.float32, device="cuda")
    engine = LLMEngine(weights, None, EngineConfig(block_size=16, num_kv_blocks=128))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (3, 17, 40, 64)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = [engine.generate([p], params)[0].token_ids for p in prompts]
    together = [o.token_ids for o in engine.generate(prompts, params)]
    assert together == alone
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


@torch.inference_mode()
def test_cuda_fp32_matches_cpu_tokens() -> None:
    src = resolve_model("random:tiny-qwen2")
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    prompt = list(range(5, 37))
    cpu = load_weights(src, dtype=torch.float32, device="cpu")
    cuda = ModelWeights(cpu.config, cpu.layout, cpu.buffer.to("cuda"))
    cuda.readiness.mark_all_ready()
    outs = [
        LLMEngine(w, None, EngineConfig(block_size=16, num_kv_blocks=32)).generate([prompt], params)[0]
        for w in (cpu, cuda)
    ]
    assert outs[0].token_ids == outs[1].token_ids


@torch.inference_mode()
def test_shipped_hot_prefixes_give_the_same_tokens_on_cuda_and_fit_beside_the_cache() -> None:
    """Hot prefixes packed on one CUDA engine and scattered into another (the worker moves
    the packed tensor over NCCL, worker/prefix_ship.py): the new engine's first request
    takes them and gives the tokens the source gives; the packed copy is bounded by the
    device's free memory."""
    from blitzscale.worker.prefix_ship import copy_room

    weights = load_weights(resolve_model("random:tiny-llama3"), dtype=torch.float32, device="cuda")
    cfg = EngineConfig(block_size=16, num_kv_blocks=128)
    src, dst = LLMEngine(weights, None, cfg), LLMEngine(weights, None, cfg)
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 512, (64,), generator=g).tolist()
    a, b = (shared + torch.randint(0, 512, (9,), generator=g).tolist() for _ in range(2))
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    src.generate([a], params)
    want = src.generate([b], params)[0].token_ids  # took the shared blocks from the cache
    hot = src.handoffs.hot_prefixes(64)
    assert len(hot) == 4 and (copy_room(src) or 0) >= len(hot)
    ids = dst.handoffs.reserve_prefixes(len(hot))
    dst.handoffs.blocks_in(ids, src.handoffs.blocks_out([h.block for h in hot]))
    dst.handoffs.commit_prefixes(ids, [(h.hash, h.parent, h.hits) for h in hot])
    assert dst.generate([b], params)[0].token_ids == want
    assert dst.scheduler.prefix_hits == 64
    dst.check_integrity()
