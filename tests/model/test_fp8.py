"""FP8 weights in the model: layout, quantization, the linear seams, the config it comes from.

A quantized model keeps e4m3 linears and fp32 per-channel scales inside the activation-dtype
buffer; every layer segment stays the same size. On CPU each weight is dequantized for its
matmul, so the model's logits equal an unquantized model's holding the dequantized weights,
exactly, and transformers' on the same weights to fp32 rounding.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.checkpoint.pack import hf_state_dict, pack_into
from blitzscale.checkpoint.presets import PRESETS
from blitzscale.errors import CheckpointError, ModelNotFoundError
from blitzscale.model import LlamaModel
from blitzscale.model.config import ModelConfig
from blitzscale.model.layout import build_layout
from blitzscale.model.linear import dequantize_rows, quantize_rows, quantize_tokens_torch, select_linear
from blitzscale.model.quant import hf_quantization_config, quant_from_hf
from blitzscale.model.weights import ModelWeights
from tests.model.test_tiny_reference import hf_logits, paged_logits

TINY = ("tiny-llama3", "tiny-mistral", "tiny-qwen2")


def dequantized_twin(w8: ModelWeights) -> ModelWeights:
    dense = ModelWeights.empty(replace(w8.config, quant="none"), w8.dtype)
    pack_into(dense, hf_state_dict(w8).__getitem__)
    return dense


def test_layout_of_llama3_8b_fp8_is_about_half_and_layers_stay_equal() -> None:
    cfg = PRESETS["llama3-8b"]
    dense, fp8 = build_layout(cfg, 2), build_layout(replace(cfg, quant="fp8"), 2)
    assert len({s.numel for s in fp8.segments[1:-1]}) == 1
    assert fp8.embed.numel == dense.embed.numel and fp8.head.numel == dense.head.numel
    ratio = fp8.layer(0).numel / dense.layer(0).numel
    assert 0.5 <= ratio < 0.502, ratio  # one byte a weight, plus the scales
    assert 0.5 < fp8.nbytes / dense.nbytes < 0.6  # embedding and lm_head stay bf16
    tensors = {t.name: t for t in fp8.layer(0).tensors}
    assert tensors["qkv"].dtype == "float8_e4m3fn" and tensors["qkv_scale"].dtype == "float32"
    assert tensors["qkv"].span == 6144 * 4096 // 2 and tensors["input_norm"].dtype == ""
    assert ["qkv", [6144, 4096], tensors["qkv"].offset, "float8_e4m3fn"] in fp8.to_dict()["segments"][1][
        "tensors"
    ]
    # an unquantized layout's dict is as before (files written by earlier versions match)
    assert all(len(t) == 3 for s in dense.to_dict()["segments"] for t in s["tensors"])


def test_quantize_rows_maps_each_row_max_to_448_and_round_trips() -> None:
    w = torch.randn(64, 96) * torch.linspace(0.01, 3, 64)[:, None]
    w[5] = 0
    q, s = quantize_rows(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (64,) and s.dtype == torch.float32
    assert torch.equal(q[5].float(), torch.zeros(96))
    rows = [r for r in range(64) if r != 5]
    assert torch.allclose(q[rows].float().abs().amax(1), torch.full((63,), 448.0))
    err = (dequantize_rows(q, s, torch.float32) - w).abs() / w.abs().amax(1, keepdim=True).clamp(min=1e-9)
    assert float(err.max()) <= 2**-4  # e4m3: 3 mantissa bits, half an ulp at the row's top


def test_per_token_quantization_scales_each_row_on_its_own() -> None:
    x = torch.randn(7, 64) * torch.tensor([1e-3, 1, 10, 100, 0, 5, 0.5])[:, None]
    q, s = quantize_tokens_torch(x)
    assert s.shape == (7, 1) and q.shape == (7, 64)
    assert torch.equal(q[4].float(), torch.zeros(64))
    back = q.float() * s
    assert torch.allclose(back, x, rtol=2**-3, atol=1e-6)


@pytest.mark.parametrize("preset", TINY)
def test_cpu_fp8_logits_equal_a_dense_model_of_the_dequantized_weights(preset: str, hf_twin: Any) -> None:
    w8 = load_weights(resolve_model(f"random:{preset}:fp8"))
    dense = dequantized_twin(w8)
    seqs = [[3, 7, 11, 13, 17, 19, 23, 29, 31], [5, 6, 7]]
    model = LlamaModel(w8)
    assert model.linear.name == "dequant"
    ours = paged_logits(model, seqs, chunk=4)
    ref = paged_logits(LlamaModel(dense), seqs, chunk=4)
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a, b)
    hf = hf_logits(hf_twin(dense), seqs[0])
    assert torch.allclose(ours[0], hf, atol=1e-4)


def test_scaled_mm_path_quantizes_activations_and_stays_close() -> None:
    """The Hopper path's arithmetic (per-token FP8 activations, rowwise `_scaled_mm`), run
    here through torch's CPU `_scaled_mm`: close to the dequantized model, not equal."""
    w8 = load_weights(resolve_model("random:tiny-llama3:fp8"))
    seqs = [[3, 7, 11, 13, 17, 19, 23, 29, 31]]
    a = paged_logits(LlamaModel(w8, linear="scaled_mm"), seqs, chunk=4)[0]
    b = paged_logits(LlamaModel(w8), seqs, chunk=4)[0]
    assert not torch.equal(a, b)
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min()) > 0.99


