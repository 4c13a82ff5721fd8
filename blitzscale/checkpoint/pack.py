"""Mapping between Hugging Face tensor names and the contiguous layout (fusing and TP slicing).

Quantization is converted here, whatever the pair: an FP8 model (`ModelConfig.quant`) takes
its linears' e4m3 weights and `weight_scale`s as a compressed-tensors checkpoint names them,
or quantizes dense ones per output channel (the whole tensor, before any TP slicing, so
every tp gives the same model); an unquantized model dequantizes FP8 tensors it is given.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from blitzscale.errors import CheckpointError
from blitzscale.model.config import ModelConfig
from blitzscale.model.linear import FP8, dequantize_rows, quantize_rows
from blitzscale.model.quant import LINEAR_NAMES
from blitzscale.model.weights import LayerWeights, ModelWeights

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


def _fp8(get: TensorGetter, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """HF linear `name` (".../q_proj") as (e4m3 weight, fp32 scale per output row), whole:
    as stored with its `weight_scale`, or quantized here from a dense weight."""
    w = get(name + ".weight")
    if w.dtype != FP8:
        return quantize_rows(_floating(w, name + ".weight"))
    s = get(name + ".weight_scale")
    shaped = s.dim() == 1 or (s.dim() == 2 and s.shape[1] == 1)
    if not (s.dtype.is_floating_point and s.numel() == w.shape[0] and shaped):
        raise CheckpointError(
            f"tensor {name}.weight_scale has shape {tuple(s.shape)} and dtype {s.dtype}; a per-channel "
            f"scale of {name}.weight needs {w.shape[0]} floats ([{w.shape[0]}, 1])"
        )
    return w, s.float().reshape(-1)


def _dense(get: TensorGetter, name: str) -> torch.Tensor:
    """HF tensor `name`, dequantized (fp32) if it is stored in FP8."""
    w = get(name)
    if w.dtype == FP8 and name.endswith(".weight"):
        q, s = _fp8(get, name[: -len(".weight")])
        return dequantize_rows(q, s, torch.float32)
    return _floating(w, name)


def _floating(t: torch.Tensor, name: str) -> torch.Tensor:
    if not t.dtype.is_floating_point or t.dtype.itemsize == 1:
        raise CheckpointError(
            f"tensor {name!r} has dtype {t.dtype}; supported: float32/bfloat16/float16, or "
            f"{FP8} weights with per-channel scales"
        )
    return t


def _linears(get: TensorGetter, lw: LayerWeights, p: str, tp: int, rank: int, quant: bool) -> None:
    """Layer `p`'s projections into `lw` (q/k/v and gate/up fused by rows, sharded by
    output; o and down sharded by input, their scales whole)."""
    fused = {
        "qkv": [f"{p}self_attn.{n}_proj" for n in "qkv"],
        "gate_up": [f"{p}mlp.{n}_proj" for n in ("gate", "up")],
    }
    by_input = {"o": p + "self_attn.o_proj", "down": p + "mlp.down_proj"}
    for name, parts in fused.items():
        if quant:
            pairs = [_fp8(get, n) for n in parts]
            _copy_rows(getattr(lw, name), [_shard(q, 0, tp, rank) for q, _ in pairs])
            _copy_rows(getattr(lw, name + "_scale"), [_shard(s, 0, tp, rank) for _, s in pairs])
        else:
            _copy_rows(getattr(lw, name), [_shard(_dense(get, n + ".weight"), 0, tp, rank) for n in parts])
    for name, hf in by_input.items():
        if quant:
            q, s = _fp8(get, hf)
            getattr(lw, name).copy_(_shard(q, 1, tp, rank))
            getattr(lw, name + "_scale").copy_(s)
        else:
            getattr(lw, name).copy_(_shard(_dense(get, hf + ".weight"), 1, tp, rank))


def pack_into(weights: ModelWeights, get: TensorGetter) -> None:
    """Fill `weights` from HF-named tensors, segment by segment, bumping readiness as each lands."""
    cfg, lay = weights.config, weights.layout
    get = _checked(get, cfg)
    tp, rank = lay.tp_size, lay.tp_rank
    quant = cfg.quant != "none"
    weights.zero_padding()
    weights.embed.copy_(_dense(get, "model.embed_tokens.weight"))
    weights.readiness.add(0)
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}."
        att = p + "self_attn."
        lw.input_norm.copy_(get(p + "input_layernorm.weight"))
        _linears(get, lw, p, tp, rank, quant)
        if lw.qkv_bias is not None:
            _copy_rows(lw.qkv_bias, [_shard(get(f"{att}{n}_proj.bias"), 0, tp, rank) for n in "qkv"])
        lw.post_norm.copy_(get(p + "post_attention_layernorm.weight"))
        weights.readiness.add(lay.layer_segment_index(i))
    weights.norm.copy_(get("model.norm.weight"))
    if not cfg.tie_word_embeddings:
        weights.lm_head.copy_(_dense(get, "lm_head.weight"))
    weights.readiness.add(len(lay.segments) - 1)


def hf_state_dict(weights: ModelWeights, dequantize: bool = False) -> dict[str, torch.Tensor]:
    """HF-named views of an unsharded model (no copies): a reference model can share them.
    An FP8 model's linears come as compressed-tensors names them (e4m3 `weight`, fp32
    `weight_scale` [rows, 1]), or with `dequantize` as new tensors of the activation dtype."""
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
        if lw.qkv_bias is not None:
            for name, part in zip("qkv", lw.qkv_bias.split([q, kv, kv]), strict=True):
                sd[f"{att}{name}_proj.bias"] = part
        sd[p + "post_attention_layernorm.weight"] = lw.post_norm
        inter = lw.gate_up.shape[0] // 2
        split = {
            "qkv": ([f"{att}{n}_proj" for n in "qkv"], [q, kv, kv]),
            "o": ([att + "o_proj"], [lw.o.shape[0]]),
            "gate_up": ([p + "mlp.gate_proj", p + "mlp.up_proj"], [inter, inter]),
            "down": ([p + "mlp.down_proj"], [lw.down.shape[0]]),
        }
        for name, (hf_names, rows) in split.items():
            w, scale = getattr(lw, name), getattr(lw, name + "_scale")
            if scale is not None and dequantize:
                w, scale = dequantize_rows(w, scale, weights.dtype), None
            for hf, part in zip(hf_names, w.split(rows), strict=True):
                sd[hf + ".weight"] = part
            if scale is not None:
                for hf, part in zip(hf_names, scale.split(rows), strict=True):
                    sd[hf + ".weight_scale"] = part.view(-1, 1)
    return sd


def copy_weights(src: ModelWeights, dst: ModelWeights) -> None:
    """Copy tensor by tensor between two layouts of the same model (dtype or device change;
    FP8 bytes and their scales as they are). Between quantizations (an unsharded model
    only) the tensors go through `pack_into`, which quantizes or dequantizes them."""
    if src.config.quant != dst.config.quant:
        if src.layout.tp_size != 1 or dst.layout.tp_size != 1:
            raise CheckpointError(
                f"converting weights from quant={src.config.quant!r} to {dst.config.quant!r} needs an "
                f"unsharded model, got tp={src.layout.tp_size}"
            )
        pack_into(dst, hf_state_dict(src).__getitem__)
        dst.readiness.mark_all_ready()
        return
    dst.zero_padding()
    dst.embed.copy_(src.embed)
    names = ["input_norm", "qkv", "o", "post_norm", "gate_up", "down"]
    if dst.config.quant != "none":
        names += [n + "_scale" for n in LINEAR_NAMES]
    for s, d in zip(src.layers, dst.layers, strict=True):
        for name in names:
            getattr(d, name).copy_(getattr(s, name))
        if d.qkv_bias is not None:
            d.qkv_bias.copy_(s.qkv_bias)
    dst.norm.copy_(src.norm)
    if not dst.config.tie_word_embeddings:
        dst.lm_head.copy_(src.lm_head)
    dst.readiness.mark_all_ready()
