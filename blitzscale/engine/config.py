"""Engine knobs. Frozen; derived values are computed where the model is known."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 64  # tokens per KV block (the design's value)
    num_kv_blocks: int | None = None  # None: sized from kv_cache_bytes or free GPU memory
    kv_cache_bytes: int = 1 << 30  # KV budget on CPU
    gpu_memory_utilization: float = 0.85  # share of free GPU memory for the KV cache
    max_num_batched_tokens: int = 2048  # prefill token budget of one step
    max_num_seqs: int = 128
    max_model_len: int | None = 8192  # capped by the model's own context

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.max_num_batched_tokens <= 0 or self.max_num_seqs <= 0:
            raise ValueError("block_size, max_num_batched_tokens and max_num_seqs must be positive")