def test_linear_selection_by_device_and_quantization() -> None:
    cpu = torch.device("cpu")
    assert select_linear(cpu, torch.float32, "none").name == "dense"
    assert select_linear(cpu, torch.float32, "fp8").name == "dequant"
    assert select_linear(cpu, torch.bfloat16, "fp8").name == "dequant"  # never _scaled_mm on CPU
    with pytest.raises(ValueError, match="'dense'"):
        select_linear(cpu, torch.float32, "fp8", "dense")
    with pytest.raises(ValueError, match="'fast'"):
        select_linear(cpu, torch.float32, "fp8", "fast")


def test_random_names_take_the_weight_type() -> None:
    src = resolve_model("random:tiny-mistral:fp8")
    w = load_weights(src, dtype=torch.bfloat16)
    assert w.quant == "fp8" and w.dtype == torch.bfloat16
    assert w.layers[0].gate_up.dtype == torch.float8_e4m3fn
    assert w.readiness.all_ready
    for bad in ("random:tiny-mistral:int4", "random:tiny-mistral:none", "random:nope:fp8"):
        with pytest.raises(ModelNotFoundError, match=bad.split(":")[-1] if "nope" not in bad else "nope"):
            resolve_model(bad)


def test_tp_shards_of_an_fp8_model_are_cut_from_the_whole() -> None:
    whole = load_weights(resolve_model("random:tiny-llama3:fp8"))
    shards = [load_weights(resolve_model("random:tiny-llama3:fp8"), tp_size=2, tp_rank=r) for r in (0, 1)]
    w0, s0, s1 = whole.layers[0], shards[0].layers[0], shards[1].layers[0]
    half = w0.down.shape[1] // 2
    assert torch.equal(s1.down.view(torch.uint8), w0.down[:, half:].contiguous().view(torch.uint8))
    assert torch.equal(s0.down_scale, w0.down_scale)  # row-parallel: the scales are whole
    rows = w0.gate_up.shape[0] // 4  # gate and up, each split in two
    assert torch.equal(s1.gate_up_scale[:rows], w0.gate_up_scale[rows : 2 * rows])


# --- compressed-tensors config.json ---------------------------------------------------


def test_the_public_fp8_config_is_read_as_fp8() -> None:
    d = {**PRESETS["tiny-llama3"].to_hf(), "quantization_config": hf_quantization_config()}
    assert ModelConfig.from_hf(d).quant == "fp8"
    assert quant_from_hf(None) == "none"
    assert ModelConfig.from_hf(PRESETS["tiny-llama3"].to_hf()).quant == "none"


def _variant(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    qc = copy.deepcopy(hf_quantization_config())
    node = qc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return qc


G = ("config_groups", "group_0")
REFUSED = {
    "group strategy": (_variant((*G, "weights", "strategy"), "group"), "strategy='group'"),
    "block": (_variant((*G, "weights", "block_structure"), [128, 128]), "block_structure"),
    "tensor strategy": (_variant((*G, "weights", "strategy"), "tensor"), "strategy='tensor'"),
    "int8": (_variant((*G, "weights", "type"), "int"), "type='int'"),
    "int4": (_variant((*G, "weights", "num_bits"), 4), "num_bits=4"),
    "static activations": (_variant((*G, "input_activations", "dynamic"), False), "dynamic=False"),
    "weight only": (_variant((*G, "input_activations"), None), "input_activations"),
    "fp8 kv cache": (_variant(("kv_cache_scheme",), {"num_bits": 8, "type": "float"}), "kv_cache_scheme"),
    "other method": ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "quant_method 'fp8'"),
    "gptq": ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq'"),
    "packed int4": (_variant(("format",), "pack-quantized"), "pack-quantized"),
    "ignored layers": (_variant(("ignore",), ["lm_head", "re:.*down_proj"]), "down_proj"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_quantization_is_refused_naming_what_it_found(case: str) -> None:
    qc, found = REFUSED[case]
    d = {**PRESETS["tiny-llama3"].to_hf(), "quantization_config": qc}
    with pytest.raises(CheckpointError) as e:
        ModelConfig.from_hf(d)
    assert found in str(e.value), str(e.value)


def test_an_unknown_quant_value_is_refused_by_name() -> None:
    with pytest.raises(CheckpointError, match="'int8'"):
        replace(PRESETS["tiny-llama3"], quant="int8")


def test_bench_engine_fp8_times_both_models_and_prints_ratios() -> None:
    from blitzscale.bench.engine_bench import EngineBenchConfig, run_engine_bench

    cfg = EngineBenchConfig(
        model="random:tiny-llama3",
        device="cpu",
        batch_sizes=(1, 4),
        context_lens=(32,),
        decode_steps=2,
        prefill_len=48,
        dtype="fp8",
    )
    r = run_engine_bench(cfg)
    assert r["fp8"]["linear"] == "dequant" and r["dense"]["linear"] == "dense"
    assert r["fp8_logits_vs_dense_dequantized"]["max_abs_diff"] == 0.0  # CPU: exact
    assert r["fp8_over_dense"]["weight_bytes"] < 0.5  # fp32 dense on CPU
    assert set(r["fp8_over_dense"]["decode_ms_per_step"]) == {"1", "4"}
    with pytest.raises(ValueError, match="'int4'"):
        run_engine_bench(replace(cfg, dtype="int4"))
