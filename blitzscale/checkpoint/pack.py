"""Mapping between Hugging Face tensor names and the contiguous layout (fusing and TP slicing)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from blitzscale.errors import CheckpointError
from blitzscale.model.config import ModelConfig
from blitzscale.model.weights import ModelWeights

TensorGetter = Callable[[str], torch.Tensor]


def _shard(t: torch.Tensor, dim: int, tp: int, rank: int) -> torch.Tensor:
    return t if tp == 1 else t.chunk(tp, dim=dim)[rank]


def _copy_rows(dst: torch.Tensor, parts: list[torch.Tensor]) -> None:
    row = 0
    for part in parts:
        dst[row : row + part.shape[0]].copy_(part)
        row += part.shape[0]
    if row != dst.shape[0]:
        raise ValueError(f"fused tensor expects {dst.shape[0]} rows, parts give {row}")


def _checked(get: TensorGetter, cfg: ModelConfig) -> TensorGetter:
    """A getter that refuses tensors whose shape disagrees with the config."""
    h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    expected = {
        "embed_tokens.weight": (cfg.vocab_size, h),
        "lm_head.weight": (cfg.vocab_size, h),
        "norm.weight": (h,),
        "layernorm.weight": (h,),
        "q_proj.weight": (q, h),
        "k_proj.weight": (kv, h),
        "v_proj.weight": (kv, h),
        "q_proj.bias": (q,),
        "k_proj.bias": (kv,),
        "v_proj.bias": (kv,),
        "o_proj.weight": (h, q),
        "gate_proj.weight": (i, h),
        "up_proj.weight": (i, h),
        "down_proj.weight": (h, i),
    }

    def get_checked(name: str) -> torch.Tensor:
        t = get(name)
        want = next((s for suffix, s in expected.items() if name.endswith(suffix)), None)
        if want is not None and tuple(t.shape) != want:
            raise CheckpointError(
                f"tensor {name!r} has shape {tuple(t.shape)}, the model config implies {want}"
            )
        return t

    return get_checked


def pack_into(weights: ModelWeights, get: TensorGetter) -> None:
    """Fill `weights` from HF-named tensors, segment by segment, bumping readiness as each lands."""
    cfg, lay = weights.config, weights.layout
    get = _checked(get, cfg)
    tp, rank = lay.tp_size, lay.tp_rank
    weights.zero_padding()
    weights.embed.copy_(get("model.embed_tokens.weight"))
    weights.readiness.add(0)
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}."
        att = p + "self_attn."
        lw.input_norm.copy_(get(p + "input_layernorm.weight"))
        _copy_rows(lw.qkv, [_shard(get(f"{att}{n}_proj.weight"), 0, tp, rank) for n in "qkv"])
        if lw.qkv_bias is not None:
            _copy_rows(lw.qkv_bias, [_shard(get(f"{att}{n}_proj.bias"), 0, tp, rank) for n in "qkv"])
        lw.o.copy_(_shard(get(att + "o_proj.weight"), 1, tp, rank))
        lw.post_norm.copy_(get(p + "post_attention_layernorm.weight"))
        _copy_rows(lw.gate_up, [_shard(get(f"{p}mlp.{n}_proj.weight"), 0, tp, rank) for n in ("gate", "up")])
        lw.down.copy_(_shard(get(p + "mlp.down_proj.weight"), 1, tp, rank))
        weights.readiness.add(lay.layer_segment_index(i))
    weights.norm.copy_(get("model.norm.weight"))
    if not cfg.tie_word_embeddings:
        weights.lm_head.copy_(get("lm_head.weight"))
    weights.readiness.add(len(lay.segments) - 1)


def hf_state_dict(weights: ModelWeights) -> dict[str, torch.Tensor]:
    """HF-named views of an unsharded model (no copies): a reference model can share them."""
    if weights.layout.tp_size != 1:
        raise ValueError("hf_state_dict needs an unsharded (tp=1) model")
    cfg = weights.config
    q, kv = cfg.q_size, cfg.kv_size
    sd = {"model.embed_tokens.weight": weights.embed, "model.norm.weight": weights.norm}
    sd["lm_head.weight"] = weights.lm_head
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}."
        att = p + "self_attn."
        sd[p + "input_layernorm.weight"] = lw.input_norm
        for name, part in zip("qkv", lw.qkv.split([q, kv, kv]), strict=True):
            sd[f"{att}{name}_proj.weight"] = part
        if lw.qkv_bias is not None:
            for name, part in zip("qkv", lw.qkv_bias.split([q, kv, kv]), strict=True):
                sd[f"{att}{name}_proj.bias"] = part
        sd[att + "o_proj.weight"] = lw.o
        sd[p + "post_attention_layernorm.weight"] = lw.post_norm
        gate, up = lw.gate_up.chunk(2)
        sd[p + "mlp.gate_proj.weight"] = gate
        sd[p + "mlp.up_proj.weight"] = up
        sd[p + "mlp.down_proj.weight"] = lw.down
    return sd


def copy_weights(src: ModelWeights, dst: ModelWeights) -> None:
    """Copy tensor by tensor between two layouts of the same model (dtype or device change)."""
    dst.zero_padding()
    dst.embed.copy_(src.embed)
    for s, d in zip(src.layers, dst.layers, strict=True):
        for name in ("input_norm", "qkv", "o", "post_norm", "gate_up", "down"):
            getattr(d, name).copy_(getattr(s, name))
        if d.qkv_bias is not None:
            d.qkv_bias.copy_(s.qkv_bias)
    dst.norm.copy_(src.norm)
    if not dst.config.tie_word_embeddings:
        dst.lm_head.copy_(src.lm_head)
    dst.readiness.mark_all_ready()
