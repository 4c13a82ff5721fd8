"""The contiguous per-rank weight layout: [embedding | layer 0 .. L-1 | final norm + lm_head].

Every layer segment has the same size, so a transfer is one message per segment and a
receiver knows where layer i lands without asking. Segments start on `SEGMENT_ALIGN`-byte
boundaries (direct I/O friendly), tensors inside a segment on `TENSOR_ALIGN` bytes.
Tensor-parallel slicing is applied here: rank k's buffer holds shard k of every layer.

The buffer has the activation dtype. A quantized model (`ModelConfig.quant`, model/quant.py)
keeps its linear weights in it as raw bytes of their own dtype (fp8: one byte an element)
with their fp32 scales beside them: a tensor's `dtype` names it, its `span` is what it
takes of the buffer. Every layer segment is still the same size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blitzscale.errors import CheckpointError
from blitzscale.model.config import ModelConfig
from blitzscale.model.quant import DTYPE_BYTES, FP8_DTYPE, LINEAR_NAMES, SCALE_DTYPE, scale_name

SEGMENT_ALIGN = 4096
TENSOR_ALIGN = 256


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    offset: int  # buffer elements from the start of its segment
    span: int  # buffer elements it takes (its numel unless `dtype` is another's)
    dtype: str = ""  # "": the buffer's dtype; else torch's name of its own (FP8_DTYPE, ...)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class SegmentSpec:
    name: str
    offset: int  # elements from the start of the buffer
    numel: int  # padded size in elements
    tensors: tuple[TensorSpec, ...]

    def tensor(self, name: str) -> TensorSpec:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True)
class WeightLayout:
    num_layers: int
    itemsize: int
    tp_size: int
    tp_rank: int
    segments: tuple[SegmentSpec, ...]

    @property
    def numel(self) -> int:
        last = self.segments[-1]
        return last.offset + last.numel

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def embed(self) -> SegmentSpec:
        return self.segments[0]

    @property
    def head(self) -> SegmentSpec:
        return self.segments[-1]

    def layer(self, i: int) -> SegmentSpec:
        return self.segments[1 + i]

    def layer_segment_index(self, i: int) -> int:
        return 1 + i

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers,
            "itemsize": self.itemsize,
            "tp_size": self.tp_size,
            "tp_rank": self.tp_rank,
            "segments": [
                {
                    "name": s.name,
                    "offset": s.offset,
                    "numel": s.numel,
                    "tensors": [
                        [t.name, list(t.shape), t.offset, *([t.dtype] if t.dtype else [])] for t in s.tensors
                    ],
                }
                for s in self.segments
            ],
        }


def check_tp(cfg: ModelConfig, tp_size: int) -> None:
    """Raise CheckpointError, naming the values, unless `tp_size` shards the model evenly."""
    if tp_size < 1:
        raise CheckpointError(f"tp must be at least 1, got {tp_size}")
    if cfg.num_heads % tp_size or cfg.num_kv_heads % tp_size or cfg.intermediate_size % tp_size:
        raise CheckpointError(
            f"tp={tp_size} does not divide num_heads={cfg.num_heads}, num_kv_heads={cfg.num_kv_heads} "
            f"and intermediate_size={cfg.intermediate_size}"
        )


def layer_tensor_shapes(cfg: ModelConfig, tp_size: int = 1) -> list[tuple[str, tuple[int, ...]]]:
    """Shapes of one layer's tensors on one TP rank (gate and up fused, q/k/v fused); a
    quantized model's linear weights are each followed by their per-output-channel scales."""
    h = cfg.hidden_size
    check_tp(cfg, tp_size)
    q, kv, inter = cfg.q_size // tp_size, cfg.kv_size // tp_size, cfg.intermediate_size // tp_size
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("input_norm", (h,)),
        ("qkv", (q + 2 * kv, h)),
    ]
    if cfg.qkv_bias:
        shapes.append(("qkv_bias", (q + 2 * kv,)))
    shapes += [
        ("o", (h, q)),
        ("post_norm", (h,)),
        ("gate_up", (2 * inter, h)),
        ("down", (h, inter)),
    ]
    if cfg.quant == "none":
        return shapes
    out: list[tuple[str, tuple[int, ...]]] = []
    for name, shape in shapes:
        out.append((name, shape))
        if name in LINEAR_NAMES:
            out.append((scale_name(name), (shape[0],)))
    return out


def tensor_dtype(cfg: ModelConfig, name: str) -> str:
    """The dtype a layer tensor is stored in ("" = the buffer's)."""
    if cfg.quant == "none":
        return ""
    if name in LINEAR_NAMES:
        return FP8_DTYPE
    if name.endswith("_scale") and name[: -len("_scale")] in LINEAR_NAMES:
        return SCALE_DTYPE
    return ""


def build_layout(cfg: ModelConfig, itemsize: int, tp_size: int = 1, tp_rank: int = 0) -> WeightLayout:
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank={tp_rank} out of range for tp_size={tp_size}")
    h = cfg.hidden_size
    groups: list[tuple[str, list[tuple[str, tuple[int, ...]]]]] = [
        ("embed", [("embed", (cfg.vocab_size, h))])
    ]
    per_layer = layer_tensor_shapes(cfg, tp_size)
    groups += [(f"layer.{i}", per_layer) for i in range(cfg.num_layers)]
    layer_dtypes = {name: tensor_dtype(cfg, name) for name, _ in per_layer}
    head: list[tuple[str, tuple[int, ...]]] = [("norm", (h,))]
    if not cfg.tie_word_embeddings:
        head.append(("lm_head", (cfg.vocab_size, h)))
    groups.append(("head", head))

    t_align = max(1, TENSOR_ALIGN // itemsize)
    s_align = max(1, SEGMENT_ALIGN // itemsize)
    segments = []
    offset = 0
    for name, shapes in groups:
        tensors = []
        inner = 0
        for tname, shape in shapes:
            dtype = layer_dtypes.get(tname, "") if name.startswith("layer.") else ""
            numel = 1
            for d in shape:
                numel *= d
            span = numel if not dtype else -(-numel * DTYPE_BYTES[dtype] // itemsize)
            tensors.append(TensorSpec(tname, shape, inner, span, dtype))
            inner = _round_up(inner + span, t_align)
        numel = _round_up(inner, s_align)
        segments.append(SegmentSpec(name, offset, numel, tuple(tensors)))
        offset += numel
    return WeightLayout(cfg.num_layers, itemsize, tp_size, tp_rank, tuple(segments))


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a
