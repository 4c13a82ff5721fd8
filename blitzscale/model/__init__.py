"""One model instance's weights and forward pass (Llama family).

The names below load on first use (blitzscale/lazy.py): `config` and `layout` are plain,
and the control plane and the simulator read them without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from blitzscale.lazy import exports

if TYPE_CHECKING:
    from blitzscale.model.config import ModelConfig
    from blitzscale.model.layout import WeightLayout, build_layout
    from blitzscale.model.llama import LlamaModel
    from blitzscale.model.weights import ModelWeights

__getattr__ = exports(
    __name__,
    {
        "LlamaModel": "blitzscale.model.llama",
        "ModelConfig": "blitzscale.model.config",
        "ModelWeights": "blitzscale.model.weights",
        "WeightLayout": "blitzscale.model.layout",
        "build_layout": "blitzscale.model.layout",
    },
)
__all__ = ["LlamaModel", "ModelConfig", "ModelWeights", "WeightLayout", "build_layout"]
