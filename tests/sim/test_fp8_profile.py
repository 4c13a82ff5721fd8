"""The simulator knows FP8 models: `llama3-8b:fp8` moves and reads half the bytes.

Its profile is derived from llama3-8b's measured one (sim/tp.py): weight bytes from the FP8
layout, decode steps scaled by the bytes they read, prefill left at the bf16 model's."""

from __future__ import annotations

from blitzscale.sim import tp
from blitzscale.sim.config import load_model, load_preset


def test_fp8_model_has_half_the_weight_bytes_and_faster_decode() -> None:
    preset = load_preset("h200x2")
    dense = preset.instance_profile(load_model("llama3-8b"))
    fp8 = preset.instance_profile(load_model("llama3-8b:fp8"))
    assert 0.5 < fp8.weight_bytes / dense.weight_bytes < 0.6
    assert fp8.weight_bytes == tp.weight_bytes(tp.shape("llama3-8b:fp8"))
    assert fp8.kv_bytes_per_token == dense.kv_bytes_per_token  # the KV cache stays bf16
    assert fp8.prefill_ms == dense.prefill_ms
    one = fp8.decode_ms[0][0] / dense.decode_ms[0][0]  # batch 1, the shortest context
    assert 0.5 < one < 0.65, one
    assert fp8.kv_tokens > dense.kv_tokens  # the freed memory holds more KV
