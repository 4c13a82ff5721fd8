"""Architecture of a Llama-family model, independent of where its weights come from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from blitzscale.errors import CheckpointError
from blitzscale.model.quant import check_quant, hf_quantization_config, quant_from_hf

# What weights are held in (checkpoint/native.py), with the bytes of one element.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_NAMES = tuple(DTYPE_BYTES)

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling; `kind` is "default", "linear" or "llama3"."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # How the linear layers' weights are stored: "none" or "fp8" (model/quant.py)
    quant: str = "none"

    def __post_init__(self) -> None:
        check_quant(self.quant)
        if self.arch not in SUPPORTED_ARCHS:
            raise CheckpointError(
                f"unsupported architecture {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    # --- Hugging Face config.json ------------------------------------------------------

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> ModelConfig:
        model_type = d.get("model_type", "llama")
        if model_type not in SUPPORTED_ARCHS:
            raise CheckpointError(f"unsupported model_type {model_type!r} in config.json")
        try:
            num_heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
            theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
            eos = d.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
            return cls(
                arch=model_type,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
                head_dim=int(d.get("head_dim") or hidden // num_heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
                rope_theta=float(theta),
                rope_scaling=_rope_from_hf(rope),
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                qkv_bias=bool(d.get("attention_bias", model_type == "qwen2")),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
                quant=quant_from_hf(d.get("quantization_config")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"config.json is missing or has a bad field: {e}") from e

    def to_hf(self) -> dict[str, Any]:
        """A config.json that transformers reads back as the same architecture."""
        rs = self.rope_scaling
        rope: dict[str, Any] | None = None
        if rs.kind == "llama3":
            rope = {
                "rope_type": "llama3",
                "factor": rs.factor,
                "low_freq_factor": rs.low_freq_factor,
                "high_freq_factor": rs.high_freq_factor,
                "original_max_position_embeddings": rs.original_max_position_embeddings,
            }
        elif rs.kind == "linear":
            rope = {"rope_type": "linear", "factor": rs.factor}
        d: dict[str, Any] = {
            "model_type": self.arch,
            "architectures": [_HF_CLASS[self.arch]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) or None,
        }
        if self.arch == "llama":
            d["attention_bias"] = self.qkv_bias
        if self.quant == "fp8":
            d["quantization_config"] = hf_quantization_config()
        return d

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        d = dict(d)
        d["rope_scaling"] = RopeScaling(**d.get("rope_scaling", {}))
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)


_HF_CLASS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def _rope_from_hf(rope: dict[str, Any]) -> RopeScaling:
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling(kind="linear", factor=float(rope["factor"]))
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=float(rope["factor"]),
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
        )
    raise CheckpointError(f"unsupported rope scaling type {kind!r}")
