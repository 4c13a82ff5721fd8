"""Model shapes that can be built with random weights (`random:NAME`) for benchmarks and tests.

`NAME:fp8` is the same shape with FP8 linear weights (model/quant.py): `random:llama3-8b:fp8`.
"""

from __future__ import annotations

from dataclasses import replace

from blitzscale.model.config import ModelConfig, RopeScaling
from blitzscale.model.quant import QUANTS

_LLAMA3_ROPE = RopeScaling(
    kind="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)

PRESETS: dict[str, ModelConfig] = {
    "llama3-8b": ModelConfig(
        arch="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        max_position_embeddings=131072,
        bos_token_id=128000,
        eos_token_ids=(128001, 128009),
    ),
    "mistral-24b": ModelConfig(
        arch="mistral",
        vocab_size=131072,
        hidden_size=5120,
        intermediate_size=32768,
        num_layers=40,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=100000000.0,
        max_position_embeddings=32768,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
    "qwen2.5-72b": ModelConfig(
        arch="qwen2",
        vocab_size=152064,
        hidden_size=8192,
        intermediate_size=29568,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        qkv_bias=True,
        bos_token_id=None,
        eos_token_ids=(151645, 151643),
    ),
    # Small shapes of each architecture, for CPU tests against transformers.
    "tiny-llama3": ModelConfig(
        arch="llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(
            kind="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
        max_position_embeddings=1024,
        eos_token_ids=(1,),
    ),
    "tiny-mistral": ModelConfig(
        arch="mistral",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=320,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        eos_token_ids=(1,),
    ),
    "tiny-qwen2": ModelConfig(
        arch="qwen2",
        vocab_size=512,
        hidden_size=96,
        intermediate_size=192,
        num_layers=3,
        num_heads=6,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=1000000.0,
        qkv_bias=True,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
        eos_token_ids=(1,),
    ),
}


def split_preset(name: str) -> tuple[str, str]:
    """ "llama3-8b:fp8" -> ("llama3-8b", "fp8"); "llama3-8b" -> ("llama3-8b", "none").
    Raises KeyError naming the value for an unknown shape or weight type."""
    base, sep, quant = name.partition(":")
    if base not in PRESETS:
        raise KeyError(f"unknown model shape {base!r}; known: {', '.join(sorted(PRESETS))}")
    if sep and (quant == "none" or quant not in QUANTS):
        known = ", ".join(q for q in QUANTS if q != "none")
        raise KeyError(f"unknown weight type {quant!r} in {name!r}; known: {known} (NAME:{known})")
    return base, quant or "none"


def preset_config(name: str) -> ModelConfig:
    """The config of preset `name` ("llama3-8b", "llama3-8b:fp8")."""
    base, quant = split_preset(name)
    return replace(PRESETS[base], quant=quant)
