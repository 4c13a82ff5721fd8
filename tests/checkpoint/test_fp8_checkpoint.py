"""FP8 checkpoints: a compressed-tensors folder loads as it is stored, `convert --dtype fp8`
writes our format, and both serve through the normal load paths (our format's file read,
the disk path of scale-ups) with the same tokens as an unquantized model of the
dequantized weights.

The compressed-tensors folder is written here in the public Llama-3.1-8B-Instruct-FP8
checkpoints' form: config.json `quantization_config` (compressed-tensors, per-channel e4m3
weights, dynamic per-token activations, lm_head ignored), e4m3 `weight`s with bf16
`weight_scale`s of shape [rows, 1], everything else bf16.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from blitzscale.checkpoint import load_weights, native, resolve_model
from blitzscale.checkpoint.convert import convert
from blitzscale.checkpoint.pack import hf_state_dict, pack_into
from blitzscale.cli.main import main
from blitzscale.engine import EngineConfig, LLMEngine, SamplingParams
from blitzscale.errors import CheckpointError
from blitzscale.model.quant import hf_quantization_config
from blitzscale.model.weights import ModelWeights
from blitzscale.transfer.checksum import buffer_checksum
from blitzscale.transfer.disk import load_native

PRESET = "tiny-llama3"
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_compressed_tensors(folder: Path, weight_dtype: torch.dtype = torch.float8_e4m3fn) -> dict:
    """A tiny Llama in the compressed-tensors FP8 form; returns the tensors written."""
    dense = load_weights(resolve_model(f"random:{PRESET}"), seed=3)
    sd: dict[str, torch.Tensor] = {}
    for name, t in hf_state_dict(dense).items():
        if name.endswith(tuple(f"{n}.weight" for n in LINEARS)):
            scale = (t.abs().amax(dim=1, keepdim=True) / 448.0).to(torch.bfloat16)
            sd[name] = (t / scale.float()).to(weight_dtype)
            sd[name[: -len("weight")] + "weight_scale"] = scale
        else:
            sd[name] = t.to(torch.bfloat16).clone()
    folder.mkdir(parents=True)
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {
        **dense.config.to_hf(),
        "torch_dtype": "bfloat16",
        "quantization_config": hf_quantization_config(),
    }
    (folder / "config.json").write_text(json.dumps(config))
    return sd


def greedy(weights: ModelWeights) -> list[list[int]]:
    cfg = EngineConfig(block_size=16, num_kv_blocks=32, max_num_batched_tokens=128, max_num_seqs=4)
    engine = LLMEngine(weights, None, cfg)
    prompts = [[5, 9, 200, 17, 33], [44, 3, 3, 100, 7, 8, 9, 10, 11]]
    return [o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0))]


def dequantized(w8: ModelWeights) -> ModelWeights:
    dense = ModelWeights.empty(replace(w8.config, quant="none"), w8.dtype)
    pack_into(dense, hf_state_dict(w8).__getitem__)
    return dense


def test_compressed_tensors_folder_loads_its_fp8_bytes_as_stored(tmp_path: Path) -> None:
    sd = write_compressed_tensors(tmp_path / "hf")
    w = load_weights(resolve_model(str(tmp_path / "hf")))
    assert w.quant == "fp8" and w.dtype == torch.float32
    q, k, v = (sd[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(w.layers[1].qkv.view(torch.uint8), torch.cat([q, k, v]).view(torch.uint8))
    down_scale = sd["model.layers.2.mlp.down_proj.weight_scale"]
    assert torch.equal(w.layers[2].down_scale, down_scale.float().reshape(-1))
    tokens = greedy(w)
    assert tokens == greedy(dequantized(w))  # CPU: the dequantized weights' model, exactly
    assert len(set(map(tuple, tokens))) == 2


def test_an_e5m2_checkpoint_is_refused_naming_its_dtype(tmp_path: Path) -> None:
    write_compressed_tensors(tmp_path / "hf", weight_dtype=torch.float8_e5m2)
    with pytest.raises(CheckpointError, match="float8_e5m2"):
        load_weights(resolve_model(str(tmp_path / "hf")))


def test_a_block_quantized_checkpoint_is_refused_at_load(tmp_path: Path) -> None:
    write_compressed_tensors(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    qc = copy.deepcopy(config["quantization_config"])
    qc["config_groups"]["group_0"]["weights"]["strategy"] = "block"
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    with pytest.raises(CheckpointError, match="strategy='block'"):
        load_weights(resolve_model(str(tmp_path / "hf")))


def test_convert_keeps_fp8_and_every_load_path_serves_the_same_tokens(tmp_path: Path) -> None:
    write_compressed_tensors(tmp_path / "hf")
    from_hf = load_weights(resolve_model(str(tmp_path / "hf")))
    dst = convert(str(tmp_path / "hf"), tmp_path / "bz")  # the source's precision: fp8, bf16
    index = native.read_index(dst)
    assert index["dtype"] == "bfloat16" and index["config"]["quant"] == "fp8"
    stored = native.load_rank(native.rank_file(dst, 0))
    assert stored.quant == "fp8" and stored.dtype == torch.bfloat16
    dense_bf16 = ModelWeights.empty(replace(stored.config, quant="none"), torch.bfloat16)
    assert (dst / "rank0.bzw").stat().st_size < 0.7 * dense_bf16.layout.nbytes
    # our format's loader and the disk path of scale-ups, into the CPU's fp32 buffer
    loaded = load_weights(resolve_model(str(dst)))
    from_disk, stats = load_native(dst, 0, "cpu", dtype=torch.float32)
    assert stats.bytes == stored.layout.nbytes
    assert buffer_checksum(loaded.buffer) == buffer_checksum(from_disk.buffer)
    for a, b in zip(loaded.layers, from_hf.layers, strict=True):
        assert torch.equal(a.gate_up.view(torch.uint8), b.gate_up.view(torch.uint8))
        assert torch.equal(a.gate_up_scale, b.gate_up_scale)
    tokens = greedy(from_hf)
    assert greedy(loaded) == tokens and greedy(from_disk) == tokens


def test_cli_convert_dtype_fp8_then_dense_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", f"random:{PRESET}", str(tmp_path / "fp8"), "--dtype", "fp8"]) == 0
    w8 = load_weights(resolve_model(str(tmp_path / "fp8")))
    assert w8.quant == "fp8"
    ref = load_weights(resolve_model(f"random:{PRESET}:fp8"), dtype=torch.bfloat16)
    assert torch.equal(w8.layers[0].o.view(torch.uint8), ref.layers[0].o.view(torch.uint8))
    # an explicit float dtype dequantizes
    assert main(["convert", str(tmp_path / "fp8"), str(tmp_path / "f32"), "--dtype", "float32"]) == 0
    dense = load_weights(resolve_model(str(tmp_path / "f32")))
    assert dense.quant == "none"
    assert greedy(dense) == greedy(w8)
