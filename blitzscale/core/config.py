"""Engine knobs: one type for a standalone engine, the `[engine]` section of `serve`'s TOML
(which picks its own defaults, for CPU serving), and the engine a worker starts when told to
(`ActivateMsg.engine`). Frozen; derived values are computed where the model is known.

What depends on the device is 0 ("sized for the device") until `for_device` fills it in
(`DEVICE_LIMITS`): the engine does on its own device, `serve` does once for its workers'
device before any of them starts, so every worker is told the same numbers."""

from __future__ import annotations

from dataclasses import dataclass, replace

# A step's prompt-token budget and the most sequences a step decodes, by device type. A GPU
# takes what vLLM takes on a large GPU (8192 tokens a step; 256 sequences, each a CUDA graph
# bucket); a CPU worker's step of 2048 tokens already takes seconds.
DEVICE_LIMITS = {"cuda": (8192, 256), "cpu": (2048, 64)}


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 64  # tokens per KV block (the design's value)
    num_kv_blocks: int = 0  # 0: sized from kv_cache_bytes (CPU) or free GPU memory
    kv_cache_bytes: int = 1 << 30  # KV budget on CPU
    gpu_memory_utilization: float = 0.85  # share of free GPU memory for the KV cache
    max_num_batched_tokens: int = 0  # prefill token budget of one step (0: for the device)
    max_num_seqs: int = 0  # sequences one step may run (0: for the device)
    max_model_len: int = 8192  # capped by the model's own context (0: the model's own)
    # Launch each decode step before reading the last one's tokens (engine/overlap.py):
    # "auto" on GPUs, "on" anywhere (on CPU nothing runs ahead; tests use it), "off".
    overlap: str = "auto"
    # A serving worker's steps last what a reference device's profile gives (worker/pacing.py):
    # "off", "reference", "reference:F", a shipped profile's name or a .json path. The
    # controller resolves it before any worker starts; a standalone engine ignores it.
    pace: str = "off"
    # Reuse the KV blocks of prompt prefixes computed before (kvcache/pool.py); greedy
    # tokens are the same either way.
    prefix_caching: bool = True
    # Models resident on one device at once (serve's `[cluster] models_per_rank`): with more
    # than one, each engine's KV cache on a GPU is its equal share of the device's memory
    # (times gpu_memory_utilization) less its own weights, whatever the others hold.
    models_per_device: int = 1

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.max_num_batched_tokens < 0 or self.max_num_seqs < 0:
            raise ValueError(
                "max_num_batched_tokens and max_num_seqs must be >= 0 (0: sized for the device), got "
                f"{self.max_num_batched_tokens}/{self.max_num_seqs}"
            )
        for name in ("num_kv_blocks", "max_model_len"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: sized for you), got {getattr(self, name)}")
        if self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be > 0, got {self.kv_cache_bytes}")
        if self.overlap not in ("auto", "on", "off"):
            raise ValueError(f"overlap must be 'auto', 'on' or 'off', got {self.overlap!r}")
        if not isinstance(self.pace, str) or not self.pace.strip():
            raise ValueError(f"pace must be 'off', 'reference', 'reference:F' or a profile: {self.pace!r}")
        if self.models_per_device < 1:
            raise ValueError(f"models_per_device must be >= 1, got {self.models_per_device}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def for_device(self, device_type: str) -> EngineConfig:
        """This config with what is 0 sized for `device_type` ("cuda", "cpu"; "cuda:1" too)."""
        tokens, seqs = DEVICE_LIMITS.get(device_type.split(":")[0], DEVICE_LIMITS["cpu"])
        return replace(
            self,
            max_num_batched_tokens=self.max_num_batched_tokens or tokens,
            max_num_seqs=self.max_num_seqs or seqs,
        )
