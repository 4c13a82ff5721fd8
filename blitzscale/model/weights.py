"""One rank's weights: a single flat buffer in the contiguous layout, with named views.

A quantized model's linear weights are views of their own dtype into the same buffer
(fp8 bytes, fp32 scales: model/layout.py); the buffer itself has the activation dtype."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blitzscale.errors import WeightsNotReadyError
from blitzscale.model.config import ModelConfig
from blitzscale.model.layout import SegmentSpec, WeightLayout, build_layout
from blitzscale.model.quant import LINEAR_NAMES
from blitzscale.model.readiness import SegmentReadiness


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    # per-output-channel fp32 scales of a quantized model's linears (None: not quantized)
    qkv_scale: torch.Tensor | None = None
    o_scale: torch.Tensor | None = None
    gate_up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None


def layout_of(config: ModelConfig, dtype: torch.dtype, tp_size: int = 1, tp_rank: int = 0) -> WeightLayout:
    """The layout of one rank's weights of a model of `config` in `dtype`."""
    return build_layout(config, torch.empty((), dtype=dtype).element_size(), tp_size, tp_rank)


class ModelWeights:
    """Views into one flat buffer; `readiness` says which segments have arrived."""

    def __init__(self, config: ModelConfig, layout: WeightLayout, buffer: torch.Tensor) -> None:
        if buffer.dim() != 1 or buffer.numel() != layout.numel:
            raise ValueError(f"buffer has {buffer.numel()} elements, layout needs {layout.numel}")
        if buffer.element_size() != layout.itemsize:
            raise ValueError("buffer dtype does not match the layout's item size")
        self.config = config
        self.layout = layout
        self.buffer = buffer
        self.readiness = SegmentReadiness(len(layout.segments))
        self._init_views()

    def _init_views(self) -> None:
        lay = self.layout
        self.embed = self._view(lay.embed, "embed")
        self.layers = [self._layer(lay.layer(i)) for i in range(lay.num_layers)]
        self.norm = self._view(lay.head, "norm")
        self.lm_head = self.embed if self.config.tie_word_embeddings else self._view(lay.head, "lm_head")

    @classmethod
    def empty(
        cls,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        tp_size: int = 1,
        tp_rank: int = 0,
        pin_memory: bool = False,
    ) -> ModelWeights:
        """`pin_memory`: page-locked host memory of exactly the buffer's size (a host copy;
        transfer/pinned.py)."""
        layout = layout_of(config, dtype, tp_size, tp_rank)
        if pin_memory:
            from blitzscale.transfer.pinned import pinned_empty

            return cls(config, layout, pinned_empty(layout.numel, dtype))
        return cls(config, layout, torch.empty(layout.numel, dtype=dtype, device=device))

    @property
    def dtype(self) -> torch.dtype:
        """The activation dtype (the buffer's); quantized linears keep their own."""
        return self.buffer.dtype

    @property
    def quant(self) -> str:
        """How the linear layers are stored: "none" or "fp8" (model/quant.py)."""
        return self.config.quant

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    def segment(self, index: int) -> torch.Tensor:
        """The flat slice of segment `index` (what a transfer sends or receives)."""
        s = self.layout.segments[index]
        return self.buffer[s.offset : s.offset + s.numel]

    def zero_padding(self) -> None:
        """Zero the alignment gaps, so a buffer filled tensor by tensor checksums the same
        on every rank (transfers and disk loads copy the gaps too)."""
        for seg in self.layout.segments:
            pos = 0
            for t in seg.tensors:
                if t.offset > pos:
                    self.buffer[seg.offset + pos : seg.offset + t.offset].zero_()
                if t.dtype:  # the bytes of its last buffer element beyond its own
                    start = seg.offset + t.offset
                    raw = self.buffer[start : start + t.span].view(torch.uint8)
                    raw[t.numel * getattr(torch, t.dtype).itemsize :].zero_()
                pos = t.offset + t.span
            if seg.numel > pos:
                self.buffer[seg.offset + pos : seg.offset + seg.numel].zero_()

    def layer(self, i: int) -> LayerWeights:
        if not self.readiness.is_ready(self.layout.layer_segment_index(i)):
            raise WeightsNotReadyError(f"layer {i} has not arrived yet")
        return self.layers[i]

    def _view(self, seg: SegmentSpec, name: str) -> torch.Tensor:
        t = seg.tensor(name)
        start = seg.offset + t.offset
        flat = self.buffer[start : start + t.span]
        if t.dtype:
            flat = flat.view(getattr(torch, t.dtype))[: t.numel]
        return flat.view(t.shape)

    def _layer(self, seg: SegmentSpec) -> LayerWeights:
        names = {t.name for t in seg.tensors}
        return LayerWeights(
            input_norm=self._view(seg, "input_norm"),
            qkv=self._view(seg, "qkv"),
            qkv_bias=self._view(seg, "qkv_bias") if "qkv_bias" in names else None,
            o=self._view(seg, "o"),
            post_norm=self._view(seg, "post_norm"),
            gate_up=self._view(seg, "gate_up"),
            down=self._view(seg, "down"),
            **{f"{n}_scale": self._view(seg, f"{n}_scale") for n in LINEAR_NAMES if f"{n}_scale" in names},
        )
