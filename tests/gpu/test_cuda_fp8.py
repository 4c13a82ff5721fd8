"""FP8 linears on a Hopper GPU (sm_89+): per-token activation quantization (Triton) and
`torch._scaled_mm` with rowwise scales, against the bf16 model of the same weights
dequantized; inside the decode CUDA graphs; and `bench engine --dtype fp8` end to end.

Llama-3-8B-shaped layers (hidden 4096, intermediate 14336, 32/8 heads), random weights.
Run on the GPU machine: `python3 -m pytest tests/gpu/test_cuda_fp8.py -q`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from blitzscale.checkpoint.loader import random_weights
from blitzscale.checkpoint.pack import hf_state_dict, pack_into
from blitzscale.checkpoint.presets import preset_config
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.kvcache.cache import KVCache
from blitzscale.model import LlamaModel
from blitzscale.model.attention import AttentionMetadata
from blitzscale.model.linear import dequantize_rows, quantize_rows, quantize_tokens_torch
from blitzscale.model.weights import ModelWeights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
        reason="FP8 matmuls need sm_89 or later",
    ),
]

LAYERS = 8  # Llama-3-8B's layers, fewer of them (the test's time and memory)


def fp8_model(layers: int = LAYERS) -> ModelWeights:
    cfg = replace(preset_config("llama3-8b:fp8"), num_layers=layers)
    return random_weights(cfg, torch.bfloat16, "cuda", seed=5)


def dequantized(w8: ModelWeights) -> ModelWeights:
    dense = ModelWeights.empty(replace(w8.config, quant="none"), torch.bfloat16, "cuda")
    pack_into(dense, hf_state_dict(w8).__getitem__)
    return dense


@pytest.mark.parametrize("shape", [(1, 4096), (7, 14336), (64, 4096), (3, 100)])
@torch.inference_mode()
def test_triton_token_quantization_equals_the_torch_reference(shape: tuple[int, int]) -> None:
    from blitzscale.model.triton_ops import quantize_tokens

    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 3
    x[0, :5] = 0
    if shape[0] > 2:
        x[2] = 0  # a zero row: scale at its floor, zeros out
    q, s = quantize_tokens(x)
    q_ref, s_ref = quantize_tokens_torch(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (shape[0], 1) and s.dtype == torch.float32
    assert torch.equal(s, s_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@torch.inference_mode()
def test_scaled_mm_linear_is_close_to_the_dequantized_matmul() -> None:
    from blitzscale.model.linear import select_linear

    linear = select_linear(torch.device("cuda"), torch.bfloat16, "fp8")
    assert linear.name == "scaled_mm"
    w = torch.randn(6144, 4096, device="cuda") * 0.02
    q, s = quantize_rows(w)
    x = torch.randn(33, 4096, device="cuda", dtype=torch.bfloat16)
    out = linear(x, q, s)
    ref = x.float() @ dequantize_rows(q, s, torch.float32).t()
    assert out.dtype == torch.bfloat16 and out.shape == (33, 6144)
    cos = torch.nn.functional.cosine_similarity(out.float(), ref, dim=-1)
    assert float(cos.min()) >= 0.995
    assert linear(x[:0], q, s).shape == (0, 6144)


@torch.inference_mode()
def test_fp8_logits_cosine_vs_the_bf16_model_of_the_dequantized_weights() -> None:
    w8 = fp8_model()
    dense = dequantized(w8)
    n = 128
    ids = torch.randint(0, w8.config.vocab_size, (n,), generator=torch.Generator().manual_seed(1)).cuda()
    out = []
    for w in (w8, dense):
        model = LlamaModel(w, max_positions=1024)
        kv = KVCache(w.config, 4, 64, torch.bfloat16, "cuda")
        meta = AttentionMetadata.build([n], [n], [[3, 1]], 64, "cuda")
        out.append(model.forward(ids, meta, kv).float())
        if w is w8:
            assert model.linear.name == "scaled_mm"
    cos = torch.nn.functional.cosine_similarity(out[0], out[1], dim=-1)
    print(f"fp8 vs bf16-dequantized logits cosine: mean {float(cos.mean()):.5f} min {float(cos.min()):.5f}")
    assert float(cos.mean()) >= 0.99
    assert float(cos.min()) >= 0.98
    assert (out[0].argmax(-1) == out[1].argmax(-1)).float().mean() >= 0.9


@torch.inference_mode()
def test_decode_graphs_run_the_fp8_path_and_equal_eager_decoding() -> None:
    w8 = fp8_model(4)
    cfg = EngineConfig(block_size=16, num_kv_blocks=256, max_num_seqs=8)
    engine = LLMEngine(w8, None, cfg)
    assert engine.runner.graphs is not None and 4 in engine.runner.graphs.buckets
    assert engine.model.linear.name == "scaled_mm"
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, w8.config.vocab_size, (n,), generator=g).tolist() for n in (5, 30, 64, 100)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    graphed = [o.token_ids for o in engine.generate(prompts, params)]
    engine.runner.graphs, kept = None, engine.runner.graphs
    eager = [o.token_ids for o in engine.generate(prompts, params)]
    engine.runner.graphs = kept
    assert graphed == eager, (graphed, eager)
    assert all(len(t) == 16 for t in graphed)
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


@torch.inference_mode()
def test_bench_engine_fp8_measures_both_and_their_ratios() -> None:
    from blitzscale.bench.engine_bench import EngineBenchConfig, run_engine_bench

    cfg = EngineBenchConfig(
        model="random:llama3-8b",
        device="cuda",
        batch_sizes=(1, 64),
        context_lens=(512,),
        decode_steps=8,
        prefill_len=2048,
        dtype="fp8",
    )
    r = run_engine_bench(cfg)
    print(r)
    assert r["fp8"]["linear"] == "scaled_mm" and r["dense"]["linear"] == "dense"
    assert 0.5 < r["fp8_over_dense"]["weight_bytes"] < 0.6
    assert r["fp8_logits_vs_dense_dequantized"]["cosine_mean"] >= 0.99
    assert set(r["fp8_over_dense"]["decode_ms_per_step"]) == {"1", "64"}
    assert r["fp8"]["prefill_ms"] > 0 and r["dense"]["prefill_ms"] > 0
