"""`blitzscale profile`: our engine's prefill and decode step times on this machine, as a
cost model (blitzscale/control/costmodel.py) for the simulator or `[model] profile`.

The same measurement a worker makes of its model at start (worker/costprobe.py), at the
points asked for: prefill of one prompt of n tokens in one step (the best of a few), and
decode of b sequences at context c (the mean of a few steps once all are decoding).
Random prompts; greedy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from blitzscale.checkpoint import load_weights, resolve_model
from blitzscale.control.costmodel import Profile
from blitzscale.engine import EngineConfig, LLMEngine
from blitzscale.engine.engine import default_dtype
from blitzscale.worker import costprobe


@dataclass(frozen=True)
class ProfileConfig:
    model: str = "smollm2-135m"
    device: str = "cpu"
    prefill_tokens: tuple[int, ...] = (16, 128, 512, 1024, 2048)
    decode_batch: tuple[int, ...] = (1, 4, 16, 64)
    decode_context: tuple[int, ...] = (128, 512, 1024)
    steps: int = 4  # decode steps timed at each point (prefill: the best of steps - 2, at least 1)
    block_size: int = 16
    memory_bytes: int = 0  # what one instance holds (0: the GPU's memory; CPU: weights + 8192 tokens of KV)

    @property
    def points(self) -> costprobe.ProbePoints:
        repeats = max(1, self.steps - 2)  # (the probe times repeats + 2 decode steps)
        return costprobe.ProbePoints(self.prefill_tokens, self.decode_batch, self.decode_context, repeats)


def measure_profile(cfg: ProfileConfig, log: Callable[[str], None] = print) -> Profile:
    device = torch.device(cfg.device)
    weights = load_weights(resolve_model(cfg.model), dtype=default_dtype(device), device=device)
    points = cfg.points
    engine = LLMEngine(
        weights,
        None,
        EngineConfig(
            block_size=cfg.block_size,
            num_kv_blocks=-(-points.tokens_needed(max(cfg.prefill_tokens)) // cfg.block_size)
            + max(cfg.decode_batch)
            + 1,
            max_num_batched_tokens=max(cfg.prefill_tokens),
            max_num_seqs=max(cfg.decode_batch),
            max_model_len=max(cfg.prefill_tokens) + max(cfg.decode_context) + 64,
        ),
    )
    kind = "cpu" if device.type == "cpu" else "cuda"
    p = costprobe.measure(engine, points, f"{cfg.model.removeprefix('random:')}-{kind}")
    for n, ms in zip(p.prefill_tokens, p.prefill_ms, strict=True):
        log(f"prefill {n:5d} tokens: {ms:.1f} ms")
    for b, row in zip(p.decode_batch, p.decode_ms, strict=True):
        for c, ms in zip(p.decode_context, row, strict=True):
            log(f"decode batch {b:3d} context {c:5d}: {ms:.1f} ms a step")
    if cfg.memory_bytes:
        memory = cfg.memory_bytes
    elif device.type == "cuda":
        memory = p.device_memory_bytes
    else:  # a CPU instance: its weights and 8192 tokens of KV
        memory = int(weights.layout.nbytes + 8192 * p.kv_bytes_per_token / p.memory_utilization) + 1
    how = f"`blitzscale profile --model {cfg.model} --device {cfg.device}`"
    note = f"measured by {how} (torch {torch.__version__})"
    return dataclasses.replace(p, note=note, device_memory_bytes=memory)
