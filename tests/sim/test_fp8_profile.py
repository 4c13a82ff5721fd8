"""The simulator knows FP8 models: `llama3-8b:fp8` moves and reads half the bytes.

On the H200 it has its own measured profile (blitzscale/data/profiles/llama3-8b-fp8-h200.json,
`blitzscale profile --model random:llama3-8b:fp8`); on a device with none (the paper's A800s)
it is derived from llama3-8b's profile there (sim/tp.py): weight bytes from the FP8 layout,
decode steps scaled by the bytes they read, prefill left at the bf16 model's."""

from __future__ import annotations

from dataclasses import replace

from blitzscale.sim import tp
from blitzscale.sim.config import load_model, load_preset


def test_fp8_model_on_the_h200_takes_its_measured_profile() -> None:
    preset = load_preset("h200x2")
    dense = preset.instance_profile(load_model("llama3-8b"))
    fp8 = preset.instance_profile(load_model("llama3-8b:fp8"))
    assert fp8.name == "llama3-8b:fp8-h200" and "measured" in fp8.note
    assert 0.5 < fp8.weight_bytes / dense.weight_bytes < 0.6
    assert fp8.weight_bytes == tp.weight_bytes(tp.shape("llama3-8b:fp8"))
    assert fp8.kv_bytes_per_token == dense.kv_bytes_per_token  # the KV cache stays bf16
    one = fp8.decode_ms[0][0] / dense.decode_ms[0][0]  # batch 1, the shortest context
    assert 0.6 < one < 0.8, one  # (measured 0.72: the GEMV, and the step's bf16 rest)
    assert fp8.prefill_ms[-1] < dense.prefill_ms[-1]  # FP8 tensor cores for long prompts
    # the freed memory holds more KV (at the same utilization: each profile carries its
    # engine's, 0.85 now, 0.9 when llama3-8b's was measured)
    assert fp8.kv_tokens > replace(dense, memory_utilization=fp8.memory_utilization).kv_tokens


def test_fp8_model_without_a_measured_profile_is_scaled_by_the_bytes_it_reads() -> None:
    preset = load_preset("paper-a")
    dense = preset.instance_profile(load_model("llama3-8b"))
    fp8 = preset.instance_profile(load_model("llama3-8b:fp8"))
    assert "derived from" in fp8.note
    assert fp8.weight_bytes == tp.weight_bytes(tp.shape("llama3-8b:fp8"))
    assert fp8.prefill_ms == dense.prefill_ms
    one = fp8.decode_ms[0][0] / dense.decode_ms[0][0]
    assert 0.5 < one < 0.65, one
