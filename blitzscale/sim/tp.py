"""Step times of models and instance shapes no machine of ours has measured yet, derived
from one that has (until a multi-GPU machine measures them).

- `scaled`: another model on the same device (Qwen2.5-72B from Mistral-24B): decode steps
  scale with the bytes a step reads (weights plus the batch's KV), prefill steps with the
  parameters (the FLOPs a token costs).
- `tensor_parallel`: one shard of a TP instance: decode reads the shard's weights (the
  embedding and lm_head are whole on every shard, the layers split) and its heads' KV,
  prefill does 1/tp of the FLOPs; each layer adds two all-reduces of the step's hidden
  states over the link between the shards (a ring: 2 (tp-1)/tp of the bytes, 2 (tp-1)
  latencies).
Byte counts come from the model's real layout (model/layout.py), so the replicated parts
and the head split are exact; the times are estimates, and the profile says so.
"""

from __future__ import annotations

from dataclasses import replace

from blitzscale.checkpoint.presets import preset_config
from blitzscale.control.costmodel import Profile
from blitzscale.model.config import ModelConfig
from blitzscale.model.layout import build_layout

BF16 = 2


def shape(model: str) -> ModelConfig:
    """The model's architecture, from the random-weight presets (`random:<model>`); an
    `NAME:fp8` model is the shape with FP8 linears (its weight bytes about half)."""
    return preset_config(model)


def weight_bytes(cfg: ModelConfig, tp: int = 1) -> int:
    """Bytes of one rank's weights in a bf16 model: the real layout's (FP8 linears at one
    byte a weight plus their scales)."""
    return build_layout(cfg, BF16, tp, 0).nbytes


def kv_bytes_per_token(cfg: ModelConfig, tp: int = 1) -> int:
    return cfg.num_layers * 2 * (cfg.num_kv_heads // tp) * cfg.head_dim * BF16


def params(cfg: ModelConfig) -> float:
    """Parameters (the FLOPs a token costs): those of the unquantized model. An FP8 model's
    prefill is estimated at its bf16 model's time (no FP8 FLOP speed-up is assumed until a
    measured profile says otherwise); its decode steps scale with the bytes they read."""
    return weight_bytes(replace(cfg, quant="none")) / BF16


def _decode(p: Profile, w: float, kv: float, extra_ms: float | None = None) -> tuple[tuple[float, ...], ...]:
    """`p`'s decode steps scaled to a step that reads `w` bytes of weights and `kv` bytes a
    token of context, plus `extra_ms(batch)` (its all-reduces)."""

    def one(b: int, c: int, ms: float) -> float:
        scale = (w + b * c * kv) / (p.weight_bytes + b * c * p.kv_bytes_per_token)
        return round(ms * scale + (extra_ms(b) if extra_ms else 0.0), 4)

    return tuple(
        tuple(one(b, c, ms) for c, ms in zip(p.decode_context, row, strict=True))
        for b, row in zip(p.decode_batch, p.decode_ms, strict=True)
    )


def scaled(p: Profile, model: str, cfg: ModelConfig, base: ModelConfig) -> Profile:
    """`p`, measured on `base`, as the profile of `model` (shape `cfg`) on the same device."""
    w, kv = weight_bytes(cfg), kv_bytes_per_token(cfg)
    flops = params(cfg) / params(base)
    decode = _decode(p, w, kv)
    return replace(
        p,
        name=f"{model}-{p.name.rsplit('-', 1)[1]}",
        note=f"derived from {p.name!r}: decode by the bytes a step reads, prefill by parameters "
        f"({flops:.3f}x)",
        weight_bytes=w,
        kv_bytes_per_token=kv,
        # a device that would hold it whole (72B does not fit one GPU); the instance's
        # shards get the real device's memory back (SimPreset.instance_profile)
        device_memory_bytes=max(p.device_memory_bytes, 2 * w),
        num_layers=cfg.num_layers,
        prefill_ms=tuple(round(ms * flops, 4) for ms in p.prefill_ms),
        decode_ms=decode,
        derived_from={**p.derived_from, "scaled_from": p.name, "flops_factor_model": round(flops, 4)},
    )


def allreduce_s(rows: int, cfg: ModelConfig, tp: int, link_bytes_per_s: float, latency_s: float) -> float:
    """The all-reduces of one step of `rows` tokens: two per layer, ring algorithm."""
    size = rows * cfg.hidden_size * BF16
    one = 2 * (tp - 1) / tp * size / link_bytes_per_s + 2 * (tp - 1) * latency_s
    return 2 * cfg.num_layers * one


def tensor_parallel(
    p: Profile, cfg: ModelConfig, tp: int, link_bytes_per_s: float, latency_s: float
) -> Profile:
    """`p` (a TP=1 profile of `cfg`) as one shard of a `tp`-way instance."""
    if tp == 1:
        return p
    w, kv = weight_bytes(cfg, tp), kv_bytes_per_token(cfg, tp)

    def ar(rows: int) -> float:
        return 1000 * allreduce_s(rows, cfg, tp, link_bytes_per_s, latency_s)

    decode = _decode(p, w, kv, ar)
    return replace(
        p,
        name=f"{p.name}-tp{tp}",
        note=f"{p.name} as one shard of a TP{tp} instance (derived: weights and KV per shard, "
        f"FLOPs / {tp}, all-reduces over {link_bytes_per_s / 1e9:g} GB/s)",
        weight_bytes=w,
        kv_bytes_per_token=kv,
        prefill_ms=tuple(
            round(ms / tp + ar(n), 4) for n, ms in zip(p.prefill_tokens, p.prefill_ms, strict=True)
        ),
        decode_ms=decode,
        derived_from={**p.derived_from, "tp": tp, "tp_link_bytes_per_s": link_bytes_per_s},
    )
