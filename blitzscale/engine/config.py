"""Engine knobs: one type for a standalone engine, the `[engine]` section of `serve`'s TOML
(which picks its own defaults, for CPU serving), and the engine a worker starts when told to
(`ActivateMsg.engine`). Frozen; derived values are computed where the model is known."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 64  # tokens per KV block (the design's value)
    num_kv_blocks: int = 0  # 0: sized from kv_cache_bytes (CPU) or free GPU memory
    kv_cache_bytes: int = 1 << 30  # KV budget on CPU
    gpu_memory_utilization: float = 0.85  # share of free GPU memory for the KV cache
    max_num_batched_tokens: int = 2048  # prefill token budget of one step
    max_num_seqs: int = 128
    max_model_len: int = 8192  # capped by the model's own context (0: the model's own)
    # Launch each decode step before reading the last one's tokens (engine/overlap.py):
    # "auto" on GPUs, "on" anywhere (on CPU nothing runs ahead; tests use it), "off".
    overlap: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.max_num_batched_tokens <= 0 or self.max_num_seqs <= 0:
            raise ValueError("block_size, max_num_batched_tokens and max_num_seqs must be positive")
        if self.num_kv_blocks < 0 or self.max_model_len < 0 or self.kv_cache_bytes <= 0:
            raise ValueError(
                "num_kv_blocks and max_model_len must be >= 0 (0: sized for you), kv_cache_bytes > 0"
            )
        if self.overlap not in ("auto", "on", "off"):
            raise ValueError(f"overlap must be 'auto', 'on' or 'off', got {self.overlap!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
